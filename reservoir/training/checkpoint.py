"""Training checkpoints: tensors and plain data only, read with ``torch.load(weights_only=True)``.

``last.pt`` holds what resuming needs (the run's settings, the trained
tensors, optimizer and RNG state, the loop state; a run on CUDA also its CUDA
generators' states, ``cuda_rng``), and what a resume must find again: the
data's identity (``data``: the task's fingerprint, a store's key) and the
settings outside the key a run may not change midway (``course``: amp,
eval_every); ``best.pt`` the settings, the data's identity, the trained
tensors and the step they are from. A file that would run code
when unpickled, or any other file that is not such a checkpoint, is refused in
one line naming it, never executed. Checkpoints are written to a temporary
file beside their path and renamed into place; a SIGTERM or SIGHUP that
arrives meanwhile takes effect once the checkpoint is in place
(:func:`reservoir.io.stop_deferred`).
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from reservoir import options, settings
from reservoir.errors import ReservoirError
from reservoir.io import atomic_write, first_sentence, one_line, stop_deferred

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.training import TrainConfig

#: What each checkpoint holds (tensors and plain data only).
LAST_KEYS = ("config", "trainable", "optimizer", "rng", "state")
BEST_KEYS = ("config", "trainable", "step")


class _Writes:
    """A binary file whose first failed write is kept: ``torch.save`` turns it into a RuntimeError that no longer
    says why (``unexpected pos``).

    Once a write has failed, or the file is closed, writes are dropped: an
    interrupt (Ctrl-C, which is not deferred) between torch's zip writer
    being made and its ``with`` block leaves the writer unfinished, and its
    destructor writes the end of the archive whenever it is collected. A
    write that raised there, in C++, would abort the process; the temporary
    it writes to is discarded anyway.
    """

    def __init__(self, f: Any):
        self.f, self.error = f, None

    def write(self, data: bytes) -> int:
        if self.error is not None or self.f.closed:
            return len(data)
        try:
            return self.f.write(data)
        except BaseException as err:  # a full disk, or Ctrl-C / SIGTERM arriving during the write
            self.error = err
            raise

    def flush(self) -> None:
        if self.error is None and not self.f.closed:
            self.f.flush()


def save(path: Path, payload: dict[str, Any]) -> None:
    """Write a checkpoint to a fresh temporary file beside ``path``, then rename it into place; a failed write (a full
    disk) is one line, and the checkpoint already at ``path`` stays as it was."""
    note = "the previous one is kept, rerun the same command to resume" if path.exists() else "none was written"
    with stop_deferred(), atomic_write(path, "the checkpoint", note=note) as f:  # a SIGTERM waits for the rename
        out = _Writes(f)
        try:
            torch.save(payload, out)
        except BaseException as err:
            raise _cause(err, out.error) from None
        if out.error is not None:  # a failed write torch did not pass on: nothing half-written is renamed into place
            raise out.error


def _cause(err: BaseException, failed_write: BaseException | None) -> BaseException:
    """What stopped ``torch.save``: an interrupt anywhere in the chain of exceptions (torch's zip writer masks it
    with its own error while closing), else the failed write's error, else ``err``."""
    seen: BaseException | None = err
    while seen is not None:
        if isinstance(seen, KeyboardInterrupt):
            return seen
        seen = seen.__context__
    return failed_write or err


def _refusal(err: BaseException) -> str:
    """Why ``torch.load`` refused a file, on one line: the unpickler's reason without torch's advice around it."""
    lines = [ln.strip() for ln in str(err).splitlines() if ln.strip()]
    if len(lines) > 2 and lines[0].startswith("Weights only load failed"):  # advice, ..., reason, link to the docs
        lines = lines[-2:-1]
    reason = first_sentence(lines[0]) if lines else ""
    if not any(c.isalpha() for c in reason):  # a bare key or number (a file of text: KeyError '174812789')
        return f"not a file torch writes ({f'{type(err).__name__} {reason}'.strip()})"
    return reason


