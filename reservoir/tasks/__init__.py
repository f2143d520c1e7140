"""Tasks: fixed arrays per split plus the metadata a readout needs.

Importing this package registers the built-in tasks; build one with
:func:`get_task`, or with :func:`load_task` through the on-disk task cache.
Arrays already in memory become a task with :meth:`TaskData.from_arrays` (``Task`` is
another name for ``TaskData``); arrays in a file are the registered task ``data``
(:mod:`reservoir.tasks.data`).
"""

from reservoir.tasks import bits, data, homology, images, listops  # noqa: F401  (register their tasks)
from reservoir.tasks.base import TASKS, Split, Task, TaskData, TaskSpec, get_task, register, task_label
from reservoir.tasks.cache import load_task, task_cache_dir

__all__ = ["TASKS", "Split", "Task", "TaskData", "TaskSpec", "get_task", "load_task", "register", "task_cache_dir",
           "task_label"]
