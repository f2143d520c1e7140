"""Readouts: ``fit-linear`` on a store's features, ``fit-raw`` on the raw inputs as the baseline."""

from __future__ import annotations

from pathlib import Path

import click

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.cli.common import (
    SEED,
    _check_out,
    _parse_layers,
    _task_from,
    ci,
    data_options,
    setting_option,
    storage_option,
    task_inputs,
)


def _pct(value: float | None) -> str:
    """An accuracy as the tables print it; ``n/a`` where there is none (no validation row to hold out)."""
    if value is None or value != value:
        return "    n/a"
    return f"{100 * value:6.2f}%"


def _cell(accuracy: float, interval) -> str:
    """``accuracy [low, high]`` and the space to the next column, 24 characters (at least one space): an interval
    reaching 100.00 takes one of the two spaces, so the columns stay in line."""
    return f"{_pct(accuracy) + ' ' + ci(interval) + ' ':<24}"


def _parse_sizes(value: str | None) -> list[int | None] | None:
    """``--train-sizes 100,1000,all`` -> ``[100, 1000, None]``."""
    if value is None:
        return None
    sizes: list[int | None] = []
    for item in value.split(","):
        item = item.strip()
        if item == "all":
            sizes.append(None)
            continue
        try:
            sizes.append(int(item))
        except ValueError:
            raise click.BadParameter(f"expected row counts like 100,1000,all; found {item!r}",
                                     param_hint="--train-sizes") from None
        if sizes[-1] < 2:
            raise click.BadParameter(f"expected row counts of at least 2; found {item}", param_hint="--train-sizes")
    if len(set(sizes)) != len(sizes):
        raise click.BadParameter(f"expected distinct row counts; found {value!r}", param_hint="--train-sizes")
    return sizes


@click.command("fit-linear")
@click.argument("store", type=click.Path())
@click.option("--layer", default="all", show_default=True, help="Layer K, a list like 0,3,6, or 'all' (a depth sweep).")
@click.option("--readout", default="logistic", show_default=True, type=click.Choice(options.READOUTS),
              help="Multinomial logistic (its L2 path batched, whitened) or closed-form ridge (one eigendecomposition "
                   "per layer).")
@click.option("--train-sizes", default=None, metavar="N,N,...,all",
              help="Also fit on nested, seeded subsets of the training rows (a learning curve; at least 10 rows "
                   "unless the store has a val split): a table and "
                   "<readout>[-<pooling>][-nonorm]-learning-curve.png. Fits in memory: not with --stream on.")
@click.option("--pooling", default=None, metavar="last|first|mean",
              help="Which pooling of the store to read (extract --pooling); default the store's first.")
@click.option("--save", is_flag=True, help="Keep each fitted readout as a probe beside its results file "
                                          "(.safetensors + .probe.json) for `reservoir predict`.")
@click.option("--stream", default="auto", show_default=True, type=click.Choice(["off", "on", "auto"]),
              help="Fit from store chunks instead of loading the layer: on, off, or auto (when a layer's train "
                   "features exceed 2 GiB as float32).")
@click.option("--seed", default=0, show_default=True, type=SEED,
              help="Seed of the validation split, the path's subsample and the learning curve.")
@click.option("--results", "results_dir", default="results/fit-linear", show_default=True, help="Folder for the results JSONs.")
@setting_option(options.DEVICE, default="cpu",
                help="Torch device of the logistic readout (cpu, cuda, cuda:N, auto); the ridge readout runs on the CPU.")
@click.option("--no-final-norm", is_flag=True, help="Read raw layer features (skip the backbone's final norm).")
@storage_option(store="STORE")
def fit_linear(store, layer, readout, train_sizes, pooling, save, stream, seed, results_dir, device, no_final_norm):
    """Fit a linear readout on stored features; print train/val/test accuracy (95% intervals) per layer."""
    from reservoir.readouts.naming import result_stem, results_folder
    from reservoir.readouts.run import fit_linear as run_fit

    if not results_dir.strip():  # the working folder would take the results' folders
        raise click.BadParameter("expected a folder for the results; found an empty path", param_hint="--results")

    layers = "all" if layer == "all" else _parse_layers(layer, "--layer")
    sizes = _parse_sizes(train_sizes)

    def show(r):
        if r is None:
            click.echo(f"{'layer':>5}  {'train':>7}  {'val [95% CI]':<22}  {'test [95% CI]':<22}  {'alpha':>7}  "
                       f"{'fit s':>6}")
            return
        m = r.metrics
        val, test = (_cell(m[f"{s}_accuracy"], m[f"{s}_interval"]) for s in ("val", "test"))
        click.echo(f"{r.config['layer']:>5}  {_pct(m['train_accuracy'])}  {val}{test}{m['alpha']:7.0e}  "
                   f"{r.timings['fit_s']:6.1f}")

    results = run_fit(store, layers, readout, seed=seed, device=device, final_norm=not no_final_norm,
                      stream={"off": False, "on": True, "auto": "auto"}[stream], train_sizes=sizes, pooling=pooling,
                      results_dir=results_dir, save=save, on_result=show)
    click.echo(f"majority-class test accuracy: {results[-1].metrics['chance']:.2%}")
    fit_s, load_s = sum(r.timings["fit_s"] for r in results), sum(r.timings["load_s"] for r in results)
    strengths = len(results[-1].metrics["val_scores"]) or 1
    click.echo(f"fits: {fit_s:.1f} s for {len(results)} layer(s), {strengths} L2 strength(s) each; "
               f"store read {load_s:.1f} s")
    folder = results_folder(results_dir, results[0].config["store"])
    stem = result_stem(readout, results[0].config["pooling"], not no_final_norm)
    if sizes:
        _show_curves(results, stem, folder)
    if save:
        click.echo(f"probes: {folder}/{stem}-layer<K>.safetensors (+ .probe.json); apply with `reservoir predict`")
    click.echo(f"results in {folder}/")


