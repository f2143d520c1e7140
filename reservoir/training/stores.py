"""Training from a feature store instead of task inputs.

A split-point store (``extract --full-seq-layer S``) holds every position's
state at layer ``S``: :func:`build_from_store` rebuilds the backbone from the
store's provenance and feeds those states to blocks ``S+1..K``, so the run
equals a live run with ``split_layer=S``. A last-token store holds the
features the head reads: :func:`train_cached` trains the output layer alone
on them with :class:`~reservoir.training.cached.CachedHead`, at the cost of the head.
"""

from __future__ import annotations

import os
import time
from collections.abc import Collection
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from torch import nn

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import missing_folders, removed_if_failed, writable_folder
from reservoir.store.lock import run_folder_lock
from reservoir.runtime import resolve_device
from reservoir.training import checkpoint as ckpt
from reservoir.training.classifier import ReservoirClassifier, heads_per_token
from reservoir.training.config import TrainConfig
from reservoir.training.data import Feeder, TrainData, carve_val, data_identity
from reservoir.training.freeze import describe, parse_groups
from reservoir.training.evaluate import scored_metrics, steps_to_converge
from reservoir.training.loop import TrainResult, check_finite, retire_results

if TYPE_CHECKING:  # pragma: no cover
    from reservoir.store import FeatureStore


def config_for_store(path: str | os.PathLike, *, given: Collection[str] | None = None, **settings: Any
                     ) -> TrainConfig:
    """The settings of a run from the store at ``path``: its task and init; the other fields from ``settings``.

    A split-point store also sets ``split_layer`` to its layer (its backbone
    is loaded by the name given, else by the store's backbone id, and checked
    against the store's weights); a last-token store trains a head alone, so
    its backbone is the store's.
    ``seed`` seeds what the store left open (the head, the validation carve,
    the batch order); without one the store's seed is used. The backbone's
    init, seed and projection are always the store's.

    Settings the store fixes (``task``, ``task_params``, ``init``, ``revision``, ``projection``, a split-point
    store's ``split_layer``, a last-token store's ``backbone``) may be given
    only with the store's values; another value is refused in one line.
    ``given`` names the settings that were asked for (the command line's
    explicit options): only those are checked against the store, and
    ``seed`` is taken from ``settings`` only when named there. ``None``:
    every key of ``settings`` was asked for.

    Examples
    --------
    >>> config = config_for_store("cache/split.zarr", backbone="minilm", finetune="layernorm,output", seed=3)
    ... # doctest: +SKIP
    >>> config.task, config.split_layer, config.seed  # doctest: +SKIP
    ('listops', 3, 3)
    """
    from reservoir.store import FeatureStore

    asked = set(settings) if given is None else set(given) & set(settings)
    with FeatureStore.open(path) as st:
        a, layer = st.attrs, st.full_seq_layer
    store_fields: dict[str, Any] = {"task": a["task"]["name"], "task_params": {}, "init": a["backbone"]["init"],
                                    "revision": a["backbone"].get("revision"), "from_store": str(path),
                                    "projection": a["projection"].get("kind", options.PROJECTIONS[0])}
    held: dict[str, Any] = {"task": store_fields["task"], "task_params": a["task"].get("params") or {},
                            "init": store_fields["init"], "revision": store_fields["revision"],
                            "projection": store_fields["projection"]}
    from reservoir.backbones.names import SHORT_NAMES

    named = next((k for k, v in SHORT_NAMES.items() if v == a["backbone"]["id"]), a["backbone"]["id"])
    if layer is not None:
        store_fields["split_layer"] = held["split_layer"] = layer
        if "backbone" not in asked:  # the blocks above run live: the store's backbone, loaded by its id (checked)
            store_fields["backbone"] = named
    else:  # the features are this backbone's, whatever name was given (named as a live run names it)
        held["backbone"] = a["backbone"]["id"]
        store_fields["backbone"] = named
    if "seed" not in asked:
        store_fields["seed"] = a["backbone"]["seed"]
    for name in [n for n in held if n in asked]:
        if not _agrees(name, settings[name], held[name]):
            flag = options.label_of(name, options.field_setting(TrainConfig, name))
            raise ReservoirError(f"{flag} with --from-store {path}: expected the store's {held[name]!r} (or no "
                                 f"{flag}), found {settings[name]!r}")
    return TrainConfig(**{**settings, **store_fields})


