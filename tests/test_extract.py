"""Extraction details: local model folders, sequences beyond the positions, length bucketing."""

import numpy as np
import pytest
import torch

from reservoir.errors import ReservoirError
from reservoir.extract import ExtractConfig, run as run_extract, extract_rows, resolve_layers
from reservoir.store import FeatureStore, WritableStore

LISTOPS = {"n_train": 30, "n_test": 10, "min_length": 40, "max_length": 90}


@pytest.fixture(scope="module")
def short_gpt2(tmp_path_factory):
    """A GPT-2 with only 64 positions, saved as a local model folder."""
    from transformers import GPT2Config, GPT2Model

    path = tmp_path_factory.mktemp("gpt2-64")
    torch.manual_seed(0)
    GPT2Model(GPT2Config(n_layer=1, n_embd=16, n_head=2, n_positions=64)).save_pretrained(path)
    return str(path)


def test_local_folder_backbone(short_gpt2, tmp_path):
    out = run_extract(ExtractConfig(task="bit-xor", backbone=short_gpt2, out=str(tmp_path / "x.zarr"),
                                task_params={"n_train": 20, "n_test": 10}), progress=False)
    with FeatureStore.open(out) as store:
        assert store.attrs["backbone"]["family"] == "gpt2"
        assert store.attrs["backbone"]["max_positions"] == 64
        assert store.layers == [0, 1]


def test_too_long_sequences_are_refused_then_truncated_on_request(short_gpt2, tmp_path):
    out = tmp_path / "lo.zarr"
    with pytest.raises(ReservoirError, match="up to .* tokens; backbone .* has 64 positions .*--truncate"):
        run_extract(ExtractConfig(task="listops", backbone=short_gpt2, out=str(out), task_params=LISTOPS), progress=False)
    assert not out.exists()
    run_extract(ExtractConfig(task="listops", backbone=short_gpt2, out=str(out), task_params=LISTOPS, truncate=True),
            progress=False)
    with FeatureStore.open(out) as store:
        cut = store.attrs["task"]["truncated"]
        assert cut["max_tokens"] == 64
        assert cut["rows_cut"]["train"] > 0
    # a store of cut sequences is never reused for other data
    with pytest.raises(ReservoirError, match="written with task.params.min_length=40, this run has 20"):
        run_extract(ExtractConfig(task="listops", backbone=short_gpt2, out=str(out),
                              task_params={**LISTOPS, "max_length": 60, "min_length": 20}), progress=False)


def test_bucketing_keeps_row_order():
    """Rows are processed sorted by length but written back in their own order."""
    from reservoir.backbones import load_backbone

    bb = load_backbone("tiny-bert", d_in=15)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 30, 50)
    ids = rng.integers(0, 15, (50, 30)).astype(np.uint8)
    got = extract_rows(bb, ids, lengths, [0, 2], 1, batch_size=7, device=torch.device("cpu"), amp="none")
    for i in (0, 17, 49):
        with torch.no_grad():
            one = bb.features(torch.from_numpy(ids[i:i + 1, :lengths[i]]), torch.tensor([lengths[i]]), [0, 2])
        np.testing.assert_allclose(got[i], one[0].numpy(), atol=1e-5)


def test_resolve_layers():
    assert resolve_layers(2, 6) == [0, 1, 2]
    assert resolve_layers([6, 0, 3, 3], 6) == [0, 3, 6]
    assert resolve_layers(None, 4) == [0, 1, 2, 3, 4]
    with pytest.raises(ReservoirError, match="within 0..6"):
        resolve_layers(7, 6)
    with pytest.raises(ReservoirError, match="within 0..6"):
        resolve_layers([-1, 2], 6)
    assert resolve_layers(np.int64(2), 6) == [0, 1, 2]


def test_layers_from_numpy_are_ints_and_an_empty_list_is_one_line():
    config = ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=np.int64(1))
    assert config.layers == 1 and type(config.layers) is int
    config = ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=(np.int64(2), 0))
    assert config.layers == [2, 0] and all(type(k) is int for k in config.layers)
    with pytest.raises(ReservoirError, match=r"^--layers must be a depth K, a list of layers or 'all', found \[\]$"):
        ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=[])


