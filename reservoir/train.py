"""Live training: the backbone in the loop, with a freeze scheme deciding what learns.

``reservoir train`` builds the same task, backbone and orthogonal projection as
``reservoir extract`` (same names, inits and seeds, so cached and live results
are comparable), adds a linear head on the final-norm-applied last real token
(the last ``n_out_tokens`` for bit memory), freezes everything but the asked
groups, and trains with Adam and gradient-norm clipping. Validation accuracy
(on the task's ``val`` split, else 10% carved from train) picks the best
checkpoint; the test split is evaluated in full, once, with it. Training
resumes from ``last.pt`` in its output folder.

Checkpoints (:mod:`reservoir.checkpoint`) hold tensors and plain data only
and are read with ``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from reservoir.errors import ReservoirError
from reservoir.runtime import autocast, check_positions
from reservoir.freeze import apply_freeze, describe, parse_groups
from reservoir import checkpoint as ckpt
from reservoir.results import writable_folder
from reservoir.tasks.files import one_line, read_json


class _Bound(NamedTuple):
    """The values one number of :class:`TrainConfig` may take."""

    integer: bool
    ok: Callable[[float], bool]
    expected: str
    optional: bool = False  # None is allowed (it means the default)
    option: bool = True  # `reservoir train` has an option for it (errors name --the-option, else the field)


#: The range of every number in :class:`TrainConfig` (recipes check their cells against it too).
BOUNDS: dict[str, _Bound] = {
    "layers": _Bound(True, lambda v: v >= 0, "an integer >= 0", optional=True),
    "lr": _Bound(False, lambda v: v > 0, "a finite number > 0"),
    "steps": _Bound(True, lambda v: v >= 1, "an integer >= 1", optional=True),
    "epochs": _Bound(False, lambda v: v > 0, "a finite number > 0", optional=True),
    "batch_size": _Bound(True, lambda v: v >= 1, "an integer >= 1"),
    "eval_every": _Bound(True, lambda v: v >= 1, "an integer >= 1"),
    "seed": _Bound(True, lambda v: 0 <= v < 2**32, "an integer in 0..4294967295"),  # what numpy and sklearn take
    "dropout": _Bound(False, lambda v: 0 <= v < 1, "a number in [0, 1)"),
    "grad_clip": _Bound(False, lambda v: v >= 0, "a finite number >= 0 (0: no clipping)", option=False),
    "val_fraction": _Bound(False, lambda v: 0 < v < 1, "a number in (0, 1)", option=False),
    "projection_gain": _Bound(False, lambda v: v > 0, "a finite number > 0", option=False),
    "split_layer": _Bound(True, lambda v: v >= 0, "an integer >= 0"),
}


def check_number(name: str, value: Any, label: str | None = None) -> None:
    """Refuse a value of the :class:`TrainConfig` number ``name`` outside :data:`BOUNDS`, in one line.

    ``label`` names the value in the message; by default the ``reservoir
    train`` option (``--batch-size``), else the field's name.

    Examples
    --------
    >>> check_number("steps", 0)
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: --steps must be an integer >= 1, found 0
    >>> check_number("lr", -1.0, label="lr in cells[0]")
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: lr in cells[0] must be a finite number > 0, found -1.0
    """
    bound = BOUNDS[name]
    if value is None and bound.optional:
        return
    finite = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if not (finite and (not bound.integer or value == int(value)) and bound.ok(value)):
        label = label or ("--" + name.replace("_", "-") if bound.option else name)
        raise ReservoirError(f"{label} must be {bound.expected}, found {value!r}")


@dataclass
class TrainConfig:
    """One live training run (saved in its checkpoints and results)."""

    task: str = field(metadata={"help": "registered task name"})
    backbone: str = field(default="minilm", metadata={"help": "backbone name, hub id or folder"})
    init: str = field(default="pretrained", metadata={"help": "pretrained | random | stats"})
    layers: int | None = field(default=None, metadata={"help": "depth K: blocks 1..K; default all"})
    finetune: str = field(default="fpt", metadata={"help": "groups to train: fpt, all, output or a comma list"})
    task_params: dict[str, Any] = field(default_factory=dict, metadata={"help": "task parameters"})
    lr: float = field(default=1e-3, metadata={"help": "Adam learning rate"})
    steps: int | None = field(default=None, metadata={"help": "optimizer steps (default: epochs, else 2000)"})
    epochs: float | None = field(default=None, metadata={"help": "passes over train (alternative to steps)"})
    batch_size: int = field(default=16, metadata={"help": "sequences per step"})
    eval_every: int = field(default=100, metadata={"help": "steps between validation passes"})
    seed: int = field(default=0, metadata={"help": "seed of inits, projection, head, data order"})
    dropout: float = field(default=0.0, metadata={"help": "dropout inside the backbone while training"})
    grad_clip: float = field(default=1.0, metadata={"help": "gradient-norm clip"})
    val_fraction: float = field(default=0.1, metadata={"help": "train share held out when the task has no val"})
    projection_gain: float = field(default=1.41, metadata={"help": "gain of the orthogonal input projection"})
    split_layer: int = field(default=0, metadata={"help": "train only blocks above this layer (split point)"})
    from_store: str | None = field(default=None, metadata={"help": "split-point store to start from"})
    device: str = field(default="auto", metadata={"help": "cpu | cuda | cuda:N | auto"})
    amp: str = field(default="auto", metadata={"help": "CUDA autocast: bf16 | fp16 | none | auto"})
    out: str | None = field(default=None, metadata={"help": "run folder (checkpoints, results.json)"})

    def __post_init__(self) -> None:
        """Refuse bad settings before anything is built or written (one line naming the option)."""
        for name in BOUNDS:
            check_number(name, getattr(self, name))
        parse_groups(self.finetune)

    def default_out(self) -> str:
        name = Path(self.backbone).name if os.sep in self.backbone else self.backbone.replace("/", "_")
        groups = "+".join(parse_groups(self.finetune))
        return str(Path("results") / "train" / f"{self.task}-{name}-{self.init}-{groups}-lr{self.lr:g}-seed{self.seed}")

    def key(self) -> dict[str, Any]:
        """Fields that must match to resume a run (everything but device and folder), as plain JSON data.

        Plain data is what a checkpoint may hold (and what ``results.json``
        holds): tuples become lists, numpy scalars floats.
        """
        d = asdict(self)
        for k in ("device", "out", "amp", "eval_every"):
            d.pop(k)
        return json.loads(json.dumps(d, default=float))


def heads_per_token(label_shape: tuple[int, ...], n_out_tokens: int) -> int:
    """Label heads each output token predicts: ``(N,)`` -> 1, ``(N, bits)`` -> bits, ``(N, n_out, bits)`` -> bits."""
    shape = tuple(label_shape)[1:] if n_out_tokens > 1 else tuple(label_shape)
    return int(np.prod(shape)) if shape else 1


class ReservoirClassifier(nn.Module):
    """Backbone + linear head on the final-norm-applied last ``n_out_tokens`` positions.

    Output logits have shape ``(B, n_out_tokens, n_heads, n_classes)``.
    """

    def __init__(self, backbone: nn.Module, n_out_tokens: int, n_heads: int, n_classes: int, seed: int = 0):
        super().__init__()
        self.backbone = backbone
        self.n_out_tokens, self.n_heads, self.n_classes = n_out_tokens, n_heads, n_classes
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.head = nn.Linear(backbone.n_dim, n_heads * n_classes)

    def _read(self, h: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        B = h.shape[0]
        offsets = torch.arange(self.n_out_tokens, device=h.device) - self.n_out_tokens
        idx = lengths[:, None] + offsets[None, :]  # (B, n_out)
        h = h[torch.arange(B, device=h.device)[:, None], idx]  # (B, n_out, n_dim)
        h = self.backbone.apply_final_norm(h)
        return self.head(h).view(B, self.n_out_tokens, self.n_heads, self.n_classes)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Logits from inputs (token ids ``(B, L)`` or vectors ``(B, L, d_in)``)."""
        h = self.backbone.embed(x)  # (B, L, n_dim)
        return self.forward_from(h, lengths, 0)

    def forward_from(self, h: torch.Tensor, lengths: torch.Tensor, start: int) -> torch.Tensor:
        """Logits from layer-``start`` states ``h`` ``(B, L, n_dim)`` (a split-point store's)."""
        mask = self.backbone.attention_mask(lengths, h.shape[1], h.dtype)
        for _, h in self.backbone.run_blocks(h, mask, start, self.backbone.depth):
            pass
        return self._read(h, lengths)