def _agrees(name: str, given: Any, held: Any) -> bool:
    """Whether a setting given with ``--from-store`` asks for what the store holds: task parameters each equal to the
    store's; a backbone name (a short name, a folder) that loads the store's backbone id; else equal values."""
    from reservoir.backbones.names import SHORT_NAMES

    if name == "task_params":
        return isinstance(given, dict) and all(k in held and held[k] == v for k, v in given.items())
    if name == "backbone" and isinstance(given, str):
        if SHORT_NAMES.get(given, given) == held:
            return True
        return Path(given).is_dir() and Path(held).is_dir() and Path(given).resolve() == Path(held).resolve()
    return bool(given == held)


def is_last_token_store(path: str | os.PathLike) -> bool:
    """Whether ``path`` is a store without full-sequence states (its features train a head alone)."""
    from reservoir.store import FeatureStore

    with FeatureStore.open(path) as st:
        return st.full_seq_layer is None


def build_from_store(config: TrainConfig, device: str | torch.device = "cpu") -> tuple[ReservoirClassifier, TrainData]:
    """The classifier and data for training blocks ``s+1..K`` from the split-point store ``config.from_store``.

    The backbone and projection are rebuilt from the store's provenance
    (init, seed, projection, weights checked by their sha256); the head and
    the validation rows carved from train (without a ``val`` split) are
    seeded by ``config.seed``, as in a live run. The data are the store's
    states at layer ``s``, read by row as batches need them; the store stays open
    until the data is closed (:meth:`TrainData.close`, or a ``with`` block).
    """
    from reservoir.store import FeatureStore

    store = FeatureStore.open(config.from_store)
    try:
        model, data = _from_open_store(store, config)
    except BaseException:
        store.close()
        raise
    return model.to(resolve_device(device)), data


def _from_open_store(store: FeatureStore, config: TrainConfig) -> tuple[ReservoirClassifier, TrainData]:
    """:func:`build_from_store` once its store is open."""
    from reservoir.backbones import load_backbone

    s = store.full_seq_layer
    if s is None:
        store.states("train")  # raises the one-line error
    a = store.attrs
    bb, task = a["backbone"], a["task"]
    depth = bb["depth"] if config.layers is None else config.layers
    if s >= depth:
        raise ReservoirError(f"{config.from_store} holds states at layer {s}; training needs depth K > {s}, "
                             f"found K={depth}")
    backbone = load_backbone(config.backbone, init=bb["init"], depth=depth, d_in=a["projection"]["d_in"],
                             seed=bb["seed"], projection=a["projection"].get("kind", options.PROJECTIONS[0]),
                             projection_gain=a["projection"]["gain"], revision=bb.get("revision"))
    if backbone.info.weights_sha256 != bb["weights_sha256"]:
        found = backbone.info.weights_sha256[:12]
        raise ReservoirError(f"{config.from_store}: expected the backbone the store was extracted with ({bb['id']!r}, "
                             f"weights sha256 {bb['weights_sha256'][:12]}...), found {found}... for "
                             f"{config.backbone!r}: pass --backbone naming that model")
    n_out = a["pooling"]["n_out_tokens"]
    # the head and the validation carve follow this run's seed (as in live training and train_cached); the backbone
    # and projection are the store's
    model = ReservoirClassifier(backbone, n_out, heads_per_token(tuple(task["label_shape"]), n_out),
                                task["n_classes"], seed=config.seed)

    def feeder(split, rows=None):
        lengths, labels = store.lengths(split), store.labels(split)
        if rows is not None:
            lengths, labels = lengths[rows], labels[rows]
        return Feeder(store.states(split), lengths, labels, start=s, index=rows)

    if "val" in store.splits:
        tr, va = feeder("train"), feeder("val")
    else:
        t, v = carve_val(len(store.lengths("train")), config.val_fraction, config.seed)
        tr, va = feeder("train", t), feeder("train", v)
    provenance = {"backbone": bb, "task": task, "store": store.fingerprint()}
    return model, TrainData(tr, va, feeder("test"), provenance, closer=store.close)


