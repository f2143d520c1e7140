"""The fast paths keep the results: token budgets, windows, the chunk writer, compute dtypes, the cached head."""

import copy
import json
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

import reservoir.store
from reservoir.backbones import load_backbone
from reservoir.extract.plan import plan_order, plan_windows
from reservoir.bench import BenchResult
from reservoir.cli import main
from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig, extract_rows
from reservoir.extract import run as run_extract
from reservoir.store import FeatureStore, WritableStore
from reservoir.training.cached import CachedHead
from reservoir.extract.writer import ChunkWriter

LISTOPS = {"n_train": 150, "n_test": 40, "min_length": 5, "max_length": 90}


def test_token_budget_plan_covers_every_row_within_budget():
    lengths = np.random.default_rng(0).integers(1, 90, 500)
    order, bounds = plan_order(lengths, max_tokens=300)
    assert sorted(order.tolist()) == list(range(500))
    assert np.all(np.diff(lengths[order]) >= 0)
    assert bounds[0][0] == 0 and bounds[-1][1] == 500
    assert all(a[1] == b[0] for a, b in zip(bounds, bounds[1:]))
    for lo, hi in bounds:
        assert (hi - lo) * lengths[order[hi - 1]] <= 300 or hi - lo == 1
    # a row cap still applies, and the default without a budget is 64 rows
    assert max(hi - lo for lo, hi in plan_order(lengths, batch_size=5, max_tokens=10_000)[1]) == 5
    assert [hi - lo for lo, hi in plan_order(lengths)[1]][:2] == [64, 64]
    with pytest.raises(ReservoirError, match="--max-tokens must be an integer >= 1, found 0"):
        plan_order(lengths, max_tokens=0)


def test_windows_group_whole_chunks_within_limits():
    todo = np.array([0, 1, 2, 4, 5])
    windows = plan_windows(todo, chunk_rows=10, n_rows=55, row_bytes=100, budget=2_000, max_rows=1_000)
    assert [w.chunks for w in windows] == [[0, 1], [2, 4], [5]]
    assert windows[1].rows.tolist() == [*range(20, 30), *range(40, 50)]
    assert windows[2].rows.tolist() == list(range(50, 55))
    # one chunk per window at least, however large
    assert [w.chunks for w in plan_windows(todo, 10, 55, row_bytes=10**9)] == [[0], [1], [2], [4], [5]]


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-bert"])
def test_token_budget_gives_the_same_features_as_fixed_batches(tmp_path, name):
    stores = {}
    for tag, batching in {"rows": {"batch_size": 7}, "tokens": {"max_tokens": 400}, "default": {}}.items():
        stores[tag] = run_extract(ExtractConfig(task="listops", backbone=name, layers=2, dtype="float32", amp="none",
                                            task_params=LISTOPS, out=str(tmp_path / f"{tag}.zarr"), **batching),
                              progress=False)
    with FeatureStore.open(stores["rows"]) as a:
        for tag in ("tokens", "default"):
            with FeatureStore.open(stores[tag]) as b:
                for split in ("train", "test"):
                    np.testing.assert_allclose(b.features(split)[...], a.features(split)[...], atol=1e-6, rtol=1e-6)
                    np.testing.assert_array_equal(b.labels(split), a.labels(split))


def test_windows_of_one_chunk_give_the_same_store(tmp_path, monkeypatch):
    """Many small windows (resume-sized) and one large window write the same bytes."""
    import reservoir.extract.plan

    big = run_extract(ExtractConfig(task="listops", backbone="tiny-gpt2", layers=2, task_params=LISTOPS,
                                out=str(tmp_path / "big.zarr")), progress=False)
    monkeypatch.setattr(reservoir.extract.plan, "WINDOW_ROWS", 1)
    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 1000)
    small = run_extract(ExtractConfig(task="listops", backbone="tiny-gpt2", layers=2, task_params=LISTOPS,
                                  out=str(tmp_path / "small.zarr")), progress=False)
    with FeatureStore.open(big) as a, FeatureStore.open(small) as b:
        assert b.chunk_rows("train") < a.chunk_rows("train")
        np.testing.assert_allclose(b.features("train")[...], a.features("train")[...], atol=1e-3)


