"""The toolkit's vocabulary of settings: each choice, default, help text and constraint defined once.

Three kinds of names live here:

- **choices and defaults** (:data:`INITS`, :data:`AMPS`, :data:`PROJECTION_GAIN`, ...);
- **constraints** (:class:`Constraint`, built by :func:`integer`, :func:`number`,
  :func:`one_of`, :func:`optional`, :func:`grid`): what a value may be, in
  words, with one message shape for every refusal,
  ``<label> must be <expected>, found <value>``;
- **settings** (:class:`Setting`): an option shared by several
  configurations and commands (:data:`BACKBONE`, :data:`INIT`,
  :data:`DEVICE`, :data:`AMP`, :data:`GAIN`, :data:`SEED`), its help,
  default and constraint. :meth:`Setting.field` declares it in a
  configuration dataclass (:class:`~reservoir.extract.ExtractConfig`,
  :class:`~reservoir.training.TrainConfig`); the command line builds its
  click options from those fields (:func:`reservoir.cli.common.config_option`),
  and :func:`check_fields` checks a configuration against them.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

from reservoir.errors import ReservoirError

# -- choices and defaults -----------------------------------------------------
#: Backbone used when none is named: sentence-transformers/all-MiniLM-L6-v2, shipped as a package.
DEFAULT_BACKBONE = "minilm"
#: Backbone weights: the checkpoint, the architecture's random init, or a per-tensor mean/std redraw.
INITS = ("pretrained", "random", "stats")
#: Autocast dtypes on CUDA (``auto``: bf16 where supported).
AMPS = ("auto", "bf16", "fp16", "none")
#: Gain of the orthogonal input projection (about sqrt(2)).
PROJECTION_GAIN = 1.41
#: Inits of the fixed input map: orthogonal (scaled by the gain), or N(0, 1) entries (an embedding table's).
PROJECTIONS = ("orthogonal", "normal")
#: Largest seed: what torch generators, numpy and scikit-learn's ``random_state`` all take.
SEED_MAX = 2**32 - 1
#: Feature dtypes a store holds.
DTYPES = ("float16", "float32")
#: Store backends.
FORMATS = ("zarr", "hdf5")
#: How a layer's hidden states become a row: the last real token, the first token, the mean over real tokens.
POOLINGS = ("last", "first", "mean")
#: The linear readouts fitted from a store.
READOUTS = ("logistic", "ridge")
#: Capturing a live training step as one CUDA graph.
CUDA_GRAPHS = ("auto", "on", "off")
#: What ``--device`` accepts.
DEVICE_HELP = "cpu, cuda, cuda:N or auto."


# -- constraints --------------------------------------------------------------
@dataclass(frozen=True)
class Constraint:
    """The values a setting may take: a predicate and what it expects, in words.

    Examples
    --------
    >>> integer(1).check(0, "--steps")
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: --steps must be an integer >= 1, found 0
    >>> one_of("zarr", "hdf5").check("h5", "--format")
    Traceback (most recent call last):
    ...
    reservoir.errors.ReservoirError: --format must be zarr or hdf5, found 'h5'
    """

    accepts: Callable[[Any], bool]
    expected: str
    choices: tuple[str, ...] | None = None  # the closed set, for a constraint made by one_of

    def check(self, value: Any, label: str) -> None:
        """Refuse ``value`` in one line naming ``label``, what was expected and what was found."""
        if not self.accepts(value):
            raise ReservoirError(f"{label} must be {self.expected}, found {shown(value)}")


def shown(value: Any, width: int = 60) -> str:
    """``repr(value)``, cut to about ``width`` characters (a 300-digit number or a huge list stays one short line).

    Examples
    --------
    >>> shown(10**300)
    '1000000000000000000000000...0000000000000000000000000 (301 characters)'
    """
    text = repr(value)
    if len(text) <= width:
        return text
    return f"{text[:width // 2 - 5]}...{text[-(width // 2 - 5):]} ({len(text):,} characters)"


def is_bool(v: Any) -> bool:
    """Python's ``bool`` or numpy's (``numpy.bool_``, whose type is named ``bool`` since numpy 2).

    Examples
    --------
    >>> import numpy as np
    >>> is_bool(True), is_bool(np.False_), is_bool(1), is_bool("no")
    (True, True, False, False)
    """
    return isinstance(v, bool) or (type(v).__module__ == "numpy" and type(v).__name__ in ("bool", "bool_"))


def is_int(v: Any) -> bool:
    """An integer, not a bool."""
    return isinstance(v, Integral) and not is_bool(v)


def repeated(values: Sequence[Any]) -> Any:
    """The first value ``values`` holds twice (in the order of its second place), or ``None``.

    Examples
    --------
    >>> repeated([2, 1, 1, 2]), repeated(["a", "b"])
    (1, None)
    """
    return next((v for i, v in enumerate(values) if v in values[:i]), None)


def is_real(v: Any) -> bool:
    """A finite real number, not a bool (an integer of any size is finite)."""
    if is_bool(v):
        return False
    return isinstance(v, Integral) or (isinstance(v, Real) and math.isfinite(v))


def integer(low: int, high: int | None = None) -> Constraint:
    """An integer ``>= low`` (and ``<= high`` when given)."""
    words = f"an integer >= {low}" if high is None else f"an integer in {low}..{high}"
    return Constraint(lambda v: is_int(v) and v >= low and (high is None or v <= high), words)


def number(low: float, high: float | None = None, *, open_low: bool = False, words: str | None = None) -> Constraint:
    """A finite number ``>= low`` (``> low`` when ``open_low``), and ``< high`` when given; ``words`` overrides how
    the expectation reads."""
    def ok(v: Any) -> bool:
        return is_real(v) and (v > low if open_low else v >= low) and (high is None or v < high)

    if words is None:
        if high is not None:
            words = f"a number in {'(' if open_low else '['}{low:g}, {high:g})"
        else:
            words = f"a finite number {'>' if open_low else '>='} {low:g}"
    return Constraint(ok, words)


def one_of(*choices: str) -> Constraint:
    """One of ``choices`` (read as ``auto, on or off``)."""
    words = choices[0] if len(choices) == 1 else f"{', '.join(choices[:-1])} or {choices[-1]}"
    return Constraint(lambda v: isinstance(v, str) and v in choices, words, choices)


def optional(inner: Constraint) -> Constraint:
    """``None`` (the default) or what ``inner`` accepts; a refusal says what ``inner`` expects."""
    return Constraint(lambda v: v is None or inner.accepts(v), inner.expected, inner.choices)


def grid(each: Constraint) -> Constraint:
    """``None`` (a default grid) or a non-empty sequence of values ``each`` accepts."""
    def ok(v: Any) -> bool:
        return v is None or (not isinstance(v, (str, bytes)) and hasattr(v, "__len__") and len(v) > 0
                             and all(each.accepts(a) for a in v))

    return Constraint(ok, f"None or a non-empty list, each {each.expected}")


#: A path as text: not empty (an empty path is the working folder, where nothing is meant to be written).
PATH = Constraint(lambda v: isinstance(v, str) and v.strip() != "", "a path (not empty)")
#: True or False.
FLAG = Constraint(is_bool, "True or False")
#: What scikit-learn's ``random_state`` takes here.
RANDOM_STATE = optional(integer(0))
#: Every seed (:data:`SEED_MAX`).
SEEDS = integer(0, SEED_MAX)


# -- settings -----------------------------------------------------------------
@dataclass(frozen=True)
class Setting:
    """One option: its help, default and constraint, and its flag where that is not ``--<field-name>``."""

    help: str
    default: Any = None
    constraint: Constraint | None = None
    flag: str | None = None
    cli: bool = True  # an option of the command line (else errors name the field, not a flag)
    limit: float | None = None  # the largest value the toolkit takes (a resource bound), checked after the constraint

    def check(self, value: Any, label: str) -> None:
        """Refuse ``value`` in one line naming ``label``: outside the constraint, or above the toolkit's limit."""
        if self.constraint is not None:
            self.constraint.check(value, label)
        if self.limit is not None:
            check_limit(value, self.limit, label)

    def field(self, **changes: Any) -> Any:
        """A dataclass field of this setting (``changes``: e.g. a ``help`` that says more for one configuration)."""
        return dataclasses.field(default=self.default, metadata={"setting": dataclasses.replace(self, **changes)})


