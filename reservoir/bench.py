"""What caching buys: cached vs live training cost, measured in one run on the same data.

``reservoir bench speedup`` measures, on one task, backbone and depth:

* the one-time extraction (store written) and a bare forward pass over the
  same rows, so the extraction overhead is a ratio (extraction time less the
  task and model setup, over the bare forward);
* (a) one epoch of output-only training: live (frozen forward every batch,
  then the head update) vs from the store (head update on cached features);
* (b) layernorm tuning of blocks ``s+1..K``: live (blocks ``1..K`` forward,
  backward through the top blocks) vs from a split-point store at layer ``s``
  (blocks ``s+1..K`` only).

Live epochs are timed on at most ``max_live_rows`` rows and scaled to the
epoch (per-row cost is flat across an epoch); cached epochs are timed whole.
The break-even point is the number of epochs after which extracting first was
cheaper than training live. Times are wall-clock on this machine and noisy:
compare ratios from one run, not seconds across runs.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from reservoir.errors import ReservoirError


def _epoch_rows(n: int, batch_size: int, seed: int, limit: int | None) -> list[np.ndarray]:
    perm = np.random.default_rng(seed).permutation(n)
    if limit is not None:
        perm = perm[:limit]
    return [perm[i : i + batch_size] for i in range(0, len(perm), batch_size)]


def _time_steps(model, data, batches, device, start: int = 0) -> float:
    """Seconds for one optimizer step per batch over ``batches`` (Adam on the trainable parameters)."""
    from reservoir.train import loss_fn

    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.Adam(params, lr=1e-3)
    t0 = time.perf_counter()
    for rows in batches:
        x, lengths, y = data.batch(rows, device)
        logits = model(x, lengths) if start == 0 else model.forward_from(x, lengths, start)
        loss = loss_fn(logits, y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - t0


class _HeadOnly(torch.nn.Module):
    """The head of a :class:`~reservoir.train.ReservoirClassifier`, reading cached features."""

    def __init__(self, model):
        super().__init__()
        self.head = model.head
        self.shape = (model.n_out_tokens, model.n_heads, model.n_classes)

    def forward(self, h: torch.Tensor, _lengths) -> torch.Tensor:
        return self.head(h).view(len(h), *self.shape)  # h (B, n_out, n_dim) -> (B, n_out, n_heads, C)


class _Cached:
    """Cached last-token features fed to a head as if they were a model's output."""

    def __init__(self, X: np.ndarray, y: np.ndarray):
        self.X, self.y = torch.from_numpy(X), torch.from_numpy(y.astype(np.int64))

    def batch(self, rows, device):
        return self.X[rows].to(device), None, self.y[rows].to(device)