def test_chunk_writer_stops_the_run_on_a_write_error():
    written = []

    def write(item):
        if item == 2:
            raise OSError(28, "No space left on device")
        written.append(item)

    with pytest.raises(OSError, match="No space left"):
        with ChunkWriter(write, depth=1) as w:
            for i in range(10):
                w.submit(i)
    assert written[:2] == [0, 1] and 2 not in written and len(written) < 10


def test_failed_chunk_write_is_not_marked_done_and_resumes(tmp_path, monkeypatch):
    out = tmp_path / "x.zarr"
    cfg = ExtractConfig(task="listops", backbone="tiny-gpt2", layers=1, task_params=LISTOPS, out=str(out))
    calls = []
    original = WritableStore.write_chunks

    def failing(self, split, chunks, *a, **k):
        calls.append(list(chunks))
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return original(self, split, chunks, *a, **k)

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 1000)
    monkeypatch.setattr(reservoir.extract.plan, "WINDOW_ROWS", 200)  # several windows of several chunks
    monkeypatch.setattr(WritableStore, "write_chunks", failing)
    with pytest.raises(OSError):
        run_extract(cfg, progress=False)
    with FeatureStore.open(out, allow_incomplete=True) as st:
        assert len(calls[0]) > 1  # a window's chunks are one write
        assert not st.complete and np.flatnonzero(st.done("train")).tolist() == calls[0]
    monkeypatch.setattr(WritableStore, "write_chunks", original)
    run_extract(cfg, progress=False)
    ref = run_extract(ExtractConfig(**{**cfg.__dict__, "out": str(tmp_path / "ref.zarr")}), progress=False)
    with FeatureStore.open(out) as a, FeatureStore.open(ref) as b:
        assert a.complete
        np.testing.assert_array_equal(a.features("train")[...], b.features("train")[...])


@pytest.mark.parametrize("name", ["tiny-gpt2", "tiny-bert"])
def test_weights_cast_once_to_bf16_stay_close_to_float32(name):
    """The compute-dtype path (what CUDA runs in bf16) on the CPU: features within bf16 tolerance."""
    rng = np.random.default_rng(1)
    lengths = rng.integers(3, 40, 30)
    ids = rng.integers(0, 15, (30, 40)).astype(np.uint8)
    bb = load_backbone(name, d_in=15)
    ref = extract_rows(bb, ids, lengths, [0, 1, 2], 1, batch_size=8)
    low = extract_rows(copy.deepcopy(bb).to(torch.bfloat16), ids, lengths, [0, 1, 2], 1, batch_size=8)
    assert low.dtype == np.float32
    scale = np.abs(ref).max()
    np.testing.assert_allclose(low, ref, atol=0.05 * scale, rtol=0.05)


