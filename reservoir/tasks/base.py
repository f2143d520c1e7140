"""What a task is: fixed arrays per split, plus enough metadata to build a readout.

A task never touches a model. It yields, per split, either token ids or
continuous vectors, the real length of every sequence, and integer labels. The
extractor turns token ids into one-hot vectors through the fixed input
projection, so both kinds reach the backbone the same way.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

import numpy as np

from reservoir.errors import ReservoirError


@dataclass(frozen=True)
class Split:
    """One split of a task.

    Attributes
    ----------
    inputs : np.ndarray
        Token tasks: integer ids ``(N, L)``, right-padded (pad value 0, never
        read: the extractor masks positions ``>= lengths``). Continuous tasks:
        float32 ``(N, L, d_in)``.
    lengths : np.ndarray
        int64 ``(N,)``, real length of each sequence, ``1 <= lengths <= L``.
    labels : np.ndarray
        int64 ``(N,)`` for one classification per sequence, or ``(N, *label_shape)``
        for several heads (bit XOR: ``(N, n_bits)``; bit memory:
        ``(N, n_out_tokens, bits_per_token)``). Values in ``[0, n_classes)``.
    """

    inputs: np.ndarray
    lengths: np.ndarray
    labels: np.ndarray

    def __post_init__(self) -> None:
        n = len(self.inputs)
        assert self.lengths.shape == (n,), (self.lengths.shape, n)
        assert len(self.labels) == n, (self.labels.shape, n)

    def __len__(self) -> int:
        return len(self.inputs)


@dataclass
class TaskData:
    """A task's splits and the facts a backbone and a readout need.

    Attributes
    ----------
    name : str
        Registry name (``"bit-xor"``, ``"listops"``, ...).
    params : dict
        Every parameter that shaped the arrays (JSON-serializable).
    kind : {"tokens", "continuous"}
        How ``inputs`` are encoded.
    d_in : int
        Vocabulary size for token tasks, vector size for continuous tasks.
    n_classes : int
        Classes per head.
    n_out_tokens : int
        How many final real positions the readout reads (1 except bit memory).
    splits : dict of str to Split
        In a fixed order; ``"train"`` and ``"test"`` always present.
    vocab : list of str or None
        Token strings in id order, for token tasks.
    fingerprint : str
        sha256 over params and every array; see :func:`fingerprint`.
    """

    name: str
    params: dict[str, Any]
    kind: Literal["tokens", "continuous"]
    d_in: int
    n_classes: int
    splits: dict[str, Split]
    n_out_tokens: int = 1
    vocab: list[str] | None = None
    fingerprint: str = field(default="")

    def __post_init__(self) -> None:
        if not self.fingerprint:
            self.fingerprint = fingerprint(self.name, self.params, self.splits)

    @property
    def label_shape(self) -> tuple[int, ...]:
        return tuple(next(iter(self.splits.values())).labels.shape[1:])

    @property
    def max_length(self) -> int:
        return max(int(s.lengths.max()) for s in self.splits.values() if len(s))


def fingerprint(name: str, params: dict[str, Any], splits: dict[str, Split]) -> str:
    """sha256 of a task's name, params and arrays (shape, dtype and bytes).

    Two runs that produce the same arrays from the same params get the same
    fingerprint, on any machine; a store records it so it can be matched to
    its data.
    """
    h = hashlib.sha256()
    h.update(json.dumps({"name": name, "params": params}, sort_keys=True).encode())
    for split_name, split in splits.items():
        h.update(split_name.encode())
        for arr in (split.inputs, split.lengths, split.labels):
            arr = np.ascontiguousarray(arr)
            h.update(f"{arr.dtype.str}{arr.shape}".encode())
            h.update(memoryview(arr).cast("B"))
    return h.hexdigest()


@dataclass(frozen=True)
class TaskSpec:
    """A registry entry: how to build a task and what to tell a user about it."""

    name: str
    build: Callable[..., TaskData]
    defaults: dict[str, Any]
    summary: str
    source: str
    tokens: str = ""
    d_in: str = ""
    classes: str = ""
    splits: str = "train, test"


TASKS: dict[str, TaskSpec] = {}


def register(spec: TaskSpec) -> TaskSpec:
    assert spec.name not in TASKS, spec.name
    TASKS[spec.name] = spec
    return spec


def resolve_params(name: str, params: dict[str, Any]) -> dict[str, Any]:
    """A registered task's defaults overridden by ``params`` (``None`` values keep the default).

    Raises
    ------
    ReservoirError
        For an unknown task or parameter, naming the known ones.
    """
    import reservoir.tasks  # noqa: F401  (registers the built-in tasks)

    if name not in TASKS:
        raise ReservoirError(f"unknown task {name!r}; expected one of: {', '.join(sorted(TASKS))}")
    spec = TASKS[name]
    unknown = sorted(set(params) - set(spec.defaults))
    if unknown:
        raise ReservoirError(
            f"task {name!r} has no parameter {unknown[0]!r}; expected one of: {', '.join(sorted(spec.defaults))}"
        )
    return {**spec.defaults, **{k: v for k, v in params.items() if v is not None}}


def get_task(name: str, **params: Any) -> TaskData:
    """Build a registered task with its defaults overridden by ``params`` (no cache; see ``load_task``).

    Examples
    --------
    >>> task = get_task("bit-xor", n_bits=5, n_train=64, n_test=32, seed=0)
    >>> task.splits["train"].inputs.shape
    (64, 10, 1)
    """
    return TASKS[name].build(**resolve_params(name, params))
