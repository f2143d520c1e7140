"""The extraction's public names as they were first published; the code lives in :mod:`reservoir.extract`.

``from reservoir.extraction import ExtractConfig, run`` keeps working.
"""

from reservoir.extract import (DTYPES, ExtractConfig, ExtractionPlan, check_poolings, extract, extract_rows,
                               plan_extraction, prepare, resolve_layers, run)
from reservoir.runtime import resolve_device

#: The plan's name before :class:`ExtractionPlan`.
Prepared = ExtractionPlan

__all__ = ["DTYPES", "ExtractConfig", "ExtractionPlan", "Prepared", "check_poolings", "extract", "extract_rows",
           "plan_extraction", "prepare", "resolve_device", "resolve_layers", "run"]