def setting(help: str, default: Any = dataclasses.MISSING, constraint: Constraint | None = None,
            flag: str | None = None, cli: bool = True, factory: Callable[[], Any] | None = None,
            limit: float | None = None) -> Any:
    """A dataclass field with its option's help, default (none: a required field; or ``factory``), constraint and
    flag."""
    first = factory() if factory is not None else None if default is dataclasses.MISSING else default
    meta = {"setting": Setting(help, first, constraint, flag, cli, limit)}
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


def field_setting(config: Any, name: str) -> Setting:
    """The :class:`Setting` of a configuration dataclass's field ``name``."""
    for f in dataclasses.fields(config):
        if f.name == name:
            found = f.metadata.get("setting")
            if found is None:
                raise KeyError(f"{type(config).__name__}.{name} declares no setting")
            return found
    raise KeyError(f"{getattr(config, '__name__', type(config).__name__)} has no field {name!r}")


def flag_of(name: str, found: Setting) -> str:
    """The command-line flag of field ``name``: its setting's own, else ``--<name with dashes>``."""
    return found.flag or "--" + name.replace("_", "-")


def label_of(name: str, found: Setting) -> str:
    """How a refusal names field ``name``: its flag where the command line has it, else the field's name."""
    return flag_of(name, found) if found.cli else name