def _show_curves(results, readout: str, folder: Path) -> None:
    """The learning curves as a table (layers by training rows) and a PNG beside the results."""
    from reservoir.readouts.curves import plot_learning_curves

    sizes = [p["n_train"] for p in results[0].metrics["learning_curve"]]
    click.echo("learning curve: test accuracy [95% CI] by training rows")
    click.echo((f"{'layer':>5}  " + "  ".join(f"{f'{s:,} rows':<22}" for s in sizes)).rstrip())
    for r in results:
        cells = [_cell(p["test_accuracy"], p["test_interval"]) for p in r.metrics["learning_curve"]]
        click.echo((f"{r.config['layer']:>5}  " + "".join(cells)).rstrip())
    png = plot_learning_curves(results, folder / f"{readout}-learning-curve.png",
                               title=f"{folder.name}: {readout} readout")
    click.echo(f"learning curve plot: {png}")


@click.command("predict")
@click.argument("probe", type=click.Path())
@click.argument("store", type=click.Path())
@click.option("--split", "splits", multiple=True, help="Split(s) to predict; default every split of the store.")
@click.option("--out", default=None, help="Write the predictions here (.npz, one array per split and the store's "
                                          "path); default <probe>-<store name>.predictions.npz beside the probe.")
@storage_option(store="STORE")
def predict(probe, store, splits, out):
    """Apply a saved probe (fit-linear --save) to a store of the same backbone and projection."""

    import numpy as np

    from reservoir.readouts.probes import predict_store
    from reservoir.readouts.naming import store_location, store_stem

    base = probe.removesuffix(".probe.json").removesuffix(".safetensors")
    target = Path(out) if out is not None else Path(f"{base}-{store_stem(store)}.predictions.npz")
    _check_out(str(target) if out is None else out, store, f"{base}.probe.json", f"{base}.safetensors")
    if target.suffix.lower() != ".npz":  # a results file or a probe named here was replaced by an archive
        raise click.BadParameter(f"expected a .npz file for the predictions; found {out}", param_hint="--out")
    if out is None:
        _check_predictions_owner(target, store_location(str(store)))
    found = predict_store(base, store, list(splits) or None)
    for split, res in found.items():
        shown = ", ".join(map(str, res["unseen"][:10])) + (", ..." if len(res["unseen"]) > 10 else "")
        if res["accuracy"] is None:  # another task's labels the probe cannot predict: no accuracy to speak of
            click.echo(f"{split}: {res['rows']:,} rows, no accuracy: its labels include classes the probe was not "
                       f"fitted on ({shown})")
        else:
            unseen = f"; rows of class(es) {shown}, which the train split lacks, count as wrong" if shown else ""
            click.echo(f"{split}: {res['rows']:,} rows, accuracy {res['accuracy']:.2%} {ci(res['interval'])}{unseen}")
    _write_npz(target, {**{f"{split}_predictions": res["predictions"] for split, res in found.items()},
                        "store": np.array(store_location(str(store)))})
    click.echo(f"predictions in {target}")


def _check_predictions_owner(target: Path, store: str) -> None:
    """Refuse (one line) to replace, under the default name, the predictions of another store of the same name
    (``x.zarr`` and ``x.h5``, or two folders), as ``fit-linear`` refuses their results."""
    import numpy as np

    from reservoir.readouts.naming import same_store

    try:
        with np.load(target, allow_pickle=False) as old:
            other = str(old["store"]) if "store" in old.files else None
    except (OSError, ValueError, KeyError):  # none there, or not predictions: the output checks say what it is
        return
    if other is not None and not same_store(other, store):
        raise ReservoirError(f"{target}: expected predictions of {store} or none; found those of {other} (another "
                             "store of the same name); pass --out to write them elsewhere")


def _write_npz(path: Path, arrays: dict) -> None:
    """An .npz written under a temporary name and renamed into place (nothing half-written at ``path``)."""
    import numpy as np

    from reservoir.io import atomic_write

    with atomic_write(path, "the predictions") as f:
        np.savez(f, **arrays)


@click.command("fit-raw")
@click.option("--task", default=None, help="A continuous task (images, bit XOR); or --data PATH.")
@data_options
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Task parameter, repeatable.")
@click.option("--readout", default="logistic", show_default=True, type=click.Choice(options.READOUTS))
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the validation split.")
@click.option("--out", default=None, help="Write the result as JSON here.")
def fit_raw(task, data, input_column, label_column, params, readout, seed, out):
    """Baseline without a backbone: the same readout on the flattened raw inputs."""
    from reservoir.readouts.raw import fit_raw as run_raw
    from reservoir.tasks.base import task_label

    task, task_params = _task_from(task, data, input_column, label_column, params)
    _check_out(out, *task_inputs(task_params))
    r = run_raw(task, task_params, readout, seed=seed)
    m = r.metrics
    click.echo(f"{task_label(task, task_params)} raw inputs ({m['n_features']} features), {readout}: "
               f"train {m['train_accuracy']:.2%}, "
               f"test {m['test_accuracy']:.2%} {ci(m['test_interval'])} (alpha {m['alpha']:.0e}, fit "
               f"{r.timings['fit_s']:.1f} s)")
    if out:
        r.write(out)
