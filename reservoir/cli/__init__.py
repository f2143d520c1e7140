"""The ``reservoir`` command line: thin wrappers over the Python API.

torch, transformers and zarr are imported inside the commands, so
``reservoir --help`` answers at once. Bad input prints one line and exits
with status 2; nothing that claims to be complete is left behind.

One module per concept: ``stores`` (extract, info, tasks), ``readouts``
(fit-linear, predict, fit-raw), ``training`` (train, plot attention), ``benchmarks``
(bench), ``recipes`` (recipe, report); ``common`` holds what they share.
"""

from __future__ import annotations

import logging
import os

import click

from reservoir import __version__
from reservoir.cli import benchmarks, readouts, recipes, stores, training
from reservoir.cli.common import _EchoHandler, _Group


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reservoir")
def main() -> None:
    """Frozen pretrained transformers as fixed feature machines.

    Extract hidden states once (`reservoir extract`), then fit readouts from
    the store in seconds (`reservoir fit-linear`).
    """
    log = logging.getLogger("reservoir")
    if not any(isinstance(h, _EchoHandler) for h in log.handlers):
        log.addHandler(_EchoHandler())  # what the library reports (task cache hits, ...): one line each
        log.setLevel(logging.INFO)
    if "MASTER_ADDR" in os.environ:
        # a rank of a job: once a peer or the store's host is gone, c10d warns with a C++ stack trace per call, dozens
        # of lines before the one that says what happened (read before torch is imported; WARNING shows them)
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")


for _command in (stores.extract, stores.info, readouts.fit_linear, readouts.predict, training.train, readouts.fit_raw, benchmarks.bench,
                 recipes.recipe, recipes.report, training.plot, stores.tasks):
    main.add_command(_command)
