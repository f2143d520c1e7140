"""Sharded extraction under torchrun: 2 gloo processes on the CPU give the single-process store, bit for bit.

Every run here is the real launcher (``python -m torch.distributed.run
--standalone``, a free port each) starting ``-m reservoir extract`` or, for
the faults, a small wrapper that makes rank 1 die or stall after its first
chunk is written.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from reservoir import distributed
from reservoir.errors import ReservoirError
from reservoir.store import FeatureStore, WritableStore
from reservoir.store.lock import StoreLock, holder, lock_path
from test_cli import assert_ok, invoke

# float32 tiny-gpt2: 2731 rows a chunk -> train 5 chunks (rank 0: 0, 2, 4; rank 1: 1, 3), test 1 chunk (rank 0)
ARGS = ["extract", "--task", "bit-xor", "-p", "n_train=12000", "-p", "n_test=500", "--backbone", "tiny-gpt2",
        "--layers", "2", "--dtype", "float32", "--device", "cpu", "--quiet"]  # fmt: skip
# varying lengths (tiny-bert float32: 2731 rows a chunk, one window a split): the ranks split the windows
LISTOPS = ["extract", "--task", "listops", "-p", "n_train=3000", "-p", "n_test=500", "-p", "max_length=120",
           "--backbone", "tiny-bert", "--layers", "2", "--dtype", "float32", "--device", "cpu", "--quiet"]  # fmt: skip
ROW_ARRAYS = ("features", "labels", "lengths", "checksums", "done")

# rank 1 dies (SIGKILL) or stalls right after its first chunk is written and marked done, or stalls opening the store;
# rank 0 dies (kill-host) after its first chunk
FAULTS = """
import os, signal, sys, time
import reservoir.extract.plan
import reservoir.extract.sharded
from reservoir.store import WritableStore

reservoir.extract.plan.WINDOW_ROWS = 1  # a window (and a write) per chunk

rank, fault, write = int(os.environ["RANK"]), os.environ.get("FAULT", ""), WritableStore.write_chunks
open(os.path.join(os.environ["PID_DIR"], f"rank{rank}.pid"), "w").write(str(os.getpid()))

def write_chunks(self, *args, **kwargs):
    write(self, *args, **kwargs)
    if rank == 1 and fault == "kill" or rank == 0 and fault == "kill-host":
        os.kill(os.getpid(), signal.SIGKILL)
    if rank == 1 and fault == "stall":
        time.sleep(120)

def open_shared(*args, open_shared=reservoir.extract.sharded._open_shared):
    if rank == 1 and fault == "stall-open":
        time.sleep(120)
    return open_shared(*args)

WritableStore.write_chunks = write_chunks
reservoir.extract.sharded._open_shared = open_shared
from reservoir.cli import main
sys.exit(main())
"""


def torchrun(*args, nproc: int = 2, env: dict[str, str] | None = None, timeout: float = 120):
    """``torchrun --standalone --nproc_per_node nproc ARGS`` (a free port of its own); the finished process."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
           *map(str, args)]
    return subprocess.run(cmd, env={**os.environ, **(env or {})}, capture_output=True, text=True, timeout=timeout)


def arrays(path: Path) -> dict[str, np.ndarray]:
    """Every row array of a store, read raw, plus its projection."""
    with FeatureStore.open(path) as st:
        out = {f"{s}/{k}": np.asarray(st._b.array(f"{s}/{k}")[...]) for s in st.splits for k in ROW_ARRAYS}
        out["projection/weight"] = st.projection_weight()
    return out


def assert_identical(path: Path, reference: Path) -> None:
    a, b = arrays(path), arrays(reference)
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key


def single(args: list[str], folder: Path) -> Path:
    """The store of one process (in-process CLI, one torch thread)."""
    path = folder / "one.zarr"
    assert_ok(invoke(*args, "--out", path))
    return path


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    return single(ARGS, tmp_path_factory.mktemp("one"))


