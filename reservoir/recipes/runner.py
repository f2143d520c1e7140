"""Running a recipe: every run of its grid, reusing feature stores and skipping finished runs."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import Any

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import atomic_write, check_inside, check_name, zarr_store_around
from reservoir.settings import describe_difference, first_difference, folder_only, is_folder
from reservoir.store.lock import run_folder_lock, writer_lock
from reservoir.store.remote import StoreURL, is_url
from reservoir.recipes.files import load_recipe
from reservoir.recipes.runs import Run, fitted_layers
from reservoir.recipes.schema import Recipe
from reservoir.recipes.state import SOURCE, begin, data_fingerprint, result_files, run_state


def _check_inside(path: Path, root: Path) -> None:
    """Every path the runner reads, writes or removes is checked first (:func:`~reservoir.io.check_inside`), so that
    no id and no symbolic link in a results folder sends a read, a write or ``--force``'s removal elsewhere."""
    check_inside(path, root, "a path", "write or remove")


def _out_dir(recipe: Recipe, out: str | os.PathLike | None) -> Path:
    """The recipe's results folder: ``out``, else ``results/<name>`` (checked to lie inside ``results``)."""
    if out is not None:
        if not str(os.fspath(out)).strip():
            raise ReservoirError("expected a results folder (--out); found an empty path")
        check_name(out)
        return Path(out)
    _check_inside(Path("results") / recipe.name, Path("results"))
    return Path("results") / recipe.name


def _checked(recipe: Recipe, out_dir: Path) -> list[Run]:
    """Every run of ``recipe``, once every path it reads, writes or removes is checked (before anything is
    written)."""
    try:
        if out_dir.exists() and not out_dir.is_dir():
            raise ReservoirError(f"{out_dir}: expected a results folder, found a file")
    except OSError as err:
        raise ReservoirError(f"{str(out_dir)[:80]}: expected a results folder; found {err.strerror}") from None
    runs = recipe.runs()
    runs_paths = (p for run in runs for p in (out_dir / run.id, *result_files(run, out_dir / run.id)))
    for path in [out_dir / "recipe.yaml", out_dir / SOURCE, *runs_paths]:
        _check_inside(path, out_dir)
    for run in runs:  # a model folder that is not there fails now, not after the runs before it
        if run.backbone is not None and folder_only(run.backbone) and not is_folder(run.backbone):
            raise ReservoirError(f"backbone {run.backbone!r} in {run.cell.where}: expected a model folder "
                                 "(config.json and weights), found no such folder")
    return runs


