"""The training loop: Adam on the unfrozen groups, validation picks the best step, the test split is read once.

:func:`train` takes objects (a :class:`~reservoir.training.ReservoirClassifier`,
its :class:`~reservoir.training.TrainData` and the run's
:class:`~reservoir.training.TrainConfig`) and returns a :class:`TrainResult`.
Given an output folder it writes ``last.pt`` and ``best.pt`` after every
validation, resumes from ``last.pt``, and writes ``results.json`` at the end;
without one it writes nothing.
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import fsync_dir, missing_folders, removed_if_failed, stop_deferred, writable_folder
from reservoir.store.lock import StoreLock, run_folder_lock
from reservoir.results import Result
from reservoir.runtime import cast_frozen_matmuls, compute_dtype
from reservoir.training import checkpoint as ckpt
from reservoir.training.classifier import ReservoirClassifier
from reservoir.training.config import TrainConfig, comparable
from reservoir.training.data import TrainData
from reservoir.training.evaluate import evaluate, evaluate_rows, scored_metrics, steps_to_converge
from reservoir.training.freeze import apply_freeze, describe, parse_groups
from reservoir.training.step import Stepper, adam, restore_optimizer_flags


@dataclass(kw_only=True)
class TrainResult(Result):
    """One training run: the keys of its ``results.json``.

    ``metrics`` holds ``test_accuracy`` (the best validation step's, on the
    full test split) and ``test_interval`` (its 95% interval over the test
    rows, :mod:`reservoir.readouts.intervals`), ``best_val_accuracy`` and
    ``best_val_interval``,
    ``best_step``, ``final_val_accuracy``, ``steps``, ``steps_to_converge``
    and ``n_test``; ``curve`` one ``{step, train_loss, val_accuracy}`` per
    validation; ``rows`` which test rows were right (for paired comparisons).
    ``store`` is set for runs from a store, ``cached`` for runs of the head
    alone on stored features.

    Examples
    --------
    >>> r = TrainResult.read("results/train/run/results.json")  # doctest: +SKIP
    >>> r.metrics["test_accuracy"], r.config["lr"]  # doctest: +SKIP
    """

    kind: str = "train"
    config: dict[str, Any]
    backbone: dict[str, Any] | None = None
    task: dict[str, Any] | None = None
    store: dict[str, Any] | None = None
    cached: bool | None = None
    parameters: dict[str, int]
    metrics: dict[str, Any]
    curve: list[dict[str, float]]
    timings: dict[str, float]
    rows: dict[str, Any] | None = None
    #: How the training steps ran: ``"eager"``, ``"cuda-graph"`` or ``"compiled"`` (:mod:`reservoir.training.step`).
    step_mode: str | None = None


def train(model: ReservoirClassifier, data: TrainData, settings: TrainConfig, *,
          out: str | os.PathLike | None = None, progress: bool = True,
          extra: dict[str, Any] | None = None) -> TrainResult:
    """Train ``model`` on ``data``; the best validation step's weights are kept and tested.

    ``train`` freezes ``model`` itself: everything, then ``settings.finetune``'s
    groups are unfrozen in blocks above ``max(settings.split_layer,
    data.start)`` (the embedding never, when fed states) (and printed as trainable / total counts). It trains where
    the model's parameters are, seeded by ``settings.seed`` (batch order,
    dropout), with Adam, gradient-norm clipping and CUDA autocast as
    ``settings`` say. Frozen linear weights are stored in the compute dtype
    for the run (what autocast computes with) and the original tensors put
    back when it ends, so ``model`` is left in its own dtype, trained (the
    originals wait in host memory meanwhile).

    Parameters
    ----------
    model : ReservoirClassifier
        Backbone and head, on the device to train on.
    data : TrainData
        Train, validation and test feeders (and their provenance).
    settings : TrainConfig
        The run's settings; the loop reads the optimization and freeze fields.
    out : path, optional
        Run folder: ``last.pt`` and ``best.pt`` after every validation, a
        ``last.pt`` of an interrupted run with the same settings resumed,
        ``results.json`` at the end. ``None``: nothing is written.
    progress : bool
        Show a progress bar.
    extra : dict, optional
        More top-level keys for the result (and its ``results.json``).

    Examples
    --------
    >>> from reservoir.backbones import load_backbone
    >>> from reservoir.tasks import load_task
    >>> task = load_task("bit-xor", {"n_train": 200, "n_test": 100})
    >>> model = ReservoirClassifier(load_backbone("tiny-gpt2", d_in=task.d_in), 1, 5, 2)
    >>> r = train(model, TrainData.from_task(task), TrainConfig(task="bit-xor", steps=20), progress=False)
    ... # doctest: +ELLIPSIS
    trainable params: ...
    >>> r.metrics["steps"]
    20
    """
    for what, value, kind in (("model", model, ReservoirClassifier), ("data", data, TrainData),
                              ("settings", settings, TrainConfig)):
        if not isinstance(value, kind):  # as reservoir.training.build makes them
            raise ReservoirError(f"expected {what} a {kind.__name__} (reservoir.training.build makes all three); "
                                 f"found {options.shown(value)}")
    weights = {name: p.data for name, p in model.named_parameters()}  # the caller's tensors
    counts, opt = ready_to_train(model, data, settings)
    # the originals of the frozen weights cast for the run, kept on the host (not beside their copies on a GPU)
    cast = {name: weights[name].cpu() for name, p in model.named_parameters() if p.dtype != weights[name].dtype}
    del weights
    try:
        return _train(model, data, settings, counts, opt, out, progress, extra)
    finally:
        with torch.no_grad():
            for name, p in model.named_parameters():  # the originals again, not the rounded copies
                if name in cast:
                    p.data = cast[name].to(p.device)


def _train(model: ReservoirClassifier, data: TrainData, settings: TrainConfig, counts: dict[str, int],
           opt: torch.optim.Optimizer, out: str | os.PathLike | None, progress: bool, extra: dict[str, Any] | None
           ) -> TrainResult:
    print(describe(counts))
    device = next(model.parameters()).device
    if settings.cuda_graphs == "on" and device.type != "cuda":  # before the folder is made
        raise ReservoirError(f"--cuda-graphs on needs a CUDA device; found {device.type}")
    made = missing_folders(out)  # removed again if the run fails before writing in them
    folder = None if out is None else writable_folder(out)  # before training: never lose a run to its folder
    with removed_if_failed(made), run_folder_lock(folder) as lock:  # one writer per run folder
        steps = settings.total_steps(len(data.train))
        flags = (opt.param_groups[0]["fused"], opt.param_groups[0]["capturable"])
        state, identity = ckpt.new_state(), run_identity(model, data)
        if folder is not None and (folder / "last.pt").exists():
            state = ckpt.resume(folder / "last.pt", settings, model, opt, device, identity, steps)
            restore_optimizer_flags(opt, *flags)
        elif folder is not None:
            _check_folder(folder, settings, identity)
            retire_results(folder)
        best, step_mode = _loop(model, opt, data, settings, steps, state, folder, progress, lock, identity)
        if folder is not None:  # the best step may predate a resume: read back, and checked to be this run's
            saved = ckpt.load(folder / "best.pt", ckpt.BEST_KEYS, device)
            ckpt.check_same_run(saved, folder, settings, identity, device, with_course=False)
            if saved["step"] != state["best_step"]:
                raise ReservoirError(f"{folder / 'best.pt'}: expected the tensors of the run's best step "
                                     f"{state['best_step']} (last.pt says so); found step {saved['step']!r}")
            best = saved["trainable"]
        ckpt.load_trainable(model, best, folder / "best.pt" if folder is not None else "the best step's tensors")
        t_eval = time.perf_counter()
        test, rows = scored_metrics(evaluate_rows(model, data.test, device, amp=settings.amp),
                                    evaluate_rows(model, data.val, device, amp=settings.amp))
        p = data.provenance
        result = TrainResult(
            config=asdict(settings),
            backbone=p["backbone"] if "backbone" in p else model.backbone.info.to_dict(),
            task=p.get("task"),
            store=p.get("store"),
            parameters=counts,
            metrics={
                **test,
                "best_val_accuracy": state["best_val"],
                "best_step": state["best_step"],
                "final_val_accuracy": state["curve"][-1]["val_accuracy"],
                "steps": steps,
                "steps_to_converge": steps_to_converge(state["curve"]),
                "n_test": len(data.test),
            },
            curve=state["curve"],
            timings={"train_s": state["train_seconds"], "test_eval_s": time.perf_counter() - t_eval},
            rows=rows,
            step_mode=step_mode,
            extra=dict(extra or {}),
        )
        if folder is not None and lock is not None:
            lock.check()
            result.write(folder / "results.json")
        return result


def run_identity(model: ReservoirClassifier, data: TrainData) -> dict[str, Any]:
    """What a run's checkpoints record of what it trains, and a resume must find again: the data's identity
    (:meth:`TrainData.identity`) and the backbone's weights (a model folder overwritten between two invocations
    is another model, whatever its name)."""
    return {**data.identity(), "backbone": model.backbone.info.weights_sha256}


def _check_folder(folder: Path, settings: TrainConfig, identity: dict[str, Any]) -> None:
    """Refuse (one line) a run folder without ``last.pt`` that holds another run: a finished one of other settings
    (``results.json``; its ``last.pt`` removed to save space, say), another run's ``best.pt``, or a head trained on
    stored features. The same run's files are computed again in place."""
    from reservoir.settings import first_difference

    results = folder / "results.json"
    if results.is_file():
        try:
            raw = TrainResult.read(results)
            old: Any = raw.config
        except ReservoirError:
            old = None  # unreadable: replaced, as any damaged result
        if isinstance(old, dict):
            key, old = comparable(settings.key()), comparable(old)
            diff = first_difference({k: old.get(k) for k in key}, key)
            if diff is not None or raw.cached:
                what = "a head trained on stored features" if raw.cached else f"a run with {diff[0]}={diff[1]!r}"
                raise ReservoirError(f"{folder} holds {what} (results.json); pass another --out")
    ckpt.check_best(folder, settings, identity, head=False)