def load(path: str | os.PathLike, keys: tuple[str, ...], device: str | torch.device = "cpu"
                    ) -> dict[str, Any]:
    """A checkpoint written by :func:`reservoir.training.train`, read with ``weights_only=True`` (never code).

    Raises
    ------
    ReservoirError
        One line naming ``path`` for anything else: a missing, empty,
        truncated or garbage file, a pickle that would run code, or a
        checkpoint without ``keys``.

    Examples
    --------
    >>> ckpt = load("results/train/run/best.pt", BEST_KEYS)  # doctest: +SKIP
    >>> ckpt["step"]  # doctest: +SKIP
    """
    path = Path(path)
    expected = f"{path}: expected a reservoir checkpoint (tensors and plain data)"
    if not path.is_file():
        raise ReservoirError(f"{expected}, found {'a folder' if path.is_dir() else 'no such file'}")
    size = path.stat().st_size
    if size == 0:
        raise ReservoirError(f"{expected}, found an empty file")
    inflated = _inflated_bytes(path)
    if inflated > size + (1 << 20):  # torch stores its entries uncompressed: a few bytes may not become gigabytes
        raise ReservoirError(f"{expected}, found compressed entries that inflate to {inflated:,} bytes from a file "
                             f"of {size:,}")
    try:
        with warnings.catch_warnings():  # torch warns about the pickle protocol of files it may then refuse
            warnings.simplefilter("ignore")
            ckpt = torch.load(path, map_location=device, weights_only=True)
    except Exception as err:  # a bad file fails in many ways: UnpicklingError, RuntimeError, EOFError, ...
        raise ReservoirError(f"{expected}, found a file torch.load(weights_only=True) refuses: {_refusal(err)}"
                             ) from None
    if not isinstance(ckpt, dict):
        raise ReservoirError(f"{expected}, found a {type(ckpt).__name__}")
    missing = [k for k in keys if k not in ckpt]
    if missing:
        raise ReservoirError(f"{expected} with {', '.join(keys)}, found one without {', '.join(missing)}")
    return ckpt


def _inflated_bytes(path: Path) -> int:
    """The bytes a checkpoint's zip entries hold once read (their sizes as the archive states them, which the zip
    reader holds them to); 0 for a file that is not a zip archive (torch.load refuses it, or reads the legacy
    format)."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            return sum(info.file_size for info in archive.infolist())
    except (zipfile.BadZipFile, OSError, ValueError):
        return 0


def differing(saved: Any, config: TrainConfig) -> str | None:
    """``"lr=0.01, this run has 0.001"``: the first setting a checkpoint's saved settings differ in (None: none)."""
    from reservoir.training.config import comparable

    new = comparable(config.key())
    diff = settings.first_difference(comparable(saved), new, keys=new)
    return None if diff is None else settings.describe_difference(diff)


def load_trainable(model: nn.Module, trainable: Any, path: str | os.PathLike) -> None:
    """Copy trained tensors (a checkpoint's ``trainable``) into ``model``; names and shapes must be the model's.

    ``path`` names where the tensors come from in errors.
    """
    params = dict(model.named_parameters())
    if not isinstance(trainable, dict):
        raise ReservoirError(f"{path}: expected trained tensors by parameter name, found a {type(trainable).__name__}")
    for name, value in trainable.items():
        shape = tuple(value.shape) if isinstance(value, torch.Tensor) else type(value).__name__
        if name not in params or shape != tuple(params[name].shape):
            raise ReservoirError(f"{path}: expected tensors shaped as this model's parameters, found {name!r}: "
                                 f"{shape}")
    with torch.no_grad():
        for name, value in trainable.items():
            params[name].copy_(value)


def new_state() -> dict[str, Any]:
    """The loop state of a run that has not started (saved in ``last.pt``)."""
    return {"step": 0, "curve": [], "best_val": -1.0, "best_step": 0, "train_seconds": 0.0}


def course(config: TrainConfig, device) -> dict[str, Any]:
    """What a resume may not change though it is outside the run's key (``last.pt`` records it as ``course``):
    the dtype its steps compute in on ``device`` (``--amp`` as it resolves there: ``auto`` and ``bf16`` are one
    course where ``auto`` is bf16) and when it validates."""
    from reservoir.runtime import compute_dtype

    return {"amp": str(compute_dtype(device, config.amp)).removeprefix("torch."), "eval_every": config.eval_every}


def check_same_run(ckpt: dict[str, Any], where: Path, config: TrainConfig, data: dict[str, Any] | None,
                   device: Any = "cpu", with_course: bool = True) -> None:
    """Refuse (one line) a checkpoint of another run: other settings, another course on ``device`` (unless
    ``with_course`` is false: ``best.pt`` records none), or other data.

    ``data`` is what the run trains (:func:`~reservoir.training.loop.run_identity`: the data's identity and the
    backbone's weights); checkpoints hold what their version recorded (none of it before identities were recorded,
    the data alone before the weights were), and are compared on that.
    """
    diff = differing(ckpt["config"], config)
    if diff is None and with_course and isinstance(ckpt.get("course"), dict):
        now = course(config, device)
        found = settings.first_difference(ckpt["course"], now, keys=now)
        diff = None if found is None else settings.describe_difference(found)
    if diff is not None:
        raise ReservoirError(f"{where} holds a run with {diff}; pass another --out")
    if data is not None and "data" in ckpt:
        saved = ckpt["data"] if isinstance(ckpt["data"], dict) else {}
        found = settings.first_difference(saved, data, keys=[k for k in data if k in saved] or None)
        if found is not None:
            key, old, new = (v[:12] + "..." if isinstance(v, str) and len(v) > 16 else v for v in found)
            what = "another backbone's weights" if key == "backbone" else "other data"
            raise ReservoirError(f"{where} holds a run trained on {what} ({key}={old!r}, this run has {new!r}); "
                                 "pass another --out")