@pytest.mark.parametrize("args, rows", [(ARGS, 12500), (LISTOPS, 3500)], ids=["equal-lengths", "varying-lengths"])
def test_two_ranks_write_the_single_process_store(tmp_path, reference, args, rows):
    """The done-when run: `torchrun --nproc_per_node 2 -m reservoir extract ...` equals one process, bit for bit
    (on 1 torch thread a rank, against 1 thread in one process)."""
    out = tmp_path / "two.zarr"
    run = torchrun("-m", "reservoir", *args, "--out", out)
    assert run.returncode == 0, run.stderr
    assert "Traceback" not in run.stderr
    assert run.stdout.count(f"wrote {out} (zarr)") == 1  # rank 0 reports, once
    assert f"2 processes wrote {rows} rows in" in run.stdout
    assert not lock_path(out).exists()  # rank 0 released the job's lock
    reference = reference if args is ARGS else single(args, tmp_path)
    a, b = arrays(out), arrays(reference)
    for split in ("train", "test"):
        for name in ("features", "labels", "lengths"):
            assert np.array_equal(a[f"{split}/{name}"], b[f"{split}/{name}"]), (split, name)
    assert_identical(out, reference)  # checksums, done flags and projection too


# the group is formed, then a model loads (transformers imports torch.distributed.nn through torch._dynamo)
GROUP_ENDS = """
import os, sys
from reservoir import distributed

assert "torch.distributed.nn" not in sys.modules, "imported before the group forms: nothing to check"
with distributed.launch("cpu", True) as job:
    import transformers.modeling_utils
    job.sync("loaded")
names = [open(f"/proc/self/task/{t}/comm").read().strip() for t in os.listdir("/proc/self/task")]
with open(os.path.join(os.environ["OUT_DIR"], f"rank{os.environ['RANK']}.txt"), "w") as f:
    f.write(str(sum(n.startswith(("pt_gloo", "gloo")) for n in names)))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="thread names from /proc")
def test_the_group_ends_with_its_threads_when_a_model_loaded_after_it_formed(tmp_path):
    """A group that outlives `destroy_process_group` (held by a default argument torch evaluates at import) leaves
    gloo's threads running into interpreter shutdown, where one dropping its last work aborts a run that
    succeeded, now and then. The group's threads end where the job ends."""
    script = tmp_path / "group_ends.py"
    script.write_text(GROUP_ENDS)
    run = torchrun(script, env={"OUT_DIR": str(tmp_path)})
    assert run.returncode == 0, run.stderr
    assert [(tmp_path / f"rank{r}.txt").read_text() for r in (0, 1)] == ["0", "0"]  # gloo threads left by each

def test_killed_rank_leaves_a_store_one_process_resumes(tmp_path, reference):
    """Rank 1 dies after its first chunk: its chunk stays done, nothing is marked complete; one process finishes it."""
    out, script = tmp_path / "killed.zarr", tmp_path / "faults.py"
    script.write_text(FAULTS)
    run = torchrun(script, *ARGS, "--out", out, env={"FAULT": "kill", "PID_DIR": str(tmp_path)})
    assert run.returncode != 0
    with FeatureStore.open(out, allow_incomplete=True) as st:
        assert not st.complete
        done = st.done("train")
        assert done[1] and not done[3], done  # rank 1's first chunk kept, its second never written
    resumed = invoke(*ARGS, "--out", out)
    assert_ok(resumed)
    assert_identical(out, reference)


