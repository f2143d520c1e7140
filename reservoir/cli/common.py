"""What every ``reservoir`` command shares: one-line errors, log lines on stdout, parsing of options."""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import functools
import json
import logging
import os
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
from click.core import ParameterSource

from reservoir import options
from reservoir.errors import ReservoirError
from reservoir.io import check_local, request_stop


#: What click raises for a group given no subcommand, to show its help (click 8.2 on; none before, where the help
#: is printed and the command exits without an error).
_HELP_ERRORS: tuple[type[Exception], ...] = tuple(
    e for e in (getattr(click.exceptions, "NoArgsIsHelpError", None),) if e is not None)


class _Group(click.Group):
    """Turns :class:`ReservoirError` into one line on stderr and exit status 2."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            with _terminate_as_interrupt():
                return super().invoke(ctx)
        except click.UsageError as err:
            if not isinstance(err, _HELP_ERRORS):  # a group named alone shows its help (which needs the context)
                err.ctx = None  # one line: no usage banner, no "Try --help" hint
            raise
        except ReservoirError as err:
            click.echo(f"Error: {error_line(err)}", err=True)
            ctx.exit(2)
        except MemoryError:
            click.echo("Error: expected inputs that fit in the memory this process may use; found it ran out of "
                       "memory (use smaller inputs or raise the limit)", err=True)
            ctx.exit(2)
        except RuntimeError as err:  # torch's allocators: the CPU's, and CUDA's OutOfMemoryError
            if not out_of_memory(err):
                raise
            where = "the GPU's memory" if "CUDA" in str(err) else "the memory this process may use"
            click.echo(f"Error: expected batches that fit in {where}; found an allocation failed "
                       f"({error_line(err)[:200]}): use a smaller --batch-size or --max-tokens, or smaller inputs",
                       err=True)
            ctx.exit(2)
        except OSError as err:  # a path given on the command line that the system cannot take
            if err.errno != errno.ENAMETOOLONG:
                raise
            name = str(err.filename or "")
            click.echo(f"Error: {name if len(name) <= 80 else name[:60] + '...'}: expected a path whose names the "
                       f"system takes (at most 255 bytes each); found a longer one ({err.strerror})", err=True)
            ctx.exit(2)
        except Terminated as stop:
            click.echo(f"Terminated; {_again(ctx)}.", err=True)
            ctx.exit(128 + stop.signum)
        except KeyboardInterrupt:
            click.echo(f"Interrupted; {_again(ctx)}.", err=True)
            ctx.exit(130)


#: Longest error line printed: past it, the middle is cut (a value read from a file can be of any size).
MAX_ERROR_CHARS = 2000


def _again(ctx: click.Context) -> str:
    """What rerunning the stopped command does: a benchmark measures again, anything else resumes its work."""
    if ctx.invoked_subcommand == "bench":
        return "rerun the same command to measure again"
    return "rerun the same command to resume"


def out_of_memory(err: BaseException) -> bool:
    """Whether ``err`` is torch's failure to allocate (CUDA's ``OutOfMemoryError``, the CPU allocator's
    RuntimeError)."""
    import torch

    text = str(err)
    return isinstance(err, torch.cuda.OutOfMemoryError) or "can't allocate memory" in text or "out of memory" in text


def error_line(err: BaseException) -> str:
    """An error as the one line the CLI prints: whitespace runs as one space, at most :data:`MAX_ERROR_CHARS`."""
    text = " ".join(str(err).split())
    if len(text) <= MAX_ERROR_CHARS:
        return text
    keep = MAX_ERROR_CHARS // 2 - 20
    return f"{text[:keep]} ...({len(text) - 2 * keep:,} characters cut)... {text[-keep:]}"


class Terminated(KeyboardInterrupt):
    """SIGTERM or SIGHUP received: unwinds like Ctrl-C, so temporaries are removed and locks released on the way
    out; exits 128 + the signal's number."""

    def __init__(self, signum: int = signal.SIGTERM):
        super().__init__(signum)
        self.signum = int(signum)


