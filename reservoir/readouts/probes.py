"""Probes you keep: a fitted readout saved as safetensors + JSON, reloaded, and applied to another store.

A probe is two files with one base name: ``<base>.safetensors`` (the learned
arrays: ``coef``, ``intercept``, ``classes`` and, for the logistic readout,
``mean``) and ``<base>.probe.json`` (the readout's kind and parameters, the
chosen strength, the feature width, the number of heads and, when saved from a
store, the layer, whether the final norm was applied, the pooling, and the
store's backbone, projection and fingerprint, plus the sha256 of the weights
file). Nothing in either file is executed: safetensors holds raw arrays and
the JSON is data; a weights file whose sha256 differs from the JSON's is
refused. The JSON's fields that say how the weights apply (:data:`BOUND`: the
layer, pooling, backbone, ...) are also kept in the weights file's header,
which that sha256 covers, so a JSON edited after it was saved is refused,
naming the field.

:func:`predict_store` applies a probe to a store of the same backbone and
projection (another split, another task's store, a store extracted later) and
refuses, in one line, a store whose backbone, projection, layers, pooling or
feature width differ.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from reservoir import options
from reservoir.errors import ReservoirError

log = logging.getLogger("reservoir")

if TYPE_CHECKING:
    from reservoir.readouts.logistic import LogisticReadout
    from reservoir.readouts.ridge import RidgeReadout
    from reservoir.readouts.run import FitResult
    from reservoir.store import FeatureStore

FORMAT = "reservoir.probe/1"
#: Backbone fields that must agree between a probe and a store (``depth`` may differ: a deeper or shallower
#: store of the same model holds the same layers).
BACKBONE_KEYS = ("id", "family", "init", "seed", "n_layer", "n_dim", "weights_sha256", "revision",
                 "final_norm_eps", "final_norm_kind")
#: The JSON's fields that say how the weights apply: kept in the weights file too (its header's metadata, under
#: :data:`BOUND_KEY`), where the JSON's ``weights_sha256`` covers them.
BOUND = ("readout", "params", "alpha", "n_features", "n_heads", "classes", "layer", "final_norm", "pooling",
         "n_out_tokens", "backbone", "projection")
BOUND_KEY = "reservoir.probe"


def _files(base: str | os.PathLike) -> tuple[Path, Path]:
    """The probe's weights and JSON paths from its base name (a ``.probe.json`` or ``.safetensors`` path too)."""
    text = os.fspath(base)
    for suffix in (".probe.json", ".safetensors"):
        if text.endswith(suffix):
            text = text[: -len(suffix)]
    return Path(text + ".safetensors"), Path(text + ".probe.json")


def save(est: LogisticReadout | RidgeReadout, base: str | os.PathLike, meta: dict[str, Any] | None = None) -> Path:
    """Write a fitted readout as ``<base>.safetensors`` and ``<base>.probe.json``; returns the JSON's path.

    ``meta`` (JSON-ready) is kept in the JSON as it is (what :func:`save_probe` records about the store).
    """
    from safetensors.numpy import save as st_save
    from sklearn.utils.validation import check_is_fitted

    from reservoir.io import atomic_write
    from reservoir.results import plain_json, write_result

    check_is_fitted(est)
    weights, info = _files(base)
    classes = np.asarray(est.classes_)
    if classes.dtype.kind not in "iu":
        raise ReservoirError(f"{info}: expected a readout fitted on integer class labels to save; found "
                             f"{classes.dtype} classes such as {_short(classes[:3].tolist())}")
    # Kept as fitted (ridge's float64, logistic's float32), so the reloaded probe scores every row as the fitted
    # one did: a ridge intercept on uncentred features can be in the thousands, where float32 would flip predictions.
    arrays: dict[str, np.ndarray] = {"coef": _as_fitted(est.coef_), "intercept": _as_fitted(est.intercept_),
                                     "classes": np.ascontiguousarray(classes, np.int64)}
    if hasattr(est, "mean_"):
        arrays["mean"] = _as_fitted(est.mean_)
    # a device given as a torch.device is kept by its name, as a string would have been given
    params = {k: list(v) if isinstance(v, tuple) else v if v is None or isinstance(v, (str, int, float, list))
              else str(v) for k, v in est.get_params().items()}
    own = {"format": FORMAT, "readout": type(est).__name__, "params": params, "alpha": est.alpha_,
           "n_features": int(est.n_features_in_), "n_heads": int(est.n_heads_), "classes": est.classes_.tolist(),
           "weights": weights.name}
    clash = sorted(set(meta or {}) & {*own, "weights_sha256"})
    if clash:  # the probe's own fields say how its weights apply: another value would load another model
        raise ReservoirError(f"{info}: expected fields beside the probe's own; found {', '.join(map(repr, clash))}, "
                             "which the probe records itself (name them otherwise)")
    record = plain_json({**own, **(meta or {})})
    bound = json.dumps({k: record[k] for k in BOUND if k in record}, sort_keys=True, allow_nan=False)
    blob = st_save(arrays, metadata={BOUND_KEY: bound})
    with atomic_write(weights, "the probe") as f:
        f.write(blob)
    write_result(info, {**record, "weights_sha256": hashlib.sha256(blob).hexdigest()})
    return info


