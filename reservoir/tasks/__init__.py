"""Tasks: fixed arrays per split plus the metadata a readout needs.

Importing this package registers the built-in tasks; build one with
:func:`get_task`.
"""

from reservoir.tasks.base import TASKS, Split, TaskData, TaskSpec, get_task, register
from reservoir.tasks import bits, homology, images, listops  # noqa: F401  (register their tasks)

__all__ = ["TASKS", "Split", "TaskData", "TaskSpec", "get_task", "register"]
