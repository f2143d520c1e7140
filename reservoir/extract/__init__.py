"""One pass of a task through a frozen backbone into a feature store, in data-flow order:

- :mod:`~reservoir.extract.config`: :class:`ExtractConfig`, the layers and poolings it resolves to;
- :mod:`~reservoir.extract.plan`: store chunks grouped into windows, rows sorted by length and cut into batches;
- :mod:`~reservoir.extract.prepare`: the task and backbone checked against each other, an :class:`ExtractionPlan`;
- :mod:`~reservoir.extract.engine`: windows of rows through the backbone on the device, features pooled there;
- :mod:`~reservoir.extract.writer`: finished windows written to the store on a background thread;
- :mod:`~reservoir.extract.passes`: every unfinished chunk of every split, by one process or one rank;
- :mod:`~reservoir.extract.sharded`: a rank's part of one store written by every process of a torchrun job;
- :mod:`~reservoir.extract.api`: :func:`extract` (a task and a backbone in hand) and :func:`run` (a config).

The package is itself callable: ``reservoir.extract(task, backbone, out, ...)``
is :func:`extract`, the name the toolkit has always exported.
"""

from __future__ import annotations

import inspect
import sys
import types
from typing import Any

from reservoir.extract.api import extract, run
from reservoir.extract.config import DTYPES, ExtractConfig, check_poolings, resolve_layers
from reservoir.extract.engine import extract_rows
from reservoir.extract.prepare import ExtractionPlan, plan_extraction, prepare

__all__ = ["DTYPES", "ExtractConfig", "ExtractionPlan", "check_poolings", "extract", "extract_rows",
           "plan_extraction", "prepare", "resolve_layers", "run"]


class _CallableModule(types.ModuleType):
    """This package's module type: calling it calls :func:`extract`, so ``reservoir.extract(...)`` keeps working
    whether ``reservoir.extract`` was first reached as the function or as the package."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return extract(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule
# what ``help(reservoir.extract)``, ``inspect.signature`` and notebook tooltips show: the function called, first
__signature__ = inspect.signature(extract)
__doc__ = (f"{inspect.cleandoc(extract.__doc__ or '')}\n\nThe package, in data-flow order:\n\n"
           f"{inspect.cleandoc(__doc__)}")
