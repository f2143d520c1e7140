"""Declarative experiments: the ``recipe`` group runs a grid, ``report`` tabulates and plots its results."""

from __future__ import annotations

import textwrap

import click

from reservoir import options
from reservoir.cli.common import setting_option, storage_option


@click.group()
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
@setting_option(options.DEVICE)
@click.option("--cache", "cache_dir", default="cache/recipes", show_default=True,
              help="Where fit-linear feature stores are kept (reused across recipes when settings match); a folder "
                   "or an object-store URL (s3://bucket/prefix).")
@click.option("--force", is_flag=True, help="Redo runs whose results already exist.")
@click.option("--quiet", is_flag=True, help="No progress bars and no line per finished run (each training still "
                                               "prints its trainable parameter counts, each task where it was read).")
@click.option("--dry-run", is_flag=True, help="List the runs and the work they ask for; run nothing.")
@storage_option(cache_dir="--cache")
def recipe_run(ref, out, device, cache_dir, force, quiet, dry_run):
    """Run every cell of a recipe; skip runs whose results exist, reuse matching feature stores."""
    from reservoir.recipes import plan, run_recipe

    if dry_run:
        rows = plan(ref, out, force=force)
        for r in rows:
            if r["kind"] == "train":
                work = (f"{r['steps']:,} steps, {r['sequences']:,} sequences" if r["steps"] else f"{r['epochs']:g} epochs")
                work += f" ({r['trainings']} trainings)" if r["trainings"] > 1 else ""
            elif r["kind"] in ("fit-linear", "bench"):
                depth = "all" if r["extraction_layers"] is None else r["extraction_layers"]
                work = f"one extraction, depth {depth}" + (", then timed epochs" if r["kind"] == "bench" else "")
            else:
                work = "readout on raw inputs"
            redo = r["state"] in ("foreign", "stale") or force and r["state"] == "done"
            state = "done" if r["done"] else "redo" if redo else "todo"
            why = f" ({r['why']})" if r["why"] and not r["done"] else ""
            click.echo(f"{state}  {r['id']}  [{work}]{why}")
        todo = [r for r in rows if not r["done"]]
        click.echo(f"{len(rows)} run(s), {len(todo)} to do: {sum(r['steps'] for r in todo):,} optimizer steps "
                   f"({sum(r['sequences'] for r in todo):,} training sequences), "
                   f"{sum(r['kind'] in ('fit-linear', 'bench') for r in todo)} extraction(s) at most (a fit-linear "
                   "store already in --cache is reused)")
        return

    r = run_recipe(ref, out=out, device=device, force=force, progress=not quiet, cache_dir=cache_dir)
    click.echo(f"{len(r['ran'])} run(s) done, {len(r['skipped'])} skipped; results in {r['out']}/ "
               f"(reservoir report {r['out']})")


@click.command()
@click.argument("results_dir", type=click.Path())
@click.option("--no-plots", is_flag=True, help="Only the markdown table.")
def report(results_dir, no_plots):
    """Markdown table of a recipe's results beside the paper's numbers, plus PNG plots."""
    from reservoir.report import report as make_report

    r = make_report(results_dir, plots=not no_plots)
    click.echo(r.markdown, nl=False)
    for path in r.files:
        click.echo(f"wrote {path}")