def _reference_head_training(head, X, Y, n_classes, order, batch_size, lr, clip):
    """What the cached side did before: autograd, torch.optim.Adam, clip_grad_norm_."""
    from reservoir.training import loss_fn

    opt = torch.optim.Adam(head.parameters(), lr=lr)
    for i in range(len(order) // batch_size):
        rows = order[i * batch_size : (i + 1) * batch_size]
        h = X[rows]  # (B, n_out, d)
        logits = head(h).view(len(rows), X.shape[1], -1, n_classes)
        loss = loss_fn(logits, Y[rows])
        opt.zero_grad()
        loss.backward()
        if clip:
            torch.nn.utils.clip_grad_norm_(list(head.parameters()), clip)
        opt.step()
    return head


@pytest.mark.parametrize("n_out,n_heads,clip", [(1, 1, 0.0), (1, 3, 1.0), (2, 4, 0.5)])
def test_cached_head_trains_the_same_head_as_autograd_adam(n_out, n_heads, clip):
    torch.manual_seed(0)
    N, d, C = 96, 12, 5
    X = torch.randn(N, n_out, d) * 3
    Y = torch.randint(0, C, (N, n_out, n_heads))
    head = torch.nn.Linear(d, n_heads * C)
    ref = _reference_head_training(copy.deepcopy(head), X, Y, C, torch.from_numpy(
        np.random.default_rng([7, 0]).permutation(N)), 16, 1e-2, clip)
    trainer = CachedHead(copy.deepcopy(head), X, Y, C, lr=1e-2, grad_clip=clip)
    assert trainer.run(trainer.epoch_order(seed=7, epoch=0), batch_size=16) == N // 16
    torch.testing.assert_close(trainer.head.weight, ref.weight, atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(trainer.head.bias, ref.bias, atol=1e-5, rtol=1e-4)
    assert trainer.mean_loss() > 0 and trainer.loss_steps == 0
    # and it learns: a separable problem reaches full accuracy
    Xs = torch.randn(256, 1, 4)
    Ys = (Xs[:, :, :1] > 0).long()
    learner = CachedHead(torch.nn.Linear(4, 2), Xs, Ys, 2, lr=5e-2)
    for epoch in range(20):
        learner.run(learner.epoch_order(0, epoch), 32)
    assert learner.accuracy(Xs, Ys) > 0.97


@pytest.mark.parametrize("n_out,n_heads,clip", [(1, 1, 0.0), (2, 3, 0.5)])
def test_cached_heads_graph_path_trains_the_head_its_eager_steps_train(monkeypatch, n_out, n_heads, clip):
    """The captured-run path (buffers gathered once per run, losses summed at its end) on the CPU, with a capture
    that records the steps instead of a CUDA graph: the same head, step for step, as the eager steps."""
    from reservoir.training import cached

    replays = []

    def record(body):
        def replay():
            replays.append(1)
            t = trainer.t
            body()
            trainer.t = t  # a replay runs no Python: the host's step count is the caller's to advance
        return replay

    torch.manual_seed(0)
    X, Y = torch.randn(16 * 70, n_out, 12), torch.randint(0, 5, (16 * 70, n_out, n_heads))
    head = torch.nn.Linear(12, n_heads * 5)
    eager = CachedHead(copy.deepcopy(head), X, Y, 5, lr=1e-2, grad_clip=clip)
    trainer = CachedHead(copy.deepcopy(head), X, Y, 5, lr=1e-2, grad_clip=clip)
    monkeypatch.setattr(trainer, "_capture", record)
    trainer.cuda_graphs = True  # as on CUDA
    for epoch in range(2):  # 70 steps: the first epoch eager (no step yet), then two replays of 32 and 6 eager steps
        order = eager.epoch_order(seed=3, epoch=epoch)
        assert eager.run(order, 16) == trainer.run(order, 16) == 70
    assert len(replays) == 2 and list(trainer._graphs) == [16] and trainer.t == eager.t == 140
    assert torch.equal(trainer.head.weight, eager.head.weight) and torch.equal(trainer.head.bias, eager.head.bias)
    assert trainer.loss_steps == 140 and trainer.mean_loss() == pytest.approx(eager.mean_loss(), rel=1e-5)
    monkeypatch.setattr(cached, "GRAPH_MAX_BYTES", 16 * 32 * n_out * 12 * 4 - 1)  # a larger batch runs eagerly
    assert trainer.run(eager.epoch_order(seed=3, epoch=2), 32) == 35 and trainer._graphs[32] is None
    assert len(replays) == 2


def run(*args):
    return CliRunner().invoke(main, [str(a) for a in args])


def test_bench_extract_cli(tmp_path):
    r = run("bench", "extract", "--task", "listops", *sum((["-p", f"{k}={v}"] for k, v in LISTOPS.items()), []),
            "--backbone", "tiny-gpt2", "--layers", 2, "--device", "cpu", "--naive-rows", 20, "--quiet",
            "--out", tmp_path / "b.json")
    assert r.exit_code == 0, r.output
    for line in ("pass / bare forward = ", "bare forward / HF forward = ", "naive / pass = ", "tokens per second"):
        assert line in r.stdout
    b = json.loads((tmp_path / "b.json").read_text())
    assert b["kind"] == "bench-extract" and b["n_rows"] == 190
    assert b["pass_over_bare"] == pytest.approx(b["pass_s"] / b["bare_forward_s"])
    assert b["naive_over_pass"] == pytest.approx(b["naive_s"] / b["pass_s"])
    # the naive way: one whole batch of 32 (20 rows' worth, at least one) of the 5 whole batches of 150 train and 40
    # test rows, scaled by batches; the partial last batches (22 and 8 rows) timed, not scaled
    assert (b["naive_whole_batches_timed"], b["naive_whole_batches"], b["naive_rows"]) == (1, 5, 32 + 22 + 8)
    assert b["naive_timed_s"] == pytest.approx(b["naive_whole_s"] + b["naive_partial_s"])
    assert b["naive_s"] == pytest.approx(b["naive_whole_s"] * 5 + b["naive_partial_s"])
    assert f"for 62 rows (1 of 5 whole batches, and the partial ones), {b['naive_s']:.2f} s scaled to 190" in r.stdout
    assert b["extract_s"] == pytest.approx(b["task_s"] + b["model_s"] + b["pass_s"])
    assert b["tokens"] < b["padded_tokens"] < b["n_rows"] * b["max_length"]  # buckets pad less than the naive way
    assert b["peak_rss_mb"] >= b["peak_rss_mb_extract"] > 100
    assert f"{b['pass_over_bare']:.3f}" in r.stdout
    # the writer's account: every row's float16 features once, within the pass
    assert b["write_mb"] == pytest.approx(190 * len(b["layers"]) * b["backbone"]["n_dim"] * 2 / 1e6)
    assert 0 < b["write_s"] and 0 <= b["tail_s"] < b["pass_s"] and b["copy_wait_s"] >= 0
    assert f"writer: {b['write_mb']:,.0f} MB of features in {b['write_s']:.2f} s summed over 1 thread (" in r.stdout
    # the pass thread's account: computing the windows, starting their copies, waiting for the writer; within the pass
    assert 0 < b["run_s"] and 0 <= b["to_host_s"] and 0 <= b["submit_wait_s"]
    assert b["run_s"] + b["to_host_s"] + b["submit_wait_s"] + b["tail_s"] <= b["pass_s"]
    assert f"pass thread: {b['run_s']:.2f} s computing windows, " in r.stdout
    read = BenchResult.read(tmp_path / "b.json")  # the file is the typed result, round trip exact
    assert read.kind == "bench-extract" and read["n_rows"] == 190
    assert sorted(read.extra) == ["environment", "written"] and read.to_dict() == b



def test_train_from_a_last_token_store_equals_live_output_only_training(tmp_path):
    """`train --from-store` on a float32 last-token store: the same head as the live output-only run."""
    from reservoir.training import TrainConfig, run

    xor = {"n_train": 200, "n_test": 60, "n_bits": 3}
    store = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", dtype="float32", task_params=xor,
                                  amp="none", out=str(tmp_path / "x.zarr")), progress=False)
    common = dict(finetune="output", steps=40, eval_every=10, batch_size=16, lr=3e-2, backbone="tiny-gpt2",
                  amp="none")  # float32 on both sides
    live = run(TrainConfig(task="bit-xor", task_params=xor, device="cpu", out=str(tmp_path / "live"), **common),
               progress=False)
    cached = run(TrainConfig(task="bit-xor", from_store=str(store), device="cpu", out=str(tmp_path / "cached"),
                             **common), progress=False)
    assert cached.cached is True and live.cached is None
    assert cached.metrics["test_accuracy"] == live.metrics["test_accuracy"]
    assert cached.metrics["best_step"] == live.metrics["best_step"]
    assert len(cached.curve) == len(live.curve) == 4
    for a, b in zip(cached.curve, live.curve):
        assert a["step"] == b["step"] and a["val_accuracy"] == b["val_accuracy"]
        assert a["train_loss"] == pytest.approx(b["train_loss"], rel=1e-4)
    best = torch.load(tmp_path / "cached" / "best.pt", weights_only=True)["head"]
    ref = torch.load(tmp_path / "live" / "best.pt", weights_only=True)["trainable"]
    torch.testing.assert_close(best["weight"], ref["head.weight"], atol=1e-5, rtol=1e-4)
    with pytest.raises(ReservoirError, match="found last-token features only, which train the output layer alone"):
        run(TrainConfig(task="bit-xor", from_store=str(store), finetune="fpt", out=str(tmp_path / "bad")),
            progress=False)