def test_stalled_rank_times_out_in_one_line_naming_it(tmp_path):
    """A collective that times out ends the run (no hang) with one line naming the missing rank; rank 0 held
    the store's lock for the job."""
    out, script = tmp_path / "stalled.zarr", tmp_path / "faults.py"
    script.write_text(FAULTS)
    t0 = time.monotonic()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2", str(script),
           *ARGS, "--out", str(out)]
    env = {**os.environ, "FAULT": "stall", "PID_DIR": str(tmp_path), "RESERVOIR_DIST_TIMEOUT": "4"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    writer = None
    while not writer and proc.poll() is None:
        writer = holder(out)
        time.sleep(0.05)
    _, stderr = proc.communicate(timeout=90)
    assert proc.returncode != 0
    assert time.monotonic() - t0 < 60
    assert writer and writer["pid"] == int((tmp_path / "rank0.pid").read_text())
    lines = [ln for ln in stderr.splitlines() if ln.startswith("Error:")]
    assert lines == ["Error: rank 0 of 2: timed out after 4 s (RESERVOIR_DIST_TIMEOUT) waiting for rank(s) 1 at "
                     "written; finished chunks are kept: rerun the same command to resume"], stderr
    with FeatureStore.open(out, allow_incomplete=True) as st:
        assert not st.complete


def test_a_rank_lost_before_writing_removes_the_store_rank_0_created(tmp_path):
    """Rank 1 never opens the store rank 0 created: rank 0 times out at open, says the store is removed, and it is."""
    out, script = tmp_path / "open.zarr", tmp_path / "faults.py"
    script.write_text(FAULTS)
    run = torchrun(script, *ARGS, "--out", out, env={"FAULT": "stall-open", "PID_DIR": str(tmp_path),
                                                   "RESERVOIR_DIST_TIMEOUT": "4"}, timeout=90)
    assert run.returncode != 0
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("Error:")]
    assert lines == ["Error: rank 0 of 2: timed out after 4 s (RESERVOIR_DIST_TIMEOUT) waiting for rank(s) 1 at open; "
                     "this run wrote no chunk (a store it created is removed, one it resumed is kept as it was)"], \
        run.stderr
    assert not out.exists()


