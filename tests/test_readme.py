"""The README's Python examples run as written (in a fresh folder, on the embedded backbones)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
BLOCKS = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_example_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    exec(compile(BLOCKS[index], f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
    printed = capsys.readouterr().out.split("\n")
    accuracies = [float(m) for line in printed for m in re.findall(r"(\d+\.\d)%", line)]
    assert accuracies, printed  # every example prints accuracies
    if index == 0:  # digits through MiniLM: layer 0 sees one patch, deeper layers see the image
        layers = [int(line.split()[0]) for line in printed if line.strip()]
        assert layers == [0, 3, 6] and accuracies[0] < accuracies[1] and accuracies[2] > 80
    else:  # the sign of a sum is linear in the inputs: a random reservoir keeps it readable
        assert accuracies[0] > 75
