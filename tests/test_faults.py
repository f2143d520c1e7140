"""The fault suite: what a store guarantees when processes die, race, disks fill and files get damaged.

Kills and races run the real command in subprocesses (``python -m
reservoir.cli``); everything else runs in-process. The number of random-moment
kills per backend is ``RESERVOIR_FAULT_KILLS`` (default 3) and of two-writer
races ``RESERVOIR_FAULT_RACES`` (default 1); the README's Reliability section
quotes a run with 20 and 10.
"""

from __future__ import annotations

import errno
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import h5py
import numpy as np
import pytest

import reservoir.extract.plan
from reservoir.errors import ReservoirError
from reservoir.store import FeatureStore, WritableStore
from reservoir.store.backends import H5Backend, ZarrBackend
from reservoir.store.lock import StoreLock, holder, lock_path
from test_cli import assert_bad_input, assert_ok, invoke

# float32, tiny-gpt2 (3 layers x 32 dim): 2731 rows a chunk -> train has 3 chunks, test 1
ARGS = ["extract", "--task", "bit-xor", "-p", "n_train=6000", "-p", "n_test=500", "--backbone", "tiny-gpt2",
        "--layers", "2", "--dtype", "float32", "--batch-size", "512", "--quiet"]  # fmt: skip
ROW_ARRAYS = ("features", "labels", "lengths", "checksums", "done")
KILLS = int(os.environ.get("RESERVOIR_FAULT_KILLS", "3"))
RACES = int(os.environ.get("RESERVOIR_FAULT_RACES", "1"))


def arrays(path) -> dict[str, np.ndarray]:
    """Every row array of a store, read raw (no checks), plus the attributes that define it."""
    with FeatureStore.open(path) as st:
        out = {f"{s}/{k}": np.asarray(st._b.array(f"{s}/{k}")[...]) for s in st.splits for k in ROW_ARRAYS}
        out["projection/weight"] = st.projection_weight()
        out.update({f"final_norm/{k}": v for k, v in st.final_norm().items()})
        out["attrs"] = np.array(json.dumps({k: st.attrs[k] for k in ("task", "backbone", "layers", "complete")}))
    return out


def _copy_of(store: Path, out: Path) -> Path:
    """A copy of a store to damage, at ``out``."""
    shutil.copytree(store, out)
    return out


def assert_identical(path, reference) -> None:
    a, b = arrays(path), arrays(reference)
    assert a.keys() == b.keys()
    for key in a:
        assert np.array_equal(a[key], b[key]), key


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> dict[str, Path]:
    """An uninterrupted store of each backend, made by the CLI."""
    folder = tmp_path_factory.mktemp("reference")
    out = {}
    for fmt, suffix in (("zarr", ".zarr"), ("hdf5", ".h5")):
        out[fmt] = folder / f"ref{suffix}"
        assert_ok(invoke(*ARGS, "--out", out[fmt]))
    return out


def _command(out: Path) -> list[str]:
    return [sys.executable, "-m", "reservoir.cli", *ARGS, "--out", str(out)]


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1"}


