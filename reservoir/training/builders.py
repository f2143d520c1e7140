"""From a :class:`~reservoir.training.TrainConfig` to a trained run, and from a run folder back to its model.

:func:`run` is what ``reservoir train`` and the recipes call: it builds the
task, backbone, classifier and data the config names (:func:`build`, or from
a store: :func:`~reservoir.training.stores.build_from_store`,
:func:`~reservoir.training.stores.train_cached`) and trains them into the
config's run folder. :func:`load_run` rebuilds a finished run's model with
its best checkpoint.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from reservoir.errors import ReservoirError
from reservoir.io import check_local, one_line, read_json
from reservoir.runtime import check_positions, resolve_device
from reservoir.store.lease import busy
from reservoir.store.lock import holder
from reservoir.training import checkpoint as ckpt
from reservoir.training.classifier import ReservoirClassifier, heads_per_token
from reservoir.training.config import TrainConfig
from reservoir.training.data import TrainData
from reservoir.training.loop import TrainResult, train


def run(config: TrainConfig, progress: bool = True, *, extra: dict[str, Any] | None = None) -> TrainResult:
    """Build what ``config`` names and train it into ``config.out`` (default :meth:`TrainConfig.default_out`).

    The folder receives ``last.pt``, ``best.pt`` and ``results.json`` (see
    :func:`~reservoir.training.train`); a ``last.pt`` left there by an
    interrupted run with the same settings is resumed. A ``from_store``
    with full-sequence states trains blocks above its layer from them; one
    without trains the output layer alone from its features
    (:func:`~reservoir.training.stores.train_cached`). ``extra`` adds top-level
    keys to the result and its file (a recipe's ``recipe`` block).

    Examples
    --------
    >>> r = run(TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=50,
    ...                     task_params={"n_train": 200, "n_test": 100}, out="/tmp/run"))  # doctest: +SKIP
    >>> r.metrics["test_accuracy"]  # doctest: +SKIP
    """
    from reservoir.training.stores import build_from_store, is_last_token_store, train_cached

    out = config.out or config.default_out()
    check_local(out, "a run folder")
    who = holder(out)  # refused before the model loads (train() takes the folder's lock itself)
    if who is not None:
        raise busy(out, who)
    if config.from_store is not None and is_last_token_store(config.from_store):
        return train_cached(config, out=out, extra=extra)
    device = resolve_device(config.device)
    if config.from_store is not None:
        model, data = build_from_store(config, device)
    else:
        _, model, data = build(config, device)
    with data:  # (a split-point store is closed once the run ends, however it ends)
        return train(model, data, config, out=out, progress=progress, extra=extra)


def build(config: TrainConfig, device: str | torch.device = "cpu", attn_implementation: str = "sdpa"
          ) -> tuple[Any, ReservoirClassifier, TrainData]:
    """The task, the classifier (on ``device``, not yet frozen) and the data ``config`` names.

    Examples
    --------
    >>> task, model, data = build(TrainConfig(task="bit-xor", backbone="tiny-gpt2",
    ...                                       task_params={"n_train": 100, "n_test": 20}))
    >>> model.n_heads, len(data.train), len(data.test)
    (5, 90, 20)
    """
    from reservoir.backbones import load_backbone
    from reservoir.tasks import load_task

    task = load_task(config.task, config.task_params)
    backbone = load_backbone(config.backbone, init=config.init, depth=config.layers, d_in=task.d_in, seed=config.seed,
                             projection_gain=config.projection_gain, projection=config.projection,
                             revision=config.revision,
                             attn_implementation=attn_implementation)
    check_positions(task, backbone, config.backbone)
    n_heads = heads_per_token(task.label_shape, task.n_out_tokens)
    model = ReservoirClassifier(backbone, task.n_out_tokens, n_heads, task.n_classes, seed=config.seed)
    data = TrainData.from_task(task, config.val_fraction, config.seed)
    return task, model.to(resolve_device(device)), data


def run_config(run_dir: str | os.PathLike) -> TrainConfig:
    """The settings of a finished ``reservoir train`` folder (``results.json`` and ``best.pt``)."""
    d = Path(run_dir)
    if not ((d / "results.json").is_file() and (d / "best.pt").is_file()):
        found = ", ".join(sorted(p.name for p in d.iterdir())) or "it empty" if d.is_dir() else "no such folder"
        raise ReservoirError(f"{d}: expected a finished `reservoir train` folder (results.json, best.pt), "
                             f"found {found}")
    raw = read_json(d / "results.json", "the results of a `reservoir train` run")
    try:
        raw = raw["config"]
        return TrainConfig(**{k: v for k, v in raw.items() if k in TrainConfig.__dataclass_fields__})
    except (AttributeError, KeyError, TypeError, ValueError) as err:  # ValueError: settings out of range
        raise ReservoirError(f"{d / 'results.json'}: expected the results of a `reservoir train` run, found "
                             f"{one_line(err)}") from None


def load_run(run_dir: str | os.PathLike, device: str = "cpu", attn_implementation: str = "sdpa"):
    """A finished live run's task, model (its best checkpoint loaded, in eval mode) and settings.

    ``run_dir`` is a ``reservoir train`` output folder (``results.json`` and
    ``best.pt``). Runs trained from a store are refused: their
    inputs are stored states, not the task's.

    Examples
    --------
    >>> task, model, config = load_run("results/train/bit-xor-minilm-pretrained-...")  # doctest: +SKIP
    """
    config = run_config(run_dir)
    if config.from_store is not None:
        raise ReservoirError(f"{run_dir} was trained from the store {config.from_store}; expected a run trained from "
                             "task inputs")
    dev = resolve_device(device)
    best = Path(run_dir) / "best.pt"
    saved = ckpt.load(best, ckpt.BEST_KEYS, dev)  # before building: a bad file is refused at once
    diff = ckpt.differing(saved["config"], config)
    if diff is not None:
        raise ReservoirError(f"{best}: expected the checkpoint of the run in results.json, found a run with {diff}")
    results = read_json(Path(run_dir) / "results.json", "the results of a `reservoir train` run")
    metrics = results.get("metrics") if isinstance(results, dict) else None
    recorded_step = metrics.get("best_step") if isinstance(metrics, dict) else None
    if saved["step"] != recorded_step:  # a rerun stopped before its end, beside the results of an earlier one
        raise ReservoirError(f"{best}: expected the best step of the run in results.json ({recorded_step!r}); found "
                             f"step {saved['step']!r}")
    task, model, _ = build(config, dev, attn_implementation)
    info = results.get("backbone")
    recorded = info.get("weights_sha256") if isinstance(info, dict) else None
    found = model.backbone.info.weights_sha256
    if recorded is not None and found != recorded:  # the folder or the hub revision changed since the run
        raise ReservoirError(f"{config.backbone}: expected the backbone weights the run was trained with (sha256 "
                             f"{str(recorded)[:12]}...), found {str(found)[:12]}...; the run's frozen weights are "
                             "gone")
    ckpt.load_trainable(model, saved["trainable"], best)
    return task, model.eval(), config


def finished_or_run(config: TrainConfig, progress: bool = True) -> tuple[Path, TrainResult | None]:
    """The run folder of ``config`` (``out``, else its default), trained first unless it holds the finished run.

    Returns the folder and the new :class:`TrainResult` (``None`` when a
    finished run with these settings was there). A folder holding a run with
    other settings is refused in one line naming the first difference.
    """
    from reservoir.settings import first_difference

    folder = Path(config.out or config.default_out())
    if (folder / "results.json").is_file():
        diff = first_difference(run_config(folder).key(), config.key())
        if diff is not None:
            key, found, given = diff
            raise ReservoirError(f"{folder} holds a run with {key}={found!r}, these options give {given!r}; "
                                 "pass --run, or remove that folder")
        return folder, None
    return folder, run(config, progress)