# -- data --------------------------------------------------------------------
@dataclass
class _Data:
    """Arrays of one split, however they are fed (inputs, or split-point states)."""

    inputs: Any  # np.ndarray (N, L[, d_in]) or a store array of layer-`start` states (N, L, n_dim)
    lengths: np.ndarray
    labels: np.ndarray
    start: int = 0  # 0: inputs are task inputs; s > 0: states at layer s

    def __len__(self) -> int:
        return len(self.lengths)

    index: np.ndarray | None = None  # rows of `inputs` this split uses (store arrays are never copied)

    def batch(self, rows: np.ndarray, device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
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


def carve_val(n: int, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted ``(train_rows, val_rows)``: a seeded ``fraction`` of ``n`` rows held out."""
    perm = np.random.default_rng([seed, 7919]).permutation(n)
    n_val = max(1, int(round(fraction * n)))
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


def split_val(task, fraction: float, seed: int) -> tuple[_Data, _Data]:
    """``(train, val)``: the task's ``val`` split if it has one, else a seeded share of train."""
    tr = task.splits["train"]
    if "val" in task.splits:
        va = task.splits["val"]
        return _Data(tr.inputs, tr.lengths, tr.labels), _Data(va.inputs, va.lengths, va.labels)
    t, v = carve_val(len(tr), fraction, seed)
    return (_Data(tr.inputs[t], tr.lengths[t], tr.labels[t]), _Data(tr.inputs[v], tr.lengths[v], tr.labels[v]))


def batch_rows(n: int, batch_size: int, seed: int, step: int) -> np.ndarray:
    """Rows of step ``step``: epoch ``e`` visits a permutation seeded by ``(seed, e)``."""
    per_epoch = max(1, n // batch_size)
    epoch, i = divmod(step, per_epoch)
    perm = np.random.default_rng([seed, epoch]).permutation(n)
    return perm[i * batch_size : (i + 1) * batch_size]


def evaluate(model: ReservoirClassifier, data: _Data, device, batch_size: int = 64, amp: str = "auto") -> float:
    """Accuracy over the whole split (each label element once), in a fixed order."""
    was = model.training
    model.eval()
    correct = total = 0
    order = np.argsort(data.lengths, kind="stable")
    with torch.inference_mode(), autocast(device, amp):
        for lo in range(0, len(data), batch_size):
            x, lengths, y = data.batch(order[lo : lo + batch_size], device)
            logits = model(x, lengths) if data.start == 0 else model.forward_from(x, lengths, data.start)
            pred = logits.argmax(-1).reshape(len(y), -1)
            correct += int((pred == y.reshape(len(y), -1)).sum())
            total += pred.numel()
    model.train(was)
    return correct / max(total, 1)


def loss_fn(logits: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy over every label element; ``y`` is reshaped to the logits' heads."""
    C = logits.shape[-1]
    return F.cross_entropy(logits.float().reshape(-1, C), y.reshape(-1))


def steps_to_converge(curve: list[dict[str, float]], tolerance: float = 0.01) -> int | None:
    """First step whose validation accuracy is within ``tolerance`` of the best (Lu et al. Table 6)."""
    if not curve:
        return None
    best = max(p["val_accuracy"] for p in curve)
    return next(int(p["step"]) for p in curve if p["val_accuracy"] >= best - tolerance)


# -- the loop ----------------------------------------------------------------
def _build(config: TrainConfig, device, attn_implementation: str = "sdpa"):
    """Task, model and the train/val/test data the config asks for."""
    from reservoir.backbones import load_backbone
    from reservoir.tasks import load_task

    task = load_task(config.task, config.task_params)
    backbone = load_backbone(config.backbone, init=config.init, depth=config.layers, d_in=task.d_in, seed=config.seed,
                             projection_gain=config.projection_gain, attn_implementation=attn_implementation)
    if not 0 <= config.split_layer <= backbone.depth:
        raise ReservoirError(f"split layer must be within 0..{backbone.depth} (the depth), found {config.split_layer}")
    check_positions(task, backbone, config.backbone)
    n_heads = heads_per_token(task.label_shape, task.n_out_tokens)
    model = ReservoirClassifier(backbone, task.n_out_tokens, n_heads, task.n_classes, seed=config.seed)
    counts = apply_freeze(backbone, model.head, parse_groups(config.finetune), config.split_layer)
    train, val = split_val(task, config.val_fraction, config.seed)
    te = task.splits["test"]
    test = _Data(te.inputs, te.lengths, te.labels)
    return task, model.to(device), counts, train, val, test


def build_from_store(config: TrainConfig, device):
    """Model and data for training blocks ``s+1..K`` from a split-point store at layer ``s``.

    The backbone, projection and task are rebuilt from the store's provenance,
    so the run equals a live run with ``split_layer=s`` on the same settings.
    """
    from reservoir.backbones import load_backbone
    from reservoir.store import FeatureStore

    store = FeatureStore.open(config.from_store)
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
                             seed=bb["seed"], projection_gain=a["projection"]["gain"], revision=bb.get("revision"))
    if backbone.info.weights_sha256 != bb["weights_sha256"]:
        raise ReservoirError(f"{config.from_store}: expected backbone weights sha256 {bb['weights_sha256'][:12]}..., "
                             f"found {backbone.info.weights_sha256[:12]}... for {config.backbone!r}")
    n_out = a["pooling"]["n_out_tokens"]
    n_heads = heads_per_token(tuple(task["label_shape"]), n_out)
    model = ReservoirClassifier(backbone, n_out, n_heads, task["n_classes"], seed=bb["seed"])
    counts = apply_freeze(backbone, model.head, parse_groups(config.finetune), s)

    def data(split, rows=None):
        lengths, labels = store.lengths(split), store.labels(split)
        if rows is not None:
            lengths, labels = lengths[rows], labels[rows]
        return _Data(store.states(split), lengths, labels, start=s, index=rows)

    if "val" in store.splits:
        tr, va = data("train"), data("val")
    else:
        t, v = carve_val(len(store.lengths("train")), config.val_fraction, bb["seed"])
        tr, va = data("train", t), data("train", v)
    provenance = {"backbone": bb, "task": task, "store": store.fingerprint()}
    return model.to(device), counts, tr, va, data("test"), provenance


def _last_token_store(path: str) -> bool:
    """Whether ``path`` is a store without full-sequence states (its features train a head alone)."""
    from reservoir.store import FeatureStore

    with FeatureStore.open(path) as st:
        return st.full_seq_layer is None


def _set_dropout(model: nn.Module, p: float) -> None:
    for m in model.modules():
        if isinstance(m, nn.Dropout):
            m.p = p


def train(config: TrainConfig, progress: bool = True, data=None) -> dict[str, Any]:
    """Train live; return (and write to ``<out>/results.json``) the run's result.

    ``data`` overrides the task's arrays with ``(model, counts, train, val,
    test)`` (split-point stores build their own). A ``last.pt`` left in the
    run folder by an interrupted run with the same settings is resumed. A
    ``from_store`` without full-sequence states trains the output layer alone
    from its features (:func:`reservoir.cached.train_cached`).

    Examples
    --------
    >>> r = train(TrainConfig(task="bit-xor", backbone="tiny-gpt2", steps=50,
    ...                       task_params={"n_train": 200, "n_test": 100}, out="/tmp/run"))  # doctest: +SKIP
    >>> r["metrics"]["test_accuracy"]  # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    from reservoir.runtime import resolve_device
    from reservoir.results import write_result

    if data is None and config.from_store is not None and _last_token_store(config.from_store):
        from reservoir.cached import train_cached

        return train_cached(config, progress)
    device = resolve_device(config.device)
    torch.manual_seed(config.seed)
    if data is None and config.from_store is not None:
        data = build_from_store(config, device)
    if data is None:
        task, model, counts, tr, va, te = _build(config, device)
        provenance = {"backbone": model.backbone.info.to_dict(),
                      "task": {"name": task.name, "params": task.params, "fingerprint": task.fingerprint}}
    else:
        model, counts, tr, va, te, provenance = data
    print(describe(counts))
    out = writable_folder(config.out or config.default_out())  # before training: never lose a run to its folder
    steps = config.steps
    if steps is None:
        epochs = config.epochs if config.epochs is not None else None
        steps = int(math.ceil(epochs * max(1, len(tr) // config.batch_size))) if epochs is not None else 2000
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=config.lr)
    _set_dropout(model, config.dropout)
    model.train(config.dropout > 0)
    state = ckpt.new_state()
    # best checkpoint: highest validation accuracy, the later one on ties
    last = out / "last.pt"
    if last.exists():
        state = ckpt.resume(last, config, model, opt, device)
    trainable_names = [n for n, p in model.named_parameters() if p.requires_grad]
    bar = tqdm(total=steps, initial=state["step"], desc="train", unit="step", disable=not progress, dynamic_ncols=True)
    running = []
    t0 = time.perf_counter()
    with bar:
        while state["step"] < steps:
            rows = batch_rows(len(tr), config.batch_size, config.seed, state["step"])
            x, lengths, y = tr.batch(rows, device)
            with autocast(device, config.amp):
                logits = model(x, lengths) if tr.start == 0 else model.forward_from(x, lengths, tr.start)
            loss = loss_fn(logits, y)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            if config.grad_clip > 0:
                torch.nn.utils.clip_grad_norm_(params, config.grad_clip)
            opt.step()
            state["step"] += 1
            running.append(float(loss.detach()))
            bar.update(1)
            if state["step"] % config.eval_every == 0 or state["step"] == steps:
                acc = evaluate(model, va, device, amp=config.amp)
                state["curve"].append({"step": state["step"], "train_loss": float(np.mean(running)),
                                       "val_accuracy": acc})
                running = []
                bar.set_postfix(loss=f"{state['curve'][-1]['train_loss']:.3f}", val=f"{acc:.3f}")
                state["train_seconds"] += time.perf_counter() - t0
                t0 = time.perf_counter()
                trainable = {n: p.detach().clone() for n, p in model.named_parameters() if n in trainable_names}
                if acc >= state["best_val"]:  # ties go to the later checkpoint (more training)
                    state["best_val"], state["best_step"] = acc, state["step"]
                    ckpt.save(out / "best.pt", {"config": config.key(), "trainable": trainable, "step": state["step"]})
                ckpt.save(last, {"config": config.key(), "trainable": trainable, "optimizer": opt.state_dict(),
                             "rng": torch.get_rng_state(), "state": state})
    final_val = state["curve"][-1]["val_accuracy"] if state["curve"] else float("nan")
    best = ckpt.load(out / "best.pt", ckpt.BEST_KEYS, device)
    ckpt.load_trainable(model, best["trainable"], out / "best.pt")
    t_eval = time.perf_counter()
    test_acc = evaluate(model, te, device, amp=config.amp)
    result = {
        "kind": "train",
        "config": asdict(config),
        **provenance,
        "parameters": counts,
        "metrics": {
            "test_accuracy": test_acc,
            "best_val_accuracy": state["best_val"],
            "best_step": state["best_step"],
            "final_val_accuracy": final_val,
            "steps": steps,
            "steps_to_converge": steps_to_converge(state["curve"]),
            "n_test": len(te),
        },
        "curve": state["curve"],
        "timings": {"train_s": state["train_seconds"], "test_eval_s": time.perf_counter() - t_eval},
    }
    write_result(out / "results.json", result)
    return result


def run_config(run_dir: str | os.PathLike) -> TrainConfig:
    """The settings of a finished ``reservoir train`` folder (``results.json`` and ``best.pt``)."""
    d = Path(run_dir)
    if not ((d / "results.json").is_file() and (d / "best.pt").is_file()):
        found = ", ".join(sorted(p.name for p in d.iterdir())) or "it empty" if d.is_dir() else "no such folder"
        raise ReservoirError(f"{d}: expected a finished `reservoir train` folder (results.json, best.pt), found {found}")
    raw = read_json(d / "results.json", "the results of a `reservoir train` run")
    try:
        raw = raw["config"]
        return TrainConfig(**{k: v for k, v in raw.items() if k in TrainConfig.__dataclass_fields__})
    except (AttributeError, KeyError, TypeError, ValueError) as err:  # ValueError: settings out of range
        raise ReservoirError(f"{d / 'results.json'}: expected the results of a `reservoir train` run, found "
                             f"{one_line(err)}") from None


def load_run(run_dir: str | os.PathLike, device: str = "cpu", attn_implementation: str = "sdpa"):
    """A finished live run's task and model, with its best checkpoint loaded, in eval mode.

    ``run_dir`` is a ``reservoir train`` output folder (``results.json`` and
    ``best.pt``). Runs trained from a split-point store are refused: their
    inputs are stored states, not the task's.

    Examples
    --------
    >>> task, model, config = load_run("results/train/bit-xor-minilm-pretrained-...")  # doctest: +SKIP
    """
    from reservoir.runtime import resolve_device

    config = run_config(run_dir)
    if config.from_store is not None:
        raise ReservoirError(f"{run_dir} was trained from a split-point store; expected a run trained from task inputs")
    dev = resolve_device(device)
    best = Path(run_dir) / "best.pt"
    saved = ckpt.load(best, ckpt.BEST_KEYS, dev)  # before building: a bad file is refused at once
    diff = ckpt.differing(saved["config"], config)
    if diff is not None:
        raise ReservoirError(f"{best}: expected the checkpoint of the run in results.json, found a run with {diff}")
    task, model, _, _, _, _ = _build(config, dev, attn_implementation)
    ckpt.load_trainable(model, saved["trainable"], best)
    return task, model.eval(), config


def parse_lr_sweep(spec: str) -> list[float]:
    """``"1e-6:1e-2:9"`` -> 9 learning rates log-spaced from 1e-6 to 1e-2."""
    try:
        lo, hi, n = spec.split(":")
        lo_f, hi_f, n_i = float(lo), float(hi), int(n)
    except ValueError:
        raise ReservoirError(f"--lr-sweep expects LOW:HIGH:N (e.g. 1e-6:1e-2:9), found {spec!r}") from None
    if not (0 < lo_f < hi_f and n_i >= 2):
        raise ReservoirError(f"--lr-sweep expects 0 < LOW < HIGH and N >= 2, found {spec!r}")
    # 12 significant digits: 1e-5, not 9.999999999999999e-06, in results and folder names
    return [float(f"{v:.12g}") for v in np.logspace(math.log10(lo_f), math.log10(hi_f), n_i)]


def sweep(config: TrainConfig, lrs: list[float], seeds: int, progress: bool = True) -> dict[str, Any]:
    """The Rothermel protocol: every lr x seed; the lr with the best mean validation accuracy wins.

    Writes ``<out>/sweep.json`` with every run's metrics and the chosen lr's
    test accuracy mean and std over seeds.
    """
    from dataclasses import replace

    from reservoir.results import write_result

    out = Path(config.out or config.default_out())
    runs = []
    for lr in lrs:
        for s in range(config.seed, config.seed + seeds):
            cfg = replace(config, lr=lr, seed=s, out=str(out / f"lr{lr:.3g}-seed{s}"))
            r = train(cfg, progress=progress)
            runs.append({"lr": lr, "seed": s, **r["metrics"]})
    by_lr = {lr: [r for r in runs if r["lr"] == lr] for lr in lrs}
    mean_val = {lr: float(np.mean([r["best_val_accuracy"] for r in rs])) for lr, rs in by_lr.items()}
    best_lr = max(lrs, key=lambda lr: mean_val[lr])
    tests = [r["test_accuracy"] for r in by_lr[best_lr]]
    result = {"kind": "sweep", "config": asdict(config), "lrs": lrs, "seeds": seeds, "runs": runs,
              "mean_val_by_lr": {str(k): v for k, v in mean_val.items()}, "best_lr": best_lr,
              "metrics": {"test_accuracy_mean": float(np.mean(tests)), "test_accuracy_std": float(np.std(tests)),
                          "test_accuracies": tests}}
    write_result(out / "sweep.json", result)
    return result
