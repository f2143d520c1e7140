"""``reservoir report``: a recipe's results as a markdown table beside the paper's numbers, plus plots.

The results folder written by :func:`reservoir.recipes.run_recipe` holds the
recipe (``recipe.yaml``) and one folder per run. The recipe is expanded again
to find each run's result files; runs are grouped into rows by their label
(task, tag, backbone, init, layer, readout or finetune and lr: everything but
the seed). A row shows the test accuracy (mean ± population std over seeds
when there are several; an lr sweep's row is its chosen lr's test accuracy
over the sweep's seeds), the number of seeds, and the first ``paper:`` entry of
the recipe whose ``match`` fits the row's label.

Plots (matplotlib, Agg, no pyplot state): ``depth.png`` test accuracy vs layer
per task, one line per backbone/init/readout, when fit-linear results span more
than one layer (paper values as crosses); ``curves.png`` validation accuracy vs
step of every train run; ``lr_sweep.png`` mean validation accuracy vs lr per
swept variant (log x).

The rows are read and tabled in :mod:`reservoir.report.rows`, the figures drawn
in :mod:`reservoir.report.plots`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from reservoir.errors import ReservoirError
from reservoir.io import atomic_write, check_inside, check_name
from reservoir.pairs import compare, markdown_pairs, markdown_text as _text
from reservoir.recipes import load_recipe
from reservoir.report.plots import plot_curves, plot_depth, plot_sweeps
from reservoir.report.rows import Row, collect, markdown_table, row_name

#: Lines of the "Not compared" list shown in full.
_SHOWN = 10

__all__ = ["Report", "Row", "collect", "markdown_table", "plot_curves", "plot_depth", "plot_sweeps", "report"]


@dataclass
class Report:
    """The rendered markdown and every file written (``report.md`` first)."""

    markdown: str
    files: list[Path]
    rows: list[Row]
    comparisons: list = field(default_factory=list)

    def __str__(self) -> str:
        return self.markdown



def report(results_dir: str | Path, plots: bool = True) -> Report:
    """Render ``results_dir`` (a ``reservoir recipe run`` output): write ``report.md`` and the PNGs.

    Examples
    --------
    >>> r = report("results/quickstart")  # doctest: +SKIP
    >>> print(r.markdown); print(r.files)  # doctest: +SKIP
    """
    d = Path(results_dir)
    check_name(d)
    if not d.is_dir():
        raise ReservoirError(f"{d}: expected a results folder (written by `reservoir recipe run`), found "
                             f"{'a file' if d.exists() else 'no such folder'}")
    if not (d / "recipe.yaml").is_file():
        raise ReservoirError(f"{d}: expected a results folder with recipe.yaml (written by `reservoir recipe run`), "
                             "found none")
    check_inside(d / "recipe.yaml", d, "the recipe's copy")
    from reservoir.recipes.state import recipe_folder

    recipe = load_recipe(d / "recipe.yaml", folder=recipe_folder(d))  # relative data paths as the run took them
    outdated: list[str] = []
    rows, curves, sweeps = collect(d, recipe, outdated)
    figures = []
    if plots:
        for fn, data, name in ((plot_depth, rows, "depth.png"), (plot_curves, curves, "curves.png"),
                               (plot_sweeps, sweeps, "lr_sweep.png")):
            written = fn(data, d / name)
            if written is not None:
                figures.append(written)
            elif (d / name).is_file() or (d / name).is_symlink():  # an earlier render's figure of rows gone since
                (d / name).unlink()
    parts = [f"# {recipe.name}", ""]
    if recipe.description:  # as text: a table, a link or HTML in it is shown, not rendered
        parts += [_text(recipe.description).replace("|", "\\|"), ""]
    note = ("Test accuracy on the full test split with its 95% interval over the test rows; with several seeds, "
            "mean ± std (population) over seeds and the interval of that mean. Paper values are from the recipe's "
            "`paper:` entries.")
    parts += [markdown_table(rows), "", note, ""]
    if outdated:
        parts += [f"**Not current:** {len(outdated)} results file(s) hold another run's results, or this recipe's "
                  "with other settings (the recipe was edited since), and show as not run; `reservoir recipe run` "
                  f"redoes them. First: {_text(outdated[0])}.", ""]
    unpaired = [f"{row_name(r.label)} ({why})" for r in rows if (why := r.unscored()) is not None]
    comparisons = compare([sc for r in rows if (sc := r.scored()) is not None], unpaired)
    if comparisons:
        parts += ["## Paired differences", "",
                  "Rows scored on the same test rows, from runs with the same settings and seeds but for what is "
                  "compared: pretrained against each other init, each layer against the one below, and training "
                  "everything against the FPT groups, in points of test accuracy with the 95% paired bootstrap "
                  "interval over test rows and the exact sign test over the rows where the two differ (McNemar's, "
                  "for one label a row); `resolved` where the interval excludes zero and p < 0.05.", "",
                  markdown_pairs(comparisons), ""]
    if unpaired:
        shown = [f"- {_text(line)}" for line in unpaired[:_SHOWN]]
        if len(unpaired) > _SHOWN:
            shown.append(f"- and {len(unpaired) - _SHOWN} more")
        parts += [f"**Not compared:** {len(unpaired)} pair(s) or row(s) whose runs differ in more than what is "
                  "compared, or whose seeds were scored apart; give them the same settings and seeds to compare "
                  "them.", "", *shown, ""]
    parts += [f"![{p.stem}]({p.name})" for p in figures]
    md = "\n".join(parts).rstrip() + "\n"
    with atomic_write(d / "report.md", "the report", text=True) as f:
        f.write(md)
    return Report(md, [d / "report.md", *figures], rows, comparisons)
