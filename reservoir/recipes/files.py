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
    if env and not Path(env).is_dir():
        found = "a file" if Path(env).exists() else "no such folder"
        raise ReservoirError(f"RESERVOIR_RECIPES: expected a folder of recipe files, found {found} at {env[:200]}")
    return Path(env) if env else Path(str(resources.files("reservoir.recipes") / "bundled"))


#: Largest recipe file read (a recipe is a few dozen lines).
MAX_RECIPE_BYTES = 1 << 20


#: Most values a recipe may hold once its aliases are expanded (the bundled ones hold a few hundred).
MAX_RECIPE_NODES = 100_000


def _loader(name: str):
    """YAML's safe loader, refusing a document whose aliases expand it past :data:`MAX_RECIPE_NODES` values (a
    few hundred bytes of nested aliases otherwise become gigabytes wherever the recipe is printed or hashed)."""
    import yaml

    class Bounded(yaml.SafeLoader):
        def compose_document(self):  # noqa: ANN202 - yaml's composer API
            node = super().compose_document()
            found = _expanded(node, {})
            if found > MAX_RECIPE_NODES:
                raise ReservoirError(f"recipe {name}: expected at most {MAX_RECIPE_NODES:,} values with its aliases "
                                     f"expanded, found {'more than ' if found > 10 * MAX_RECIPE_NODES else ''}"
                                     f"{min(found, 10 * MAX_RECIPE_NODES):,}")
            twice = _repeated_key(node)
            if twice is not None:  # PyYAML keeps the last silently: a whole earlier block would vanish
                key, first, again = twice
                raise ReservoirError(f"recipe {name}: expected each key once in a mapping; found {key!r} at line "
                                     f"{first} and again at line {again}")
            return node

    return Bounded


def _expanded(node, memo: dict[int, int]) -> int:
    """Values under a YAML node with every alias expanded, counted once per distinct node (memoised); stops counting
    past ten times the limit."""
    import yaml

    if node is None:
        return 0
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = 1  # a node inside itself counts once
    n = 1
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [c for pair in node.value for c in pair]
    else:
        children = []
    for child in children:
        n += _expanded(child, memo)
        if n > 10 * MAX_RECIPE_NODES:
            break
    memo[id(node)] = n
    return n


def _repeated_key(root) -> tuple[str, int, int] | None:
    """The first key written twice in one mapping of a YAML node tree (``(key, first line, second line)``), or
    ``None``; a merge key (``<<``) too: YAML takes one a mapping (a list of mappings to merge several), and with
    two PyYAML keeps one of them without a word."""
    import yaml

    seen: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            todo.extend(node.value)
        elif isinstance(node, yaml.MappingNode):
            lines: dict[tuple[str, str], int] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):
                    line = key.start_mark.line + 1
                    if (key.tag, key.value) in lines:
                        return key.value, lines[(key.tag, key.value)], line
                    lines[(key.tag, key.value)] = line
                todo.extend((key, value))
    return None


def load_recipe(name_or_path: str | os.PathLike, folder: Path | None = None) -> Recipe:
    """A recipe from a ``.yaml`` path, or by name from :func:`recipes_dir`; its relative data paths are taken from
    ``folder`` (default: the file's own folder)."""
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
        size = p.stat().st_size
        if size > MAX_RECIPE_BYTES:
            raise ReservoirError(f"recipe {p.name}: expected a recipe of at most {MAX_RECIPE_BYTES // 1024} KiB, "
                                 f"found {size:,} bytes")
        text = p.read_bytes().decode("utf-8")
    except UnicodeDecodeError as err:
        raise ReservoirError(f"recipe {p.name}: expected UTF-8 text, found byte {err.object[err.start]:#04x} at "
                             f"offset {err.start}") from None
    except OSError as err:
        raise ReservoirError(f"recipe {p}: expected a readable file, found {err.strerror or err}") from None
    try:
        data = yaml.load(text, Loader=_loader(p.name))  # noqa: S506 - the safe loader, bounded
    except RecursionError:
        raise ReservoirError(f"recipe {p.name}: expected YAML, found nesting too deep to read") from None
    except ReservoirError:  # the loader's own bound (a ValueError too)
        raise
    except ValueError as err:  # an integer of more than 4,300 digits, say (YAMLError is no ValueError)
        from reservoir.io import one_line

        raise ReservoirError(f"recipe {p.name}: expected YAML values Python reads, found {one_line(err)}") from None
    except yaml.YAMLError as err:
        mark = getattr(err, "problem_mark", None)
        at = f" at line {mark.line + 1}" if mark is not None else ""
        raise ReservoirError(f"recipe {p.name}: expected YAML, found a syntax error{at}: "
                             f"{getattr(err, 'problem', None) or err}") from None
    recipe = Recipe.from_dict(data, p.name, text, folder=p.parent if folder is None else folder)
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
