"""Frozen Hugging Face backbones, their architecture table and inits."""

from reservoir.backbones.arch import ARCHS, ArchFacts, arch_for
from reservoir.backbones.load import INITS, load_backbone
from reservoir.backbones.model import Backbone, BackboneInfo, last_token_index
from reservoir.backbones.names import backbone_names
from reservoir.backbones.projection import input_projection, orthogonal_projection

__all__ = [
    "ARCHS",
    "INITS",
    "ArchFacts",
    "Backbone",
    "BackboneInfo",
    "arch_for",
    "backbone_names",
    "input_projection",
    "last_token_index",
    "load_backbone",
    "orthogonal_projection",
]
