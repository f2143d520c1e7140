"""Paired comparisons of report rows that were scored on the same test rows.

Two rows of a report share their test rows when their results name the same
task fingerprint and hold per-row results of the same length (every
``fit-linear``, ``fit-raw`` and ``train`` result keeps which test rows it got
right). The report compares

* each init against ``pretrained`` with everything else equal (pretrained vs
  random at the same layer, the question of Lu et al. Table 2 and 12), and
* each fitted layer against the layer below it with everything else equal
  (does one more block help?), and
* a run that trains everything (``--finetune all``, unfrozen) against the FPT
  groups (frozen) with everything else equal (Rothermel et al.'s question),

with the paired bootstrap interval of the difference and the exact sign test
over the rows where the two differ
(:func:`reservoir.readouts.intervals.paired_difference`), and marks those both
resolve (the interval excludes zero and the test rejects no difference at 5%).
With several seeds, a row's per-row results are summed over its seeds first.

"Everything else equal" means the runs' whole settings (what their results
files record: steps, batch size, dtype, store depth, projection, ...), not
only the report's label, and the same seeds. Two rows that differ in the
compared key and also in another setting or their seeds are not a pair; each
such pair gets a line saying what else differs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from reservoir.readouts.intervals import Difference, paired_difference
from reservoir.settings import first_difference


@dataclass
class Scored:
    """A report row's per-row results: correct heads summed over seeds ``(N,)``, heads per row times seeds; the
    settings of its runs (all but the seed) and its seeds."""

    label: dict[str, Any]
    fingerprint: str
    correct: np.ndarray
    heads: int
    settings: dict[str, Any] = field(default_factory=dict)
    seeds: tuple[int, ...] = ()


@dataclass
class Comparison:
    """``a`` minus ``b``, what differs between them, and the paired difference."""

    a: Scored
    b: Scored
    what: str
    difference: Difference


def _key(label: dict[str, Any], without: str) -> tuple:
    return tuple((k, v) for k, v in label.items() if k != without)


def settings_key(settings: dict[str, Any]) -> str:
    """Runs' settings as one hashable text: the layers of one store share it (its depth, dtype, ...)."""
    return json.dumps(settings, sort_keys=True, default=str)


def _seeds(seeds: tuple[int, ...]) -> str:
    return ",".join(map(str, seeds)) or "none"


def why_not_paired(a: Scored, b: Scored, compared: str) -> str | None:
    """What keeps ``a`` and ``b`` (which differ in ``compared``) from being a pair, in a few words; ``None`` when
    nothing does: the same settings but ``compared``, the same seeds, the same test rows and heads.

    Examples
    --------
    >>> ones = np.ones(4, int)
    >>> a = Scored({"init": "pretrained"}, "f", ones, 1, {"init": "pretrained", "steps": 100}, (0,))
    >>> b = Scored({"init": "random"}, "f", ones, 1, {"init": "random", "steps": 10}, (0,))
    >>> why_not_paired(a, b, "init")
    'other settings: steps 100 against 10'
    """
    diff = first_difference({k: v for k, v in a.settings.items() if k != compared},
                            {k: v for k, v in b.settings.items() if k != compared})
    if diff is not None:
        key, mine, theirs = diff
        return f"other settings: {key} {mine!r:.40} against {theirs!r:.40}"
    if a.seeds != b.seeds:
        return f"other seeds: {_seeds(a.seeds)} against {_seeds(b.seeds)}"
    if a.fingerprint != b.fingerprint or a.correct.shape != b.correct.shape:
        return "scored on other test rows (the task's data differs)"
    if a.heads != b.heads:
        return f"{a.heads} against {b.heads} scores a test row"
    return None