def retire_results(folder: Path) -> None:
    """Remove the ``results.json`` of a run computed again from its first step, before its first checkpoint: a run
    stopped before its end must not leave new checkpoints beside the old run's results, read as finished."""
    with contextlib.suppress(FileNotFoundError):
        (folder / "results.json").unlink()
    fsync_dir(folder)


def ready_to_train(model: ReservoirClassifier, data: TrainData, settings: TrainConfig
                   ) -> tuple[dict[str, int], torch.optim.Optimizer]:
    """What every run does before its first step: freeze (:func:`_freeze`), seed, dropout and train mode set,
    and Adam (:func:`~reservoir.training.step.adam`) over the trainable parameters; the counts and the optimizer."""
    _check_describes(model, data, settings)
    counts = _freeze(model, data, settings)
    torch.manual_seed(settings.seed)
    _set_dropout(model, settings.dropout)
    model.train(settings.dropout > 0)
    device = next(model.parameters()).device
    # the frozen linear layers stored in bf16 once: what autocast makes of them at every step
    cast_frozen_matmuls(model.backbone, compute_dtype(device, settings.amp))
    return counts, adam([p for p in model.parameters() if p.requires_grad], settings.lr, device)


def _check_describes(model: ReservoirClassifier, data: TrainData, settings: TrainConfig) -> None:
    """Refuse (one line) settings that name another task, init or depth than the data and model trained: the result
    records the settings, and would say it trained what it did not."""
    task = data.provenance.get("task")
    name = task.get("name") if isinstance(task, dict) else None
    info = model.backbone.info
    for what, given, actual in (("task", settings.task, name), ("init", settings.init, info.init),
                                ("layers", settings.layers, model.backbone.depth)):
        if given is not None and actual is not None and given != actual:
            raise ReservoirError(f"settings.{what} is {given!r}, but the {'data' if what == 'task' else 'model'} "
                                 f"trained has {actual!r}; expected settings that describe the data and model "
                                 "(build them from the settings with reservoir.training.build)")