def _check_bound(meta: dict[str, Any], blob: bytes, info: Path, weights: Path) -> None:
    """Refuse (one line) a JSON whose fields in :data:`BOUND` differ from those its weights were saved with. A
    weights file without them (a probe saved before they were kept) is taken as it is."""
    size = int.from_bytes(blob[:8], "little")  # safetensors: a little-endian u64, then that many bytes of JSON header
    header = json.loads(blob[8:8 + size])  # already parsed by safetensors' loader: well formed and in bounds
    text = (header.get("__metadata__") or {}).get(BOUND_KEY)
    if text is None:
        return
    try:
        saved = json.loads(text)
    except ValueError:
        saved = None
    if not isinstance(saved, dict):
        raise ReservoirError(f"{weights}: expected the probe's fields as a JSON object in its header's "
                             f"{BOUND_KEY!r}; found {_short(text)}")
    missing = object()

    def shown(value: Any) -> str:
        return "none" if value is missing else _short(value)

    for key in BOUND:
        was, now = saved.get(key, missing), meta.get(key, missing)
        if was != now:
            raise ReservoirError(f"{info}: expected {key} = {shown(was)}, as the probe's weights were saved with; "
                                 f"found {shown(now)} (the JSON was changed after it was saved); save the probe "
                                 "again")


def _as_fitted(a: Any) -> np.ndarray:
    """A fitted array as safetensors keeps it: float32 or float64 as it is, any other dtype as float64."""
    a = np.asarray(a)
    return np.ascontiguousarray(a, a.dtype if a.dtype in (np.float32, np.float64) else np.float64)