def compare(rows: list[Scored], unpaired: list[str] | None = None) -> list[Comparison]:
    """Every init-vs-pretrained, layer-vs-layer-below and unfrozen-vs-frozen pair among ``rows`` with everything
    else equal (:func:`why_not_paired`); ``unpaired`` gets a line for each pair of rows whose labels differ only
    in the compared key but whose runs differ in more (another setting, other seeds, other test rows)."""
    out: list[Comparison] = []

    def paired(a: Scored, b: Scored, what: str, compared: str) -> None:
        why = why_not_paired(a, b, compared)
        if why is None:
            out.append(Comparison(a, b, what, paired_difference(a.correct, b.correct, a.heads)))
        elif unpaired is not None:
            unpaired.append(f"{what} ({a.label.get('task')}: {why})")

    by_init: dict[tuple, dict[str, Scored]] = {}
    for r in rows:
        by_init.setdefault(_key(r.label, "init"), {})[str(r.label.get("init"))] = r
    for group in by_init.values():
        base = group.get("pretrained")
        for init, r in group.items():
            if base is not None and init != "pretrained":
                paired(base, r, f"pretrained − {init}", "init")
    by_layer: dict[tuple, list[Scored]] = {}
    for r in rows:  # the layers of one store (each store's settings hold its depth): a step up that store
        if r.label.get("kind") == "fit-linear" and isinstance(r.label.get("layer"), int):
            by_layer.setdefault((*_key(r.label, "layer"), settings_key(r.settings)), []).append(r)
    for group in by_layer.values():
        group.sort(key=lambda r: r.label["layer"])
        for lower, upper in zip(group, group[1:]):
            paired(upper, lower, f"layer {upper.label['layer']} − layer {lower.label['layer']}", "layer")
    by_groups: dict[tuple, dict[str, Scored]] = {}
    for r in rows:
        if r.label.get("kind") == "train":
            by_groups.setdefault(_key(r.label, "finetune"), {})[str(r.label.get("finetune"))] = r
    for group in by_groups.values():
        if "all" in group and "fpt" in group:
            paired(group["all"], group["fpt"], "unfrozen − frozen (all − fpt)", "finetune")
    return out


#: Characters a recipe's text (a description, a task's tag, a backbone name, a paper source, a run id) could start
#: markup with: HTML tags and entities, links and images, code spans. Such text is shown as written, never rendered.
_MARKUP = str.maketrans({"&": "&amp;", "<": "&lt;", ">": "&gt;", "[": "\\[", "]": "\\]", "`": "\\`",
                         "\\": "\\\\"})


def markdown_text(text: str) -> str:
    """Text from a recipe as Markdown that shows it as written: no HTML, link, image or code span of its own (a
    table cell also escapes ``|``).

    Examples
    --------
    >>> markdown_text("a<b>[x](y)")
    'a&lt;b&gt;\\\\[x\\\\](y)'
    """
    return text.translate(_MARKUP)


def _p(p: float) -> str:
    """A p-value as the table prints it: ``0.0215``, ``<0.0001``.

    Examples
    --------
    >>> _p(0.021484375), _p(3e-9), _p(1.0)
    ('0.0215', '<0.0001', '1')
    """
    return "<0.0001" if p < 1e-4 else f"{p:.3g}"


def markdown_pairs(comparisons: list[Comparison]) -> str:
    """The comparisons as a markdown table (points of accuracy; ``yes`` where the difference is resolved: its
    interval excludes zero and the sign test's p is below 0.05)."""
    head = ["task", "backbone", "setting", "layer", "comparison", "difference", "95% paired interval",
            "sign test p", "resolved"]
    lines = ["| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    for c in comparisons:
        lab, d = c.a.label, c.difference
        setting = lab.get("readout") or lab.get("finetune") or lab.get("kind")
        layer = "—" if c.what.startswith("layer") or lab.get("layer") is None else str(lab["layer"])
        task = lab["task"] + (f" ({lab['tag']})" if lab.get("tag") else "")
        init = "" if c.what.startswith("pretrained") else f"{lab.get('init')}, "
        setting = f"{lab.get('init')}" if c.what.startswith("unfrozen") else f"{init}{setting}"
        if lab.get("kind") == "train" and lab.get("lr") is not None:  # rows of several rates differ only there
            lr = lab["lr"]
            setting += f", lr {lr:g}" if isinstance(lr, (int, float)) else f", lr {lr}"
        cells = [markdown_text(task), markdown_text(str(lab.get("backbone") or "—")), setting, layer, c.what,
                 f"{100 * d.diff:+.2f} pts", f"[{100 * d.low:+.2f}, {100 * d.high:+.2f}]", _p(d.p_value),
                 "yes" if d.resolved else "no"]
        lines.append("| " + " | ".join(x.replace("|", "\\|") for x in cells) + " |")
    return "\n".join(lines)