def _freeze(model: ReservoirClassifier, data: TrainData, settings: TrainConfig) -> dict[str, int]:
    """Freeze all but ``settings.finetune``'s groups above the split; return the parameter counts."""
    depth = model.backbone.depth
    if not 0 <= settings.split_layer <= depth:
        raise ReservoirError(f"split layer must be within 0..{depth} (the depth), found {settings.split_layer}")
    first_block = max(settings.split_layer, data.start or 0)
    return apply_freeze(model.backbone, model.head, parse_groups(settings.finetune), first_block,
                        states=data.start is not None)


#: Float attributes through which Hugging Face modules apply dropout functionally (Llama-style attention, OPT layers).
DROPOUT_ATTRS = ("attention_dropout", "dropout")


def _set_dropout(model: nn.Module, p: float) -> None:
    """Every dropout inside ``model`` at ``p``: ``nn.Dropout`` modules and the float rates HF modules keep."""
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p
        for attr in DROPOUT_ATTRS:
            if isinstance(getattr(m, attr, None), float):
                setattr(m, attr, p)


def _loop(model: ReservoirClassifier, opt: torch.optim.Optimizer, data: TrainData, settings: TrainConfig,
          steps: int, state: dict[str, Any], folder: Path | None, progress: bool, lock: StoreLock | None = None,
          identity: dict[str, Any] | None = None) -> tuple[dict[str, torch.Tensor] | None, str]:
    """Optimizer steps from ``state["step"]`` to ``steps``, validating every ``eval_every`` and at the end.

    The steps run through a :class:`~reservoir.training.step.Stepper` (batches
    ahead, loss on the device, CUDA graphs where they apply); the host reads
    the device only at validations. Updates ``state`` (step, curve, best,
    seconds) in place and, with a ``folder``, checkpoints it after each
    validation, once its ``lock`` is found still held. Returns the trained tensors of the best step validated in this
    call (``None`` if none beat the resumed best) and how the steps ran
    (``"eager"``, ``"cuda-graph"`` or ``"compiled"``).
    """
    from tqdm.auto import tqdm

    device = next(model.parameters()).device
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    best, t0 = None, time.perf_counter()
    stepper = Stepper(model, opt, data.train, device, settings.batch_size, settings.seed, amp=settings.amp,
                      grad_clip=settings.grad_clip, start=state["step"], cuda_graphs=settings.cuda_graphs,
                      compile=settings.compile, scaler_state=state.get("grad_scaler"))
    bar = tqdm(total=steps, initial=state["step"], desc="train", unit="step", disable=None if progress else True,
               dynamic_ncols=True)
    try:
        with bar:
            while state["step"] < steps:
                # run to the next validation (or the end) without reading anything back from the device
                n = min(settings.eval_every - state["step"] % settings.eval_every, steps - state["step"])
                for _ in range(n):
                    stepper.step()
                    bar.update(1)
                state["step"] += n
                loss = stepper.mean_loss()
                # fp16: the scaler skips the steps whose loss overflowed, so only the weights say a run diverged
                check_finite(loss if stepper.scaler is None else None,
                             (p for n_, p in model.named_parameters() if n_ in names), state["step"])
                acc = evaluate(model, data.val, device, amp=settings.amp)
                state["curve"].append({"step": state["step"], "train_loss": loss, "val_accuracy": acc})
                bar.set_postfix(loss=f"{state['curve'][-1]['train_loss']:.3f}", val=f"{acc:.3f}")
                state["train_seconds"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                is_best = acc >= state["best_val"]  # ties go to the later step (more training)
                # a copy of the trained tensors only where it is kept (the best) or written (a checkpoint)
                trainable = ({n: p.detach().clone() for n, p in model.named_parameters() if n in names}
                             if is_best or folder is not None else {})
                if is_best:
                    state["best_val"], state["best_step"], best = acc, state["step"], trainable
                if stepper.scaler is not None:  # fp16: a resumed run goes on with the same loss scale
                    state["grad_scaler"] = stepper.scaler.state_dict()
                if folder is not None:
                    if lock is not None:
                        lock.check()  # the folder's lock file still this run's: no second run writes beside it
                    _checkpoint(folder, settings, identity if identity is not None else data.identity(), trainable,
                                opt, state, is_best)
        mode = stepper.mode
    finally:
        stepper.close()
    return best, mode


def check_finite(loss: float | None, trained: Any, step: int) -> None:
    """Refuse (one line) to go on from a step whose mean training loss or trained tensors are NaN or infinite: a run
    that diverged has nothing to report (its accuracies would be argmax of NaN logits), and no checkpoint of it is
    written."""
    parts = [] if loss is None or np.isfinite(loss) else [f"its mean loss {loss}"]
    if any(not bool(torch.isfinite(p).all()) for p in trained):
        parts.append("trained weights")
    if parts:
        raise ReservoirError(f"training diverged by step {step:,}: expected finite losses and weights; found "
                             f"{' and '.join(parts)} not finite: train with a lower --lr (in another --out), or "
                             "rescale the inputs")


def _checkpoint(folder: Path, settings: TrainConfig, data: dict[str, Any], trainable: dict[str, torch.Tensor],
                opt: torch.optim.Optimizer, state: dict[str, Any], is_best: bool) -> None:
    """Write ``best.pt`` (when this step is the best) and ``last.pt`` (always) for the step in ``state``.

    Both record the data's identity (``data``); ``last.pt`` also the run's course (amp, eval_every), the CPU
    generator's state and, for a run on CUDA, every CUDA generator's (dropout draws there).
    """
    key = settings.key()
    device = next(iter(trainable.values())).device
    last = {"config": key, "data": data, "course": ckpt.course(settings, device), "trainable": trainable,
            "optimizer": opt.state_dict(), "rng": torch.get_rng_state(), "state": state}
    if any(t.is_cuda for t in trainable.values()):
        last["cuda_rng"] = torch.cuda.get_rng_state_all()
    # last.pt first: best.pt is then never ahead of it, and a run stopped between the two (a SIGKILL; a SIGTERM
    # waits for both) finds its best step's tensors in last.pt when it resumes (checkpoint.resume)
    with stop_deferred():
        ckpt.save(folder / "last.pt", last)
        if is_best:
            ckpt.save(folder / "best.pt", {"config": key, "data": data, "trainable": trainable,
                                           "step": state["step"]})
