"""The layering contract (``[tool.importlinter]`` in pyproject.toml) holds, and breaks where it should.

Each test runs ``lint-imports`` on a copy of the package; the copies that
break a rule (an import up the layers, transport that reaches a store) must
be refused with the offending import named.
"""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("importlinter")
ROOT = Path(__file__).resolve().parents[1]


def lint(tmp_path: Path, extra: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    """``lint-imports`` on a copy of the package, with ``extra`` lines appended to the named modules."""
    shutil.copytree(ROOT / "reservoir", tmp_path / "reservoir", ignore=shutil.ignore_patterns("__pycache__"),
                    symlinks=True)
    shutil.copy(ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    for module, line in (extra or {}).items():
        path = tmp_path / (module.replace(".", "/") + ".py")
        path.write_text(path.read_text() + f"\n{line}\n")
    env = {**os.environ, "PYTHONPATH": str(tmp_path)}
    cli = Path(sys.executable).with_name("lint-imports")
    return subprocess.run([str(cli), "--no-cache"], cwd=tmp_path, env=env, capture_output=True, text=True)


def test_the_package_keeps_its_layers(tmp_path):
    run = lint(tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "Contracts: 3 kept, 0 broken." in run.stdout


def test_an_import_up_the_layers_is_refused(tmp_path):
    run = lint(tmp_path, {"reservoir.store.layout": "import reservoir.extract.passes  # noqa"})
    assert run.returncode != 0
    assert "Layers follow the data flow BROKEN" in run.stdout
    assert "reservoir.store.layout -> reservoir.extract.passes" in run.stdout


def test_transport_that_reaches_a_store_is_refused(tmp_path):
    run = lint(tmp_path, {"reservoir.distributed.jobs": "import reservoir.store.layout  # noqa"})
    assert run.returncode != 0
    assert "distributed is transport only" in run.stdout and "BROKEN" in run.stdout
    assert "reservoir.distributed.jobs -> reservoir.store.layout" in run.stdout
