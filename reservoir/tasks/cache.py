"""Tasks built once: a task's arrays kept on disk, found again by what made them.

:func:`load_task` builds a registered task the first time and writes its
arrays to ``<cache>/<name>-<key>/`` (one ``.npy`` file per array, plus
``task.json`` with the metadata and the fingerprint). The key hashes the task
name, every parameter (defaults included), the package version and, for a task
read from files (a ``data_dir`` parameter, ``~/.cache/reservoir/<name>`` when it
is ``None``, or the ``data`` task's ``path``), each file's name, size,
modification time, inode and change time (which a copy or an edit in place
sets, and ``os.utime`` cannot), so edited data is never served from the cache.
An entry records its key: one found under another key (copied or moved there)
is refused like a damaged one. Later calls
memory-map the inputs copy-on-write (a large task is not read into memory until rows are
used) and check them against the recorded fingerprint, and the metadata
(``kind``, ``n_classes``, ...) against a digest that binds it to that
fingerprint; an entry that does not match, or whose ``.npy`` headers claim more
data than their files hold, is refused, removed and rebuilt.

The cache folder is ``cache/tasks`` under the working directory, or the
``RESERVOIR_TASK_CACHE`` environment variable (``off`` disables it).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from reservoir import __version__
from reservoir.io import load_npy, lookup, read_json
from reservoir.tasks.arrays import _SPLIT_NAME, checked_task
from reservoir.tasks.base import Split, TaskData, fingerprint, get_task, resolve_params, task_label
from reservoir.tasks.columns import is_saved_dataset
from reservoir.tasks.files import download_folder

log = logging.getLogger("reservoir")

ENV = "RESERVOIR_TASK_CACHE"
DEFAULT_DIR = Path("cache") / "tasks"
_ARRAYS = ("inputs", "lengths", "labels")


def task_cache_dir() -> Path | None:
    """The task cache folder (``None`` when ``RESERVOIR_TASK_CACHE=off``)."""
    value = os.environ.get(ENV)
    if value is not None and value.strip().lower() in ("off", "0", "none", ""):
        return None
    return Path(value) if value else DEFAULT_DIR


def _stamp(st: os.stat_result) -> list[int]:
    """A data file's size, modification time, inode and change time (a copy or an edit sets the last two, and
    ``os.utime`` cannot)."""
    return [st.st_size, st.st_mtime_ns, st.st_ino, st.st_ctime_ns]


def cache_key(name: str, params: dict[str, Any]) -> str:
    """What identifies a built task before building it: name, full params, version, data files."""
    key = {"name": name, "params": params, "version": __version__, "files": data_files(name, params)}
    return hashlib.sha256(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:16]


def data_files(name: str, params: dict[str, Any]) -> list[list[Any]]:
    """The files a task with full ``params`` reads, each ``[name, size, mtime, inode, ctime]`` (:func:`_stamp`):
    its ``data_dir``, the folder a download writes to and its data file ``path``; empty for a task made from its
    parameters alone (or whose files are absent)."""
    files = []
    path = params.get("path")
    sources = [params.get("data_dir"), path]
    if "data_dir" in params:  # a task of downloadable files also reads them where a download puts them
        sources.append(download_folder(name))
    for source in dict.fromkeys(sources):
        root = Path(source).expanduser() if source else None  # a folder of files; the data task's file or folder
        st = None if root is None else lookup(root)
        if st is None:
            continue
        if stat.S_ISREG(st.st_mode):
            files.append([root.name, *_stamp(st)])
        elif source is path and not is_saved_dataset(root):
            continue  # not a dataset folder (a mistyped /usr, say): the build refuses it without a walk
        elif stat.S_ISDIR(st.st_mode):
            files += _walk(root)
    return files


def _walk(root: Path) -> list[list[Any]]:
    """Every file under ``root``, linked folders followed (a task reads through them: a change there is a change
    to its data) and each real folder walked once (a link back up is no loop), as ``[relative name, *stamp]``."""
    found, seen = [], set()
    for folder, dirs, names in os.walk(root, followlinks=True):
        st = os.stat(folder)
        if (st.st_dev, st.st_ino) in seen:
            dirs.clear()
            continue
        seen.add((st.st_dev, st.st_ino))
        dirs.sort()  # one order of the walk: a folder reached by two paths is named by the same one every time
        for name in names:
            p = Path(folder, name)
            if p.is_file():
                found.append([str(p.relative_to(root)), *_stamp(p.stat())])
    return sorted(found)


def load_task(name: str, params: dict[str, Any] | None = None, cache_dir: str | os.PathLike | None | bool = True
              ) -> TaskData:
    """Build a registered task, or load it from the task cache when it was built before.

    Parameters
    ----------
    name : str
        Registered task name.
    params : dict, optional
        Task parameters (as for :func:`~reservoir.tasks.get_task`).
    cache_dir : path, True or None
        The cache folder; ``True`` for :func:`task_cache_dir`, ``None`` or
        ``False`` to build without the cache.

    Returns
    -------
    TaskData
        The same arrays, params and fingerprint as ``get_task(name, **params)``.

    Examples
    --------
    >>> task = load_task("bit-xor", {"n_train": 64, "n_test": 32}, cache_dir=None)
    >>> task.splits["train"].inputs.shape
    (64, 10, 1)
    """
    params = dict(params or {})
    folder = task_cache_dir() if cache_dir is True else (Path(cache_dir) if cache_dir else None)
    if folder is None or params.get("download"):
        return get_task(name, **params)
    full = resolve_params(name, params)
    key = cache_key(name, full)
    entry = folder / f"{name}-{key}"
    label = task_label(name, full)  # data-<file stem> for a data file
    if entry.is_dir():
        task = _read(entry, key)
        if task is not None:
            log.info("task %s: loaded from the task cache %s (fingerprint %s)", label, entry, task.fingerprint[:12])
            return task
        if _earlier(entry):
            log.info("task %s: the cached copy %s was written by an earlier version; rebuilt", label, entry)
        else:
            log.warning("task %s: the cached copy %s is unreadable or does not match its fingerprint; refused and "
                        "rebuilt", label, entry)
        shutil.rmtree(entry, ignore_errors=True)
    task = get_task(name, **params)
    try:
        if _write(task, entry, key):
            log.info("task %s: built and saved to the task cache %s", label, entry)
        else:
            log.info("task %s: built; another process saved it to the task cache %s first", label, entry)
    except OSError as err:  # a read-only or full disk: the task is still good, only not cached
        log.warning("task %s: not cached (%s)", label, err.strerror or err)
    return task


def _write(task: TaskData, entry: Path, key: str) -> bool:
    """Write the task under a temporary name, then rename it into place (readers never see half an entry); ``False``
    when another process saved the same entry first."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{entry.name}-", dir=entry.parent))
    try:
        for split_name, split in task.splits.items():
            for a in _ARRAYS:
                np.save(tmp / f"{split_name}.{a}.npy", np.ascontiguousarray(getattr(split, a)))
        meta = {"name": task.name, "params": task.params, "kind": task.kind, "d_in": task.d_in,
                "n_classes": task.n_classes, "n_out_tokens": task.n_out_tokens, "vocab": task.vocab,
                "splits": list(task.splits), "fingerprint": task.fingerprint, "reservoir_version": __version__,
                "key": key}
        meta["digest"] = _digest(meta)
        (tmp / "task.json").write_text(json.dumps(meta, indent=1))
        os.rename(tmp, entry)
    except OSError:
        shutil.rmtree(tmp, ignore_errors=True)
        if entry.is_dir():  # another process cached the same task first
            return False
        raise
    return True