def _check_raw_tasks(runs: list[Run]) -> None:
    """The tasks of ``runs`` (fit-raw) built, or read from the task cache, and checked for a raw-input baseline
    (:func:`~reservoir.readouts.raw.check_raw`) before anything is written: a token task in a late cell is refused
    now, not after the runs before it."""
    from reservoir.readouts.raw import check_raw
    from reservoir.tasks import load_task

    seen = set()
    for run in runs:
        key = json.dumps([run.task, run.cell.task_params], sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            try:
                check_raw(load_task(run.task, dict(run.cell.task_params)))
            except ReservoirError as err:
                raise ReservoirError(f"{run.cell.where}: {err}") from None


def _check_train_groups(runs: list[Run]) -> None:
    """Each train run's groups on its backbone when that is built in (its architecture known without a download,
    built here from its config alone): groups that hold no parameter there (``recurrent`` of a transformer) are
    refused before anything is written, not when the run's turn comes."""
    from torch import nn

    from reservoir.backbones import load_backbone
    from reservoir.backbones.names import builtin_layers
    from reservoir.training.freeze import check_trains_something, parameter_groups, parse_groups

    built: dict[tuple, tuple[nn.Module, dict[str, list[nn.Parameter]]]] = {}  # each backbone and depth built once
    for run in runs:
        if run.backbone is None or run.finetune is None or builtin_layers(run.backbone) is None:
            continue
        key = (run.backbone, run.layers)
        if key not in built:
            backbone = load_backbone(run.backbone, init="random", d_in=1, depth=run.layers)
            built[key] = backbone, parameter_groups(backbone, nn.Linear(1, 1))
        try:
            check_trains_something(*built[key], parse_groups(run.finetune))
        except ReservoirError as err:
            raise ReservoirError(f"{run.cell.where}: {err}") from None


def _check_cache(cache: Path | StoreURL) -> None:
    """Refuse (one line) a local store cache inside a Zarr store (whose rebuild would delete every store in it),
    before the results folder is written."""
    if isinstance(cache, Path):
        if cache.exists() and not cache.is_dir():
            raise ReservoirError(f"{cache}: expected a store cache folder (--cache); found a file")
        around = zarr_store_around(cache / "_")
        if around is not None:
            raise ReservoirError(f"{cache}: expected a store cache (--cache) outside any feature store; found it "
                                 f"inside the store {around}")


def _states(runs: list[Run], out_dir: Path) -> list[tuple[Run, str, str]]:
    """Every run with its :func:`run_state`."""
    return [(run, *run_state(run, out_dir / run.id)) for run in runs]


def _clear(folder: Path) -> None:
    """Remove a run folder (``--force``, or results of other settings): a link or a file in its place goes alone."""
    if folder.is_symlink() or folder.is_file():
        folder.unlink()
    elif folder.exists():
        shutil.rmtree(folder)


def _copy_text(recipe: Recipe) -> str:
    """The recipe's copy for its results folder: the file as written (comments kept), named as the run named it."""
    import yaml

    raw = json.loads(json.dumps(recipe.raw, default=str))  # a recipe built in Python may hold a Path
    text = recipe.text or yaml.safe_dump(raw, sort_keys=False)
    if raw.get("name"):
        return text
    if "name" in raw:  # null or empty: the name in its place
        return yaml.safe_dump({**raw, "name": recipe.name}, sort_keys=False)
    named = {"name": recipe.name, **raw}
    prefixed = f"name: {recipe.name}\n{text}"  # keeps the comments; valid where the file is a plain block mapping
    try:
        if yaml.safe_load(prefixed) == named:
            return prefixed
    except yaml.YAMLError:
        pass
    return yaml.safe_dump(named, sort_keys=False)


def store_for(run: Run, cache_dir: Path | StoreURL, device: str = "auto", force: bool = False) -> Path | StoreURL:
    """The run's feature store: reused when complete with matching provenance, else extracted (or resumed).

    ``cache_dir`` is a folder or an object-store prefix (``s3://bucket/recipes``).
    """
    import reservoir.extract as ex
    from reservoir.runtime import compute_dtype, resolve_device
    from reservoir.store import FeatureStore, remove
    from reservoir.tasks import load_task

    c = run.cell
    task = load_task(run.task, c.task_params)
    computed = str(compute_dtype(resolve_device(device), c.amp)).removeprefix("torch.")
    key = {"task": run.task, "fingerprint": task.fingerprint, "backbone": run.backbone, "init": run.init,
           "seed": run.seed, "depth": run.layers, "dtype": c.dtype, "compute_dtype": computed,
           "gain": options.PROJECTION_GAIN if c.projection == "orthogonal" else None}
    if c.projection != options.PROJECTIONS[0]:  # (the stores of orthogonal runs keep the names they had)
        key["projection"] = c.projection
    name = f"{hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()[:12]}.zarr"
    path: Path | StoreURL
    if isinstance(cache_dir, StoreURL):
        path = cache_dir.child(name)
    else:
        path = cache_dir / name
        _check_inside(path, cache_dir)
    if path.exists():
        with FeatureStore.open(path, allow_incomplete=True) as st:  # an unfinished store is resumed below
            a = st.attrs
            found = {"task": a["task"]["name"], "fingerprint": a["task"]["fingerprint"], "init": a["backbone"]["init"],
                     "seed": a["backbone"]["seed"], "depth": max(a["layers"]), "dtype": a["dtype"],
                     "compute_dtype": a.get("compute_dtype"), "gain": a["projection"]["gain"]}
            if a["projection"].get("kind", options.PROJECTIONS[0]) != options.PROJECTIONS[0]:
                found["projection"] = a["projection"]["kind"]
            diff = first_difference(found, key, keys=found)
            recorded = a["backbone"].get("weights_sha256")
            complete = st.complete
        if diff is None and recorded is not None:  # a model folder saved over since, or another hub revision
            now = _weights_sha256(run)
            if now != recorded:
                diff = ("backbone.weights_sha256", recorded, now)
        if diff is not None:
            if not force:
                raise ReservoirError(f"{path} was written with {describe_difference(diff)}; delete it or pass --force")
            with writer_lock(path, "recipe run --force"):  # never deleted under another writer
                remove(path)
        elif complete:
            return path
    assert run.backbone is not None and run.init is not None  # (a fit-linear run always names them)
    cfg = ex.ExtractConfig(task=run.task, backbone=run.backbone, init=run.init, layers=run.layers, out=str(path),
                           task_params=dict(c.task_params), seed=run.seed, dtype=c.dtype, amp=c.amp,
                           projection=c.projection, device=device,
                           batch_size=c.batch_size)  # none given: the device's batching
    return ex.run(cfg, progress=False, task=task)


def _weights_sha256(run: Run) -> str:
    """The hash of the weights ``run``'s backbone loads with now (:attr:`BackboneInfo.weights_sha256`)."""
    from reservoir.backbones import load_backbone

    assert run.backbone is not None and run.init is not None  # (a fit-linear run always names them)
    return load_backbone(run.backbone, init=run.init, seed=run.seed, d_in=1, depth=0).info.weights_sha256


def _execute(run: Run, folder: Path, cache_dir: Path | StoreURL, device: str, force: bool, meta: dict) -> str:
    """Compute one run into ``folder``; return a short summary."""
    from reservoir.results import write_result
    from reservoir.runtime import resolve_device

    c = run.cell
    fit_device = str(resolve_device(device))
    if run.kind == "fit-raw":
        import reservoir.readouts.raw as raw

        accs = []
        for r in c.readout:
            res = raw.fit_raw(run.task, dict(c.task_params), r, seed=run.seed, device=fit_device)
            write_result(folder / f"{r}.json", {**res.to_dict(), "recipe": meta})
            accs.append(f"{r} {res.metrics['test_accuracy']:.2%}")
        return ", ".join(accs)
    if run.kind == "bench":
        from reservoir.bench import speedup

        assert run.backbone is not None and run.init is not None  # (a bench run always names them)
        bench = speedup(run.task, dict(c.task_params), backbone=run.backbone, init=run.init, layers=run.layers,
                        split_layer=c.split_layer, max_live_rows=c.max_live_rows, seed=run.seed, device=device,
                        **_given(batch_size=c.batch_size))
        write_result(folder / "speedup.json", {**bench.to_dict(), "kind": "bench", "recipe": meta})
        return (f"output only {bench['output_only']['speedup']:.0f}x, layernorm top "
                f"{bench['layernorm_top']['speedup']:.1f}x per epoch")
    if run.kind == "fit-linear":
        import reservoir.readouts.run as rr

        store = store_for(run, cache_dir, device, force)
        best = []
        for r in c.readout:
            results = rr.fit_linear(store, fitted_layers(c), r, seed=run.seed, device=fit_device)  # writes nothing
            for res in results:
                write_result(folder / f"{r}-layer{res.config['layer']}.json", {**res.to_dict(), "recipe": meta})
            top = max(results, key=lambda res: res.metrics["test_accuracy"])
            best.append(f"{r} best layer {top.config['layer']} {top.metrics['test_accuracy']:.2%}")
        return ", ".join(best)
    import reservoir.training as tr

    cfg = tr.TrainConfig(task=run.task, backbone=run.backbone, init=run.init, layers=run.layers,
                         finetune=run.finetune, task_params=dict(c.task_params), steps=c.steps, epochs=c.epochs,
                         eval_every=c.eval_every, seed=run.seed, dropout=c.dropout, amp=c.amp,
                         projection=c.projection, device=device,
                         out=str(folder), **_given(lr=run.lr, batch_size=c.batch_size))
    if c.lr_sweep:  # the sweep writes sweep.json (with the recipe block) into the run folder it owns
        s = tr.sweep(cfg, tr.parse_lr_sweep(str(c.lr_sweep)), len(c.seeds), progress=False, extra={"recipe": meta})
        m = s.metrics
        return f"best lr {s.best_lr:.2e}: {m['test_accuracy_mean']:.2%} +- {m['test_accuracy_std']:.2%}"
    res = tr.run(cfg, progress=False, extra={"recipe": meta})  # writes results.json into its folder
    return f"test {res.metrics['test_accuracy']:.2%}"


def _given(**settings: Any) -> dict[str, Any]:
    """The settings a cell gives (not ``None``), so those it leaves out take the command's own defaults."""
    return {k: v for k, v in settings.items() if v is not None}


def plan(recipe: Recipe | str | os.PathLike, out: str | os.PathLike | None = None,
         force: bool = False) -> list[dict[str, Any]]:
    """What :func:`run_recipe` would do, without loading models (a task read from files is loaded, through the task
    cache, only to check the results already there against its data): one dict per run.

    Each has ``id``, ``kind``, ``done`` (its results exist under ``out``; never with ``force``), ``state`` and
    ``why`` (:func:`run_state`) and
    the work it asks for: ``steps`` and ``sequences`` (optimizer steps x
    batch, per learning rate and seed for a sweep), ``trainings`` (1, or
    rates x seeds), ``extraction_layers`` for fit-linear (blocks run once over
    every example).

    Examples
    --------
    >>> sum(p["steps"] for p in plan("paper-table2"))  # doctest: +SKIP
    """
    from reservoir.training import TrainConfig, parse_lr_sweep
    from reservoir.training.config import DEFAULT_STEPS

    batch = options.field_setting(TrainConfig, "batch_size").default

    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe)
    out_dir = _out_dir(recipe, out)
    rows = []
    for run, state, why in _states(_checked(recipe, out_dir), out_dir):
        c = run.cell
        row = {"id": run.id, "kind": run.kind, "done": state == "done" and not force, "state": state, "why": why,
               "steps": 0, "sequences": 0, "trainings": 0, "extraction_layers": None}
        if run.kind == "train":
            n = len(parse_lr_sweep(str(c.lr_sweep))) * len(c.seeds) if c.lr_sweep else 1
            steps = c.steps if c.steps is not None else (None if c.epochs is not None else DEFAULT_STEPS)
            row["trainings"] = n
            if steps is not None:  # epochs: the step count depends on the data
                row["steps"] = n * steps
                row["sequences"] = n * steps * (c.batch_size or batch)
            row["epochs"] = c.epochs
        elif run.kind in ("fit-linear", "bench"):
            row["extraction_layers"] = run.layers
        rows.append(row)
    return rows