@contextlib.contextmanager
def _terminate_as_interrupt() -> Iterator[None]:
    """SIGTERM and SIGHUP raise :class:`Terminated` while a command runs. Not under ``torchrun`` (its agent stops
    workers with SIGTERM and expects them gone) nor outside the main thread (where no handler can be set)."""
    if "TORCHELASTIC_RUN_ID" in os.environ or threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, frame: Any) -> None:
        request_stop(Terminated(signum))  # at once, or where a write that must not be cut ends (stop_deferred)

    caught = (signal.SIGTERM, signal.SIGHUP)  # a closed terminal sends SIGHUP
    before = {s: signal.signal(s, stop) for s in caught}
    try:
        yield
    finally:
        for s, handler in before.items():
            signal.signal(s, handler)


class _EchoHandler(logging.Handler):
    """Log records as plain lines of the command's report on stdout (stderr carries only the one error line)."""

    def emit(self, record: logging.LogRecord) -> None:
        click.echo(record.getMessage())


#: Every --seed: what torch generators, numpy and scikit-learn's ``random_state`` all take.
SEED = click.IntRange(0, options.SEED_MAX)

def ci(interval) -> str:
    """A 95% interval of an accuracy as printed beside it: ``[21.33, 22.95]`` (percent); ``[n/a]`` without one."""
    if not interval or any(v is None or v != v for v in interval):
        return "[n/a]"
    lo, hi = interval
    return f"[{100 * lo:5.2f}, {100 * hi:5.2f}]"


def _parse_params(pairs: tuple[str, ...]) -> dict[str, Any]:
    """``-p KEY=VALUE`` pairs: VALUE as JSON when it parses, else the plain text (always text for a path, a column
    or a choice: :data:`~reservoir.tasks.base.TEXT_PARAMS`); each KEY once."""
    from reservoir.tasks.base import TEXT_PARAMS

    params: dict[str, Any] = {}
    given: dict[str, str] = {}  # key -> the pair that gave it
    for pair in pairs:
        if "=" not in pair:
            raise click.BadParameter(f"expected KEY=VALUE, found {pair!r}", param_hint="--param")
        key, value = pair.split("=", 1)
        key = key.strip()
        if key in given:
            raise click.BadParameter(f"expected each parameter once, found {key} twice ({given[key]!r} and {pair!r})",
                                     param_hint="--param")
        given[key] = pair
        if key in TEXT_PARAMS and value != "null":  # a folder named 2024 is the text "2024" (null: the default)
            params[key] = value
            continue
        try:
            params[key] = json.loads(value)
        except json.JSONDecodeError:
            params[key] = value
        except (RecursionError, ValueError) as err:  # nested too deeply; an integer of more than 4,300 digits
            from reservoir.io import one_line

            found = "JSON nested too deeply to read" if isinstance(err, RecursionError) else one_line(err)
            raise click.BadParameter(f"expected a JSON value or plain text for {key!r}, found {found} "
                                     f"({len(value):,} characters)", param_hint="--param") from None
    return params


def _check_out(out: str | None, *inputs: Any) -> None:
    """Refuse an --out file that cannot be written before the work whose result it will hold, or that is one of the
    command's ``inputs`` (files or folders; ``None`` and URLs are skipped) or lies inside one."""
    from reservoir.io import check_name, replaceable, within, writable_folder
    from reservoir.store.remote import is_url

    if out is None:
        return
    if not out.strip():
        raise click.BadParameter("expected a file path; found an empty one", param_hint="--out")
    check_name(out)
    try:
        target, is_dir = Path(out).resolve(), Path(out).is_dir()
    except OSError as err:  # a path longer than the system takes, say
        raise ReservoirError(f"{out[:200]}: expected a path this system can use, found {err.strerror or err}") from None
    if is_dir:
        raise click.BadParameter(f"expected a file path, found the folder {out}", param_hint="--out")
    for source in inputs:
        if source is None or is_url(str(source)):
            continue
        if within(target, source):
            where = "is" if target == Path(source).resolve() else "lies inside"
            raise ReservoirError(f"{out}: expected an output apart from the command's inputs; found it {where} the "
                                 f"input {source}")
    replaceable(out)
    writable_folder(Path(out).parent)