def speedup(
    task: str,
    task_params: dict[str, Any] | None = None,
    backbone: str = "minilm",
    init: str = "pretrained",
    layers: int | None = None,
    split_layer: int | None = None,
    batch_size: int = 16,
    max_live_rows: int = 1024,
    seed: int = 0,
    device: str = "auto",
    progress: bool = False,
) -> dict[str, Any]:
    """Measure cached vs live training cost per epoch; return every timing and ratio.

    Examples
    --------
    >>> r = speedup("bit-xor", {"n_train": 256, "n_test": 64}, backbone="tiny-gpt2")  # doctest: +SKIP
    >>> r["output_only"]["speedup"]  # doctest: +SKIP
    """
    from reservoir.backbones import load_backbone
    from reservoir.extract import ExtractConfig, extract, resolve_device
    from reservoir.freeze import apply_freeze
    from reservoir.readouts.features import load_layer
    from reservoir.store import FeatureStore
    from reservoir.tasks import get_task
    from reservoir.train import ReservoirClassifier, _Data, heads_per_token

    dev = resolve_device(device)
    data = get_task(task, **(task_params or {}))
    bb = load_backbone(backbone, init=init, depth=layers, d_in=data.d_in, seed=seed).to(dev)
    t0 = time.perf_counter()  # what extract() spends before its forward passes (imports already warm)
    load_backbone(backbone, init=init, depth=layers, d_in=get_task(task, **(task_params or {})).d_in, seed=seed)
    setup_s = time.perf_counter() - t0
    K = bb.depth
    s = K - 1 if split_layer is None else split_layer
    if not 0 <= s < K:
        raise ReservoirError(f"--split-layer must be within 0..{K - 1} (below the depth {K}), found {s}")
    tr = data.splits["train"]
    n = len(tr)
    label_shape = data.label_shape
    n_heads = heads_per_token(label_shape, data.n_out_tokens)
    result: dict[str, Any] = {"task": data.name, "task_params": data.params, "backbone": bb.info.to_dict(),
                              "depth": K, "split_layer": s, "batch_size": batch_size, "n_train": n,
                              "device": str(dev), "torch_threads": torch.get_num_threads()}

    with tempfile.TemporaryDirectory() as tmp:
        base = dict(task=task, task_params=task_params or {}, backbone=backbone, init=init, layers=K, seed=seed,
                    device=str(dev), dtype="float32")
        # one-time costs: bare forward, extraction of the last-token store, extraction of a split-point store
        live_data = _Data(tr.inputs, tr.lengths, tr.labels)
        t0 = time.perf_counter()
        with torch.inference_mode():
            order = np.argsort(tr.lengths, kind="stable")
            for i in range(0, n, 64):
                x, lengths, _ = live_data.batch(order[i : i + 64], dev)
                bb.features(x, lengths, [K], data.n_out_tokens)
        result["bare_forward_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        store = extract(ExtractConfig(**base, out=str(Path(tmp) / "last.zarr")), progress=progress)
        result["extract_s"] = time.perf_counter() - t0
        t0 = time.perf_counter()
        split_store = extract(ExtractConfig(**base, full_seq_layer=s, out=str(Path(tmp) / "split.zarr")),
                              progress=progress)
        result["extract_split_s"] = time.perf_counter() - t0
        result["setup_s"] = setup_s
        result["extract_overhead"] = max(result["extract_s"] - setup_s, 1e-12) / result["bare_forward_s"]

        # (a) output only: live forward + head vs head on cached features
        model = ReservoirClassifier(bb, data.n_out_tokens, n_heads, data.n_classes, seed=seed).to(dev)
        apply_freeze(bb, model.head, ("output",))
        live_batches = _epoch_rows(n, batch_size, seed, max_live_rows)
        live_rows = sum(len(b) for b in live_batches)
        t_live = _time_steps(model, live_data, live_batches, dev) * n / live_rows
        with FeatureStore.open(store) as st:
            X, y = load_layer(st, "train", K)
        X = X.reshape(n, data.n_out_tokens, -1)
        y = y.reshape(n, *label_shape)
        head = _HeadOnly(model)
        t_cached = _time_steps(head, _Cached(X, y), _epoch_rows(n, batch_size, seed, None), dev)
        result["output_only"] = {"live_epoch_s": t_live, "cached_epoch_s": t_cached, "live_rows_timed": live_rows,
                                 "speedup": t_live / t_cached,
                                 "break_even_epochs": result["extract_s"] / max(t_live - t_cached, 1e-12)}

        # (b) layernorm tuning of blocks s+1..K: live vs split-point store
        model = ReservoirClassifier(bb, data.n_out_tokens, n_heads, data.n_classes, seed=seed).to(dev)
        apply_freeze(bb, model.head, ("layernorm", "output"), first_block=s)
        t_live_ln = _time_steps(model, live_data, live_batches, dev) * n / live_rows
        with FeatureStore.open(split_store) as st:
            states = np.asarray(st.states("train")[...], dtype=np.float32)
        t_split = _time_steps(model, _Data(states, tr.lengths, tr.labels, start=s),
                              live_batches, dev, start=s) * n / live_rows
        result["layernorm_top"] = {"blocks_trained": list(range(s + 1, K + 1)), "live_epoch_s": t_live_ln,
                                   "split_store_epoch_s": t_split, "speedup": t_live_ln / t_split,
                                   "break_even_epochs": result["extract_split_s"] / max(t_live_ln - t_split, 1e-12)}
    return result


def format_speedup(r: dict[str, Any]) -> str:
    """The benchmark as a small text table."""
    a, b = r["output_only"], r["layernorm_top"]
    lines = [
        f"{r['task']} through {r['backbone']['id']} ({r['backbone']['init']}), depth {r['depth']}, "
        f"{r['n_train']} train rows, batch {r['batch_size']}, {r['device']}, {r['torch_threads']} threads",
        f"one-time: bare forward {r['bare_forward_s']:.2f} s, extraction {r['extract_s']:.2f} s "
        f"(of which {r['setup_s']:.2f} s task and model setup; (extraction - setup) / bare forward = "
        f"{r['extract_overhead']:.2f}), split-point extraction {r['extract_split_s']:.2f} s",
        f"{'per epoch':<34} {'live s':>9} {'cached s':>9} {'speedup':>9} {'break-even epochs':>18}",
        f"{'(a) output layer only':<34} {a['live_epoch_s']:9.2f} {a['cached_epoch_s']:9.3f} "
        f"{a['speedup']:8.0f}x {a['break_even_epochs']:18.2f}",
        f"{'(b) layernorm, blocks ' + str(b['blocks_trained'][0]) + '..' + str(b['blocks_trained'][-1]):<34} "
        f"{b['live_epoch_s']:9.2f} {b['split_store_epoch_s']:9.3f} {b['speedup']:8.1f}x "
        f"{b['break_even_epochs']:18.2f}",
        f"(live epochs timed on {a['live_rows_timed']} rows and scaled to {r['n_train']})",
    ]
    return "\n".join(lines)


def readout_vs_sklearn(store_path: str, layer: int, seed: int = 0, max_iter: int = 1000) -> dict[str, Any]:
    """``fit-linear``'s logistic readout vs scikit-learn's ``LogisticRegression`` on the same stored features.

    Both see the same final-norm-applied layer. scikit-learn gets standardized
    features and, like the readout, its ``C`` chosen on the same validation
    rows (``C = 1 / (alpha * n)`` over the readout's alpha grid, the same
    objective); both are then refitted on all train rows. Wall times include
    the selection.
    """
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    from reservoir.readouts.features import load_layer
    from reservoir.readouts.logistic import DEFAULT_ALPHAS, LogisticReadout
    from reservoir.store import FeatureStore
    from reservoir.train import carve_val

    with FeatureStore.open(store_path) as st:
        X, y = load_layer(st, "train", layer)
        Xt, yt = load_layer(st, "test", layer)
    if y.ndim != 1:
        raise ReservoirError(f"{store_path}: the scikit-learn comparison needs one label per row, found label shape "
                             f"{y.shape[1:]}")
    t_rows, v_rows = carve_val(len(X), 0.1, seed)
    t0 = time.perf_counter()
    ours = LogisticReadout(random_state=seed).fit(X, y)
    t_ours = time.perf_counter() - t0
    t0 = time.perf_counter()
    best = (-1.0, None)
    for alpha in DEFAULT_ALPHAS:
        C = 1.0 / (alpha * len(t_rows))
        sk = make_pipeline(StandardScaler(), LogisticRegression(C=C, max_iter=max_iter))
        acc = sk.fit(X[t_rows], y[t_rows]).score(X[v_rows], y[v_rows])
        if acc > best[0]:
            best = (acc, C)
    sk = make_pipeline(StandardScaler(), LogisticRegression(C=best[1], max_iter=max_iter)).fit(X, y)
    t_sk = time.perf_counter() - t0
    return {"store": str(store_path), "layer": layer, "n_train": len(X), "n_features": X.shape[1],
            "reservoir": {"fit_s": t_ours, "test_accuracy": ours.score(Xt, yt), "alpha": ours.alpha_},
            "sklearn": {"fit_s": t_sk, "test_accuracy": float(sk.score(Xt, yt)), "C": best[1]},
            "time_ratio": t_sk / t_ours, "torch_threads": torch.get_num_threads()}
