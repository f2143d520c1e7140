"""CUDA paths (autocast, pinned transfers); skipped without a GPU."""

import numpy as np
import pytest

from reservoir.extraction import ExtractConfig, run as run_extract
from reservoir.store import FeatureStore

pytestmark = pytest.mark.gpu


@pytest.mark.parametrize("amp", ["bf16", "fp16", "none"])
def test_cuda_extraction_matches_cpu(tmp_path, amp):
    params = {"task": "listops", "backbone": "tiny-bert", "layers": 2, "dtype": "float32",
              "task_params": {"n_train": 64, "n_test": 32, "max_length": 60}}
    cpu = run_extract(ExtractConfig(**params, device="cpu", out=str(tmp_path / "cpu.zarr")), progress=False)
    gpu = run_extract(ExtractConfig(**params, device="cuda", amp=amp, out=str(tmp_path / f"{amp}.zarr")), progress=False)
    tol = 1e-4 if amp == "none" else 5e-2
    with FeatureStore.open(cpu) as a, FeatureStore.open(gpu) as b:
        np.testing.assert_allclose(b.features("test")[...], a.features("test")[...], atol=tol, rtol=tol)