def load(base: str | os.PathLike) -> tuple[LogisticReadout | RidgeReadout, dict[str, Any]]:
    """The readout a probe holds (fitted, ready to ``predict``) and its JSON record.

    Raises
    ------
    ReservoirError
        One line for a missing or unreadable file, a JSON of another format,
        weights whose sha256 does not match, or arrays of the wrong shapes.
    """
    from safetensors import SafetensorError
    from safetensors.numpy import load as st_load

    from reservoir.io import check_regular, read_json
    from reservoir.readouts.logistic import LogisticReadout
    from reservoir.readouts.ridge import RidgeReadout

    if Path(base).is_dir() or not Path(base).name.strip("."):  # "." gave "..probe.json"
        raise ReservoirError(f"{base}: expected a probe's base name (<folder>/logistic-layer6, the .probe.json or "
                             "the .safetensors path); found a folder")
    weights, info = _files(base)
    meta = read_json(info, "a probe JSON object")
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        found = meta.get("format") if isinstance(meta, dict) else type(meta).__name__
        raise ReservoirError(f"{info}: expected a probe of format {FORMAT!r}; found {found!r}")
    kinds = {"LogisticReadout": LogisticReadout, "RidgeReadout": RidgeReadout}
    if not isinstance(meta.get("readout"), str) or meta["readout"] not in kinds:
        raise ReservoirError(f"{info}: expected readout LogisticReadout or RidgeReadout; found {meta.get('readout')!r}")
    _check_meta(meta, info)
    check_regular(weights, "the probe's weights (a safetensors file)")
    try:
        blob = weights.read_bytes()
    except OSError as err:
        raise ReservoirError(f"{weights}: expected the probe's weights; found {err.strerror or err}") from None
    if hashlib.sha256(blob).hexdigest() != meta.get("weights_sha256"):
        raise ReservoirError(f"{weights}: the weights do not match the sha256 recorded in {info.name} (changed "
                             "after it was saved); save the probe again")
    try:
        arrays = st_load(blob)
    except (SafetensorError, ValueError, KeyError) as err:  # KeyError: a dtype numpy lacks (BF16, F8_*)
        raise ReservoirError(f"{weights}: expected safetensors weights of float and int64 arrays; found "
                             f"{err}") from None
    cls = kinds[meta["readout"]]
    params = {k: v for k, v in (meta.get("params") or {}).items() if k in cls().get_params()}
    est = cls(**params)
    try:
        est._check_params()
    except ValueError as err:
        raise ReservoirError(f"{info}: expected the readout's parameters; found {err}") from None
    _check_bound(meta, blob, info, weights)  # after the checks of each field's type and range, which say more
    d, H = meta["n_features"], meta["n_heads"]
    names = ("coef", "intercept", "classes", *(("mean",) if cls is LogisticReadout else ()))
    missing = [name for name in names if name not in arrays]
    if missing:
        raise ReservoirError(f"{weights}: expected the arrays {', '.join(names)}; found no {', '.join(missing)}")
    coef, intercept, classes = arrays["coef"], arrays["intercept"], arrays["classes"]
    if classes.ndim != 1 or classes.dtype.kind not in "iu" or len(np.unique(classes)) != len(classes):
        repeats = " with repeats" if classes.ndim == 1 and classes.dtype.kind in "iu" else ""
        raise ReservoirError(f"{weights}: expected classes as distinct integers, one row; found {classes.dtype} of "
                             f"shape {classes.shape}{repeats}")
    if classes.tolist() != meta["classes"]:
        raise ReservoirError(f"{weights}: expected the classes {info.name} records; found {classes.tolist()[:10]}")
    mean = arrays.get("mean") if cls is LogisticReadout else None
    shapes = {"coef": (max(H, 1), len(classes), d), "intercept": (max(H, 1), len(classes)), "mean": (d,)}
    for name, a in (("coef", coef), ("intercept", intercept), ("mean", mean)):
        if a is None:
            continue
        if a.shape != shapes[name] or a.dtype.kind != "f":
            raise ReservoirError(f"{weights}: expected {name} as floats of shape {shapes[name]} ({len(classes)} "
                                 f"classes, {d} features); found {a.dtype} of shape {a.shape}")
        if not np.isfinite(a).all():
            raise ReservoirError(f"{weights}: expected finite weights; found NaN or inf in {name}")
    est.coef_, est.intercept_, est.classes_ = coef, intercept, classes
    est.n_features_in_, est.n_heads_, est.alpha_ = d, H, float(meta["alpha"])
    if mean is not None:
        est.mean_ = mean
    return est, meta


def _is_int(v: Any, low: int) -> bool:
    return options.is_int(v) and v >= low


#: A probe JSON's fields: (must be there, check, what was expected).
FIELDS: dict[str, tuple[bool, Any, str]] = {
    "weights_sha256": (True, lambda v: isinstance(v, str), "a string"),
    "n_features": (True, lambda v: _is_int(v, 1), "an integer >= 1"),
    "n_heads": (True, lambda v: _is_int(v, 0), "an integer >= 0"),
    "alpha": (True, lambda v: isinstance(v, (int, float)) and not isinstance(v, bool) and np.isfinite(v) and v >= 0,
              "a finite number >= 0"),
    "classes": (True, lambda v: isinstance(v, list) and all(_is_int(c, -2**63) for c in v) and len(set(v)) == len(v),
                "a list of distinct integers"),
    "params": (False, lambda v: isinstance(v, dict), "an object"),
    "layer": (False, lambda v: _is_int(v, 0), "an integer >= 0"),
    "final_norm": (False, lambda v: isinstance(v, bool), "true or false"),
    "pooling": (False, lambda v: v in options.POOLINGS, f"one of {', '.join(options.POOLINGS)}"),
    "n_out_tokens": (False, lambda v: _is_int(v, 1), "an integer >= 1"),
    "backbone": (False, lambda v: isinstance(v, dict), "an object"),
    "projection": (False, lambda v: isinstance(v, dict), "an object"),
}