def test_chunk_writer_workers_write_every_item_once_and_stop_on_the_first_error():
    import threading

    seen, lock = [], threading.Lock()

    def write(item):
        with lock:
            seen.append(item)

    with ChunkWriter(write, depth=2, workers=3) as w:
        for i in range(50):
            w.submit(i)
    assert sorted(seen) == list(range(50))

    def failing(item):
        if item == 5:
            raise OSError(28, "No space left on device")

    with pytest.raises(OSError, match="No space left"):
        with ChunkWriter(failing, depth=1, workers=3) as w:
            for i in range(1000):
                w.submit(i)


def test_several_writer_threads_write_the_one_writer_store(tmp_path, monkeypatch):
    """Windows written side by side (as on CUDA): chunks, checksums and done flags as one writer leaves them."""
    from test_distributed import arrays

    passes = sys.modules["reservoir.extract.passes"]
    cfg = dict(task="listops", backbone="tiny-gpt2", layers=2, task_params=LISTOPS)
    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 1000)
    monkeypatch.setattr(reservoir.extract.plan, "WINDOW_ROWS", 60)  # many windows of a few chunks each
    one = run_extract(ExtractConfig(**cfg, out=str(tmp_path / "one.zarr")), progress=False)
    many = run_extract(ExtractConfig(**cfg, writers=4, out=str(tmp_path / "many.zarr")), progress=False)
    ref, got = arrays(one), arrays(many)
    assert got.keys() == ref.keys() and len(ref) > 0
    for key in ref:
        assert np.array_equal(got[key], ref[key]), key
    with FeatureStore.open(many) as s:
        assert s.complete and s.done("train").all() and s.chunk_rows("train") * 4 < s.n_rows("train")
    cpu, cuda = torch.device("cpu"), torch.device("cuda")
    assert passes.writers(cpu)["workers"] == 1 and passes.writers(cuda)["workers"] == passes.CUDA_WRITERS
    assert passes.writers(cpu, 4)["workers"] == passes.writers(cuda, 4)["workers"] == 4
    with pytest.raises(ReservoirError, match=r"--writers must be an integer in 1\.\.16, found 0"):
        ExtractConfig(**cfg, writers=0)


def test_default_batching_is_64_rows_on_the_cpu_and_a_width_scaled_token_budget_on_cuda():
    from reservoir.extract.plan import CUDA_BATCH_ELEMENTS, resolve_batching

    assert resolve_batching(None, None, torch.device("cpu"), 768) == (64, None)
    assert resolve_batching(None, None, torch.device("cuda", 1), 768) == (None, CUDA_BATCH_ELEMENTS // 768)
    assert resolve_batching(None, None, "cuda", 4096) == (None, 16384)
    assert resolve_batching(32, None, "cuda", 768) == (32, None)  # given settings stand, on any device
    assert resolve_batching(None, 5000, "cpu", 768) == (None, 5000)
    with pytest.raises(ReservoirError, match="--max-tokens must be an integer >= 1"):
        resolve_batching(None, 0, "cuda", 768)
    from reservoir.extract import prepare

    plan = prepare(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=1, task_params={"n_train": 50}))
    assert plan.batching == (64, None)
