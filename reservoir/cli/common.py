"""What every ``reservoir`` command shares: one-line errors, log lines on stdout, parsing of options."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import click

from reservoir import options
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


def ci(interval) -> str:
    """A 95% interval of an accuracy as printed beside it: ``[21.33, 22.95]`` (percent); ``[n/a]`` without one."""
    if not interval or any(v is None or v != v for v in interval):
        return "[n/a]"
    lo, hi = interval
    return f"[{100 * lo:5.2f}, {100 * hi:5.2f}]"


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
            from reservoir.io import one_line

            found = "JSON nested too deeply to read" if isinstance(err, RecursionError) else one_line(err)
            raise click.BadParameter(f"expected a JSON value or plain text for {key.strip()!r}, found {found} "
                                     f"({len(value):,} characters)", param_hint="--param") from None
    return params


def _check_out(out: str | None) -> None:
    """Refuse an --out file that cannot be written before the work whose result it will hold."""
    from reservoir.io import writable_folder

    if out is not None:
        if Path(out).is_dir():
            raise click.BadParameter(f"expected a file path, found the folder {out}", param_hint="--out")
        writable_folder(Path(out).parent)


def _parse_layers(value: str | None) -> int | list[int] | None:
    if value is None or value == "all":
        return None
    try:
        if "," in value:
            return [int(v) for v in value.split(",")]  # an empty item ("0,,3") is refused too
        return int(value)
    except ValueError:
        raise click.BadParameter(f"expected a depth K, a list like 0,3,6 or 'all', found {value!r}") from None


def data_options(f: Any) -> Any:
    """``--data PATH``, ``--input-column``, ``--label-column``: a data file as the task (instead of ``--task``)."""
    f = click.option("--label-column", default="label", show_default=True,
                     help="With --data (Parquet, CSV, datasets folder): the column of integer labels.")(f)
    f = click.option("--input-column", default="inputs", show_default=True,
                     help="With --data (Parquet, CSV, datasets folder): the column of sequences.")(f)
    return click.option("--data", "data", default=None, metavar="PATH",
                        help="Your labelled arrays as the task: an .npz, .parquet or .csv file, or a datasets "
                             "save_to_disk folder (see README 'Tasks and data'); instead of --task.")(f)


def _task_from(task: str | None, data: str | None, input_column: str, label_column: str, params: tuple[str, ...],
               alternative: str = "") -> tuple[str | None, dict[str, Any]]:
    """The task name and parameters of ``--task T -p ...`` or ``--data PATH`` (one of them; ``None`` for neither
    when ``alternative`` names another way, such as ``--from-store``)."""
    task_params = _parse_params(params)
    if task is not None and data is not None:
        raise click.UsageError(f"expected --task or --data, not both; found --task {task} and --data {data}")
    if data is None:
        if task is None and not alternative:
            raise click.UsageError("Missing option '--task' (or pass --data PATH).")
        return task, task_params
    taken = [k for k in ("path", "input_column", "label_column") if k in task_params]
    if taken:
        raise click.UsageError(f"expected the data file's path and columns from --data, --input-column and "
                               f"--label-column; found -p {taken[0]}=...")
    if not data.strip():
        raise click.BadParameter("expected a data file or folder; found an empty path", param_hint="--data")
    path = str(Path(data).expanduser().resolve())
    return "data", {**task_params, "path": path, "input_column": input_column, "label_column": label_column}


def backbone_option(help: str = "Backbone name, hub id or local folder.") -> Any:
    """``--backbone`` (default :data:`reservoir.options.DEFAULT_BACKBONE`)."""
    return click.option("--backbone", default=options.DEFAULT_BACKBONE, show_default=True, help=help)


def init_option(help: str = "Backbone weights: checkpoint, architecture's random init, or per-tensor mean/std "
                            "redraw.") -> Any:
    """``--init``, one of :data:`reservoir.options.INITS`."""
    return click.option("--init", default=options.INITS[0], show_default=True, type=click.Choice(options.INITS),
                        help=help)


def device_option(default: str = "auto", help: str = options.DEVICE_HELP) -> Any:
    """``--device``: cpu, cuda, cuda:N or auto."""
    return click.option("--device", default=default, show_default=True, help=help)


def amp_option(help: str = "Autocast dtype on CUDA (auto: bf16 where supported).") -> Any:
    """``--amp``, one of :data:`reservoir.options.AMPS`."""
    return click.option("--amp", default=options.AMPS[0], show_default=True, type=click.Choice(options.AMPS),
                        help=help)


def gain_option() -> Any:
    """``--gain`` (default :data:`reservoir.options.PROJECTION_GAIN`)."""
    return click.option("--gain", default=options.PROJECTION_GAIN, show_default=True, type=float,
                        help="Gain of the orthogonal input projection.")


def step_options(f: Any) -> Any:
    """``--amp`` and ``--cuda-graphs``: how a live training step runs (``train``, ``bench train``)."""
    f = click.option("--cuda-graphs", default="auto", show_default=True, type=click.Choice(["auto", "on", "off"]),
                     help="Capture the training step as one CUDA graph (auto: on CUDA when every train row has one "
                          "length).")(f)
    return amp_option(help="Autocast on CUDA (float32 master weights).")(f)