def _digest(meta: dict[str, Any]) -> str:
    """What binds an entry's metadata to its arrays: a hash of every field but itself, the arrays' fingerprint
    among them, so an edited ``n_classes`` or ``kind`` no longer matches."""
    fields = {k: v for k, v in meta.items() if k != "digest"}
    return hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()


def _earlier(entry: Path) -> bool:
    """Whether an entry was written before entries recorded their key (its metadata otherwise whole)."""
    try:
        meta = read_json(entry / "task.json", "the task cache's metadata")
    except (OSError, ValueError):
        return False
    return isinstance(meta, dict) and "key" not in meta and meta.get("digest") == _digest(meta)


def _read(entry: Path, key: str) -> TaskData | None:
    """The cached task, or ``None`` when the entry is unreadable, was written under another key than ``key``, or
    its arrays do not hash to its fingerprint."""
    try:
        meta = read_json(entry / "task.json", "the task cache's metadata")
        if not isinstance(meta, dict) or meta.get("digest") != _digest(meta) or meta.get("key") != key:
            return None
        splits = {}
        for s in meta["splits"]:
            if not isinstance(s, str) or not _SPLIT_NAME.fullmatch(s):  # a name that would reach outside the entry
                return None
            files = {a: entry / f"{s}.{a}.npy" for a in _ARRAYS}
            if any(f.is_symlink() for f in files.values()):  # the entry's own files only
                return None
            splits[s] = Split(**{a: load_npy(f, mmap_mode="c" if a == "inputs" else None) for a, f in files.items()})
        if fingerprint(meta["name"], meta["params"], splits) != meta["fingerprint"]:
            return None
        # the metadata against the arrays, as a build checks them (token ids below d_in, labels below n_classes,
        # lengths, finite inputs): the digest binds the two but is no secret, so an edited entry can pass it
        fields = {k: meta[k] for k in ("kind", "d_in", "n_classes", "n_out_tokens")}
        checked = checked_task(meta["name"], splits, **fields, vocab=meta["vocab"], params=meta["params"])
        if any(getattr(checked, k) != v for k, v in fields.items()):
            return None
        return TaskData(name=meta["name"], params=meta["params"], **fields, splits=splits, vocab=meta["vocab"],
                        fingerprint=meta["fingerprint"])
    except (OSError, ValueError, KeyError, TypeError):  # a damaged entry (ReservoirError is a ValueError)
        return None


__all__ = ["cache_key", "load_task", "task_cache_dir"]