def train_cached(config: TrainConfig, *, out: str | os.PathLike | None = None,
                 extra: dict[str, Any] | None = None) -> TrainResult:
    """``reservoir train --from-store STORE --finetune output`` on a last-token store: the head alone.

    The output-only run of live training (same head init, batch order, loss,
    gradient clip and Adam) with the frozen forward replaced by the store's
    features at the top layer (final norm applied): the same trained head, at
    the cost of the head. Validation picks the best step as in live training;
    the test split is evaluated once with it. With ``out``, writes
    ``best.pt`` (the head's tensors) and ``results.json`` there. The run holds
    the head alone (the backbone's work is in the store): its trainable and
    total parameter counts are the head's, printed as every run's are.
    """
    from reservoir.training.cached import CachedHead

    if parse_groups(config.finetune) != ("output",):
        raise ReservoirError(f"{config.from_store}: expected a split-point store (extract --full-seq-layer S) to "
                             f"train --finetune {config.finetune}; found last-token features only, which train the "
                             "output layer alone (--finetune output)")
    _check_headless(config)
    device = resolve_device(config.device)
    splits, attrs, fingerprint = _resident_splits(config, device)
    (X, Y), (Xv, Yv) = splits["train"], splits["val"]
    n_classes = attrs["task"]["n_classes"]
    with torch.random.fork_rng(devices=[]):  # the head ReservoirClassifier builds for this seed
        torch.manual_seed(config.seed)
        head = nn.Linear(X.shape[-1], heads_per_token(tuple(attrs["task"]["label_shape"]), X.shape[1]) * n_classes)
    trainer = CachedHead(head.to(device), X, Y, n_classes, lr=config.lr, grad_clip=config.grad_clip)
    n_params = sum(p.numel() for p in head.parameters())
    counts = {"output": n_params, "trainable": n_params, "total": n_params}  # the run holds the head alone
    print(describe(counts))
    steps = config.total_steps(len(X))
    identity = data_identity({"task": attrs["task"], "store": fingerprint})
    made = missing_folders(out)  # removed again if the run fails before writing in them
    folder = None if out is None else writable_folder(out)  # before training: never lose a run to its folder
    with removed_if_failed(made), run_folder_lock(folder) as lock:  # one writer per run folder
        if folder is not None:
            _check_cached_folder(folder, config, identity)
            retire_results(folder)
        t0 = time.perf_counter()
        curve, (best_val, best_step, best) = _fit_head(trainer, Xv, Yv, config, steps)
        train_s = time.perf_counter() - t0
        head.load_state_dict(best)
        test, rows = scored_metrics(trainer.correct_rows(*splits["test"]), trainer.correct_rows(Xv, Yv))
        result = TrainResult(
            config=asdict(config), backbone=attrs["backbone"], task=attrs["task"], store=fingerprint, cached=True,
            parameters=counts,
            metrics={**test, "best_val_accuracy": best_val,
                     "best_step": best_step, "final_val_accuracy": curve[-1]["val_accuracy"], "steps": steps,
                     "steps_to_converge": steps_to_converge(curve), "n_test": len(splits["test"][0])},
            curve=curve, timings={"train_s": train_s, "step_ms": 1e3 * train_s / steps}, rows=rows,
            extra=dict(extra or {}),
        )
        if folder is not None and lock is not None:
            lock.check()  # the folder's lock file still this run's: no second run writes beside it
            ckpt.save(folder / "best.pt", {"config": config.key(), "data": identity, "head": best, "step": best_step})
            result.write(folder / "results.json")
        return result


#: Settings of a forward, each with the values a head trained on stored features honours (it runs no forward).
_FORWARD_ONLY = {"dropout": (0.0,), "amp": ("auto", "none"), "compile": (False,), "cuda_graphs": ("auto", "off")}