# ------------------------------------------------------------------ kills
@pytest.mark.parametrize("fmt", ["zarr", "hdf5"])
def test_random_sigkill_then_same_command_is_bit_identical(tmp_path, reference, fmt):
    """Kill one extraction at a random moment, rerun the same command: the store equals the uninterrupted one.

    Moments are drawn from the writing phase (from the lock being taken to the process's exit, timed on an
    uninterrupted run): half uniformly over it, half within its first 50 ms, while the store is created.
    """
    rng = random.Random(f"kill-{fmt}")
    suffix = ".zarr" if fmt == "zarr" else ".h5"
    phase = _writing_phase(tmp_path / f"timed{suffix}")
    states = []
    for trial in range(KILLS):
        out = tmp_path / f"t{trial}{suffix}"
        proc = subprocess.Popen(_command(out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        while not lock_path(out).exists() and proc.poll() is None:
            time.sleep(0.001)
        time.sleep(rng.uniform(0, 0.05) if trial % 2 == 0 else rng.uniform(0, phase))
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stderr.close()
        states.append(_state(out))
        rerun = subprocess.run(_command(out), env=_env(), capture_output=True, text=True)
        assert rerun.returncode == 0, rerun.stderr
        assert "Traceback" not in rerun.stderr
        assert_identical(out, reference[fmt])
        assert not list(tmp_path.glob(f".{out.name}.tmp-*"))  # half-built stores of killed runs are cleared
    print(f"{fmt}: {KILLS} SIGKILLs in a {phase:.2f} s writing phase left "
          + ", ".join(f"{states.count(k)} {k}" for k in sorted(set(states)))
          + "; each rerun gave the uninterrupted store")


def _writing_phase(out: Path) -> float:
    """Seconds from the lock being taken to the end of an uninterrupted run of the command."""
    proc = subprocess.Popen(_command(out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not lock_path(out).exists() and proc.poll() is None:
        time.sleep(0.001)
    t0 = time.monotonic()
    assert proc.wait() == 0
    return time.monotonic() - t0


def _state(out: Path) -> str:
    """What a killed run left at ``out``."""
    if not out.exists():
        return "no store"
    with FeatureStore.open(out, allow_incomplete=True) as st:
        return "a complete store" if st.complete else "an unfinished store"


# ------------------------------------------------------------------ one writer
def test_second_writer_refused_in_one_line_naming_the_holder(tmp_path):
    out = tmp_path / "s.h5"
    with h5py.File(out, "w") as f:  # an existing file at the path must not be truncated by the refused writer
        f.attrs["schema"] = json.dumps("something else")
    before = out.read_bytes()
    with StoreLock(out):
        line = assert_bad_input(invoke(*ARGS, "--out", out))
        assert f"is being written by pid {os.getpid()} on " in line
        assert "pass another --out" in line
        # readers are told too
        assert "is being written by" in assert_bad_input(invoke("fit-linear", out, "--results", tmp_path / "r"))
    assert out.read_bytes() == before
    assert not lock_path(out).exists()  # released and removed


def test_lock_left_by_a_dead_process_is_taken_over(tmp_path, reference):
    out = tmp_path / "s.zarr"
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    lock_path(out).write_text(json.dumps({"pid": dead.pid, "host": "here", "started": "earlier"}))
    assert holder(out) is None  # a lock file nobody holds is no lock
    assert_ok(invoke(*ARGS, "--out", out))
    assert_identical(out, reference["zarr"])


def test_a_record_naming_a_pid_beyond_any_process_names_none():
    """A lease or lock record's pid beyond what a pid can be gave OverflowError (exit 1) from every reader."""
    from reservoir.io.system import MAX_PID, process_alive

    assert process_alive(os.getpid()) and not process_alive(2**64) and not process_alive(MAX_PID + 1)
    assert process_alive(-3) and process_alive("12")  # not a pid at all: taken as alive, as before


def test_a_lock_file_removed_under_a_writer_stops_it_and_its_release_spares_the_next_writers(tmp_path, monkeypatch):
    import reservoir.store.files

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 2 * 3 * 4)  # 3-row chunks
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": "float32", "pooling": {"kind": "last_real_token", "n_out_tokens": 1}, "full_seq_layer": None}
    path, rows = tmp_path / "s.zarr", np.ones((10, 2, 1, 3), np.float32)

    def writer():
        return WritableStore.create(path, attrs, {"train": (10, ())}, (2, 1, 3), np.eye(2, 3, dtype=np.float32))

    first = writer()
    n = first.chunk_rows("train")
    first.write_chunk("train", 0, rows[:n], np.zeros(n), np.ones(n))
    lock_path(path).unlink()  # by hand: the path no longer names the locked file
    second = StoreLock(path).acquire()  # what a second extraction would now be let in by
    with pytest.raises(ReservoirError, match=r"expected this writer's lock file .*s\.zarr\.lock in place; found it "
                                             r"removed or replaced while writing"):
        first.write_chunk("train", 1, rows[n:2 * n], np.zeros(n), np.ones(n))
    with pytest.raises(ReservoirError, match="removed or replaced"):
        first.mark_complete()
    first.close()
    assert holder(path)["pid"] == os.getpid() and lock_path(path).exists()  # the second writer's lock stands
    second.release()
    with writer() as st:  # a rerun resumes: chunk 0 done, chunk 1 never written
        assert n == 3 and st.done("train").tolist() == [True, False, False, False]


def test_two_concurrent_writers_leave_one_correct_store(tmp_path, reference):
    """``RACES`` times: two identical extractions start together into one path. Each race ends with the
    uninterrupted store and either one clean refusal or, when one run finished before the other took the
    lock, a second run that found the store complete."""
    outcomes = []
    for race in range(RACES):
        out = tmp_path / f"race{race}.zarr"
        procs = [subprocess.Popen(_command(out), env=_env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                  text=True) for _ in range(2)]
        results = [(p.wait(), p.stderr.read()) for p in procs]
        for p in procs:
            p.stderr.close()
        codes = sorted(rc for rc, _ in results)
        assert codes in ([0, 0], [0, 2]), results
        for rc, err in results:
            if rc == 2:
                lines = [ln for ln in err.splitlines() if ln.strip()]
                assert len(lines) == 1 and "is being written by pid" in lines[0], err
        assert_identical(out, reference["zarr"])
        outcomes.append("refused" if codes == [0, 2] else "both finished")
    print(f"two-writer races: {outcomes.count('refused')} of {RACES} ended with a refusal, "
          f"{outcomes.count('both finished')} with the second run finding the store complete")


def test_reader_of_an_interrupted_store_is_told_to_rerun(tmp_path, monkeypatch):
    out = tmp_path / "s.zarr"
    original = WritableStore.write_chunks
    calls = []
    monkeypatch.setattr(reservoir.extract.plan, "WINDOW_ROWS", 1)  # a window (and a write) per chunk

    def interrupted(self, *a, **k):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt
        return original(self, *a, **k)

    monkeypatch.setattr(WritableStore, "write_chunks", interrupted)
    assert invoke(*ARGS, "--out", out).exit_code == 130
    line = assert_bad_input(invoke("fit-linear", out, "--results", tmp_path / "r"))
    assert "is incomplete (an extraction was interrupted)" in line
    info = invoke("info", out)
    assert_ok(info)
    assert "status     interrupted" in info.stdout


# ------------------------------------------------------------------ damaged chunks
def _zarr_chunk(store: Path, split: str, name: str, chunk: int) -> Path:
    first = store / split / name / "c" / str(chunk)
    if first.is_file():  # a 1-d array's chunk
        return first
    files = sorted(first.rglob("*"))
    return next(f for f in files if f.is_file())


def _h5_corrupt(store: Path, split: str, name: str, chunk: int) -> None:
    with h5py.File(store, "r") as f:
        offset = f[f"{split}/{name}"].id.get_chunk_info(chunk).byte_offset
    with open(store, "r+b") as fh:
        fh.seek(offset + 16)
        fh.write(b"\x7f" * 64)


@pytest.mark.parametrize("name", ["done", "checksums"])
def test_a_garbled_flag_or_checksum_file_costs_its_own_chunk_only(tmp_path, reference, monkeypatch, name):
    """Flags and checksums are stored a chunk a file: one that does not decode marks that chunk damaged (listed by
    `info --verify`, written again by the rerun), not the whole split."""
    out = tmp_path / "s.zarr"
    shutil.copytree(reference["zarr"], out)
    _zarr_chunk(out, "train", name, 1).write_bytes(b"junkjunk")
    verify = invoke("info", out, "--verify")
    assert verify.exit_code == 2, verify.output
    assert "verify     train: 2/3 written chunks match their checksums" in verify.stdout
    assert f"chunk 1: train/{name} of chunk 1 unreadable" in verify.stdout
    assert "1 damaged chunk(s), 0 damaged array(s)" in verify.stderr
    _assert_rerun_rewrites_train_chunk_1(out, reference["zarr"], monkeypatch)


def _assert_rerun_rewrites_train_chunk_1(out: Path, reference: Path, monkeypatch) -> None:
    """The same extract command, rerun on a store whose train chunk 1 is damaged, writes that chunk alone again,
    says so, and leaves the uninterrupted store, which then verifies."""
    written = []
    original = WritableStore.write_chunks
    monkeypatch.setattr(WritableStore, "write_chunks", lambda self, split, cs, *a, **k: (
        written.extend((split, c) for c in cs), original(self, split, cs, *a, **k)))
    result = invoke(*ARGS, "--out", out)
    assert_ok(result)
    assert "1 damaged chunk(s) and 0 damaged array(s) will be written again: train 1" in result.stdout
    assert written == [("train", 1)]  # exactly the damaged chunk
    assert_identical(out, reference)
    assert_ok(invoke("info", out, "--verify"))


@pytest.mark.parametrize(
    "fmt, damage",
    [
        ("zarr", "delete features"),
        ("zarr", "delete labels"),
        ("zarr", "truncate features"),
        ("hdf5", "overwrite features"),
    ],
)
def test_damaged_chunk_is_refused_listed_and_re_extracted(tmp_path, reference, monkeypatch, fmt, damage):
    out = tmp_path / ("s.zarr" if fmt == "zarr" else "s.h5")
    assert_ok(invoke(*ARGS, "--out", out))
    action, name = damage.split()
    if fmt == "zarr":
        chunk = _zarr_chunk(out, "train", name, 1)
        if action == "delete":
            chunk.unlink()  # Zarr would read it as zeros
        else:
            chunk.write_bytes(chunk.read_bytes()[:100])
    else:
        _h5_corrupt(out, "train", name, 1)

    line = assert_bad_input(invoke("fit-linear", out, "--layer", "2", "--results", tmp_path / "r" / "fits"))
    assert "damaged store" in line and "train" in line
    assert not (tmp_path / "r").exists()  # the folders the refused fit made are gone again
    verify = invoke("info", out, "--verify")
    assert verify.exit_code == 2
    assert "verify     train: 2/3 written chunks match their checksums" in verify.stdout
    assert "chunk 1:" in verify.stdout
    assert "1 damaged chunk(s), 0 damaged array(s)" in verify.stderr
    _assert_rerun_rewrites_train_chunk_1(out, reference[fmt], monkeypatch)


@pytest.mark.parametrize(
    "damage, expected",
    [
        ("delete train/labels", "array train/labels is missing or unreadable"),
        ("garble train/features/zarr.json", "array train/features is missing or unreadable"),
        ("shape train/features", "array train/features is float32 (7000, 3, 1, 32), expected float32 (6000"),
        ("delete zarr.json", "expected a feature store (a Zarr folder holding zarr.json); found a folder without one"),
    ],
)
def test_structurally_damaged_store_is_one_line_everywhere(tmp_path, reference, damage, expected):
    out = _copy_of(reference["zarr"], tmp_path / "s.zarr")
    action, name = damage.split()
    target = out / name
    if action == "delete":
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    elif action == "garble":
        target.write_text("{not json")
    else:
        meta = json.loads((target / "zarr.json").read_text())
        meta["shape"][0] = 7000
        (target / "zarr.json").write_text(json.dumps(meta))
    commands = [["info", out], ["fit-linear", out, "--results", tmp_path / "r"]]
    if action != "delete" or name == "zarr.json":  # a missing array is made again by the extract rerun (below)
        commands.append(ARGS + ["--out", out])
    for cmd in commands:
        assert expected in assert_bad_input(invoke(*cmd)), cmd


@pytest.mark.parametrize("fmt, names", [
    ("zarr", ["train/labels"]),
    ("zarr", ["test/features", "test/checksums"]),
    ("zarr", ["train/done", "projection/weight"]),
    ("zarr", ["train"]),
    ("hdf5", ["train/features"]),
    ("hdf5", ["test/done", "final_norm/weight"]),
])
def test_an_array_deleted_whole_is_made_again_by_the_extract_rerun(tmp_path, reference, fmt, names):
    """A copy cut short or a folder deleted leaves arrays of the layout absent: readers refuse the store in one line
    naming one, and the same extract command makes them again and writes their splits whole, to the uninterrupted
    store."""
    import h5py

    out = tmp_path / ("s.zarr" if fmt == "zarr" else "s.h5")
    shutil.copytree(reference[fmt], out) if fmt == "zarr" else shutil.copy(reference[fmt], out)
    for name in names:
        if fmt == "zarr":
            shutil.rmtree(out / name)
        else:
            with h5py.File(out, "r+") as f:
                del f[name]
    line = assert_bad_input(invoke("info", out))
    assert "is missing or unreadable" in line and "rerun the extract command that wrote it" in line
    rerun = invoke(*ARGS, "--out", out)
    assert_ok(rerun)
    missing = names if names != ["train"] else None
    assert "missing array(s) will be made again (their splits extracted again): " in rerun.stdout
    if missing is not None:
        (said,) = [ln for ln in rerun.stdout.splitlines() if "missing array(s)" in ln]
        assert f"{len(missing)} missing array(s)" in said and set(said.split(": ")[-1].split(", ")) == set(missing)
    assert_identical(out, reference[fmt])
    assert_ok(invoke("info", out, "--verify"))


@pytest.mark.parametrize("edit", ["layers", "label_shape", "layer order", "chunk_rows", "complete"])
def test_edited_attributes_are_one_line(tmp_path, reference, edit):
    out = _copy_of(reference["zarr"], tmp_path / "s.zarr")
    meta = json.loads((out / "zarr.json").read_text())
    attrs = meta["attributes"]
    if edit == "layers":
        attrs["layers"] = [0, 1, 2, 3]
    elif edit == "label_shape":
        attrs["task"]["label_shape"] = [5, 1]
    elif edit == "layer order":  # same shapes, other meaning: a readout would read the wrong layer
        attrs["layers"] = [2, 1, 0]
    elif edit == "chunk_rows":
        attrs["chunk_rows"]["train"] = 0
    else:
        attrs["complete"] = "yes"
    (out / "zarr.json").write_text(json.dumps(meta))
    for cmd in (["info", out], ["fit-linear", out, "--layer", "2", "--results", tmp_path / "r"]):
        line = assert_bad_input(invoke(*cmd))
        assert "damaged store: its attributes were changed after it was created" in line, line


# ------------------------------------------------------------------ write errors
@pytest.mark.parametrize("backend", [ZarrBackend, H5Backend])
def test_full_disk_stops_with_one_line_and_resumes_bit_identically(tmp_path, reference, monkeypatch, backend):
    """A write that fails with ENOSPC ends the run in one line with that chunk not marked done; the same
    command then resumes to the uninterrupted store. (Injected at the fourth flush: after creation, chunk 0's
    rows and its flag, chunk 1's rows.)"""
    fmt = "zarr" if backend is ZarrBackend else "hdf5"
    out = tmp_path / ("s.zarr" if fmt == "zarr" else "s.h5")
    original, flushes = backend.flush, []
    monkeypatch.setattr(reservoir.extract.plan, "WINDOW_ROWS", 1)  # a window (and a write) per chunk

    def full_disk(self):
        flushes.append(1)
        if len(flushes) == 4:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        return original(self)

    monkeypatch.setattr(backend, "flush", full_disk)
    line = assert_bad_input(invoke(*ARGS, "--out", out))
    assert "could not write chunk 1 of split 'train' (No space left on device); it is not marked done" in line
    monkeypatch.setattr(backend, "flush", original)
    with FeatureStore.open(out, allow_incomplete=True) as st:
        assert not st.complete and st.done("train").tolist() == [True, False, False]
    assert_ok(invoke(*ARGS, "--out", out))
    assert_identical(out, reference[fmt])


def test_failed_creation_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "s.zarr"

    def no_space(self, *a, **k):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(ZarrBackend, "create", no_space)
    line = assert_bad_input(invoke(*ARGS, "--out", out))
    assert "No space left on device" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # no store, no temporary, no lock file


# ------------------------------------------------------------------ non-finite values
@pytest.mark.parametrize("gain", ["nan", "inf", "-inf", "0", "-1"])
def test_gain_must_be_finite_and_positive(tmp_path, gain):
    line = assert_bad_input(invoke(*ARGS, "--gain", gain, "--out", tmp_path / "s.zarr"))
    assert "--gain must be a finite number above 0" in line
    assert not list(tmp_path.iterdir())


def test_float16_overflow_is_refused_and_no_store_is_left(tmp_path):
    args = [a for a in ARGS if a not in ("--dtype", "float32")]
    line = assert_bad_input(invoke(*args, "--gain", "1e30", "--out", tmp_path / "s.zarr"))
    assert "non-finite values (NaN or inf) in layer 0 of split 'train'" in line
    assert "--dtype float32" in line
    assert not list(tmp_path.iterdir())


def test_store_refuses_non_finite_chunks(tmp_path):
    attrs = {"backbone": {"n_dim": 3}, "projection": {}, "task": {"name": "t", "label_shape": []}, "layers": [0, 1],
             "dtype": "float32",
             "pooling": {"kind": "last_real_token", "n_out_tokens": 1}, "full_seq_layer": None}
    with WritableStore.create(tmp_path / "s.zarr", attrs, {"train": (4, ())}, (2, 1, 3),
                              np.eye(2, 3, dtype=np.float32)) as st:
        feats = np.zeros((4, 2, 1, 3), np.float32)
        feats[1, 1, 0, 2] = np.nan
        with pytest.raises(ReservoirError, match="non-finite values .* in layer 1 of split 'train'"):
            st.write_chunk("train", 0, feats, np.zeros(4, np.int64), lengths=np.ones(4))
        assert not st.done("train").any()


# ------------------------------------------------------------------ other one-line cases
def test_format_contradicting_the_existing_store_is_refused(tmp_path, reference):
    line = assert_bad_input(invoke(*ARGS, "--format", "hdf5", "--out", reference["zarr"]))
    assert "is an existing zarr store, --format asks for hdf5" in line


def test_other_task_is_named_in_the_refusal(reference):
    args = ["extract", "--task", "listops", "-p", "n_train=40", "-p", "n_test=20", "-p", "max_length=60",
            "--backbone", "tiny-gpt2", "--layers", "2", "--dtype", "float32", "--quiet"]
    line = assert_bad_input(invoke(*args, "--out", reference["zarr"]))
    assert "was written with task.name='bit-xor', this run has 'listops'" in line


@pytest.mark.parametrize("cmd", ["info", "fit-linear", "extract"])
def test_non_store_hdf5_file_with_attributes_is_one_line(tmp_path, cmd):
    path = tmp_path / "other.h5"
    with h5py.File(path, "w") as f:
        f.attrs["note"] = "not json"
        f.attrs["n"] = 3
        f["data"] = np.arange(5)
    before = path.read_bytes()
    args = {"info": ["info", path], "fit-linear": ["fit-linear", path, "--results", tmp_path / "r"],
            "extract": [*ARGS, "--out", path]}[cmd]
    line = assert_bad_input(invoke(*args))
    assert "expected a reservoir feature store" in line
    assert path.read_bytes() == before


# ------------------------------------------------------------------ what the audit found
def test_cleared_done_flag_of_a_complete_store_is_damage_and_repaired(tmp_path, reference):
    out = _copy_of(reference["zarr"], tmp_path / "s.zarr")
    (out / "train" / "done" / "c" / "1").unlink()  # Zarr reads the flag as False
    verify = invoke("info", out, "--verify")
    assert verify.exit_code == 2 and "chunk 1: marked unwritten in a complete store" in verify.stdout
    result = invoke(*ARGS, "--out", out)
    assert_ok(result)
    assert "will be written again: train 1" in result.stdout and f"wrote {out} (zarr)" in result.stdout
    assert_identical(out, reference["zarr"])


@pytest.mark.parametrize("damage", ["delete", "garble"])
def test_damaged_final_norm_is_refused_and_rewritten(tmp_path, reference, damage):
    out = _copy_of(reference["zarr"], tmp_path / "s.zarr")
    chunk = out / "final_norm" / "weight" / "c" / "0"
    chunk.unlink() if damage == "delete" else chunk.write_bytes(b"\x00garbage" * 4)
    line = assert_bad_input(invoke("fit-linear", out, "--layer", "2", "--results", tmp_path / "r"))
    assert "damaged store: final_norm/weight" in line
    verify = invoke("info", out, "--verify")
    assert verify.exit_code == 2 and "0 damaged chunk(s), 1 damaged array(s)" in verify.stderr
    result = invoke(*ARGS, "--out", out)
    assert_ok(result)
    assert "0 damaged chunk(s) and 1 damaged array(s) will be written again: final_norm/weight" in result.stdout
    assert f"wrote {out} (zarr)" in result.stdout  # the store was reopened as incomplete, then completed
    assert_identical(out, reference["zarr"])
    assert_ok(invoke("info", out, "--verify"))


def test_swapped_chunks_do_not_match_their_checksums(tmp_path, reference):
    out = _copy_of(reference["zarr"], tmp_path / "s.zarr")
    for name in ("features", "labels", "lengths"):
        a, b = _zarr_chunk(out, "train", name, 0), _zarr_chunk(out, "train", name, 1)
        data_a, data_b = a.read_bytes(), b.read_bytes()
        a.write_bytes(data_b), b.write_bytes(data_a)
    a, b = out / "train" / "checksums" / "c" / "0" / "0", out / "train" / "checksums" / "c" / "1" / "0"
    data_a, data_b = a.read_bytes(), b.read_bytes()
    a.write_bytes(data_b), b.write_bytes(data_a)
    verify = invoke("info", out, "--verify")
    assert verify.exit_code == 2 and "chunk 0:" in verify.stdout and "chunk 1:" in verify.stdout


def test_dangling_symlink_or_dot_as_out_is_one_line(tmp_path, monkeypatch):
    link = tmp_path / "d.zarr"
    link.symlink_to(tmp_path / "nowhere.zarr")
    assert "symbolic link" in assert_bad_input(invoke(*ARGS, "--out", link))
    assert not list(tmp_path.glob(".d.zarr.tmp-*"))
    monkeypatch.chdir(tmp_path)
    assert "feature store" in assert_bad_input(invoke("info", "."))
    assert "expected a store path" in assert_bad_input(invoke("info", "/"))


def test_lock_file_that_is_a_symlink_is_not_followed(tmp_path, reference):
    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "s.zarr"
    lock_path(out).symlink_to(victim)
    assert "lock" in assert_bad_input(invoke(*ARGS, "--out", out))
    assert victim.read_text() == "precious"


def test_atomic_write_syncs_the_file_then_the_folder_that_holds_its_rename(tmp_path, monkeypatch):
    """A file published by rename survives a crash: the data are synced before the rename, the folder after it."""
    import os

    from reservoir.io import atomic_write

    synced = []
    real = os.fsync

    def recording(fd):
        synced.append(os.readlink(f"/proc/self/fd/{fd}"))
        real(fd)

    monkeypatch.setattr(os, "fsync", recording)
    with atomic_write(tmp_path / "r.json", "a result", text=True) as f:
        f.write("{}")
    assert len(synced) == 2 and synced[0].startswith(str(tmp_path / ".")) and synced[1] == str(tmp_path)
    assert (tmp_path / "r.json").read_text() == "{}"
