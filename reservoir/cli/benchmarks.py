"""``reservoir bench``: what caching buys (extraction, training from a store, the readout's fit)."""

from __future__ import annotations

import click

from reservoir.cli.common import (
    DEPTH,
    SEED,
    _check_out,
    _parse_layers,
    _task_from,
    backbone_input,
    ci,
    data_options,
    extract_option,
    forward_options,
    step_options,
    storage_option,
    task_inputs,
    train_option,
)
from reservoir.errors import ReservoirError
from reservoir.training.config import MAX_STEPS


def _live_options(f):
    """The task (or data file), backbone, init and depth of a benchmark that trains: bench speedup, bench train."""
    for option in reversed([
        train_option("task", default=None, help="Task name (see `reservoir tasks`); or --data PATH."),
        data_options,
        train_option("task_params", "--param", "-p", "params", multiple=True, metavar="KEY=VALUE", default=None),
        train_option("backbone"),
        train_option("init"),
        train_option("layers", type=DEPTH),
    ]):
        f = option(f)
    return f


@click.group()
def bench():
    """Benchmarks: what caching buys."""


@bench.command("extract")
@extract_option("task", default=None)
@data_options
@extract_option("task_params", "--param", "-p", "params", multiple=True, metavar="KEY=VALUE", default=None)
@extract_option("backbone")
@extract_option("init")
@extract_option("layers", type=str)
@extract_option("format", "--format", "fmt", default="zarr", show_default=True, help="Backend of the temporary store.")
@forward_options
@extract_option("full_seq_layer")
@extract_option("truncate")
@click.option("--naive-rows", default=128, show_default=True, type=int,
              help="Rows the naive way (full model, padded to the maximum, fp32) is timed on (every row when the "
                   "task has fewer), then scaled.")
@click.option("--out", default=None, help="Write the measurements as JSON here.")
@click.option("--store-url", default=None, metavar="URL",
              help="Also time the pass into a new store under this object-store prefix (s3://bucket/prefix; removed "
                   "afterwards), beside the one on local disk.")
@storage_option(store_url="--store-url")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def bench_extract(task, data, input_column, label_column, params, backbone, init, layers, fmt, batch_size, max_tokens,
                  writers, dtype, device, amp, seed, full_seq_layer, truncate, naive_rows, out, store_url, quiet):
    """Extraction vs a bare forward of the same model on the same batches, vs HF's forward, vs the naive way."""
    from reservoir.bench import bench_extract as run_bench
    from reservoir.bench import format_extract
    from reservoir.extract import ExtractConfig

    if naive_rows < 1:
        raise click.BadParameter(f"expected a positive number of rows, found {naive_rows}", param_hint="--naive-rows")
    task, task_params = _task_from(task, data, input_column, label_column, params)
    _check_out(out, *task_inputs(task_params), backbone_input(backbone))
    config = ExtractConfig(task=task, backbone=backbone, init=init, layers=_parse_layers(layers), format=fmt,
                           task_params=task_params, seed=seed, batch_size=batch_size,
                           max_tokens=max_tokens, writers=writers, dtype=dtype, device=device, amp=amp,
                           truncate=truncate,
                           full_seq_layer=full_seq_layer)
    if store_url is not None:
        from reservoir.store.remote import StoreURL

        StoreURL(store_url)  # a malformed URL is refused before the model loads
    r = run_bench(config, naive_rows=naive_rows, progress=not quiet, store_url=store_url)
    click.echo(format_extract(r))
    if out:
        r.write(out)


@bench.command("speedup")
@_live_options
@click.option("--split-layer", default=None, type=int, help="Split point s for (b); default K-1 (tune the top block).")
@click.option("--batch-size", default=16, show_default=True, type=int, help="Rows per optimizer step.")
@click.option("--max-live-rows", default=1024, show_default=True, type=int,
              help="Rows timed for each live epoch (scaled to the full epoch); they also bound the large batch "
                   "(1024) that both sides of (a) are timed at.")
@train_option("seed")
@train_option("device")
@train_option("amp")
@click.option("--out", default=None, help="Write the measurements as JSON here.")
def bench_speedup(task, data, input_column, label_column, params, backbone, init, layers, split_layer, batch_size,
                  max_live_rows, seed, device, amp, out):
    """Per-epoch cost of training live vs from a store, and the break-even number of epochs (what only caching pays
    once, the pass and the store read, over what it saves per epoch)."""
    from reservoir.bench import format_speedup, speedup

    task, task_params = _task_from(task, data, input_column, label_column, params)
    _check_out(out, *task_inputs(task_params), backbone_input(backbone))
    r = speedup(task, task_params, backbone, init, layers, split_layer, batch_size, max_live_rows, seed,
                device, amp=amp)
    click.echo(format_speedup(r))
    if out:
        r.write(out)