def _check_headless(config: TrainConfig) -> None:
    """Refuse (one line) settings that act on a forward: the head alone, on a last-token store's features, in
    float32, runs none, so they would be ignored."""
    for name, honoured in _FORWARD_ONLY.items():
        value = getattr(config, name)
        if value not in honoured:
            flag = options.label_of(name, options.field_setting(TrainConfig, name))
            found = flag if isinstance(value, bool) else f"{flag} {value}"
            allowed = " or ".join(f"{flag} {v}" for v in honoured if not isinstance(v, bool)) or f"no {flag}"
            raise ReservoirError(f"{found} with --from-store {config.from_store}: expected {allowed} (a last-token "
                                 "store trains the output layer alone on its features, in float32; no forward runs "
                                 "for it to act on)")


def _check_cached_folder(folder: Path, config: TrainConfig, identity: dict[str, Any]) -> None:
    """Refuse (one line) a run folder that holds another run: a live one (``last.pt``, or a ``best.pt`` of trained
    tensors), or a cached one of other settings or data. The same cached run is computed again in place."""
    if (folder / "last.pt").exists():
        raise ReservoirError(f"{folder} holds a live run (last.pt); pass another --out")
    ckpt.check_best(folder, config, identity, head=True)


def _resident_splits(config: TrainConfig, device) -> tuple[dict[str, tuple[torch.Tensor, torch.Tensor]], dict, dict]:
    """Features at layer K (final norm applied) and labels on ``device`` by split; the store's attrs and fingerprint.

    Without a ``val`` split, a seeded ``config.val_fraction`` of train is
    held out as in live training.
    """
    from reservoir.readouts.features import load_layer
    from reservoir.store import FeatureStore
    from reservoir.training.cached import resident

    with FeatureStore.open(config.from_store) as st:
        K = max(st.layers) if config.layers is None else config.layers
        st.layer_index(K)  # refuses a layer the store does not hold
        if "last" not in st.poolings:  # live training's head reads the last tokens, whatever else a store pools
            raise ReservoirError(f"{config.from_store}: expected a store with last-token features (extract "
                                 f"--pooling last), as live training's head reads; found {', '.join(st.poolings)} "
                                 "pooling only")
        splits = {s: resident(*load_layer(st, s, K, pooling="last"), st.n_out_tokens, device) for s in st.splits}
        attrs, fingerprint = st.attrs, st.fingerprint()
    if "val" not in splits:
        X, Y = splits["train"]
        t, v = (torch.from_numpy(rows).to(device) for rows in carve_val(len(X), config.val_fraction, config.seed))
        splits["train"], splits["val"] = (X[t], Y[t]), (X[v], Y[v])
    return splits, attrs, fingerprint


def _fit_head(trainer, Xv: torch.Tensor, Yv: torch.Tensor, config: TrainConfig, steps: int
              ) -> tuple[list[dict[str, float]], tuple[float, int, dict[str, torch.Tensor]]]:
    """``steps`` cached steps in live training's batch order, validating every ``eval_every`` and at the end.

    Returns the curve and ``(best_val, best_step, head_state)`` of the best
    validation (ties go to the later step, as in live training).
    """
    per_epoch = max(1, trainer.N // config.batch_size)
    curve, best, step, order = [], (-1.0, 0, None), 0, None
    while step < steps:
        epoch, i = divmod(step, per_epoch)
        if i == 0 or order is None:
            order = trainer.epoch_order(config.seed, epoch)
        step += trainer.run(order, config.batch_size, i,
                            i + min(steps - step, config.eval_every - step % config.eval_every))
        if step % config.eval_every == 0 or step == steps:
            loss = trainer.mean_loss()
            check_finite(loss, trainer.head.parameters(), step)
            acc = trainer.accuracy(Xv, Yv)
            curve.append({"step": step, "train_loss": loss, "val_accuracy": acc})
            if acc >= best[0]:
                best = (acc, step, {k: v.detach().clone() for k, v in trainer.head.state_dict().items()})
    return curve, best
