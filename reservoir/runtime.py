"""Where, in what precision and from which seeds the backbone runs: devices, compute dtypes, seeds, positions.

Shared by extraction, live training, the readouts and the benchmarks, so that
all of them run the model the same way and refuse the same bad settings.
"""

from __future__ import annotations

import contextlib
import functools
import re
from typing import Any

from reservoir import options
from reservoir.errors import ReservoirError

AMPS = options.AMPS
#: The largest seed every consumer takes (torch generators, numpy, scikit-learn's ``random_state``).
SEED_MAX = options.SEED_MAX
_DEVICE = re.compile(r"cpu|cuda(:\d+)?")


def resolve_device(device: str) -> "Any":
    """The ``torch.device`` for ``device``: ``cpu``, ``cuda``, ``cuda:N`` or ``auto`` (CUDA when present, else CPU).

    The one place devices are checked: an unknown name, CUDA without a GPU
    or a GPU index beyond the machine's raises ReservoirError (one line).

    Examples
    --------
    >>> resolve_device("cpu")
    device(type='cpu')
    """
    import torch

    if isinstance(device, torch.device):
        device = str(device)
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if not isinstance(device, str) or not _DEVICE.fullmatch(device):
        raise ReservoirError(f"unknown device {device!r}; expected cpu, cuda, cuda:N or auto")
    if device.startswith("cuda"):
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise ReservoirError(f"device {device!r} asked for, found no CUDA device (use --device cpu)")
        if int(device.partition(":")[2] or 0) >= count:
            raise ReservoirError(f"device {device!r} asked for, found {count} CUDA device(s): cuda:0..cuda:{count - 1}")
    return torch.device(device)


def check_seed(seed: Any, what: str = "seed") -> int:
    """``seed`` as an int, or ReservoirError (one line) unless it is an integer in ``0..SEED_MAX``.

    Examples
    --------
    >>> check_seed(7)
    7
    """
    options.SEEDS.check(seed, what)
    return int(seed)


@functools.cache
def cpuinfo(field: str) -> str | None:
    """The first CPU's ``field`` in ``/proc/cpuinfo`` (``flags``, ``model name``), or ``None`` (not Linux, or no
    such field)."""
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key.strip() == field:
                    return value.strip()
    except OSError:
        pass
    return None


@functools.cache
def native_bf16() -> str | None:
    """The CPU's native bfloat16 instructions (``"amx_bf16"`` or ``"avx512_bf16"``, from ``/proc/cpuinfo``), or
    ``None``: without them bf16 arithmetic on the CPU is emulated, slower than float32."""
    flags = set((cpuinfo("flags") or "").split())
    return next((x for x in ("amx_bf16", "avx512_bf16") if x in flags), None)


def compute_dtype(device, amp: str):
    """The dtype the frozen forward runs in.

    CUDA: bf16 or fp16 (``auto``: bf16 where supported). CPU: bf16 (``auto``:
    only where the processor has native bf16, :func:`native_bf16`, else
    float32; fp16 is refused, the CPU has no fast fp16 path). ``none``: float32
    everywhere.
    """
    import torch

    if amp not in AMPS:
        raise ReservoirError(f"unknown amp {amp!r}; expected one of: {', '.join(AMPS)}")
    device = torch.device(device) if isinstance(device, str) else device
    if amp == "none":
        return torch.float32
    if device.type == "cpu":
        if amp == "fp16":
            raise ReservoirError("--amp fp16 is for CUDA; expected --amp auto, bf16 or none on the CPU, found fp16")
        return torch.bfloat16 if amp == "bf16" or native_bf16() else torch.float32
    if device.type != "cuda":
        return torch.float32
    if amp == "auto":
        amp = "bf16" if torch.cuda.is_bf16_supported() else "fp16"
    return torch.bfloat16 if amp == "bf16" else torch.float16


def compute_path(device, amp: str) -> str:
    """What :func:`compute_dtype` chose and why, for a benchmark's header: ``"bfloat16 (native avx512_bf16)"``."""
    import torch

    dtype = str(compute_dtype(device, amp)).replace("torch.", "")
    device = torch.device(device) if isinstance(device, str) else device
    if device.type != "cpu":
        return dtype
    native = native_bf16()
    if dtype == "bfloat16":
        return f"bfloat16 (native {native})" if native else "bfloat16 (emulated: no native bf16 on this CPU)"
    return "float32" + ("" if amp == "none" else " (no native bf16 on this CPU)")


def autocast(device, amp: str, cache: bool = True):
    """Autocast in :func:`compute_dtype`; a no-op where that is float32 (``amp="none"``, a CPU without native bf16).

    Training keeps float32 master weights under autocast; extraction casts the
    frozen weights once instead (:func:`cast_for_inference`). ``cache=False``
    turns off autocast's cache of cast weights, which a CUDA graph capture
    needs (the cache would hold tensors from outside the graph's memory).
    """
    import torch

    dtype = compute_dtype(device, amp)
    if dtype == torch.float32:
        return contextlib.nullcontext()
    return torch.autocast(device.type, dtype=dtype, cache_enabled=cache)


