"""The classes of hostile input a trial found, each closed at its root: a test per class.

Model folders never run code (no remote code, no prompt); writes and repairs
never land outside the output; ``--out`` never replaces what is not a regular
file; a run folder has one writer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from test_cli import assert_bad_input, invoke

EXTRACT = ["extract", "--task", "bit-xor", "-p", "n_train=64", "-p", "n_test=32", "--layers", "1", "--quiet"]


# ------------------------------------------------------------------ model folders run no code
def _code_folder(folder: Path, model_type: str, marker: Path) -> Path:
    """A model folder whose config maps the Auto classes to its own code, which would leave ``marker`` if run."""
    folder.mkdir()
    config = {"model_type": model_type, "auto_map": {"AutoConfig": "evil.EvilConfig", "AutoModel": "evil.EvilModel"},
              "hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2, "intermediate_size": 64,
              "vocab_size": 10, "max_position_embeddings": 64}
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "evil.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\n"
                                    "from transformers import PretrainedConfig, PreTrainedModel\n"
                                    "class EvilConfig(PretrainedConfig):\n    model_type = 'evil-model'\n"
                                    "class EvilModel(PreTrainedModel):\n    config_class = EvilConfig\n")
    return folder


@pytest.mark.parametrize("model_type", ["evil-model", "bert"])
def test_a_model_folder_with_code_never_runs_it_even_when_told_yes(tmp_path, model_type):
    marker = tmp_path / "code-ran"
    folder = _code_folder(tmp_path / "model", model_type, marker)
    run = subprocess.run([sys.executable, "-m", "reservoir", *EXTRACT, "--backbone", str(folder), "--init", "random",
                          "--out", tmp_path / "x.zarr"], input="y\ny\n", capture_output=True, text=True,
                         timeout=120, env={**os.environ, "HF_HUB_OFFLINE": "1"})
    assert not marker.exists(), "the folder's code ran"
    assert "custom code" not in run.stdout and "[y/N]" not in run.stdout  # nothing asked
    if model_type == "evil-model":  # an architecture only its code defines: refused in one line
        assert run.returncode == 2, run.stderr
        lines = [ln for ln in run.stderr.splitlines() if ln.strip()]
        assert len(lines) == 1 and lines[0].startswith("Error: "), run.stderr
    else:  # a known architecture: the toolkit's own class, the folder's code ignored
        assert run.returncode == 0, run.stderr
