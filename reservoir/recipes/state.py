"""Where a recipe's run stands in its results folder: its results files checked and matched to the run (its id,
its settings, the digest of the data it read), and the record a run leaves before it starts, which says whether
an interrupted run may be resumed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from reservoir.errors import ReservoirError
from reservoir.io import atomic_write
from reservoir.recipes.runs import Run
from reservoir.settings import describe_difference, first_difference


def finished(path: Path) -> bool:
    """Whether ``path`` holds a results file that validates (a JSON object whose accuracies are accuracies): a run
    counts as done only then, never because a truncated or foreign file is there."""
    return _valid(path) is not None


def _valid(path: Path) -> dict[str, Any] | None:
    """The results file at ``path`` when it validates (:func:`finished`), else ``None``."""
    from reservoir.io import read_json
    from reservoir.results import check_accuracies, check_agreement

    if not path.is_file():
        return None
    try:
        data = read_json(path, "a results JSON object")
        if not isinstance(data, dict) or "kind" not in data and "config" not in data:
            return None
        check_accuracies(data)
        check_agreement(data)
    except ReservoirError:
        return None
    return data


def result_files(run: Run, folder: Path) -> list[Path]:
    """The files a finished ``run`` leaves in ``folder`` (all must exist for it to be skipped)."""
    return [folder / name for _, name in run.outputs()]


def run_state(run: Run, folder: Path) -> tuple[str, str]:
    """Where ``run`` stands in ``folder``: ``(state, why)``.

    ``done``: every results file validates and records this run (and its
    settings, :meth:`Run.settings`, where the file records them); ``todo``: a
    file is missing or does not validate (an interrupted run resumes there);
    ``foreign``: a file is another run's; ``stale``: a file is this run's
    with other settings (the recipe was edited since), or of a task read from
    files that now hold other data (:func:`data_fingerprint`; data that cannot
    be read leaves the results as they are). Only ``done`` is skipped; a
    ``foreign`` or ``stale`` folder is cleared first.
    """
    states = [file_state(run, path) for path in result_files(run, folder)]
    state = next((s for want in ("todo", "foreign", "stale") for s in states if s[0] == want), ("done", ""))
    if state[0] == "todo":  # an interrupted run resumes there, unless it was begun with other settings or data
        begun = _begun_otherwise(run, folder)
        if begun is not None:
            return "stale", begun
    return state


#: What the runner writes into a run folder before the run starts: the settings (and data digest) it runs with.
BEGUN = "recipe-run.json"


#: Beside the recipe's copy: the folder its relative data paths were taken from (what ``report`` resolves them in).
SOURCE = "recipe-source.json"


def recipe_folder(out_dir: Path) -> Path | None:
    """The folder the recipe run into ``out_dir`` took its relative data paths from (:data:`SOURCE`), if it still
    exists; ``None`` otherwise (the copy's own folder then stands in)."""
    from reservoir.io import read_json

    try:
        found = read_json(out_dir / SOURCE, "the folder a recipe's relative paths lead to")
    except ReservoirError:  # none (an earlier version's results), or unreadable: the copy's folder
        return None
    folder = found.get("folder") if isinstance(found, dict) else None
    try:
        return Path(folder) if isinstance(folder, str) and Path(folder).is_dir() else None
    except OSError:  # a name too long for a path (a garbled record) is no folder
        return None


def begin(run: Run, folder: Path, meta: dict[str, Any]) -> None:
    """Record in ``folder`` what the run about to start runs with (:data:`BEGUN`): its settings as written, its
    data's digest and its task parameters as resolved (a data file's absolute path, which a train checkpoint
    holds)."""
    folder.mkdir(parents=True, exist_ok=True)
    with atomic_write(folder / BEGUN, "the run's settings", text=True) as f:
        json.dump({"run": run.id, "settings": meta["settings"], "data": meta.get("data"),
                   "task_params": _resolved_params(run)}, f)


def _resolved_params(run: Run) -> Any:
    """``run``'s task parameters as it runs with them (a data file's path absolute), as JSON reads them back."""
    return json.loads(json.dumps(run.cell.task_params, default=str))


def _begun_otherwise(run: Run, folder: Path) -> str | None:
    """Why the unfinished run in ``folder`` cannot be resumed by ``run`` (begun with other settings, or on other
    data), or ``None`` (nothing begun there, a folder of an earlier version, or the same run)."""
    from reservoir.io import read_json

    if not (folder / BEGUN).is_file():
        return None
    try:
        begun = read_json(folder / BEGUN, "the settings of a run begun there")
    except ReservoirError as err:  # a damaged record: begin again rather than resume what it cannot vouch for
        return f"an interrupted run whose record is unreadable ({err})"
    if not isinstance(begun, dict):
        return "an interrupted run whose record is not a JSON object"
    recorded = begun.get("settings")
    diff = first_difference(_compared(recorded), _compared(run.settings()))
    if diff is not None:
        return f"an interrupted run with {describe_difference(diff)}"
    try:
        now = data_fingerprint(run)
    except ReservoirError:
        return None  # the run itself says why its data cannot be read
    if now is not None and begun.get("data") not in (None, now):
        return "an interrupted run on other data"
    # a moved project: its checkpoint names the old place
    if begun.get("task_params") not in (None, _resolved_params(run)):
        return "an interrupted run begun with its data at another path"
    return None


def _compared(settings: Any) -> dict[str, Any]:
    """Run settings (as recorded: anything but a mapping is none) as two of them are compared: an ``lr_sweep`` as
    the rates it sweeps, so that one sweep written two ways (``1e-3:1e-2:2``, ``0.001:0.01:2``; the run's id is the
    same) is not redone."""
    from reservoir.training import parse_lr_sweep

    if not isinstance(settings, dict):
        return {}
    sweep = settings.get("lr_sweep")
    if not isinstance(sweep, str):
        return settings
    try:
        return {**settings, "lr_sweep": parse_lr_sweep(sweep)}
    except ReservoirError:  # a recorded value no longer read as a sweep: compared as written
        return settings


def file_state(run: Run, path: Path, read_data: bool = True) -> tuple[str, str]:
    """One results file of ``run`` as :func:`run_state` judges it: ``todo``, ``foreign``, ``stale`` or ``done``.

    ``read_data=False`` judges by the recorded settings alone, never reading the run's data files (``report`` reads
    nothing outside the results folder it renders)."""
    data = _valid(path)
    if data is None:
        return "todo", ""
    record = data.get("recipe")
    if not isinstance(record, dict) or record.get("run") != run.id:
        found = record.get("run") if isinstance(record, dict) else None
        return "foreign", f"{path.name} holds {'run ' + repr(found) if found else 'no recipe run'}"
    recorded = record.get("settings")
    if recorded is not None:  # (files written before results recorded their run's settings have none)
        diff = first_difference(_compared(recorded), _compared(run.settings()))
        if diff is not None:
            return "stale", f"computed with {describe_difference(diff)}"
    if not read_data:
        return "done", ""
    try:
        now = data_fingerprint(run)
    except ReservoirError:  # the data is not here (results copied elsewhere): the results stand as they are
        return "done", ""
    if now is None:  # a task made from its parameters alone: the settings said everything
        return "done", ""
    then = record.get("data")
    if then is not None and then != now:  # (a file of an earlier version, which recorded none, is taken as it is)
        return "stale", f"computed on other data (data digest {str(then)[:12]}, the data now {now[:12]})"
    return "done", ""


#: The digest of a task read from files, by its task cache key (which stamps every file it reads).
_DIGESTS: dict[str, str] = {}


def data_fingerprint(run: Run) -> str | None:
    """The digest of the data ``run``'s task reads now, for a task read from files (a data file, a ``data_dir``):
    its fingerprint (:func:`~reservoir.tasks.base.fingerprint`) with the files' location left out, so a project
    moved elsewhere keeps its results. Loaded through the task cache, once per state of the files. ``None`` for a
    task made from its parameters alone, or whose files are absent; files that no longer read as its data are one
    line (:class:`ReservoirError`)."""
    from reservoir.tasks.base import fingerprint, resolve_params
    from reservoir.tasks.cache import cache_key, data_files, load_task

    params = resolve_params(run.task, dict(run.cell.task_params))
    where = ("path", "data_dir")
    if not data_files(run.task, params):  # generated, or its files are not here: nothing to check against
        return None
    key = f"{run.task}-{cache_key(run.task, params)}"
    if key not in _DIGESTS:
        task = load_task(run.task, dict(run.cell.task_params))
        _DIGESTS[key] = fingerprint(task.name, {k: v for k, v in task.params.items() if k not in where}, task.splits)
    return _DIGESTS[key]
