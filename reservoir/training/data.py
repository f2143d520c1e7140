"""Feeding training: the rows of each split as device batches, the validation carve-out and the batch order."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import torch

from reservoir.errors import ReservoirError


@dataclass
class Feeder:
    """The arrays of one split, fed as batches: task inputs, or a split-point store's states.

    Parameters
    ----------
    inputs : np.ndarray or store array
        Task inputs ``(N, L)`` token ids or ``(N, L, d_in)`` vectors (``start``
        None), or a store array of layer-``start`` states ``(N, L, n_dim)``.
    lengths : np.ndarray
        ``(N,)`` real lengths of the rows.
    labels : np.ndarray
        ``(N, ...)`` integer labels.
    start : int or None
        None: ``inputs`` are task inputs; ``s`` >= 0: states at layer ``s``
        (layer 0: the embedding's output, never embedded again).
    index : np.ndarray, optional
        Rows of a store array ``inputs`` this split uses (store arrays are never copied).

    Examples
    --------
    >>> f = Feeder(np.zeros((4, 6, 2), np.float32), np.array([6, 3, 5, 1]), np.array([0, 1, 1, 0]))
    >>> [tuple(t.shape) for t in f.batch(np.array([1, 3]), "cpu")]  # padded to the batch's longest row
    [(2, 3, 2), (2,), (2,)]
    """

    inputs: Any
    lengths: np.ndarray
    labels: np.ndarray
    start: int | None = None
    index: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.lengths)

    @classmethod
    def from_split(cls, split, rows: np.ndarray | None = None) -> Feeder:
        """A task split's arrays (``rows`` of them only, when given)."""
        if rows is None:
            return cls(split.inputs, split.lengths, split.labels)
        return cls(split.inputs[rows], split.lengths[rows], split.labels[rows])

    def batch(self, rows: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(x, lengths, labels)`` of ``rows`` on ``device``, ``x`` cut to the longest of them."""
        L = int(self.lengths[rows].max())
        if isinstance(self.inputs, np.ndarray):
            x = self.inputs[rows, :L]
        else:  # store array: read rows in increasing order, then put them back in batch order
            src = rows if self.index is None else self.index[rows]
            order = np.argsort(src)
            x = np.empty((len(rows), L, self.inputs.shape[-1]), dtype=np.float32)
            if hasattr(self.inputs, "get_orthogonal_selection"):  # zarr
                got = self.inputs.get_orthogonal_selection((src[order], slice(0, L), slice(None)))
            else:  # h5py: fancy indexing needs increasing, unique indices
                got = self.inputs[src[order].tolist(), :L]
            x[order] = np.asarray(got, dtype=np.float32)
        x_t = torch.from_numpy(np.ascontiguousarray(x))
        if x_t.dtype == torch.float16:
            x_t = x_t.float()
        return (x_t.to(device), torch.from_numpy(self.lengths[rows].astype(np.int64)).to(device),
                torch.from_numpy(self.labels[rows].astype(np.int64)).to(device))


def data_identity(provenance: dict[str, Any]) -> dict[str, Any]:
    """:meth:`TrainData.identity` of a run's ``provenance`` (``task`` and, for a store, ``store``: its fingerprint)."""
    out: dict[str, Any] = {}
    task = provenance.get("task")
    if isinstance(task, dict) and "fingerprint" in task:
        out["task"] = task["fingerprint"]
    if isinstance(provenance.get("store"), dict):
        out["store"] = {k: v for k, v in provenance["store"].items() if k not in ("created", "reservoir_version")}
    return json.loads(json.dumps(out, default=float))  # plain data, as a checkpoint holds it


@dataclass
class TrainData:
    """What a run trains on (``train``), selects its best step on (``val``) and reports (``test``).

    ``provenance`` holds the result keys that say where the data come from:
    ``task`` (name, params, fingerprint) and, for a store, ``store`` and the
    store's ``backbone``.

    Raises
    ------
    ReservoirError
        When the three splits are not fed from the same layer.
    """

    train: Feeder
    val: Feeder
    test: Feeder
    provenance: dict[str, Any] = field(default_factory=dict)
    #: Releases what the feeders read from (a split-point store): :meth:`close`.
    closer: Callable[[], None] | None = field(default=None, repr=False, compare=False)

    def __post_init__(self) -> None:
        starts = [self.train.start, self.val.start, self.test.start]
        if len(set(starts)) != 1:
            found = ", ".join("inputs" if s is None else f"layer {s}" for s in starts)
            raise ReservoirError(f"expected train, val and test fed from one layer, found {found}")

    def close(self) -> None:
        """Close what the feeders read from (the store of :func:`~reservoir.training.stores.build_from_store`);
        nothing for arrays in memory. The feeders read nothing once it is closed; closing again does nothing."""
        closer, self.closer = self.closer, None
        if closer is not None:
            closer()

    def __enter__(self) -> TrainData:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def identity(self) -> dict[str, Any]:
        """What a checkpoint records of its data, and a resume must find again: the task's fingerprint and, for a
        store, the store's key (its ``created`` time and writer's version left out: a store extracted again with the
        same settings holds the same data)."""
        return data_identity(self.provenance)

    @property
    def start(self) -> int | None:
        """The layer the feeders' arrays are states of (``None``: task inputs)."""
        return self.train.start

    @classmethod
    def from_task(cls, task, val_fraction: float = 0.1, seed: int = 0) -> TrainData:
        """A task's splits: its ``val`` split if it has one, else a seeded ``val_fraction`` of train.

        Examples
        --------
        >>> from reservoir.tasks import load_task
        >>> data = TrainData.from_task(load_task("bit-xor", {"n_train": 100, "n_test": 20}))
        >>> len(data.train), len(data.val), len(data.test)
        (90, 10, 20)
        """
        from reservoir.tasks.arrays import train_classes

        tr, te = task.splits["train"], task.splits["test"]
        if "val" in task.splits:
            train, val = Feeder.from_split(tr), Feeder.from_split(task.splits["val"])
        else:
            t, v = carve_val(len(tr), val_fraction, seed)
            train, val = Feeder.from_split(tr, t), Feeder.from_split(tr, v)
        train_classes(tr.labels, f"task {task.name!r}")
        task_info = {"name": task.name, "params": task.params, "fingerprint": task.fingerprint}
        return cls(train, val, Feeder.from_split(te), provenance={"task": task_info})


def carve_val(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``(train_rows, val_rows)``: a seeded ``fraction`` of ``n`` rows held out.

    Examples
    --------
    >>> t, v = carve_val(10, 0.2, seed=0)
    >>> len(t), len(v), sorted([*t, *v]) == list(range(10))
    (8, 2, True)
    """
    n_val = max(1, round(fraction * n))
    if n - n_val < 1:
        raise ReservoirError(f"expected a train split of at least 2 rows, to hold out {fraction:g} of them for "
                             f"validation (the task has no val split); found {n}")
    perm = np.random.default_rng([seed, 7919]).permutation(n)
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def epoch_permutation(n: int, seed: int, epoch: int) -> np.ndarray:
    """The order epoch ``epoch`` visits ``n`` training rows in, seeded by ``(seed, epoch)``: live training's
    (:class:`EpochOrder`) and the cached head's alike."""
    return np.random.default_rng([seed, epoch]).permutation(n)


class EpochOrder:
    """The rows of each step: epoch ``e`` visits a permutation seeded by ``(seed, e)`` in whole batches.

    One permutation is computed per epoch (a step only slices it).

    Examples
    --------
    >>> order = EpochOrder(10, 4, seed=0)
    >>> order.per_epoch, len(order.rows(0)), sorted([*order.rows(0), *order.rows(1)]) == sorted(
    ...     np.random.default_rng([0, 0]).permutation(10)[:8])
    (2, 4, True)
    """

    def __init__(self, n: int, batch_size: int, seed: int):
        self.n, self.batch_size, self.seed = n, batch_size, seed
        self.per_epoch = max(1, n // batch_size)
        self._epoch, self._perm = -1, np.empty(0, np.int64)

    def rows(self, step: int) -> np.ndarray:
        """Rows of step ``step`` (``batch_size`` of them, or all ``n`` when ``n < batch_size``)."""
        epoch, i = divmod(step, self.per_epoch)
        if epoch != self._epoch:
            self._epoch, self._perm = epoch, epoch_permutation(self.n, self.seed, epoch)
        return self._perm[i * self.batch_size : (i + 1) * self.batch_size]


def batch_rows(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Rows of step ``step`` (:class:`EpochOrder`, for one step)."""
    return EpochOrder(n, batch_size, seed).rows(step)