def test_config_values_of_the_wrong_kind_are_one_line_and_numpy_values_are_taken(tmp_path):
    def refused(match, **kw):
        with pytest.raises(ReservoirError, match=match):
            ExtractConfig(task="bit-xor", backbone="tiny-gpt2", **kw)

    refused(r"^--batch-size must be an integer >= 1, found 2.5$", batch_size=2.5)
    refused(r"^--batch-size must be an integer >= 1, found '8'$", batch_size="8")
    refused(r"^--batch-size must be an integer >= 1, found True$", batch_size=True)
    refused(r"^--max-tokens must be an integer >= 1, found 40.5$", max_tokens=40.5)
    refused(r"^--pooling must be one or more of last, first, mean .*; found None$", pooling=None)
    refused(r"^--out must be a path \(not empty\), found ''$", out="")
    refused(r"^--layers: expected each layer once; found layer 1 twice in 2,1,1$", layers=[2, 1, 1])
    config = ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=np.array([0, 2]), batch_size=np.int64(8),
                           max_tokens=np.int32(64), out=tmp_path / "x.zarr")
    assert config.layers == [0, 2] and all(type(k) is int for k in config.layers)
    assert type(config.batch_size) is int and type(config.max_tokens) is int and config.out == str(tmp_path / "x.zarr")


def test_extract_rows_takes_a_device_name_and_no_rows():
    from reservoir.backbones import load_backbone

    bb = load_backbone("tiny-gpt2", d_in=15)
    ids, lengths = np.random.default_rng(0).integers(0, 15, (3, 5)).astype(np.uint8), np.array([5, 2, 4])
    np.testing.assert_array_equal(extract_rows(bb, ids, lengths, [0, 2], 1, device="cpu", amp="none"),
                                  extract_rows(bb, ids, lengths, [0, 2], 1, amp="none"))
    feats, states = extract_rows(bb, ids[:0], lengths[:0], [0, 2], 1, full_seq_layer=1, amp="none")
    assert feats.shape == (0, 2, 1, 32) and states.shape == (0, 5, 32) and feats.dtype == np.float32


def test_extract_refuses_a_backbone_whose_weights_are_not_float32(tmp_path):
    from reservoir import extract, get_task
    from reservoir.backbones import load_backbone

    task = get_task("bit-xor", n_train=16, n_test=8)
    bb = load_backbone("tiny-gpt2", d_in=task.d_in)
    for dtype, name in ((torch.float16, "float16"), (torch.bfloat16, "bfloat16")):
        out = tmp_path / f"{name}.zarr"
        with pytest.raises(ReservoirError, match=f"^expected a backbone with float32 weights, .*; found {name}$"):
            extract(task, bb.to(dtype), out, layers=1, amp="none", progress=False)
        assert not out.exists()
    with extract(task, bb.float(), tmp_path / "f.zarr", layers=1, amp="none", progress=False) as store:
        assert store.attrs["compute_dtype"] == "float32"


def test_split_point_states_default_to_the_inputs_width():
    from reservoir.backbones import load_backbone

    bb = load_backbone("tiny-gpt2", d_in=15)
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 12, 9)
    ids = rng.integers(0, 15, (9, 12)).astype(np.uint8)
    feats, states = extract_rows(bb, ids, lengths, [0, 2], 1, full_seq_layer=1, amp="none")
    assert feats.shape == (9, 2, 1, 32) and states.shape == (9, 12, 32)
    _, given = extract_rows(bb, ids, lengths, [0, 2], 1, full_seq_layer=1, max_length=12, amp="none")
    np.testing.assert_array_equal(states, given)
    with pytest.raises(ReservoirError, match=f"expected max_length at least the longest sequence \\({lengths.max()}\\) "
                                             "for the full-sequence states, found 3"):
        extract_rows(bb, ids, lengths, [0, 2], 1, full_seq_layer=1, max_length=3, amp="none")