def cast_for_inference(backbone, device, amp: str):
    """Move a frozen backbone to ``device`` with its weights cast once for the compute dtype.

    Returns ``(backbone, context)``: the context to run forwards in. On CUDA,
    transformer backbones run natively in bf16/fp16 (every weight cast, no
    autocast, so no per-op casts). On the CPU only the linear layers of the
    blocks are cast, under autocast: the residual stream, the norms and the
    embeddings stay float32, which keeps bf16's rounding out of what every
    layer adds to (a fully cast MiniLM read bit XOR's layer 1 two points worse
    than float32; this way within its interval), at a small cost in speed. The
    LSTM baseline keeps float32 weights under autocast (its fused kernels pick
    their own precision).
    """
    import torch

    backbone.to(device)
    dtype = compute_dtype(device, amp)
    if dtype != torch.float32 and not _keeps_float32(backbone):
        if _mixed(backbone, device):
            cast_frozen_matmuls(backbone, dtype)
        else:
            backbone.cast(dtype)
    return backbone, forward_context(backbone, device, amp)


def cast_frozen_matmuls(backbone, dtype) -> int:
    """Store the frozen linear layers of ``backbone``'s blocks in ``dtype`` once; return how many (none for a
    backbone without blocks, the LSTM baseline).

    Under autocast a matrix product casts a float32 weight to the compute
    dtype at every call (autocast's cache keeps only the casts of weights that
    train). A frozen weight cast once is the tensor autocast would make, with
    the same rounding, so what autocast computes does not change; only the
    per-call copies go. Nothing changes in float32.
    """
    import torch
    from torch import nn
    from transformers.pytorch_utils import Conv1D

    blocks = getattr(backbone, "blocks", None)
    if dtype == torch.float32 or blocks is None:
        return 0
    n = 0
    for m in blocks.modules():
        own = list(m.parameters(recurse=False))
        if isinstance(m, (nn.Linear, Conv1D)) and own and not any(p.requires_grad for p in own):
            m.to(dtype=dtype)
            n += 1
    return n


def _keeps_float32(backbone) -> bool:
    """The LSTM baseline (no architecture-table entry) keeps float32 weights under autocast."""
    return getattr(backbone, "arch", None) is None


def _mixed(backbone, device) -> bool:
    """A transformer on the CPU: linear layers in the compute dtype, the rest float32, under autocast."""
    import torch

    device = torch.device(device) if isinstance(device, str) else device
    return device.type == "cpu" and not _keeps_float32(backbone)


def forward_context(backbone, device, amp: str):
    """What a forward of ``backbone`` runs in: autocast for the LSTM baseline and for transformers on the CPU,
    :func:`attention_backends` for cast transformers on CUDA."""
    if _keeps_float32(backbone) or _mixed(backbone, device):
        return autocast(device, amp)
    return attention_backends(device)


def attention_backends(device):
    """Scaled dot-product attention without the cuDNN backend on CUDA (nothing on the CPU).

    cuDNN attention builds an execution plan for every new input shape: tens of
    milliseconds each on an H200 (torch 2.11, cuDNN 9.19), several times the
    forward itself for a batch of 64. A pass over variable-length batches
    meets a new shape almost every batch and never amortizes them (``bench
    extract``, MiniLM on ListOps 20-500: pass 7.35 s with it, 1.88 s
    without). The flash and memory-efficient kernels need no plan.
    """
    if getattr(device, "type", device) != "cuda":
        return contextlib.nullcontext()
    return _NoCudnnAttention()


class _NoCudnnAttention:
    """A reusable (and nestable) ``sdpa_kernel`` context of every backend but cuDNN's (:func:`attention_backends`)."""

    def __init__(self):
        self._open: list[Any] = []

    def __enter__(self):
        from torch.nn.attention import SDPBackend, sdpa_kernel

        cm = sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH])
        cm.__enter__()
        self._open.append(cm)
        return self

    def __exit__(self, *exc):
        return self._open.pop().__exit__(*exc)


def synchronize(device) -> None:
    """Wait for the device's queued work (a no-op on the CPU): what timings must do before reading the clock."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def check_positions(task, backbone, name: str, hint: str = "") -> None:
    """Refuse a task whose sequences are longer than the backbone's position table."""
    if task.max_length > backbone.info.max_positions:
        raise ReservoirError(f"task {task.name!r} has sequences of up to {task.max_length} tokens; backbone {name!r} "
                             f"has {backbone.info.max_positions} positions{hint}")
