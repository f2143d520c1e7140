"""Where a fit's files go: the stem of their names (readout, pooling, raw features), the results folder of a
store (named after the store), and whether two store paths name one store."""

from __future__ import annotations

import os
from pathlib import Path

from reservoir.errors import ReservoirError


def result_stem(readout: str, pooling: str, final_norm: bool) -> str:
    """The name of a fit's files less ``-layer<K>.json``: the readout, then the pooling unless ``last``, then
    ``nonorm`` for raw features, so every kind of fit of a layer sits beside the others.

    Examples
    --------
    >>> result_stem("logistic", "last", True), result_stem("ridge", "mean", False)
    ('logistic', 'ridge-mean-nonorm')
    """
    return readout + ("" if pooling == "last" else f"-{pooling}") + ("" if final_norm else "-nonorm")


def store_stem(store: object) -> str:
    """The name a store's results go by: its file name less the format's suffix (``cache/xor.zarr`` -> ``xor``).

    Only that suffix goes: ``xor.digits.zarr`` is ``xor.digits``. Two stores of
    one name (``xor.zarr`` and ``xor.h5``, or in two folders) share it, and
    :func:`~reservoir.readouts.run.fit_linear` refuses to mix their results in one folder.
    """
    name = Path(str(store).rstrip("/")).name  # a path, or an object store's URL
    for suffix in (".zarr", ".h5", ".hdf5", ".hdf"):
        if name.lower().endswith(suffix) and len(name) > len(suffix):
            return name[: -len(suffix)]
    return name


def results_folder(results_dir: str | os.PathLike, store: object) -> Path:
    """The folder of ``results_dir`` that :func:`~reservoir.readouts.run.fit_linear` writes a store's results in;
    a store whose name leaves no folder name inside ``results_dir`` (``...zarr``, ``..``) is refused in one line."""
    stem = store_stem(store)
    if stem in ("", ".", ".."):
        raise ReservoirError(f"{store}: expected a store whose name (less its suffix) names its results folder inside "
                             f"{results_dir}; found {stem!r} (rename the store)")
    return Path(results_dir) / stem


def store_location(store: str) -> str:
    """A store's path or URL as results record it: a URL as given, a local path made absolute (the results file,
    read from another folder, still names the store).

    Examples
    --------
    >>> store_location("s3://bucket/x.zarr"), store_location("/data/x.zarr")
    ('s3://bucket/x.zarr', '/data/x.zarr')
    """
    return store if "://" in store else os.path.abspath(store)


def same_store(recorded: str, store: str) -> bool:
    """Whether a store path (or URL) a results file recorded names ``store``. A relative path, as earlier versions
    recorded, says nothing of the folder it was relative to: it names ``store`` when their file names agree (two
    stores of one name in different folders then show as one; their fingerprints are still compared)."""
    if "://" in recorded or "://" in store:
        return recorded.rstrip("/") == store.rstrip("/")
    if not os.path.isabs(recorded):
        return Path(recorded).name == Path(store).name
    return Path(recorded).resolve() == Path(store).resolve()