def test_extract_on_objects_equals_the_config_builder(tmp_path):
    """extract(task, backbone, out) writes the store run(ExtractConfig) writes, and leaves the task whole."""
    from reservoir import extract, get_task, load_backbone

    params = {"n_train": 64, "n_test": 32}
    task = get_task("bit-xor", **params)
    backbone = load_backbone("tiny-gpt2", d_in=task.d_in)
    with extract(task, backbone, tmp_path / "objects.zarr", layers=[0, 2], dtype="float32", progress=False) as first:
        assert first.complete and first.layers == [0, 2]
    # a handle names the store to resume; it is closed, the store returned takes its place
    with extract(task, backbone, first, layers=[0, 2], dtype="float32", progress=False) as a:
        assert first.closed and a.path == first.path
        ref = run_extract(ExtractConfig(task="bit-xor", backbone="tiny-gpt2", layers=[0, 2], dtype="float32",
                                        task_params=params, out=str(tmp_path / "config.zarr")), progress=False)
        with FeatureStore.open(ref) as b:
            assert {k: a.attrs[k] for k in ("task", "backbone", "projection", "layers")} == \
                   {k: b.attrs[k] for k in ("task", "backbone", "projection", "layers")}
            for split in ("train", "test"):
                np.testing.assert_array_equal(a.features(split)[...], b.features(split)[...])
    wrong = load_backbone("tiny-gpt2", d_in=task.d_in + 1)
    with pytest.raises(ReservoirError, match="d_in=1, the backbone's projection takes d_in=2"):
        extract(task, wrong, tmp_path / "wrong.zarr", progress=False)
    assert not (tmp_path / "wrong.zarr").exists()



@pytest.mark.parametrize("lengths", ["varying", "equal"])
def test_resumed_store_batches_every_row_as_the_uninterrupted_one(tmp_path, monkeypatch, lengths):
    """A resumed run runs the whole window of an unfinished chunk again (writing only that chunk), so every row
    shares its batch with the rows it did: rows of varying lengths are batched by length within their window, and
    a row's result can depend on its batch's size even where every row has one length (a lone row takes another
    matrix kernel, whose sums round otherwise on the CPU's threads). The store is the same bit for bit."""
    import shutil

    import reservoir.store.files
    from reservoir import extract, get_task, load_backbone
    from reservoir.extract.engine import Engine

    monkeypatch.setattr(reservoir.store.files, "MIN_CHUNK_BYTES", 3 * 32 * 4 * 40)  # 40 rows a chunk
    if lengths == "varying":
        task = get_task("listops", n_train=400, n_test=80, min_length=5, max_length=60)
    else:
        task = get_task("bit-xor", n_train=400, n_test=80)
    batches: list[tuple[int, ...]] = []
    original_run = Engine.run

    def run_batches(self, inputs, lengths, rows, order, bounds, *args, **kwargs):
        batches.extend(tuple(sorted(rows[order[lo:hi]].tolist())) for lo, hi in bounds)
        return original_run(self, inputs, lengths, rows, order, bounds, *args, **kwargs)

    monkeypatch.setattr(Engine, "run", run_batches)

    def run(out):  # 16 rows a batch: chunks of 40 rows start inside batches
        bb = load_backbone("tiny-bert", d_in=task.d_in)
        return extract(task, bb, out, layers=[0, 1, 2], dtype="float32", device="cpu", batch_size=16, progress=False)

    with run(tmp_path / "ref.zarr") as ref:
        assert ref.chunk_rows("train") == 40 and len(ref.done("train")) == 10
        expected = np.asarray(ref.features("train")[:])
    uninterrupted, batches[:] = set(batches), []
    resumed = shutil.copytree(tmp_path / "ref.zarr", tmp_path / "resumed.zarr")
    for c in (3, 7):  # as a kill leaves them: features and done flag never written
        (resumed / "train" / "done" / "c" / str(c)).unlink()
        shutil.rmtree(resumed / "train" / "features" / "c" / str(c))
    written = []
    original = WritableStore.write_chunks

    def write_chunks(self, split, cs, *args, **kwargs):
        written.append((split, list(cs)))
        return original(self, split, cs, *args, **kwargs)

    monkeypatch.setattr(WritableStore, "write_chunks", write_chunks)
    with run(resumed) as st:
        assert [c for _, cs in written for c in cs] == [3, 7] and {s for s, _ in written} == {"train"}
        assert batches and set(batches) <= uninterrupted  # each row batched with the rows it was batched with
        assert {r for b in batches for r in b} >= {*range(120, 160), *range(280, 320)}
        assert np.array_equal(np.asarray(st.features("train")[:]), expected)