def backbone_input(backbone: str | None) -> str | None:
    """The model folder a ``--backbone`` names (what no --out may replace), or ``None`` for a built-in name or a
    hub id."""
    if not backbone:
        return None
    folder = os.path.expanduser(backbone)
    return folder if os.path.isdir(folder) else None


def task_inputs(task_params: dict[str, Any]) -> list[Any]:
    """The files a task is read from (a data file's ``path``, an image task's ``data_dir``): what no --out may
    replace."""
    return [task_params.get("path"), task_params.get("data_dir")]


def _parse_layers(value: str | None, flag: str = "--layers") -> int | list[int] | None:
    if value is None or value == "all":
        return None
    items = value.split(",")  # an empty item ("0,,3") is refused too
    if not all(v.strip().isascii() and v.strip().isdigit() for v in items):  # not "1_0", "+3" or "٣"
        raise click.BadParameter(f"expected a depth K, a list like 0,3,6 or 'all', found {value!r}", param_hint=flag)
    if any(len(v.strip()) > 6 for v in items):  # no model is a million blocks deep (and int() stops at 4,300 digits)
        raise click.BadParameter(f"expected depths below 1,000,000, found {value[:40]!r}", param_hint=flag)
    return [int(v) for v in items] if len(items) > 1 else int(items[0])


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
        ctx = click.get_current_context(silent=True)
        given = [flag for flag, name in (("--input-column", "input_column"), ("--label-column", "label_column"))
                 if ctx is not None and ctx.get_parameter_source(name) not in (None, ParameterSource.DEFAULT)]
        if given:
            raise click.UsageError(f"{given[0]} names a column of a --data file; found it without --data")
        if task is None and not alternative:
            raise click.UsageError("Missing option '--task' (or pass --data PATH).")
        return task, task_params
    taken = [k for k in ("path", "input_column", "label_column") if k in task_params]
    if taken:
        raise click.UsageError(f"expected the data file's path and columns from --data, --input-column and "
                               f"--label-column; found -p {taken[0]}=...")
    if not data.strip():
        raise click.BadParameter("expected a data file or folder; found an empty path", param_hint="--data")
    check_local(data, "a data file")
    path = str(Path(os.path.expanduser(data)).resolve())
    return "data", {**task_params, "path": path, "input_column": input_column, "label_column": label_column}


#: Click types of the plain field types (the annotation without ``| None``); others parse as text.
_TYPES: dict[str, Any] = {"int": int, "float": float}


def setting_option(found: options.Setting, *decls: str, annotation: str = "str", **changes: Any) -> Any:
    """A click option of a :class:`~reservoir.options.Setting`: its flag, default, help and choices.

    ``decls`` replaces the declared names (default: the setting's flag);
    ``annotation`` is the field's type, which picks the click type where no
    choices or seed range do; ``changes`` sets what the command line does
    differently (``multiple``, ``metavar``, a ``type`` the command parses itself).
    """
    default = found.default
    kw: dict[str, Any] = {"help": found.help}
    if isinstance(default, bool):
        kw["is_flag"] = True
    else:
        kw["default"] = ",".join(map(str, default)) if isinstance(default, list) else default
        kw["show_default"] = default is not None and not isinstance(default, dict)
        choices = found.constraint.choices if found.constraint is not None else None
        if choices is not None:
            kw["type"] = click.Choice(choices)
        elif found.constraint is options.SEEDS:
            kw["type"] = SEED
        else:
            kw["type"] = _TYPES.get(annotation.removesuffix(" | None"), str)
    kw.update(changes)
    if not decls and found.flag is None:
        raise TypeError("a setting without a flag needs its option's names")
    return click.option(*(decls or (found.flag,)), **kw)


