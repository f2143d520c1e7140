"""Every docstring example of the package runs and prints what it shows (examples marked ``+SKIP`` need files or a
network this suite does not have)."""

import doctest
import importlib
import pkgutil

import pytest

import reservoir

MODULES = sorted(m.name for m in pkgutil.walk_packages(reservoir.__path__, "reservoir."))


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run_as_shown(name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # examples that write files write them here
    monkeypatch.setenv("RESERVOIR_TASK_CACHE", "off")
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE, report=False,
                             raise_on_error=False, verbose=False)
    assert result.failed == 0, f"{result.failed} of {result.attempted} examples in {name} failed (run " \
                               f"`python -m doctest -v` on its file to see them)"


def test_the_callable_extract_package_shows_the_function():
    """``reservoir.extract`` is a package that calls :func:`reservoir.extract.api.extract`: help and tooltips
    show that function's parameters and text first, not ``(*args, **kwargs)``."""
    import inspect

    from reservoir.extract.api import extract

    assert inspect.signature(reservoir.extract) == inspect.signature(extract)
    assert reservoir.extract.__doc__.startswith(inspect.cleandoc(extract.__doc__))
    assert "The package, in data-flow order" in reservoir.extract.__doc__
