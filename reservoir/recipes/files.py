"""Finding and reading recipe files: the shipped recipes, a recipe by name or path, the list of them."""

from __future__ import annotations

import os
from pathlib import Path

from reservoir.errors import ReservoirError
from reservoir.recipes.schema import Recipe


def recipes_dir() -> Path:
    """``$RESERVOIR_RECIPES``, else the recipes shipped with the package.

    The shipped recipes are the repository's top-level ``recipes/`` folder:
    ``reservoir/recipes/bundled`` links to it in a source checkout (so an
    editable install reads the files being edited), and a wheel carries copies
    of them there, so they are found from any working directory.
    """
    from importlib import resources

    env = os.environ.get("RESERVOIR_RECIPES")
    return Path(env) if env else Path(str(resources.files("reservoir.recipes") / "bundled"))


def load_recipe(name_or_path: str | os.PathLike) -> Recipe:
    """A recipe from a ``.yaml`` path, or by name from :func:`recipes_dir`."""
    import yaml

    ref = str(name_or_path)
    p = Path(ref)
    if not (p.suffix in (".yaml", ".yml") or os.sep in ref or p.is_file()):
        p = recipes_dir() / f"{ref}.yaml"
        if not p.is_file():
            names = [n for n, _ in list_recipes()]
            raise ReservoirError(f"unknown recipe {ref!r}; expected a .yaml path or one of: "
                                 f"{', '.join(names) or '(none in ' + str(recipes_dir()) + ')'}")
    if not p.is_file():
        raise ReservoirError(f"{p}: expected a recipe file, found no such file")
    try:
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ReservoirError(f"recipe {p.name}: expected UTF-8 text, found byte {err.object[err.start]:#04x} at "
                             f"offset {err.start}") from None
    except OSError as err:
        raise ReservoirError(f"recipe {p}: expected a readable file, found {err.strerror or err}") from None
    try:
        data = yaml.safe_load(text)
    except RecursionError:
        raise ReservoirError(f"recipe {p.name}: expected YAML, found nesting too deep to read") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ReservoirError(f"recipe {p.name}: expected YAML, found a syntax error{at}: "
                             f"{getattr(err, 'problem', None) or err}") from None
    recipe = Recipe.from_dict(data, p.name, text, folder=p.parent)
    recipe.path = p
    return recipe


def list_recipes() -> list[tuple[str, str]]:
    """``(name, description)`` for every recipe in :func:`recipes_dir` (an invalid one says why)."""
    out = []
    for p in sorted(recipes_dir().glob("*.yaml")):
        try:
            r = load_recipe(p)
            out.append((p.stem, r.description.splitlines()[0] if r.description else ""))
        except ReservoirError as err:
            out.append((p.stem, f"(invalid: {err})"))
    return out