@bench.command("train")
@_live_options
@click.option("--finetune", default="fpt", show_default=True, help="Groups to train (as `reservoir train`).")
@click.option("--batch-size", default=16, show_default=True, type=int, help="Sequences per step.")
@click.option("--lr", default=1e-3, show_default=True, type=float, help="Adam learning rate.")
@click.option("--steps", default=50, show_default=True, type=int, help="Steps timed on each side.")
@click.option("--warmup", default=10, show_default=True, type=int,
              help="Untimed steps first, on each side (at least 4 where the step is a CUDA graph: its capture).")
@train_option("seed")
@train_option("device")
@step_options
@click.option("--out", default=None, help="Write the measurements as JSON here.")
def bench_train(task, data, input_column, label_column, params, backbone, init, layers, finetune, batch_size, lr,
                steps, warmup, seed, device, amp, cuda_graphs, compiled, out):
    """The project's training step vs a plain PyTorch loop over the Hugging Face model (same groups, same batches)."""
    from reservoir.bench import bench_train as run_bench
    from reservoir.bench import format_train
    from reservoir.training import TrainConfig

    task, task_params = _task_from(task, data, input_column, label_column, params)
    _check_out(out, *task_inputs(task_params), backbone_input(backbone))
    for name, value in (("--steps", steps), ("--warmup", warmup)):
        if not 1 <= value <= MAX_STEPS:
            raise click.BadParameter(f"expected 1..{MAX_STEPS:,}, found {value:,}", param_hint=name)
    config = TrainConfig(task=task, task_params=task_params, backbone=backbone, init=init, layers=layers,
                         finetune=finetune, batch_size=batch_size, lr=lr, seed=seed, device=device, amp=amp,
                         cuda_graphs=cuda_graphs, compile=compiled)
    r = run_bench(config, steps=steps, warmup=warmup)
    click.echo(format_train(r))
    if out:
        r.write(out)


@bench.command("readout")
@click.argument("store", type=click.Path())
@click.option("--layer", default="all", show_default=True, help="Stored layer K, a list like 0,3,6, or 'all'.")
@click.option("--penalty", default="standardized", show_default=True, type=click.Choice(["standardized", "whitened"]),
              help="The readout's L2 penalty: on standardized features' weights (scikit-learn's model) or on "
                   "whitened ones (fit-linear's default).")
@click.option("--path-rows", default="all", show_default=True, metavar="N|all",
              help="Rows the readout fits its L2 path on: all those scikit-learn fits on, or a seeded subsample of N "
                   "(fit-linear's default: 16384).")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the validation split.")
@click.option("--out", default=None, help="Write the measurements as JSON here.")
@storage_option(store="STORE")
def bench_readout(store, layer, penalty, path_rows, seed, out):
    """The logistic readout's all-layer sweep vs scikit-learn's LogisticRegression: wall time, accuracy."""
    from reservoir.bench import readout_vs_sklearn

    _check_out(out, store)
    layers = "all" if layer == "all" else _parse_layers(layer, "--layer")
    rows = None if path_rows == "all" else _path_rows(path_rows)
    r = readout_vs_sklearn(store, layers, seed=seed, penalty=penalty, path_rows=rows)
    click.echo(f"{len(r.layers)} layer(s), {r.n_train:,} train rows x {r.n_features} features, "
               f"{r.torch_threads} threads; the same validation rows and L2 grid on both sides; readout: "
               f"{r.penalty} penalty, path on {'every fit row' if rows is None else f'{r.path_rows:,} rows'}"
               + ("" if rows is None or rows == r.path_rows else f" (at most {rows:,} asked)"))
    click.echo(f"{'layer':>5}  {'reservoir s':>11}  {'test [95% CI]':<22}  {'sklearn s':>9}  test [95% CI]")
    for p in r.per_layer:
        ours, sk = p["reservoir"], p["sklearn"]
        click.echo(f"{p['layer']:>5}  {ours['fit_s']:11.2f}  {_acc(ours)}  {sk['fit_s']:9.2f}  {_acc(sk)}")
    click.echo(f"all-layer sweep: reservoir {r.reservoir_s:.2f} s, scikit-learn {r.sklearn_s:.2f} s; "
               f"scikit-learn / reservoir wall time: {r.time_ratio:.1f}x; largest test accuracy gap "
               f"{100 * r.max_accuracy_gap:.2f} points")
    if out:
        r.write(out)


def _path_rows(text: str) -> int:
    """``--path-rows N``: an integer of at least 2 (one line otherwise)."""
    try:
        rows = int(text)
    except ValueError:
        rows = 0
    if rows < 2:
        raise ReservoirError(f"--path-rows: expected 'all' or an integer >= 2, found {text!r}")
    return rows


def _acc(side) -> str:
    return f"{100 * side['test_accuracy']:6.2f}% {ci(side['test_interval'])}"
