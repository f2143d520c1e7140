"""The toolkit's vocabulary of settings: each choice and default defined once.

The configurations (:class:`~reservoir.extraction.ExtractConfig`,
:class:`~reservoir.training.TrainConfig`), the backbone loader, the recipes
and the command line all read their choices and defaults from here.
"""

from __future__ import annotations

#: Backbone used when none is named: sentence-transformers/all-MiniLM-L6-v2, shipped as a package.
DEFAULT_BACKBONE = "minilm"
#: Backbone weights: the checkpoint, the architecture's random init, or a per-tensor mean/std redraw.
INITS = ("pretrained", "random", "stats")
#: Autocast dtypes on CUDA (``auto``: bf16 where supported).
AMPS = ("auto", "bf16", "fp16", "none")
#: Gain of the orthogonal input projection (about sqrt(2)).
PROJECTION_GAIN = 1.41
#: What ``--device`` accepts.
DEVICE_HELP = "cpu, cuda, cuda:N or auto."
