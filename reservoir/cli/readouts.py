"""Readouts: ``fit-linear`` on a store's features, ``fit-raw`` on the raw inputs as the baseline."""

from __future__ import annotations

import click

from reservoir.cli.common import SEED, _check_out, _parse_layers, _task_from, data_options


@click.command("fit-linear")
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


@click.command("fit-raw")
@click.option("--task", default=None, help="A continuous task (images, bit XOR); or --data PATH.")
@data_options
@click.option("--param", "-p", "params", multiple=True, metavar="KEY=VALUE", help="Task parameter, repeatable.")
@click.option("--readout", default="logistic", show_default=True, type=click.Choice(["logistic", "ridge"]))
@click.option("--seed", default=0, show_default=True, type=SEED, help="Seed of the validation split.")
@click.option("--out", default=None, help="Write the result as JSON here.")
def fit_raw(task, data, input_column, label_column, params, readout, seed, out):
    """Baseline without a backbone: the same readout on the flattened raw inputs."""
    from reservoir.readouts.run import fit_raw as run_raw
    from reservoir.tasks.base import task_label

    task, task_params = _task_from(task, data, input_column, label_column, params)
    _check_out(out)
    r = run_raw(task, task_params, readout, seed=seed)
    m = r.metrics
    click.echo(f"{task_label(task, task_params)} raw inputs ({m['n_features']} features), {readout}: "
               f"train {m['train_accuracy']:.2%}, "
               f"test {m['test_accuracy']:.2%} (alpha {m['alpha']:.0e}, fit {r.timings['fit_s']:.1f} s)")
    if out:
        r.write(out)
