"""Live training: ``train`` with the backbone in the loop, ``plot attention`` of a trained model."""

from __future__ import annotations

from pathlib import Path

import click

from reservoir.cli.common import (DEPTH, _Group, _task_from, ci, data_options, step_options, storage_option,
                                   train_option)
from reservoir.training.config import DEFAULT_STEPS


@click.command()
@train_option("task", default=None)
@data_options
@train_option("task_params", "--param", "-p", "params", multiple=True, metavar="KEY=VALUE", default=None)
@train_option("from_store", type=click.Path())
@train_option("backbone")
@train_option("init")
@train_option("revision")
@train_option("projection")
@train_option("layers", type=DEPTH)
@train_option("finetune")
@train_option("lr")
@click.option("--lr-sweep", default=None, metavar="LOW:HIGH:N",
              help="Sweep N log-spaced learning rates; pick by mean validation accuracy (Rothermel et al.).")
@click.option("--seeds", default=1, show_default=True, type=int, help="Seeds per learning rate (with --lr-sweep).")
@train_option("steps")
@train_option("epochs")
@train_option("batch_size")
@train_option("eval_every")
@train_option("dropout")
@train_option("seed")
@train_option("split_layer")
@train_option("device")
@step_options
@train_option("out")
@storage_option(from_store="--from-store")
@click.option("--quiet", is_flag=True, help="No progress bar.")
def train(task, data, input_column, label_column, params, from_store, backbone, init, revision, projection, layers,
          finetune, lr, lr_sweep, seeds, steps, epochs, batch_size, eval_every, dropout, seed, split_layer, device, amp,
          cuda_graphs, compiled, out, quiet):
    """Train live with the backbone in the loop; freeze everything but the --finetune groups."""
    from reservoir.training import TrainConfig, config_for_store, parse_lr_sweep, run, sweep

    if seeds < 1:
        raise click.BadParameter(f"expected at least 1, found {seeds}", param_hint="--seeds")
    if seeds != 1 and lr_sweep is None:
        raise click.UsageError(f"--seeds {seeds} applies to an lr sweep: pass --lr-sweep LOW:HIGH:N, or drop --seeds")
    if steps is not None and epochs is not None:
        raise click.UsageError(f"expected --steps or --epochs, not both; found --steps {steps} and --epochs {epochs:g}")
    if lr_sweep is not None and _explicit(click.get_current_context(), {"lr": "lr"}):
        raise click.UsageError(f"expected --lr or --lr-sweep, not both (the sweep chooses the rate); found --lr {lr:g} "
                               f"and --lr-sweep {lr_sweep}")
    settings = dict(backbone=backbone, revision=revision, projection=projection, layers=layers, finetune=finetune,
                    lr=lr, steps=steps, epochs=epochs, batch_size=batch_size, eval_every=eval_every, dropout=dropout,
                    split_layer=split_layer, device=device, amp=amp, cuda_graphs=cuda_graphs, compile=compiled, out=out)
    task, task_params = _task_from(task, data, input_column, label_column, params, alternative="--from-store")
    if from_store is not None:  # the store says which task and init (and split layer, or backbone); --seed is ours
        given = _explicit(click.get_current_context(), {"task": "task", "data": "task", "params": "task_params",
                                                        "init": "init", "seed": "seed", "backbone": "backbone",
                                                        "revision": "revision", "projection": "projection",
                                                        "split_layer": "split_layer"})
        if "task" in given:
            given.add("task_params")
        config = config_for_store(from_store, given=given, task=task, task_params=task_params, init=init, seed=seed,
                                  **settings)
    elif task is None:
        raise click.UsageError("Missing option '--task' (or pass --from-store); or --data PATH.")
    else:
        config = TrainConfig(task=task, task_params=task_params, init=init, seed=seed, **settings)
    if lr_sweep is not None:
        s = sweep(config, parse_lr_sweep(lr_sweep), seeds, progress=not quiet)
        for lr_value, acc in s.mean_val_by_lr.items():
            click.echo(f"lr {float(lr_value):8.2e}  mean val {acc:7.2%}")
        click.echo(f"best lr {s.best_lr:.2e}: test {s.metrics['test_accuracy_mean']:.2%} +- "
                   f"{s.metrics['test_accuracy_std']:.2%} over {seeds} seed(s) {ci(s.metrics['test_interval'])}")
        return
    m = run(config, progress=not quiet).metrics
    settled = (f"within 1 point of best from step {m['steps_to_converge']}" if m["steps_to_converge"] is not None
               else f"the last validation {m['final_val_accuracy']:.2%} is more than 1 point below it")
    click.echo(f"test accuracy {m['test_accuracy']:.2%} {ci(m['test_interval'])} (best val "
               f"{m['best_val_accuracy']:.2%} {ci(m['best_val_interval'])} at step {m['best_step']}; {settled})")
    click.echo(f"results in {Path(config.out or config.default_out()) / 'results.json'}")


