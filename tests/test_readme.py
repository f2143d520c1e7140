"""The README's Python examples run as written (in a fresh folder, on the embedded backbones)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).parents[1] / "README.md"
# (code, what the README says it prints or ""): a block followed by "prints ..." and an output block
BLOCKS = [(code, shown) for code, shown in re.findall(r"```python\n(.*?)```(?:\n\nprints[^\n]*\n\n```\n(.*?)```)?",
                                                      README.read_text(), flags=re.S)]


def _readme_machine() -> bool:
    """Whether this CPU is the kind the README's outputs were printed on (an AMD EPYC computing in bf16 with
    AVX-512 BF16): other CPUs round bf16 products, or compute in float32, differently."""
    from reservoir.runtime import native_bf16

    try:
        amd = "AuthenticAMD" in Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return amd and native_bf16() == "avx512_bf16"


def test_the_readme_has_python_examples():
    assert len(BLOCKS) >= 3 and sum(bool(shown) for _, shown in BLOCKS) >= 2


@pytest.mark.parametrize("index", range(len(BLOCKS)))
def test_readme_python_example_runs(index, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    code, shown = BLOCKS[index]
    exec(compile(code, f"README.md python block {index}", "exec"), {"__name__": "__readme__"})
    out = capsys.readouterr().out
    if shown and _readme_machine():  # what the README says it prints, exactly
        assert out == shown, f"README.md python block {index} printed\n{out}"
    printed = out.split("\n")
    accuracies = [float(m) for line in printed for m in re.findall(r"(\d+\.\d)%", line)]
    assert accuracies, printed  # every example prints accuracies
    if index == 0:  # digits through MiniLM: layer 0 sees one patch, deeper layers see the image
        layers = [int(line.split()[0]) for line in printed if line.strip()]
        assert layers == [0, 3, 6] and accuracies[0] < accuracies[1] and accuracies[2] > 80
    else:  # the sign of a sum is linear in the inputs: a random reservoir keeps it readable
        assert accuracies[0] > 75
