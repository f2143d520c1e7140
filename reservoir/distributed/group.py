"""Forming the process group torchrun describes: the rank's device, its threads, gloo (and NCCL) with timeouts."""

from __future__ import annotations

import contextlib
import datetime
import os
import signal
import sys
from collections.abc import Iterator

from reservoir.distributed.jobs import (DEFAULT_TIMEOUT, ENV_TIMEOUT, LOCAL, Job, Local, gloo_cause, is_leader,
                                        local_place, world_size)
from reservoir.errors import ReservoirError
from reservoir.io import env_seconds


def sharding(sharded: bool | None = None) -> bool:
    """Whether this process runs as a rank of a job (:func:`launch`'s ``sharded``, checked against the launch).

    ``None`` shards when launched by torchrun with several processes (the
    CLI), ``False`` never (one process works alone, as in a DDP script where
    only rank 0 extracts), ``True`` requires a torchrun launch (of any size: a
    job of one process runs the whole protocol, its group included).
    """
    is_leader()  # RANK and WORLD_SIZE read as torchrun sets them, or one line, before anything is written
    launched = "WORLD_SIZE" in os.environ and "MASTER_ADDR" in os.environ  # torchrun sets both, even for 1 process
    if sharded and not launched:
        raise ReservoirError(f"expected a torchrun launch for sharded=True; found WORLD_SIZE="
                             f"{os.environ.get('WORLD_SIZE', 'unset')} and MASTER_ADDR "
                             f"{'set' if 'MASTER_ADDR' in os.environ else 'unset'}")
    return bool(sharded) or (sharded is None and world_size() > 1)


@contextlib.contextmanager
def launch(device: str, sharded: bool | None = None) -> Iterator[Local]:
    """The job this process is part of: :data:`LOCAL` alone, else a :class:`Job` in a process group.

    ``sharded`` as :func:`sharding`. Each rank gets a device it can own
    (``cuda:LOCAL_RANK``) and its share of the node's cores. A group the
    caller formed is used, else one is formed here and ended on the way out.
    """
    if not sharding(sharded):
        yield LOCAL
        return
    import torch.distributed as dist

    _end_with_the_agent()
    local_rank, local_world = local_place(world_size())
    timeout = _timeout()
    device = rank_device(device, local_rank)
    _set_threads(local_world)
    own = not dist.is_initialized()
    if own:
        _init(device, timeout)
    group = None  # a caller's group without gloo (NCCL only) gets a gloo group beside it for the CPU messages
    if "gloo" not in str(dist.get_backend()):
        group = dist.new_group(backend="gloo", timeout=datetime.timedelta(seconds=timeout))
    # a caller's own group keeps the timeout it was formed with
    known = timeout if own or group is not None else None
    try:
        yield Job(dist.get_rank(), dist.get_world_size(), local_rank, device, known, group)
    finally:
        if group is not None:
            dist.destroy_process_group(group)
        if own:
            dist.destroy_process_group()


def _end_with_the_agent() -> None:
    """Under torchrun, end this worker when the agent that started it dies (SIGKILLed, say): left running, the
    workers would wait on peers that are gone and print c10d's complaints until their timeout. Linux only."""
    if not sys.platform.startswith("linux") or "TORCHELASTIC_RUN_ID" not in os.environ:
        return
    import ctypes

    pr_set_pdeathsig = 1
    agent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
    except (OSError, AttributeError):  # no prctl: the timeout still ends the worker
        return
    if os.getppid() != agent:  # the agent died before the request took effect
        os.kill(os.getpid(), signal.SIGTERM)


def _timeout() -> float:
    return env_seconds(ENV_TIMEOUT, DEFAULT_TIMEOUT)


def rank_device(device: str, local_rank: int) -> str:
    """The device of local rank ``local_rank``: ``cuda``/``auto`` on a GPU machine give ``cuda:LOCAL_RANK``."""
    import torch

    device = str(device)  # a torch.device from the Python API too
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda":
        return f"cuda:{local_rank}"
    if str(device).startswith("cuda:"):
        raise ReservoirError(f"expected --device cuda, auto or cpu in a sharded run (each rank takes "
                             f"cuda:LOCAL_RANK), found {device!r}")
    return device


def _set_threads(local_world: int) -> None:
    """Split the cores among this node's ranks, unless ``OMP_NUM_THREADS`` asks for other than torchrun's 1."""
    import torch

    if os.environ.get("OMP_NUM_THREADS", "1") not in ("", "1"):
        return
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    torch.set_num_threads(max(1, cores // max(1, local_world)))


def _import_before_the_group() -> None:
    """Import ``torch.distributed.nn.functional`` while no group exists.

    Its collectives take ``group=group.WORLD`` as a default argument, evaluated once, at import. Imported after the
    group forms (transformers imports it through ``torch._dynamo`` when the model loads), it keeps the default group
    alive for good: :func:`destroy_process_group` then leaves gloo's worker threads running, and one that drops its
    last finished work (whose tensors are Python objects) while the interpreter shuts down aborts the process
    ("terminate called without an active exception"), now and then, after a run that succeeded.
    """
    with contextlib.suppress(ImportError):  # a torch built without it has nothing to hold the group either
        import torch.distributed.nn.functional  # noqa: F401


def _init(device: str, timeout: float) -> None:
    """Join the process group torchrun describes (``MASTER_ADDR``, ``RANK``, ...): gloo, plus NCCL for CUDA."""
    import torch
    import torch.distributed as dist

    _import_before_the_group()
    backend = "gloo"
    if device.startswith("cuda"):
        from reservoir.runtime import resolve_device

        torch.cuda.set_device(resolve_device(device))
        backend = "cpu:gloo,cuda:nccl"
    try:
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout))
    except (RuntimeError, ValueError) as err:
        rank = f"rank {os.environ.get('RANK')} of {os.environ.get('WORLD_SIZE')}"
        if "timed out" in str(err).lower():  # the launch is fine; a peer did not come in time
            raise ReservoirError(f"{rank}: timed out after {timeout:g} s ({ENV_TIMEOUT}) waiting for the other ranks "
                                 f"to join ({gloo_cause(err)})") from None
        raise ReservoirError(f"{rank}: expected a torchrun launch (MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE), "
                             f"could not join it: {gloo_cause(err)}") from None