def config_option(config: Any, name: str, *decls: str, **changes: Any) -> Any:
    """A click option built from field ``name`` of the configuration dataclass ``config``
    (:mod:`reservoir.options`), so its help, default and choices exist once, on the field."""
    found = options.field_setting(config, name)
    annotation = str(next(f.type for f in dataclasses.fields(config) if f.name == name))
    return setting_option(found, *(decls or (options.flag_of(name, found),)), annotation=annotation, **changes)


def extract_option(name: str, *decls: str, **changes: Any) -> Any:
    """:func:`config_option` of :class:`~reservoir.extract.ExtractConfig` (``reservoir extract``, ``bench extract``)."""
    from reservoir.extract.config import ExtractConfig

    return config_option(ExtractConfig, name, *decls, **changes)


def forward_options(f: Any) -> Any:
    """How the forwards of an extraction run and their results are written: ``--batch-size``, ``--max-tokens``,
    ``--writers``, ``--dtype``, ``--device``, ``--amp``, ``--seed`` (``reservoir extract``, ``bench extract``)."""
    for name in reversed(("batch_size", "max_tokens", "writers", "dtype", "device", "amp", "seed")):
        f = extract_option(name)(f)
    return f


class _Depth(click.ParamType):
    """A depth K (keep blocks 1..K), or ``all`` (every block): what ``--layers`` takes where one depth is run."""

    name = "K|all"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> int | None:
        if value is None or isinstance(value, int):
            return value
        if str(value).strip().lower() == "all":  # (the help shows the metavar as K|ALL)
            return None
        try:
            return int(str(value))
        except ValueError:
            self.fail(f"expected a depth K (an integer) or 'all'; found {value!r}", param, ctx)


DEPTH = _Depth()


def train_option(name: str, *decls: str, **changes: Any) -> Any:
    """:func:`config_option` of :class:`~reservoir.training.TrainConfig` (``reservoir train``, ``plot attention``)."""
    from reservoir.training.config import TrainConfig

    return config_option(TrainConfig, name, *decls, **changes)


def _parse_storage(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    from reservoir.store.remote import parse_options

    try:
        return parse_options(values) if values else {}
    except ReservoirError as err:
        raise click.BadParameter(str(err).removeprefix("--storage-option: "), param_hint="--storage-option")


def storage_option(**targets: str) -> Callable[[Any], Any]:
    """``--storage-option KEY=VALUE`` (repeatable): how store URLs (``s3://...``) are reached, for this command.

    ``targets`` maps each parameter that may name a store URL to how the
    command line names it (``out="--out"``, ``store="STORE"``); options given
    while none of them is a URL would be ignored, so they are refused. The
    options hold while the command runs.
    """
    def decorate(f: Any) -> Any:
        @functools.wraps(f)
        def command(*args: Any, storage_options: dict[str, str], **kwargs: Any) -> Any:
            from reservoir.store.remote import configure, is_url

            if storage_options and not any(is_url(kwargs.get(name)) for name in targets):
                found = "; ".join(f"{label} {kwargs[name]}" for name, label in targets.items()
                                  if kwargs.get(name) not in (None, ""))
                found = f"{found}, a local path" if found else f"no {' or '.join(targets.values())}"
                raise click.UsageError("expected a store URL (s3://, gs://, az://) for --storage-option to apply to; "
                                       f"found {found}")
            configure(storage_options)
            try:
                return f(*args, **kwargs)
            finally:
                configure(None)

        return click.option("--storage-option", "storage_options", multiple=True, metavar="KEY=VALUE",
                            callback=_parse_storage,
                            help="For a store URL (s3://, gs://, az://): an object-store setting, repeatable (e.g. "
                                 "endpoint=http://127.0.0.1:9000, region=eu-west-1, max_retries=3); credentials also "
                                 "come from the environment (AWS_*, GOOGLE_*, AZURE_*).")(command)

    return decorate


def step_options(f: Any) -> Any:
    """``--amp``, ``--cuda-graphs`` and ``--compile``: how a live training step runs (``train``, ``bench train``)."""
    return train_option("amp")(train_option("cuda_graphs")(train_option("compile", "--compile", "compiled")(f)))
