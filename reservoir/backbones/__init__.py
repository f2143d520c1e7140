"""Frozen Hugging Face backbones, their architecture table and inits."""

from reservoir.backbones.arch import ARCHS, ArchFacts, arch_for
from reservoir.backbones.load import INITS, backbone_names, load_backbone, orthogonal_projection
from reservoir.backbones.model import Backbone, BackboneInfo

__all__ = [
    "ARCHS",
    "ArchFacts",
    "Backbone",
    "BackboneInfo",
    "INITS",
    "arch_for",
    "backbone_names",
    "load_backbone",
    "orthogonal_projection",
]