def test_the_store_host_lost_is_one_line_on_the_survivor(tmp_path):
    """Launched without torchrun's agent, rank 0 hosts the group's key-value store: when it dies, rank 1's progress
    calls to the store fail, each with a C++ stack trace from c10d unless silenced. Rank 1 ends with one line."""
    import socket

    out, script = tmp_path / "host.zarr", tmp_path / "faults.py"
    script.write_text(FAULTS)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "FAULT": "kill-host", "PID_DIR": str(tmp_path), "RESERVOIR_DIST_TIMEOUT": "30",
           "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port),
           "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, str(script), *ARGS, "--out", str(out)]
    ranks = [subprocess.Popen(cmd, env={**env, "RANK": str(r), "LOCAL_RANK": str(r)}, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for r in (0, 1)]
    _, stderr = ranks[1].communicate(timeout=90)
    ranks[0].communicate(timeout=30)
    assert ranks[0].returncode == -9 and ranks[1].returncode == 2
    lines = [ln for ln in stderr.splitlines() if "task cache" not in ln]
    assert len(lines) == 1 and re.fullmatch(r"Error: rank 1 of 2: lost a peer rank \(Connection closed by peer "
                                            r"\S+\) at written; finished chunks are kept: rerun the same command to "
                                            r"resume", lines[0]), stderr


def test_a_failed_store_call_is_the_last(monkeypatch):
    """A key-value store that failed once (its host gone) is not called again: each call would warn and wait."""
    import torch.distributed.distributed_c10d as c10d

    monkeypatch.setattr(c10d, "_get_default_store", lambda: "the store")
    job, calls = distributed.Job(0, 2, 0, "cpu", 1.0), []

    def fail(store):
        calls.append(store)
        raise RuntimeError("Connection reset by peer")

    assert job._store_call(fail) is None and job._store_call(fail) is None
    assert calls == ["the store"] and job.store_lost


def test_second_job_on_a_locked_store_is_refused(tmp_path):
    out = tmp_path / "locked.zarr"
    with StoreLock(out):
        run = torchrun("-m", "reservoir", *ARGS, "--out", out)
    assert run.returncode != 0
    lines = [ln for ln in run.stderr.splitlines() if ln.startswith("Error:")]
    assert any(f"is being written by pid {os.getpid()} on " in ln for ln in lines), run.stderr
    assert "Error: rank 1: stopped at create: rank 0 failed (see its error)" in lines
    assert not out.exists()


# ------------------------------------------------------------------ without a launcher
def test_python_dash_m_reservoir():
    run = subprocess.run([sys.executable, "-m", "reservoir", "--version"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.startswith("reservoir, version"), run.stderr


def test_sharded_hdf5_is_refused(tmp_path, monkeypatch):
    from reservoir.extract.api import open_job

    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(ReservoirError, match=r"expected a Zarr store for a sharded run \(2 processes"):
        with open_job(tmp_path / "x.h5", None, "cpu"):
            pass
    with pytest.raises(ReservoirError, match="expected a Zarr store"):
        with open_job(tmp_path / "x.store", "hdf5", "cpu"):
            pass
    with pytest.raises(ReservoirError, match="--format hdf5 contradicts the path's suffix .zarr"):
        with open_job(tmp_path / "x.zarr", "hdf5", "cpu"):
            pass
    assert not (tmp_path / "x.h5").exists() and not (tmp_path / "x.store").exists()


def test_rank_devices_and_timeout_setting(monkeypatch):
    assert distributed.rank_device("cpu", 3) == "cpu"
    if not __import__("torch").cuda.is_available():
        assert distributed.rank_device("auto", 1) == "cpu"
    assert distributed.rank_device("cuda", 3) == "cuda:3"
    with pytest.raises(ReservoirError, match="expected --device cuda, auto or cpu in a sharded run"):
        distributed.rank_device("cuda:1", 0)
    for bad in ("0", "-1", "soon", "inf"):
        monkeypatch.setenv(distributed.ENV_TIMEOUT, bad)
        with pytest.raises(ReservoirError, match="RESERVOIR_DIST_TIMEOUT: expected seconds from 0.01 to"):
            distributed.group._timeout()
    monkeypatch.setenv(distributed.ENV_TIMEOUT, "2.5")
    assert distributed.group._timeout() == 2.5


def test_windows_are_dealt_round_robin_over_the_splits():
    """The windows a single process would run (those holding an unfinished chunk) are dealt, continuing over the
    splits: each row is batched as in one process, whatever its split's lengths."""
    from reservoir.extract.plan import plan_windows

    def plan(chunks):  # 10 rows a chunk, 2 chunks a window
        return plan_windows(np.asarray(chunks, dtype=int), 10, 75, 1, budget=20, max_rows=20, stable=True)

    todo = np.array([1, 2, 4, 5, 6, 7])  # chunks 0 and 3 done: their windows run whole, only 1 and 2 written
    jobs = [distributed.Job(r, 3, r, "cpu", 10.0) for r in range(3)]
    windows = [[(w.chunks, w.done) for w in j.deal(plan(todo))] for j in jobs]
    assert windows == [[([0, 1], (0,)), ([6, 7], ())], [([2, 3], (3,))], [([4, 5], ())]]
    more = [[w.chunks for w in j.deal(plan(np.array([0, 1, 2])))] for j in jobs]
    assert more == [[], [[0, 1]], [[2, 3]]]  # after 4 windows: rank 1 deals first


# the Python API: extract(..., sharded=True) on every rank, or rank 0 alone extracting (the default) in a DDP job
API = """
import os, sys
import torch.distributed as dist
from reservoir import extract, get_task, load_backbone

mode, out = sys.argv[1], sys.argv[2]
dist.init_process_group("gloo")
task = get_task("bit-xor", n_train=12000, n_test=500)
if mode == "sharded" or dist.get_rank() == 0:
    bb = load_backbone("tiny-gpt2", d_in=task.d_in, depth=2)
    with extract(task, bb, out, layers=[0, 1, 2], dtype="float32", device="cpu", progress=False,
                 sharded=mode == "sharded") as store:
        assert store.complete
dist.barrier()
dist.destroy_process_group()
"""


@pytest.mark.parametrize("mode", ["sharded", "rank0-alone"])
def test_python_api_under_torchrun(tmp_path, reference, mode):
    """Every rank calling extract(sharded=True) writes the single-process store; by default a rank extracts alone."""
    script = tmp_path / "api.py"
    script.write_text(API)
    out = tmp_path / "api.zarr"
    done = torchrun(script, mode, out, env={"OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    assert_identical(out, reference)


def test_ranks_stop_writing_when_rank_0s_lock_is_gone(tmp_path):
    """A rank writes only while rank 0 holds the lock: once rank 0 has ended, another writer may take the store."""
    from reservoir.store.lock import SharedLock

    path = tmp_path / "s.zarr"
    lock = StoreLock(path).acquire()
    SharedLock(path, lock.record).check()  # rank 0 holds it: writing goes on
    lock.release()
    with pytest.raises(ReservoirError, match="found it released \\(rank 0 has ended\\)"):
        SharedLock(path, lock.record).check()
    other = StoreLock(path).acquire()  # another writer took the store: not rank 0's lock any more
    other.path.write_text(json.dumps({**other.record, "pid": 1, "host": "another-host"}))
    with pytest.raises(ReservoirError, match=f"expected rank 0 of this job \\(pid {os.getpid()} on .*\\) to hold "
                                             "the store's write lock .* found it held by pid 1 on another-host"):
        SharedLock(path, lock.record).check()
    other.release()


def test_other_ranks_open_the_store_rank_0_created_with_tuple_params(tmp_path):
    """The settings a rank compares with the store go through JSON as the store's attributes did: a tuple param
    (a list once stored) is the same setting."""
    from types import SimpleNamespace

    from reservoir.extract.sharded import _open_shared

    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "layers": [0], "dtype": "float32", "compute_dtype": None,
             "task": {"name": "t", "label_shape": [], "params": {"window": (2, 3)}},
             "pooling": {"kinds": ["last"], "n_out_tokens": 1}, "full_seq_layer": None}
    path = tmp_path / "s.zarr"
    with WritableStore.create(path, attrs, {"train": (2, ())}, (1, 1, 3), np.eye(2, 3, dtype=np.float32)) as st:
        writer = st.writer()
        shared = _open_shared(path, SimpleNamespace(attrs=attrs), SimpleNamespace(rank=1), writer)
        assert shared.writer() == writer
        shared.write_chunk("train", 0, np.ones((2, 1, 1, 3), np.float32), np.zeros(2), np.ones(2))  # rank 0's lock
        shared.close()
        assert st.done("train").all()


def test_a_rank_batching_otherwise_than_rank_0_is_refused(tmp_path):
    """Batching shapes a row's features (its batch's padding): every rank must batch as rank 0 began the store."""
    from types import SimpleNamespace

    from reservoir.extract.sharded import _open_shared

    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "layers": [0], "dtype": "float32", "compute_dtype": None,
             "task": {"name": "t", "label_shape": [], "params": {}}, "pooling": {"kinds": ["last"], "n_out_tokens": 1},
             "full_seq_layer": None, "batching": {"batch_size": 64, "max_tokens": None}}
    path = tmp_path / "s.zarr"
    with WritableStore.create(path, attrs, {"train": (2, ())}, (1, 1, 3), np.eye(2, 3, dtype=np.float32)) as st:
        other = {**attrs, "batching": {"batch_size": 5, "max_tokens": None}}
        with pytest.raises(ReservoirError, match=r"rank 1: .* is batched by rank 0 with --batch-size 64; found "
                                                 r"--batch-size 5 on this rank: expected one batching on every rank"):
            _open_shared(path, SimpleNamespace(attrs=other), SimpleNamespace(rank=1), st.writer())
        _open_shared(path, SimpleNamespace(attrs=attrs), SimpleNamespace(rank=1), st.writer()).close()
