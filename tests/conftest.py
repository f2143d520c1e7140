import os
import tempfile

import pytest

# Tests never reach a model hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
# Built tasks are cached in a folder of this session, never in the working tree.
os.environ.setdefault("RESERVOIR_TASK_CACHE", tempfile.mkdtemp(prefix="reservoir-task-cache-"))


def pytest_configure(config):
    import torch

    # Tiny models run fastest on one thread, and tests never fight each other for the cores.
    torch.set_num_threads(1)


def pytest_collection_modifyitems(config, items):
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