def check_best(folder: Path, config: TrainConfig, data: dict[str, Any] | None, head: bool) -> None:
    """Refuse (one line) a ``best.pt`` in ``folder`` of another run: of the other kind (a head trained on stored
    features when ``head`` is false, trained tensors of a live run when it is true), or of other settings or data
    (:func:`check_same_run`; an older cached run that recorded neither is taken); and a folder holding an lr sweep
    (``sweep.json``), whose runs are in folders of their own."""
    if (folder / "sweep.json").exists():
        raise ReservoirError(f"{folder} holds an lr sweep (sweep.json); pass another --out")
    best = folder / "best.pt"
    if not best.exists():
        return
    saved = load(best, ("step",))  # (a folder or garbage there: one line)
    if ("head" in saved) != head:
        what = "a live run (best.pt of its trained tensors)" if head else "a head trained on stored features (best.pt)"
        raise ReservoirError(f"{folder} holds {what}; pass another --out")
    if "config" in saved:
        check_same_run(saved, folder, config, data, with_course=False)


def resume(last: Path, config: TrainConfig, model: nn.Module, opt: torch.optim.Optimizer, device,
           data: dict[str, Any] | None = None, steps: int | None = None) -> dict[str, Any]:
    """Restore an interrupted run from ``last.pt``: trained tensors, optimizer, RNG; return the loop state.

    The checkpoint must be of this run (:func:`check_same_run`: settings, course and, given ``data``, the data's
    identity). The CUDA generators are restored on a CUDA ``device`` from a checkpoint that holds them (older ones
    do not: they resume with the CUDA generators as they are).
    """
    ckpt = load(last, LAST_KEYS, device)
    check_same_run(ckpt, last.parent, config, data, device)
    load_trainable(model, ckpt["trainable"], last)
    try:
        opt.load_state_dict(ckpt["optimizer"])
        torch.set_rng_state(ckpt["rng"].cpu())  # the CPU generator's state, wherever map_location put it
        if "cuda_rng" in ckpt and torch.device(device).type == "cuda":
            for i, cuda_state in enumerate(list(ckpt["cuda_rng"])[: torch.cuda.device_count()]):
                torch.cuda.set_rng_state(cuda_state.cpu(), i)
    except (AttributeError, KeyError, RuntimeError, TypeError, ValueError) as err:
        raise ReservoirError(f"{last}: expected the optimizer and RNG state of this run, found {one_line(err)}"
                             ) from None
    state = ckpt["state"]
    if not isinstance(state, dict) or not new_state().keys() <= state.keys():
        found = f"keys {', '.join(map(str, state))}" if isinstance(state, dict) else f"a {type(state).__name__}"
        raise ReservoirError(f"{last}: expected a loop state with {', '.join(new_state())}, found {found}")
    bad = _bad_state(state, steps)
    if bad is not None:
        raise ReservoirError(f"{last}: expected the loop state of this run; found {bad}")
    _complete_best(last, ckpt, state)
    return state


def _bad_state(state: dict[str, Any], steps: int | None) -> str | None:
    """What is wrong with a resumed loop state, in words (``None``: nothing): the step an integer within the run's
    ``steps``, one validation record per validated step, ending at it, the best among them."""
    step, curve, best_step, best_val = state["step"], state["curve"], state["best_step"], state["best_val"]
    if not options.is_int(step) or step < 0 or (steps is not None and step > steps):
        return f"step {step!r} (expected an integer in 0..{steps if steps is not None else 'the run steps'})"
    if not isinstance(curve, list) or not all(
            isinstance(c, dict) and options.is_int(c.get("step")) and isinstance(c.get("val_accuracy"), (int, float))
            for c in curve):
        return "a curve that is not a list of validation records (step, val_accuracy)"
    if (len(curve) == 0) != (step == 0) or (curve and curve[-1]["step"] != step):
        return f"a curve of {len(curve)} validation(s) for step {step}"
    if not isinstance(best_val, (int, float)) or not options.is_int(best_step) or \
            (curve and best_step not in [c["step"] for c in curve]):
        return f"best step {best_step!r} (val {best_val!r}) not among the curve's validations"
    if not isinstance(state["train_seconds"], (int, float)):
        return f"train_seconds {state['train_seconds']!r}"
    return None


def _complete_best(last: Path, ckpt: dict[str, Any], state: dict[str, Any]) -> None:
    """Write ``best.pt`` from ``last.pt`` when the run stopped between the two writes of its best step (``last.pt``
    is written first, so that is the one way they disagree; a ``best.pt`` left unreadable is written again too)."""
    if state["step"] == 0 or state["best_step"] != state["step"]:
        return
    best = last.parent / "best.pt"
    try:
        if load(best, BEST_KEYS)["step"] == state["step"]:
            return
    except ReservoirError:  # missing, or cut short by the stop
        pass
    save(best, {"config": ckpt["config"], **({"data": ckpt["data"]} if "data" in ckpt else {}),
                "trainable": ckpt["trainable"], "step": state["step"]})