def _explicit(ctx: click.Context, names: dict[str, str]) -> set[str]:
    """The settings (``names``: option parameter -> setting) given on the command line or in the environment."""
    from click.core import ParameterSource

    return {setting for param, setting in names.items()
            if ctx.get_parameter_source(param) in (ParameterSource.COMMANDLINE, ParameterSource.ENVIRONMENT)}


@click.group(cls=_Group)
def plot():
    """Figures of trained models (attention maps)."""


@plot.command("attention")
@click.option("--run", "run_dir", default=None, type=click.Path(),
              help="A finished `reservoir train` folder. Default: the folder `reservoir train` would use for the "
                   "options below, trained first if it holds no finished run.")
@train_option("task", default=None, help="Task to train on when --run is not given (e.g. bit-xor); or --data PATH.")
@data_options
@train_option("task_params", "--param", "-p", "params", multiple=True, metavar="KEY=VALUE", default=None)
@train_option("backbone")
@train_option("init")
@train_option("finetune")
@train_option("lr")
@train_option("steps", help=f"Optimizer steps of the run trained first (default {DEFAULT_STEPS}).")
@train_option("seed")
@click.option("--layer", default=1, show_default=True, type=int, help="Block whose attention is drawn (1 = first).")
@click.option("--example", default=0, show_default=True, type=int, help="Index of the example drawn.")
@click.option("--split", default="test", show_default=True, help="Split the example comes from.")
@train_option("device")
@click.option("--out", default=None, help="Figure path (.png, .pdf, .svg, ...; no suffix: .png). Default: "
                                          "<run>/attention-layer<L>-example<N>.png.")
def plot_attention(run_dir, task, data, input_column, label_column, params, backbone, init, finetune, lr, steps, seed,
                   layer, example, split, device, out):
    """Attention map of one block of a trained model (Lu et al., Figures 3-5)."""
    from reservoir.io import check_local, writable_folder
    from reservoir.training.attention import attention, figure_path, summary
    from reservoir.training.attention import plot_attention as draw

    ctx = click.get_current_context()
    training = _explicit(ctx, {n: n for n in ("task", "data", "params", "backbone", "init", "finetune", "lr", "steps",
                                               "seed")})
    if run_dir is not None and training:  # the run's own settings are drawn, not these
        flags = ", ".join(sorted("-p" if n == "params" else f"--{n}" for n in training))
        raise click.UsageError(f"expected --run or the options of a run to train, not both; found --run with {flags}")
    if out is not None:  # before any training or drawing
        if not out.strip():
            raise click.BadParameter("expected a figure file path; found an empty one", param_hint="--out")
        check_local(out, "a figure path")
        out = figure_path(out)
        writable_folder(out.absolute().parent)

    if run_dir is None:
        from reservoir.training import TrainConfig
        from reservoir.training.builders import finished_or_run

        task, task_params = _task_from(task, data, input_column, label_column, params, alternative="--run")
        if task is None:
            raise click.UsageError("Missing option '--task' (or pass --run); or --data PATH.")
        config = TrainConfig(task=task, task_params=task_params, backbone=backbone, init=init,
                             finetune=finetune, lr=lr, steps=steps, seed=seed, device=device)
        run_dir, trained = finished_or_run(config)
        if trained is None:
            click.echo(f"using the finished run in {run_dir}")
        else:
            click.echo(f"trained: test accuracy {trained.metrics['test_accuracy']:.2%} "
                       f"{ci(trained.metrics['test_interval'])}")
    maps = attention(run_dir, layer=layer, example=example, split=split, device=device)
    path = draw(maps, out or Path(run_dir) / f"attention-layer{layer}-example{example}.png")
    click.echo(f"readout token, layer {layer}, strongest keys per head (mean over {maps['n_averaged']} examples):")
    click.echo(summary(maps))
    click.echo(f"wrote {path}")
