"""The ``reservoir`` command line: thin wrappers over the Python API.

torch, transformers and zarr are imported inside the commands, so
``reservoir --help`` answers at once. Bad input prints one line and exits
with status 2; nothing that claims to be complete is left behind.
"""

from __future__ import annotations

import json
import logging
import sys
import textwrap
from pathlib import Path
from typing import Any

import click

from reservoir import __version__
from reservoir.errors import ReservoirError
from reservoir.runtime import SEED_MAX


class _Group(click.Group):
    """Turns :class:`ReservoirError` into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.UsageError as err:
            err.ctx = None  # one line: no usage banner, no "Try --help" hint
            raise
        except ReservoirError as err:
            click.echo(f"Error: {err}", err=True)
            ctx.exit(2)
        except KeyboardInterrupt:
            click.echo("Interrupted; rerun the same command to resume.", err=True)
            ctx.exit(130)


class _EchoHandler(logging.Handler):
    """Log records as plain lines of the command's report on stdout (stderr carries only the one error line)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(record.getMessage())


#: Every --seed: what torch generators, numpy and scikit-learn's ``random_state`` all take.
SEED = click.IntRange(0, SEED_MAX)


def _parse_params(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``-p KEY=VALUE`` pairs: VALUE as JSON when it parses, else the plain text."""
    params: dict[str, Any] = {}
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"expected KEY=VALUE, found {pair!r}", param_hint="--param")
        key, value = pair.split("=", 1)
        try:
            params[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            params[key.strip()] = value
        except (RecursionError, ValueError) as err:  # nested too deeply; an integer of more than 4,300 digits
            from reservoir.tasks.files import one_line

            found = "JSON nested too deeply to read" if isinstance(err, RecursionError) else one_line(err)
            raise click.BadParameter(f"expected a JSON value or plain text for {key.strip()!r}, found {found} "
                                     f"({len(value):,} characters)", param_hint="--param") from None
    return params


def _check_out(out: str | None) -> None:
    """Refuse an --out file that cannot be written before the work whose result it will hold."""
    from reservoir.results import writable_folder

    if out is not None:
        if Path(out).is_dir():
            raise click.BadParameter(f"expected a file path, found the folder {out}", param_hint="--out")
        writable_folder(Path(out).parent)


def _parse_layers(value: str | None) -> int | list[int] | None:
    if value is None or value == "all":
        return None
    try:
        if "," in value:
            return [int(v) for v in value.split(",") if v.strip()]
        return int(value)
    except ValueError:
        raise click.BadParameter(f"expected a depth K, a list like 0,3,6 or 'all', found {value!r}") from None


@click.group(cls=_Group, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="reservoir")
def main() -> None:
    """Frozen pretrained transformers as fixed feature machines.

    Extract hidden states once (`reservoir extract`), then fit readouts from
    the store in seconds (`reservoir fit-linear`).
    """
    log = logging.getLogger("reservoir")
    if not any(isinstance(h, _EchoHandler) for h in log.handlers):
        log.addHandler(_EchoHandler())  # what the library reports (task cache hits, ...): one line each
        log.setLevel(logging.INFO)


@main.command()
@click.option("--task", required=True, help="Task name (see `reservoir tasks`).")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE",
              help="Task parameter, repeatable (e.g. -p n_train=4000 -p max_length=300).")
@click.option("--backbone", default="minilm", show_default=True,
              help="minilm, tiny-gpt2, tiny-bert, a hub id (gpt2, gpt2-medium) or a local model folder.")
@click.option("--init", default="pretrained", show_default=True, type=click.Choice(["pretrained", "random", "stats"]),
              help="Backbone weights: checkpoint, architecture's random init, or per-tensor mean/std redraw.")
@click.option("--layers", default=None, help="Depth K (store layers 0..K; blocks above K never run), a list like 0,3,6, or 'all'.")
@click.option("--out", default=None, help="Store path (.zarr folder or .h5 file). Default: cache/<task>-<backbone>-<init>.zarr")
@click.option("--format", "fmt", default=None, type=click.Choice(["zarr", "hdf5"]), help="Store backend; default from the suffix.")
@click.option("--batch-size", default=None, type=int,
              help="Most sequences per forward pass (default 64; no row cap with --max-tokens unless given).")
@click.option("--max-tokens", default=None, type=int,
              help="Token budget per forward pass (rows x longest length): short sequences travel in large batches.")
@click.option("--dtype", default="float16", show_default=True, type=click.Choice(["float16", "float32"]), help="Stored feature dtype.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--amp", default="auto", show_default=True, type=click.Choice(["auto", "bf16", "fp16", "none"]),
              help="Autocast dtype on CUDA (auto: bf16 where supported).")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the random/stats inits and the input projection.")
@click.option("--gain", default=1.41, show_default=True, type=float, help="Gain of the orthogonal input projection.")
@click.option("--revision", default=None, help="Hub revision (branch, tag or commit) for hub ids.")
@click.option("--full-seq-layer", default=None, type=int,
              help="Also store every position's state at this layer: a split-point store for `train --from-store`.")
@click.option("--truncate", is_flag=True,
              help="Keep the first max-positions tokens of longer sequences (recorded in the store) instead of failing.")
@click.option("--download", is_flag=True,
              help="Fetch the dataset files from their usual source first (mnist, fashion-mnist, cifar10, cifar10-lra).")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def extract(task, params, backbone, init, layers, out, fmt, batch_size, max_tokens, dtype, device, amp, seed, gain,
            revision, full_seq_layer, truncate, download, quiet):
    """Run a task through a frozen backbone once and store every layer's features."""
    from reservoir.extraction import ExtractConfig
    from reservoir.extraction import run as run_extract
    from reservoir.store import FeatureStore

    task_params = _parse_params(params)
    if download:
        task_params["download"] = True
    config = ExtractConfig(task=task, backbone=backbone, init=init, layers=_parse_layers(layers), out=out, format=fmt,
                           task_params=task_params, seed=seed, projection_gain=gain, batch_size=batch_size,
                           max_tokens=max_tokens, dtype=dtype, device=device, amp=amp, revision=revision, truncate=truncate,
                           full_seq_layer=full_seq_layer)
    path = run_extract(config, progress=not quiet)
    with FeatureStore.open(path) as store:
        shapes = ", ".join(f"{s} {tuple(store.features(s).shape)}" for s in store.splits)
        click.echo(f"wrote {path} ({store.format}): {shapes}; layers {store.layers}")


@main.command()
@click.argument("store", type=click.Path())
@click.option("--json", "as_json", is_flag=True, help="Print the store's attributes as JSON.")
@click.option("--verify", is_flag=True, help="Read every written chunk and check it against its checksums.")
def info(store, as_json, verify):
    """Print a store's provenance, splits, shapes, layers and completeness (--verify: check every chunk)."""
    from reservoir.store import FeatureStore
    from reservoir.store.lock import describe, holder

    with FeatureStore.open(store, allow_incomplete=True) as st:
        if as_json:
            click.echo(json.dumps(st.attrs, indent=2))
        else:
            _describe_store(st)
            if not st.complete:
                writer = holder(st.path)
                click.echo(f"status     {'being written by ' + describe(writer) if writer is not None else 'interrupted'}"
                           f"{'' if writer is not None else '; rerun the extract command to finish it'}")
        if verify:
            bad = st.verify(progress=sys.stderr.isatty())
            for split in st.splits:
                done = st.done(split)
                found = bad.get(split, {})
                click.echo(f"verify     {split}: {int(done.sum()) - len(found)}/{int(done.sum())} written chunks "
                           "match their checksums")
                for c, reason in sorted(found.items()):
                    click.echo(f"           chunk {c}: {reason}")
            if bad:
                raise ReservoirError(f"{st.path}: {sum(map(len, bad.values()))} damaged chunk(s); rerun the extract "
                                     "command that wrote it to re-extract them")


def _describe_store(st) -> None:
    a = st.attrs
    bb, task = a["backbone"], a["task"]
    click.echo(f"store      {st.path} ({st.format}, schema {a['schema']}, reservoir {a.get('reservoir_version')})")
    click.echo(f"complete   {st.complete}   created {a.get('created')}")
    click.echo(f"backbone   {bb['id']} ({bb['family']}, {bb['n_layer']} layers, {bb['n_dim']} dim) "
               f"init={bb['init']} seed={bb['seed']} revision={bb.get('revision')}")
    click.echo(f"weights    sha256 {bb['weights_sha256'][:16]}...")
    click.echo(f"task       {task['name']} {json.dumps(task['params'], sort_keys=True)}")
    click.echo(f"           fingerprint {task['fingerprint'][:16]}...  classes {task['n_classes']}  "
               f"label shape {task['label_shape']}")
    p = a["projection"]
    click.echo(f"projection {p['kind']} d_in={p['d_in']} gain={p['gain']} seed={p['seed']} ({p['input']} inputs)")
    click.echo(f"layers     {st.layers}   pooling {a['pooling']['kind']} x{a['pooling']['n_out_tokens']}   "
               f"dtype {a['dtype']}   final norm {'stored' if st.final_norm() is not None else 'none'}")
    if st.full_seq_layer is not None:
        click.echo(f"split      every position's state at layer {st.full_seq_layer} (train --from-store)")
    if task.get("truncated"):
        click.echo(f"truncated to {task['truncated']['max_tokens']} tokens; rows cut: {task['truncated']['rows_cut']}")
    for split in st.splits:
        done = st.done(split)
        click.echo(f"  {split:<10} features {st.shape(split, 'features')}  labels "
                   f"{st.shape(split, 'labels')}  chunks {int(done.sum())}/{len(done)} done")


@main.command("fit-linear")
@click.argument("store", type=click.Path())
@click.option("--layer", default="all", show_default=True, help="Layer K, a list like 0,3,6, or 'all' (a depth sweep).")
@click.option("--readout", default="logistic", show_default=True, type=click.Choice(["logistic", "ridge"]),
              help="Multinomial logistic (L-BFGS, whitened) or closed-form ridge (one-vs-rest, streamed statistics).")
@click.option("--stream", default="off", show_default=True, type=click.Choice(["off", "on", "auto"]),
              help="Fit from store chunks instead of loading the layer; auto streams above 2 GiB of float32 features.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the validation split.")
@click.option("--results", "results_dir", default="results/fit-linear", show_default=True, help="Folder for the results JSONs.")
@click.option("--device", default="cpu", show_default=True, help="Torch device for the fit.")
@click.option("--no-final-norm", is_flag=True, help="Read raw layer features (skip the backbone's final norm).")
def fit_linear(store, layer, readout, stream, seed, results_dir, device, no_final_norm):
    """Fit a linear readout on stored features; print train/val/test accuracy per layer."""
    from reservoir.readouts.run import fit_linear as run_fit

    layers = "all" if layer == "all" else _parse_layers(layer)

    def show(r):
        if r is None:
            click.echo(f"{'layer':>5}  {'train':>7}  {'val':>7}  {'test':>7}  {'alpha':>7}  {'fit s':>6}")
            return
        m = r.metrics
        click.echo(f"{r.config['layer']:>5}  {m['train_accuracy']:7.2%}  {m['val_accuracy']:7.2%}  "
                   f"{m['test_accuracy']:7.2%}  {m['alpha']:7.0e}  {r.timings['fit_s']:6.1f}")

    results = run_fit(store, layers, readout, seed=seed, device=device, final_norm=not no_final_norm,
                      stream={"off": False, "on": True, "auto": "auto"}[stream], results_dir=results_dir,
                      on_result=show)
    click.echo(f"majority-class test accuracy: {results[-1].metrics['chance']:.2%}")
    click.echo(f"results in {results_dir}/")


@main.command()
@click.option("--task", default=None, help="Task name (see `reservoir tasks`); not needed with --from-store.")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Task parameter, repeatable.")
@click.option("--from-store", default=None, type=click.Path(),
              help="Split-point store (extract --full-seq-layer S): run only blocks S+1..K live.")
@click.option("--backbone", default="minilm", show_default=True, help="Backbone name, hub id or local folder.")
@click.option("--init", default="pretrained", show_default=True, type=click.Choice(["pretrained", "random", "stats"]),
              help="Backbone weights.")
@click.option("--layers", default=None, type=int, help="Depth K: keep blocks 1..K (default all).")
@click.option("--finetune", default="fpt", show_default=True,
              help="Groups to train: fpt (input,positions,layernorm,output), all, output, or a comma list of "
                   "input, positions, layernorm, attention, feedforward, recurrent (LSTM), output.")
@click.option("--lr", default=1e-3, show_default=True, type=float, help="Adam learning rate.")
@click.option("--lr-sweep", default=None, metavar="LOW:HIGH:N",
              help="Sweep N log-spaced learning rates; pick by mean validation accuracy (Rothermel et al.).")
@click.option("--seeds", default=1, show_default=True, type=int, help="Seeds per learning rate (with --lr-sweep).")
@click.option("--steps", default=None, type=int, help="Optimizer steps (default 2000 unless --epochs).")
@click.option("--epochs", default=None, type=float, help="Passes over the training split.")
@click.option("--batch-size", default=16, show_default=True, type=int, help="Sequences per step.")
@click.option("--eval-every", default=100, show_default=True, type=int, help="Steps between validation passes.")
@click.option("--dropout", default=0.0, show_default=True, type=float, help="Dropout inside the backbone in training.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of inits, projection, head and data order.")
@click.option("--split-layer", default=0, show_default=True, type=int,
              help="Train only blocks above this layer (what a split-point store at this layer allows).")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--out", default=None, help="Run folder (checkpoints, results.json); default results/train/<run>.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(task, params, from_store, backbone, init, layers, finetune, lr, lr_sweep, seeds, steps, epochs, batch_size,
          eval_every, dropout, seed, split_layer, device, out, quiet):
    """Train live with the backbone in the loop; freeze everything but the --finetune groups."""
    from reservoir.training import TrainConfig, config_for_store, parse_lr_sweep, run, sweep

    if seeds < 1:
        raise click.BadParameter(f"expected at least 1, found {seeds}", param_hint="--seeds")
    settings = dict(backbone=backbone, layers=layers, finetune=finetune, lr=lr, steps=steps, epochs=epochs,
                    batch_size=batch_size, eval_every=eval_every, dropout=dropout, split_layer=split_layer,
                    device=device, out=out)
    if from_store is not None:  # the store says which task, init, seed (and split layer)
        config = config_for_store(from_store, **settings)
    elif task is None:
        raise click.UsageError("Missing option '--task' (or pass --from-store).")
    else:
        config = TrainConfig(task=task, task_params=_parse_params(params), init=init, seed=seed, **settings)
    if lr_sweep is not None:
        s = sweep(config, parse_lr_sweep(lr_sweep), seeds, progress=not quiet)
        for lr_value, acc in s.mean_val_by_lr.items():
            click.echo(f"lr {float(lr_value):8.2e}  mean val {acc:7.2%}")
        click.echo(f"best lr {s.best_lr:.2e}: test {s.metrics['test_accuracy_mean']:.2%} +- "
                   f"{s.metrics['test_accuracy_std']:.2%} over {seeds} seed(s)")
        return
    m = run(config, progress=not quiet).metrics
    click.echo(f"test accuracy {m['test_accuracy']:.2%} (best val {m['best_val_accuracy']:.2%} at step "
               f"{m['best_step']}; within 1 point of best from step {m['steps_to_converge']})")
    click.echo(f"results in {Path(config.out or config.default_out()) / 'results.json'}")


@main.command("fit-raw")
@click.option("--task", required=True, help="A continuous task (images, bit XOR).")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Task parameter, repeatable.")
@click.option("--readout", default="logistic", show_default=True, type=click.Choice(["logistic", "ridge"]))
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the validation split.")
@click.option("--out", default=None, help="Write the result as JSON here.")
def fit_raw(task, params, readout, seed, out):
    """Baseline without a backbone: the same readout on the flattened raw inputs."""
    from reservoir.readouts.run import fit_raw as run_raw

    _check_out(out)
    r = run_raw(task, _parse_params(params), readout, seed=seed)
    m = r.metrics
    click.echo(f"{task} raw inputs ({m['n_features']} features), {readout}: train {m['train_accuracy']:.2%}, "
               f"test {m['test_accuracy']:.2%} (alpha {m['alpha']:.0e}, fit {r.timings['fit_s']:.1f} s)")
    if out:
        r.write(out)


@main.group()
def bench():
    """Benchmarks: what caching buys."""


@bench.command("extract")
@click.option("--task", required=True, help="Task name (see `reservoir tasks`).")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Task parameter, repeatable.")
@click.option("--backbone", default="minilm", show_default=True, help="Backbone name, hub id or local folder.")
@click.option("--init", default="pretrained", show_default=True, type=click.Choice(["pretrained", "random", "stats"]))
@click.option("--layers", default=None, help="Depth K, a list like 0,3,6, or 'all'.")
@click.option("--format", "fmt", default="zarr", show_default=True, type=click.Choice(["zarr", "hdf5"]),
              help="Backend of the temporary store.")
@click.option("--batch-size", default=None, type=int, help="Most sequences per forward (default 64 without --max-tokens).")
@click.option("--max-tokens", default=None, type=int, help="Token budget per forward (rows x longest length).")
@click.option("--dtype", default="float16", show_default=True, type=click.Choice(["float16", "float32"]))
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--amp", default="auto", show_default=True, type=click.Choice(["auto", "bf16", "fp16", "none"]))
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the inits and the input projection.")
@click.option("--full-seq-layer", default=None, type=int, help="Also store every position at this layer.")
@click.option("--truncate", is_flag=True, help="Cut sequences longer than the backbone's positions.")
@click.option("--naive-rows", default=128, show_default=True, type=int,
              help="Rows the naive way (full model, padded to the maximum, fp32) is timed on, then scaled.")
@click.option("--out", default=None, help="Write the measurements as JSON here.")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def bench_extract(task, params, backbone, init, layers, fmt, batch_size, max_tokens, dtype, device, amp, seed,
                  full_seq_layer, truncate, naive_rows, out, quiet):
    """Extraction vs a bare forward of the same model on the same batches, vs HF's forward, vs the naive way."""
    from reservoir.bench import bench_extract as run_bench
    from reservoir.bench import format_extract
    from reservoir.extraction import ExtractConfig
    from reservoir.results import write_result

    if naive_rows < 1:
        raise click.BadParameter(f"expected a positive number of rows, found {naive_rows}", param_hint="--naive-rows")
    _check_out(out)
    config = ExtractConfig(task=task, backbone=backbone, init=init, layers=_parse_layers(layers), format=fmt,
                           task_params=_parse_params(params), seed=seed, batch_size=batch_size,
                           max_tokens=max_tokens, dtype=dtype, device=device, amp=amp, truncate=truncate,
                           full_seq_layer=full_seq_layer)
    r = run_bench(config, naive_rows=naive_rows, progress=not quiet)
    click.echo(format_extract(r))
    if out:
        write_result(out, {"kind": "bench-extract", **r})


@bench.command("speedup")
@click.option("--task", required=True, help="Task name.")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Task parameter, repeatable.")
@click.option("--backbone", default="minilm", show_default=True, help="Backbone name, hub id or local folder.")
@click.option("--init", default="pretrained", show_default=True, type=click.Choice(["pretrained", "random", "stats"]))
@click.option("--layers", default=None, type=int, help="Depth K (default all).")
@click.option("--split-layer", default=None, type=int, help="Split point s for (b); default K-1 (tune the top block).")
@click.option("--batch-size", default=16, show_default=True, type=int, help="Rows per optimizer step.")
@click.option("--max-live-rows", default=1024, show_default=True, type=int,
              help="Rows timed for each live epoch (scaled to the full epoch).")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of inits, projection, head and data order.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--out", default=None, help="Write the measurements as JSON here.")
def bench_speedup(task, params, backbone, init, layers, split_layer, batch_size, max_live_rows, seed, device, out):
    """Per-epoch cost of training live vs from a store, and the break-even number of epochs."""
    from reservoir.bench import format_speedup, speedup
    from reservoir.results import write_result

    _check_out(out)
    r = speedup(task, _parse_params(params), backbone, init, layers, split_layer, batch_size, max_live_rows, seed,
                device)
    click.echo(format_speedup(r))
    if out:
        write_result(out, {"kind": "bench-speedup", **r})


@bench.command("readout")
@click.argument("store", type=click.Path())
@click.option("--layer", required=True, type=int, help="Stored layer to fit.")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the validation split.")
@click.option("--out", default=None, help="Write the measurements as JSON here.")
def bench_readout(store, layer, seed, out):
    """fit-linear's logistic readout vs scikit-learn's LogisticRegression: wall time and accuracy."""
    from reservoir.bench import readout_vs_sklearn

    _check_out(out)
    r = readout_vs_sklearn(store, layer, seed=seed)
    click.echo(f"layer {layer}, {r.n_train} train rows x {r.n_features} features, {r.torch_threads} threads")
    for name, side in (("reservoir", r.reservoir), ("sklearn", r.sklearn)):
        click.echo(f"{name:<10} fit {side['fit_s']:7.2f} s   test {side['test_accuracy']:.2%}")
    click.echo(f"scikit-learn / reservoir wall time: {r.time_ratio:.1f}x")
    if out:
        r.write(out)


@main.group()
def recipe():
    """Declarative experiments: recipes/*.yaml grids of extractions, readouts and training runs."""


@recipe.command("list")
def recipe_list():
    """List the recipes shipped with the package (or in $RESERVOIR_RECIPES)."""
    from reservoir.recipes import list_recipes, recipes_dir

    for name, description in list_recipes():
        click.echo(f"{name:<24} {textwrap.shorten(description, 110, placeholder=' ...')}")
    click.echo(f"(from {recipes_dir().resolve()})")


@recipe.command("run")
@click.argument("ref", metavar="NAME|PATH")
@click.option("--out", default=None, help="Results folder. Default: results/<recipe name>.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--cache", "cache_dir", default="cache/recipes", show_default=True,
              help="Where fit-linear feature stores are kept (reused across recipes when settings match).")
@click.option("--force", is_flag=True, help="Redo runs whose results already exist.")
@click.option("--quiet", is_flag=True, help="No progress bar or per-run lines.")
@click.option("--dry-run", is_flag=True, help="List the runs and the work they ask for; run nothing.")
def recipe_run(ref, out, device, cache_dir, force, quiet, dry_run):
    """Run every cell of a recipe; skip runs whose results exist, reuse matching feature stores."""
    from reservoir.recipes import plan, run_recipe

    if dry_run:
        rows = plan(ref, out)
        for r in rows:
            if r["kind"] == "train":
                work = (f"{r['steps']:,} steps, {r['sequences']:,} sequences" if r["steps"] else f"{r['epochs']:g} epochs")
                work += f" ({r['trainings']} trainings)" if r["trainings"] > 1 else ""
            elif r["kind"] in ("fit-linear", "bench"):
                depth = "all" if r["extraction_layers"] is None else r["extraction_layers"]
                work = f"one extraction, depth {depth}" + (", then timed epochs" if r["kind"] == "bench" else "")
            else:
                work = "readout on raw inputs"
            click.echo(f"{'done' if r['done'] else 'todo'}  {r['id']}  [{work}]")
        todo = [r for r in rows if not r["done"]]
        click.echo(f"{len(rows)} run(s), {len(todo)} to do: {sum(r['steps'] for r in todo):,} optimizer steps "
                   f"({sum(r['sequences'] for r in todo):,} training sequences), "
                   f"{sum(r['kind'] in ('fit-linear', 'bench') for r in todo)} extraction(s)")
        return

    r = run_recipe(ref, out=out, device=device, force=force, progress=not quiet, cache_dir=cache_dir)
    click.echo(f"{len(r['ran'])} run(s) done, {len(r['skipped'])} skipped; results in {r['out']}/ "
               f"(reservoir report {r['out']})")


@main.command()
@click.argument("results_dir", type=click.Path())
@click.option("--no-plots", is_flag=True, help="Only the markdown table.")
def report(results_dir, no_plots):
    """Markdown table of a recipe's results beside the paper's numbers, plus PNG plots."""
    from reservoir.report import report as make_report

    r = make_report(results_dir, plots=not no_plots)
    click.echo(r.markdown, nl=False)
    for path in r.files:
        click.echo(f"wrote {path}")


@main.group(cls=_Group)
def plot():
    """Figures of trained models (attention maps)."""


@plot.command("attention")
@click.option("--run", "run_dir", default=None, type=click.Path(),
              help="A finished `reservoir train` folder. Default: the folder `reservoir train` would use for the "
                   "options below, trained first if it holds no finished run.")
@click.option("--task", default=None, help="Task to train on when --run is not given (e.g. bit-xor).")
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Task parameter, repeatable.")
@click.option("--backbone", default="minilm", show_default=True, help="Backbone name, hub id or local folder.")
@click.option("--init", default="pretrained", show_default=True, type=click.Choice(["pretrained", "random", "stats"]))
@click.option("--finetune", default="fpt", show_default=True, help="Groups trained (as in `reservoir train`).")
@click.option("--lr", default=1e-3, show_default=True, type=float, help="Adam learning rate.")
@click.option("--steps", default=None, type=int, help="Optimizer steps (default 2000).")
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of inits, projection, head and data order.")
@click.option("--layer", default=1, show_default=True, type=int, help="Block whose attention is drawn (1 = first).")
@click.option("--example", default=0, show_default=True, type=int, help="Index of the example drawn.")
@click.option("--split", default="test", show_default=True, help="Split the example comes from.")
@click.option("--device", default="auto", show_default=True, help="cpu, cuda, cuda:N or auto.")
@click.option("--out", default=None, help="PNG path. Default: <run>/attention-layer<L>-example<N>.png.")
def plot_attention(run_dir, task, params, backbone, init, finetune, lr, steps, seed, layer, example, split, device,
                   out):
    """Attention map of one block of a trained model (Lu et al., Figures 3-5)."""
    from reservoir.attention import attention, summary
    from reservoir.attention import plot_attention as draw

    if run_dir is None:
        from reservoir.settings import first_difference
        from reservoir.training import TrainConfig, run, run_config

        if task is None:
            raise click.UsageError("Missing option '--task' (or pass --run).")
        config = TrainConfig(task=task, task_params=_parse_params(params), backbone=backbone, init=init,
                             finetune=finetune, lr=lr, steps=steps, seed=seed, device=device)
        run_dir = config.default_out()
        if (Path(run_dir) / "results.json").is_file():
            diff = first_difference(run_config(run_dir).key(), config.key())
            if diff is not None:
                key, found, given = diff
                raise ReservoirError(f"{run_dir} holds a run with {key}={found!r}, these options give {given!r}; "
                                     "pass --run, or remove that folder")
            click.echo(f"using the finished run in {run_dir}")
        else:
            m = run(config).metrics
            click.echo(f"trained: test accuracy {m['test_accuracy']:.2%}")
    maps = attention(run_dir, layer=layer, example=example, split=split, device=device)
    path = draw(maps, out or Path(run_dir) / f"attention-layer{layer}-example{example}.png")
    click.echo(f"readout token, layer {layer}, strongest keys per head (mean over {maps['n_averaged']} examples):")
    click.echo(summary(maps))
    click.echo(f"wrote {path}")


@main.command()
def tasks():
    """List the registered tasks, their defaults and where their data comes from."""
    from reservoir.tasks import TASKS

    for name in sorted(TASKS):
        spec = TASKS[name]
        click.echo(f"{name:<16} {spec.summary}")
        click.echo(f"{'':<16} tokens: {spec.tokens or '?'}   input dim: {spec.d_in or '?'}   "
                   f"classes: {spec.classes or '?'}   splits: {spec.splits}")
        click.echo(f"{'':<16} data: {spec.source}")
        click.echo(f"{'':<16} params: {json.dumps(spec.defaults)}")


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