def run_recipe(recipe: Recipe | str | os.PathLike, out: str | os.PathLike | None = None, device: str = "auto",
               force: bool = False, progress: bool = True, cache_dir: str | os.PathLike = "cache/recipes"
               ) -> dict[str, Any]:
    """Run every cell of ``recipe`` into ``out`` (default ``results/<name>``).

    Returns ``{"out", "ran", "skipped"}`` (run ids). Runs whose results exist
    are skipped unless ``force``; fit-linear stores are reused when their
    provenance matches. One progress bar over runs; a line per finished run.

    Examples
    --------
    >>> run_recipe("quickstart", out="results/quickstart")  # doctest: +SKIP
    """
    from tqdm.auto import tqdm

    from reservoir.runtime import resolve_device

    if not isinstance(recipe, Recipe):
        recipe = load_recipe(recipe)
    out_dir = _out_dir(recipe, out)
    cache = StoreURL(str(cache_dir)) if is_url(cache_dir) else Path(cache_dir)
    _check_cache(cache)
    resolve_device(device)  # an unknown or absent device is refused before --force removes anything
    # before anything is written: the recipe's copy, every run folder and every results file it reads or writes
    runs = _checked(recipe, out_dir)
    with run_folder_lock(out_dir) as lock:  # one recipe run per results folder
        checked = _states(runs, out_dir)  # as they are now that no other run of this folder is under way
        todo = [run for run, state, _ in checked if force or state != "done"]
        _check_raw_tasks([run for run in todo if run.kind == "fit-raw"])
        _check_train_groups([run for run in todo if run.kind == "train"])
        out_dir.mkdir(parents=True, exist_ok=True)
        with atomic_write(out_dir / "recipe.yaml", "the recipe's copy", text=True) as f:
            f.write(_copy_text(recipe))
        with atomic_write(out_dir / SOURCE, "where the recipe's relative paths lead", text=True) as f:
            json.dump({"folder": None if recipe.folder is None else str(recipe.folder)}, f)
        ran, skipped = [], []
        bar = tqdm(checked, desc=f"recipe {recipe.name}", unit="run", disable=None if progress else True,
                   dynamic_ncols=True)
        for run, state, why in bar:
            assert lock is not None  # (a results folder is always given here)
            lock.check()  # the folder's lock file still this run's (not removed by hand under it) before each run
            folder = out_dir / run.id
            if state == "done" and not force:
                skipped.append(run.id)
                if progress:
                    bar.write(f"skip {run.id} (results exist)")
                continue
            bar.set_postfix_str(run.id)
            if force or state in ("foreign", "stale"):
                if why and progress:
                    bar.write(f"redo {run.id}: {why}")
                _clear(folder)
            meta = {"name": recipe.name, "run": run.id, "cell": run.cell.where, "seed": run.seed, "label": run.label(),
                    "settings": run.settings()}
            data = data_fingerprint(run)
            if data is not None:  # what file_state checks the data against, in every results file of the run
                meta["data"] = data
            begin(run, folder, meta)
            summary = _execute(run, folder, cache, device, force, meta)
            ran.append(run.id)
            if progress:
                bar.write(f"done {run.id}: {summary}")
    return {"out": str(out_dir), "ran": ran, "skipped": skipped}
