"""What a task is: fixed arrays per split, plus enough metadata to build a readout.

A task never touches a model. It yields, per split, either token ids or
continuous vectors, the real length of every sequence, and integer labels. The
extractor turns token ids into one-hot vectors through the fixed input
projection, so both kinds reach the backbone the same way.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

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
        if self.lengths.shape != (n,):
            raise ReservoirError(f"split: expected lengths of shape ({n},), one per row of inputs; "
                                 f"found {self.lengths.shape}")
        if len(self.labels) != n:
            raise ReservoirError(f"split: expected {n} labels, one per row of inputs; found {len(self.labels)} "
                                 f"(labels of shape {self.labels.shape})")

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

    @classmethod
    def from_arrays(
        cls,
        name: str = "arrays",
        splits: Mapping[str, Split | Sequence[Any]] | None = None,
        *,
        train: Split | Sequence[Any] | None = None,
        val: Split | Sequence[Any] | None = None,
        test: Split | Sequence[Any] | None = None,
        lengths: Mapping[str, Any] | None = None,
        kind: Literal["tokens", "continuous"] | None = None,
        d_in: int | None = None,
        n_classes: int | None = None,
        n_out_tokens: int = 1,
        vocab: Sequence[str] | None = None,
        params: Mapping[str, Any] | None = None,
    ) -> TaskData:
        """A task from arrays already in memory, checked as a built-in task's are.

        Parameters
        ----------
        name : str
            What the task is called in stores and results (default
            ``"arrays"``); not a registered task's name.
        splits : mapping of str to tuple or Split, optional
            ``{"train": (inputs, lengths, labels), "test": ...}`` (``"train"``
            and ``"test"`` required, ``"val"`` the validation split, others
            such as ``"test_ood"`` extracted and predicted too; names of
            letters, digits, ``_`` and ``-``; order kept). ``(inputs, labels)`` or ``lengths=None`` means every
            sequence is full length. Inputs are token ids, integers ``(N, L)``
            (right-padded; every id, padding included, in ``0..d_in-1``), or
            vectors ``(N, L, d_in)`` of numbers. Lengths are integers ``(N,)``
            in ``n_out_tokens..L``; labels integers ``(N, *label_shape)``
            ``>= 0``, the same ``label_shape`` in every split.
        train, val, test : tuple or Split, optional
            The keyword form, instead of ``splits``: ``train=(X, y),
            test=(X, y)`` (``val`` optional), each as a value of ``splits``;
            the splits are ordered train, val, test.
        lengths : mapping of str to array, optional
            With the keyword form: lengths ``(N,)`` per split name, e.g.
            ``{"train": ln_train, "test": ln_test}``, for splits given as
            ``(inputs, labels)``; a split it does not name is full length.
        kind : {"tokens", "continuous"}, optional
            Inferred from the inputs (2-D integers: tokens, 3-D: continuous);
            given, it must agree with them.
        d_in : int, optional
            Tokens: the vocabulary size, default the largest id + 1 over all
            splits. Continuous: the vector size (must equal ``inputs.shape[2]``).
        n_classes : int, optional
            Classes per head (at least 2), default the largest label + 1 over all splits.
        n_out_tokens : int
            How many final real positions the readout reads; with more than
            one, labels are ``(N, n_out_tokens, ...)``.
        vocab : sequence of str, optional
            Token strings in id order (tokens only); sets ``d_in`` when that is not given.
        params : mapping, optional
            JSON-serializable facts about where the arrays came from; kept in
            stores and part of the fingerprint.

        Returns
        -------
        TaskData
            Token inputs keep their dtype when the backbone reads it directly
            (uint8, int16, int32, int64; other integers become int64),
            continuous inputs become float32, lengths and labels int64 (no copy
            where the dtype already fits). The fingerprint is computed as for a
            built-in task, from ``name``, ``params`` and the arrays.

        Raises
        ------
        ReservoirError
            One line naming the split and what was expected and found, for any
            shape, dtype, length, label or id out of place.

        Examples
        --------
        >>> rng = np.random.default_rng(0)
        >>> x = rng.normal(size=(40, 6, 3)).astype(np.float32)
        >>> y = (x[:, -1, 0] > 0).astype(np.int64)
        >>> task = TaskData.from_arrays("my-task", {"train": (x[:30], y[:30]), "test": (x[30:], y[30:])})
        >>> task.kind, task.d_in, task.n_classes, task.splits["test"].lengths[:3].tolist()
        ('continuous', 3, 2, [6, 6, 6])
        >>> ids = np.array([[3, 1, 0], [2, 2, 2]])
        >>> TaskData.from_arrays("toy", {"train": (ids, [2, 3], [0, 1]), "test": (ids, [1, 3], [1, 0])}).d_in
        4
        >>> toy = TaskData.from_arrays(train=(ids, [0, 1]), test=(ids, [1, 0]), lengths={"train": [2, 3]}, name="toy")
        >>> toy.splits["train"].lengths.tolist(), toy.splits["test"].lengths.tolist()
        ([2, 3], [3, 3])
        """
        from reservoir.tasks.arrays import from_arrays, gather_splits

        splits = gather_splits(splits, train=train, val=val, test=test, lengths=lengths)
        return from_arrays(name, splits, kind=kind, d_in=d_in, n_classes=n_classes, n_out_tokens=n_out_tokens,
                           vocab=vocab, params=params)

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
    """A registry entry: how to build a task and what to tell a user about it.

    The task's parameters and their defaults are those of ``build``'s
    signature (:attr:`defaults`), so they are written in one place.
    """

    name: str
    build: Callable[..., TaskData]
    summary: str
    source: str
    tokens: str = ""
    d_in: str = ""
    classes: str = ""
    splits: str = "train, test"
    #: Checks the parameters (``build``'s keywords, defaults filled in) without building anything: one line naming
    #: the first bad value, as ``build`` would raise it. What a recipe runs to refuse a cell when it is loaded.
    check: Callable[[Mapping[str, Any]], Any] | None = None

    def __post_init__(self) -> None:
        for p in inspect.signature(self.build).parameters.values():
            if p.kind not in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) or p.default is p.empty:
                raise ReservoirError(f"task {self.name!r}: expected a builder whose every parameter is a keyword "
                                     f"with a default; found {p.name!r} ({p.kind.description}, "
                                     f"{'no default' if p.default is p.empty else 'default ' + repr(p.default)})")

    @property
    def defaults(self) -> dict[str, Any]:
        """Every parameter of ``build`` with its default, in signature order (what ``reservoir tasks`` lists)."""
        return {name: p.default for name, p in inspect.signature(self.build).parameters.items()}


TASKS: dict[str, TaskSpec] = {}

#: Another name for :class:`TaskData` (``reservoir.Task.from_arrays(train=(X, y), test=(X, y))``).
Task = TaskData


def register(spec: TaskSpec) -> TaskSpec:
    """Add ``spec`` to :data:`TASKS`; a name already registered is refused (one line)."""
    if spec.name in TASKS:
        raise ReservoirError(f"task {spec.name!r}: expected a name not yet registered; found it registered already")
    TASKS[spec.name] = spec
    return spec


#: Task parameters that are text (file and folder paths, column names, choices) in every task that takes them.
TEXT_PARAMS = ("path", "data_dir", "input_column", "label_column", "source", "tokenization", "format", "test_split")


def check_text_params(name: str, params: Mapping[str, Any]) -> None:
    """Refuse a :data:`TEXT_PARAMS` value that is not non-empty text (``data_dir: 2024`` from YAML or JSON), in one
    line; ``None`` keeps the default, and a path may be a ``Path``."""
    for key in TEXT_PARAMS:
        value = params.get(key)
        if key in ("path", "data_dir") and isinstance(value, os.PathLike):
            value = os.fspath(value)  # a Path from the Python API
        if value is not None and (not isinstance(value, str) or not value.strip()):
            found = "empty text" if isinstance(value, str) else f"{value!r} ({type(value).__name__})"
            raise ReservoirError(f"task {name!r}: expected {key} as non-empty text, found {found}")


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
    check_text_params(name, params)
    return {**spec.defaults, **{k: v for k, v in params.items() if v is not None}}


def check_params(name: str, params: Mapping[str, Any]) -> dict[str, Any]:
    """A registered task's parameters (:func:`resolve_params`) checked as its builder checks them, without building
    (reading no file, generating nothing); a bad value is one line naming the task and the parameter.

    Examples
    --------
    >>> check_params("bit-xor", {"n_train": 64})["n_train"]
    64
    >>> check_params("bit-xor", {"n_bits": 0})
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: task 'bit-xor': n_bits must be an integer in [1, 256]; found 0
    """
    full = resolve_params(name, dict(params))
    check = TASKS[name].check
    if check is not None:
        check(full)
    return full


def get_task(name: str, **params: Any) -> TaskData:
    """Build a registered task with its defaults overridden by ``params`` (no cache; see ``load_task``).

    Examples
    --------
    >>> task = get_task("bit-xor", n_bits=5, n_train=64, n_test=32, seed=0)
    >>> task.splits["train"].inputs.shape
    (64, 10, 1)
    """
    full = resolve_params(name, params)  # refuses an unknown name before it is looked up
    return TASKS[name].build(**full)


def task_label(name: str, params: Mapping[str, Any] | None = None) -> str:
    """The task as part of a file or folder name: ``name``, or ``<name>-<file stem>`` for a task read from one file.

    A task with a ``path`` parameter (``data``) would otherwise give every
    file's store, run folder and recipe run the same name.

    Examples
    --------
    >>> task_label("listops", {"n_train": 10}), task_label("data", {"path": "/tmp/my digits.npz"})
    ('listops', 'data-my_digits')
    """
    path = (params or {}).get("path")
    if not path:
        return name
    stem = re.sub(r"[^A-Za-z0-9._-]+", "_", Path(str(path).rstrip("/\\")).stem).strip("._") or "file"
    return f"{name}-{stem}"