def _check_meta(meta: dict[str, Any], where: Path) -> None:
    """Refuse (one line) a probe JSON whose fields are missing or of the wrong type."""
    for key, (required, ok, expected) in FIELDS.items():
        if key not in meta:
            if required:
                raise ReservoirError(f"{where}: expected {key} ({expected}); found no {key}")
            continue
        if not ok(meta[key]):
            raise ReservoirError(f"{where}: expected {key} to be {expected}; found {_short(meta[key])}")


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


def save_probe(est: LogisticReadout | RidgeReadout, base: str | os.PathLike, store: FeatureStore, layer: int,
               final_norm: bool, result: FitResult | None = None, pooling: str | None = None) -> Path:
    """Save a readout fitted on ``layer`` (``pooling``) of ``store`` with what applying it elsewhere must match."""
    a = store.attrs
    meta = {"layer": layer, "final_norm": final_norm, "pooling": store.pooling(pooling),
            "n_out_tokens": store.n_out_tokens,
            "backbone": {k: a["backbone"].get(k) for k in BACKBONE_KEYS}, "projection": a["projection"],
            "store": store.fingerprint(), "store_path": str(store.path)}
    if result is not None:
        meta["fit"] = {k: result.metrics.get(k) for k in ("test_accuracy", "test_interval", "val_accuracy")}
    return save(est, base, meta)


def check_store(meta: dict[str, Any], store: FeatureStore, where: str) -> None:
    """Refuse (one line) a store the probe cannot read: another backbone, projection, layer, pooling or width."""
    a = store.attrs
    for key in BACKBONE_KEYS:
        want, got = (meta.get("backbone") or {}).get(key), a["backbone"].get(key)
        if want != got:
            raise ReservoirError(f"{store.path}: expected a store of the probe's backbone ({where}); found "
                                 f"backbone.{key} = {got!r}, the probe's is {want!r}")
    proj = {k: v for k, v in a["projection"].items()}
    if proj != meta.get("projection"):
        diff = next(k for k in sorted(set(proj) | set(meta.get("projection") or {}))
                    if proj.get(k) != (meta.get("projection") or {}).get(k))
        raise ReservoirError(f"{store.path}: expected the probe's input projection ({where}); found projection."
                             f"{diff} = {proj.get(diff)!r}, the probe's is {(meta.get('projection') or {}).get(diff)!r}")
    if meta.get("layer") not in store.layers:
        raise ReservoirError(f"{store.path}: expected layer {meta.get('layer')} (the probe's); found layers "
                             f"{store.layers}")
    if int(a["backbone"]["n_dim"]) != int(meta["n_features"]):
        raise ReservoirError(f"{store.path}: expected features of width {meta['n_features']}; found "
                             f"{a['backbone']['n_dim']}")
    if meta.get("pooling") not in store.poolings:
        raise ReservoirError(f"{store.path}: expected features pooled by {meta.get('pooling')!r} (the probe's); found "
                             f"poolings {store.poolings}")
    if meta.get("n_out_tokens") != store.n_out_tokens:
        raise ReservoirError(f"{store.path}: expected {meta.get('n_out_tokens')} output token(s) per row (the "
                             f"probe's); found {store.n_out_tokens}")
    label_shape = list(a["task"].get("label_shape") or [])
    head_shape = label_shape[1:] if store.n_out_tokens > 1 else label_shape  # several tokens: a row per token
    heads = int(np.prod(head_shape)) if head_shape else 0
    if heads != meta["n_heads"]:
        per = "output token" if store.n_out_tokens > 1 else "row"
        raise ReservoirError(f"{store.path}: expected labels of the probe's {_heads(meta['n_heads'])}; found "
                             f"{_heads(heads)} (labels of shape {tuple(head_shape)} per {per})")
    recorded = meta.get("store")
    fitted: dict[str, Any] = recorded if isinstance(recorded, dict) else {}
    was, now = _precision(fitted), _precision(a)
    if "dtype" in fitted and was != now:  # the same features, rounded otherwise: said, not refused
        log.warning("%s: features %s, the probe's were %s: predictions can move with the rounding (most where "
                    "the probe's weights are large)", store.path, now, was)


