"""The fixed input map in front of a backbone: a task's inputs (one-hot tokens or real vectors, ``d_in`` wide) to
the model's width, seeded and never trained."""

from __future__ import annotations

import torch
from torch import nn

from reservoir import options
from reservoir.errors import ReservoirError


def orthogonal_projection(d_in: int, n_dim: int, gain: float = options.PROJECTION_GAIN, seed: int = 0) -> nn.Linear:
    """The fixed input map: ``Linear(d_in, n_dim)``, orthogonal weight scaled by ``gain``, zero bias.

    Examples
    --------
    >>> proj = orthogonal_projection(15, 32, gain=1.0, seed=0)
    >>> torch.allclose(proj.weight.t() @ proj.weight, torch.eye(15), atol=1e-5)
    True
    """
    proj = nn.Linear(d_in, n_dim)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        nn.init.orthogonal_(proj.weight, gain=gain, generator=gen)
        proj.bias.zero_()
    return proj


def input_projection(kind: str, d_in: int, n_dim: int, gain: float = options.PROJECTION_GAIN,
                     seed: int = 0) -> nn.Linear:
    """The fixed input map of ``kind`` (:data:`~reservoir.options.PROJECTIONS`), seeded, zero bias.

    ``orthogonal``: :func:`orthogonal_projection` (scaled by ``gain``).
    ``normal``: N(0, 1) entries, what ``nn.Embedding`` draws: a token task's
    one-hot rows then pick rows of an embedding table, as the official FPT
    code embeds tokens (``gain`` does not apply).

    Examples
    --------
    >>> w = input_projection("normal", 15, 768, seed=0).weight.detach()
    >>> round(float(w.std()), 1), w.shape
    (1.0, torch.Size([768, 15]))
    """
    if kind == "orthogonal":
        return orthogonal_projection(d_in, n_dim, gain, seed)
    if kind != "normal":
        raise ReservoirError(f"unknown projection {kind!r}; expected one of: {', '.join(options.PROJECTIONS)}")
    proj = nn.Linear(d_in, n_dim)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        proj.weight.normal_(0.0, 1.0, generator=gen)
        proj.bias.zero_()
    return proj
