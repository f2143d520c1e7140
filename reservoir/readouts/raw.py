"""The no-backbone baseline: :func:`fit_raw`, a readout on a continuous task's flattened raw inputs."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from reservoir.errors import ReservoirError
from reservoir.readouts.intervals import encode_rows
from reservoir.readouts.run import FitResult, check_readout
from reservoir.readouts.sweep import make_readout, test_metrics, validation_metrics
from reservoir.runtime import check_seed, resolve_device

if TYPE_CHECKING:
    from reservoir.tasks import TaskData


def check_raw(data: TaskData) -> None:
    """Refuse (one line) a task no raw-input baseline can fit: a token task or one of several output tokens, inputs
    of other shapes in different splits (one weight per input number), a train split of one class."""
    from reservoir.tasks.arrays import train_classes
    from reservoir.tasks.base import task_label

    name = task_label(data.name, data.params)
    train_classes(data.splits["train"].labels, f"task {name!r}")
    if data.kind != "continuous" or data.n_out_tokens != 1:
        raise ReservoirError(f"a raw-input baseline needs a continuous task with one output token; found "
                             f"{name!r} ({data.kind}, {data.n_out_tokens} output tokens)")
    shapes = {split: tuple(s.inputs.shape[1:]) for split, s in data.splits.items()}
    if len(set(shapes.values())) > 1:
        found = ", ".join(f"{split} {' x '.join(map(str, shape))}" for split, shape in shapes.items())
        raise ReservoirError(f"a raw-input baseline needs inputs of one shape per row in every split of {name!r} "
                             f"(positions x numbers); found {found}")


def fit_raw(task: str | TaskData, task_params: dict[str, Any] | None = None, readout: str = "logistic", *,
            seed: int = 0, device: str = "cpu") -> FitResult:
    """The no-backbone baseline: the same readout on a continuous task's flattened raw inputs.

    Lu et al. quote 92% for a linear classifier on raw MNIST; Fashion-MNIST's
    published raw-pixel logistic baseline is about 84%. The logistic readout
    penalizes the weights of standardized pixels (the textbook baseline).

    Parameters
    ----------
    task : str or TaskData
        A registered task name (built with ``task_params`` through the task
        cache) or a task object already built.
    task_params : dict, optional
        Parameters of a named task; not allowed with a task object.
    readout : {"logistic", "ridge"}
    seed : int
        Seed of the carved validation split (when the task has no ``val``).
    device : str
        Torch device of the logistic fit.

    Writes nothing: the caller owning an output writes the result there.

    Examples
    --------
    >>> fit_raw("digits").metrics["test_accuracy"]  # doctest: +SKIP
    """
    from reservoir.tasks import load_task

    check_readout(readout)
    seed, device = check_seed(seed), str(resolve_device(device))
    if isinstance(task, str):
        data = load_task(task, task_params)
    elif task_params:
        raise ReservoirError(f"task_params apply to a task name; found a task object {task.name!r} and "
                             f"task_params {task_params!r} (build the task with them instead)")
    else:
        data = task
    check_raw(data)
    tr, te = data.splits["train"], data.splits["test"]
    X, Xt = tr.inputs.reshape(len(tr), -1), te.inputs.reshape(len(te), -1)
    val = None
    if "val" in data.splits:
        va = data.splits["val"]
        val = (va.inputs.reshape(len(va), -1), va.labels)
    # the textbook baseline: L2 on standardized pixels (whitening raw pixels amplifies near-constant ones)
    est = make_readout(readout, seed, device, **({"penalty": "standardized"} if readout == "logistic" else {}))
    t0 = time.perf_counter()
    est.fit(X, tr.labels, validation_data=val)
    t_fit = time.perf_counter() - t0
    test, correct, heads = test_metrics(est, Xt, te.labels, 1)
    return FitResult(
        kind="fit-raw",
        config={"task": task if isinstance(task, str) else data.name, "task_params": data.params, "readout": readout,
                "seed": seed},
        task={"name": data.name, "fingerprint": data.fingerprint},
        metrics={"train_accuracy": est.score(X, tr.labels), **validation_metrics(est),
                 **test,
                 "alpha": est.alpha_, "n_features": int(X.shape[1]), "n_train": len(X), "n_test": len(Xt)},
        timings={"fit_s": t_fit},
        rows={"test": encode_rows(correct, heads)},
    )