def _precision(attrs: dict[str, Any]) -> str:
    """How a store's features were rounded: ``stored as float16, computed in bfloat16``."""
    computed = attrs.get("compute_dtype")
    return f"stored as {attrs.get('dtype')}" + (f", computed in {computed}" if computed else "")


def _heads(n: int) -> str:
    return "one label per row" if n == 0 else f"{n} label heads"


def _task_fingerprint(attrs: Any) -> str | None:
    """The task fingerprint a store's attributes (or a probe's record of them) hold, if any."""
    task = attrs.get("task") if isinstance(attrs, dict) else None
    found = task.get("fingerprint") if isinstance(task, dict) else None
    return found if isinstance(found, str) else None


def predict_store(probe: str | os.PathLike, store: FeatureStore | str | os.PathLike,
                  splits: str | list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Apply a saved probe to a store: per split, the predictions and the accuracy with its interval.

    Returns ``{split: {"predictions": ndarray (N * n_out_tokens, ...), "accuracy": float,
    "interval": [low, high], "rows": N, "unseen": [...]}}``. Where the split's labels include classes the probe
    never saw (``unseen``), it cannot be right on them: on the task it was fitted on (a test split holding a class
    the train split lacks) those rows count as wrong, as ``fit-linear`` counted them; on a store of another task
    ``accuracy`` and ``interval`` are ``None`` (the labels are not the probe's).

    Examples
    --------
    >>> out = predict_store("results/fit-linear/xor/logistic-layer2", "cache/xor-again.zarr")  # doctest: +SKIP
    >>> out["test"]["accuracy"], out["test"]["interval"]                                       # doctest: +SKIP
    """
    from reservoir.readouts.features import load_layer, opened
    from reservoir.readouts.intervals import accuracy_interval

    est, meta = load(probe)
    where = os.fspath(_files(probe)[1])
    if "layer" not in meta:
        raise ReservoirError(f"{where}: expected a probe saved from a store (fit-linear --save); found one "
                             "without its layer")
    if isinstance(splits, str):  # one split by name, not its letters
        splits = [splits]
    twice = options.repeated(splits or [])
    if twice is not None:  # not predicted (and printed) twice, nor dropped without a word
        raise ReservoirError(f"splits (--split): expected each split once; found {twice!r} twice")
    out = {}
    with opened(store) as st:
        if not st.complete:
            raise ReservoirError(f"{st.path}: expected a complete store, found an unfinished extraction (rerun it)")
        check_store(meta, st, where)
        fitted_on = _task_fingerprint(meta.get("store"))
        same_task = fitted_on is not None and fitted_on == _task_fingerprint(st.attrs)
        for split in splits or st.splits:
            X, y = load_layer(st, split, int(meta["layer"]), bool(meta.get("final_norm", True)),
                              pooling=meta["pooling"])
            try:
                pred = np.asarray(est.predict(X))
            except ValueError as err:
                raise ReservoirError(f"{where} on {st.path} ({split}): {err}") from None
            n_out = st.n_out_tokens
            hit = (pred == y).reshape(len(y) // n_out, -1) if len(y) else np.zeros((0, 1), bool)
            unseen = sorted(int(c) for c in np.setdiff1d(np.unique(y), est.classes_))
            acc = None if unseen and not same_task else int(hit.sum()) / hit.size if hit.size else float("nan")  # as fit-linear's
            out[split] = {"predictions": pred, "accuracy": acc, "rows": len(hit), "unseen": unseen,
                          "interval": None if acc is None else list(accuracy_interval(hit.sum(1), hit.shape[1]))}
    return out