def check_fields(config: Any) -> None:
    """Check every field of a configuration dataclass against its setting's constraint (one line naming it); a flag
    given as a numpy bool is kept as Python's (what JSON, the store's attributes and run settings, can write)."""
    for f in dataclasses.fields(config):
        found = f.metadata.get("setting")
        if found is not None:
            value = getattr(config, f.name)
            found.check(value, label_of(f.name, found))
            if found.constraint is FLAG:
                object.__setattr__(config, f.name, bool(value))


def check_limit(value: Any, limit: float, label: str) -> None:
    """Refuse a number above ``limit`` (a bound of the toolkit, not of the setting's meaning), in one line."""
    if value is not None and not isinstance(value, (str, bool)) and is_real(value) and value > limit:
        most = f"{int(limit):,}" if float(limit).is_integer() else f"{limit:g}"
        raise ReservoirError(f"{label} must be at most {most}, found {shown(value)}")


def check_projection(kind: Any, gain: Any) -> None:
    """Refuse (one line) an unknown input map, or a gain given to the ``normal`` one, which takes none."""
    if kind not in PROJECTIONS:
        raise ReservoirError(f"--projection: expected one of {', '.join(PROJECTIONS)}; found "
                             f"{shown(kind)}")
    if kind == "normal" and gain not in (None, PROJECTION_GAIN):
        raise ReservoirError(f"--gain applies to the orthogonal projection; --projection normal draws N(0, 1) entries "
                             f"and takes none: expected the default gain, found {shown(gain)}")


BACKBONE = Setting("Backbone: minilm, tiny-<family> (tiny-gpt2, tiny-llama, tiny-vit, ...), a hub id (gpt2, "
                   "EleutherAI/pythia-410m) or a local model folder.", DEFAULT_BACKBONE, flag="--backbone")
INIT = Setting("Backbone weights: the checkpoint (pretrained), the architecture's random init, or a per-tensor "
               "mean/std redraw (stats).", INITS[0], one_of(*INITS), flag="--init")
DEVICE = Setting(DEVICE_HELP, "auto", flag="--device")
AMP = Setting("Compute dtype of the backbone: auto (bf16 on CUDA where supported, else fp16; on the CPU bf16 where "
              "the processor has native bf16, else float32), bf16, fp16 (CUDA only) or none (float32). Training "
              "keeps float32 master weights.", AMPS[0],
              one_of(*AMPS), flag="--amp")
GAIN = Setting("Gain of the orthogonal input projection.", PROJECTION_GAIN,
               number(0, open_low=True, words="a finite number above 0"), flag="--gain")
PROJECTION = Setting("Init of the fixed input map: orthogonal (scaled by --gain; the official code's linear input) "
                     "or normal (N(0, 1) entries, no gain: the official code's token embedding table).",
                     PROJECTIONS[0], one_of(*PROJECTIONS), flag="--projection")
REVISION = Setting("Hub revision (branch, tag or commit) for hub ids.", None, flag="--revision")
SEED = Setting("Seed of the random/stats inits and the input projection (in training also the head and the data "
               "order).", 0, SEEDS, flag="--seed")
