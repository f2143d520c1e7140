"""Low-level I/O shared by every package: errors on one line, JSON read safely, files published atomically, folders
proven writable.

Nothing here knows about tasks, stores or models; everything above imports it. The modules, lowest first:

- :mod:`~reservoir.io.text`: an error on one line, a byte count for people;
- :mod:`~reservoir.io.system`: live processes, a scratch folder, durations from the environment, memory;
- :mod:`~reservoir.io.paths`: regular files, paths kept inside a folder, output names and folders;
- :mod:`~reservoir.io.reads`: JSON of bounded size, ``.npy`` arrays checked before their data;
- :mod:`~reservoir.io.writes`: files published whole by rename, stop requests held back during a write.

Each name is imported from here (``from reservoir.io import atomic_write``). A test that replaces one for the code
that calls it (``available_memory`` for :func:`~reservoir.io.system.check_memory`) replaces it in the module that
defines it.
"""

from reservoir.io.paths import (MAX_NAME_BYTES, ZARR_MARKERS, check_inside, check_local, check_name, check_regular,
                                file_kind, lookup, missing_folders, removed_if_failed, unwritable, within,
                                writable_folder, zarr_store_around)
from reservoir.io.reads import MAX_JSON_BYTES, ArrayHeader, load_npy, npy_header, read_json
from reservoir.io.system import (MAX_SECONDS, MIN_SECONDS, available_memory, check_memory, env_seconds,
                                 process_alive, scratch_folder)
from reservoir.io.text import cause, control_char, first_sentence, one_line, size_text
from reservoir.io.writes import (HDF5_MAGIC, atomic_write, fsync_dir, publish, replaceable, request_stop,
                                 save_figure, stop_deferred)

__all__ = ["HDF5_MAGIC", "MAX_JSON_BYTES", "MAX_NAME_BYTES", "MAX_SECONDS", "MIN_SECONDS", "ZARR_MARKERS",
           "ArrayHeader", "atomic_write", "available_memory", "cause", "check_inside", "check_local", "check_memory",
           "check_name", "check_regular", "control_char", "env_seconds", "file_kind", "first_sentence", "fsync_dir",
           "load_npy", "lookup", "missing_folders", "npy_header", "one_line", "process_alive", "publish", "read_json",
           "removed_if_failed", "replaceable", "request_stop", "save_figure", "scratch_folder", "size_text",
           "stop_deferred", "unwritable", "within", "writable_folder", "zarr_store_around"]
