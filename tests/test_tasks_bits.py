"""Bit XOR and bit memory: shapes, labels recomputed from inputs, seeding, validation."""

import numpy as np
import pytest

from reservoir.errors import ReservoirError
from reservoir.tasks import TASKS, get_task
from reservoir.tasks.bits import make_bit_memory, make_bit_xor


def test_registered_with_metadata():
    for name in ("bit-xor", "bit-memory"):
        spec = TASKS[name]
        assert spec.source == "generated (seeded)"
        assert spec.summary and "\n" not in spec.summary
    assert TASKS["bit-xor"].defaults == {"n_bits": 5, "n_train": 4000, "n_test": 1000, "seed": 0}
    assert TASKS["bit-memory"].defaults == {
        "n_bits": 1000, "n_patterns": 5, "bits_per_token": 50, "n_train": 2000, "n_test": 500, "seed": 0,
    }  # fmt: skip


# ----------------------------------------------------------------------- XOR


def test_xor_defaults_shapes_and_dtypes():
    task = get_task("bit-xor")
    assert (task.kind, task.d_in, task.n_classes, task.n_out_tokens) == ("continuous", 1, 2, 1)
    assert list(task.splits) == ["train", "test"]
    tr, te = task.splits["train"], task.splits["test"]
    assert tr.inputs.shape == (4000, 10, 1) and te.inputs.shape == (1000, 10, 1)
    assert tr.inputs.dtype == np.float32
    assert tr.lengths.dtype == np.int64 and np.all(tr.lengths == 10)
    assert tr.labels.shape == (4000, 5) and tr.labels.dtype == np.int64
    assert task.label_shape == (5,)
    assert task.max_length == 10
    assert set(np.unique(tr.inputs)) == {0.0, 1.0}
    assert task.params == {"n_bits": 5, "n_train": 4000, "n_test": 1000, "seed": 0}


@pytest.mark.parametrize("n_bits", [1, 5, 17, 256])
def test_xor_labels_are_xor_of_inputs(n_bits):
    task = get_task("bit-xor", n_bits=n_bits, n_train=300, n_test=50, seed=3)
    for split in task.splits.values():
        x = split.inputs[..., 0].astype(np.int64)  # (N, 2*n_bits)
        a, b = x[:, :n_bits], x[:, n_bits:]
        np.testing.assert_array_equal(split.labels, a ^ b)
        assert split.labels.shape == (len(split), n_bits)
    # both label values occur, so nothing degenerate
    assert set(np.unique(task.splits["train"].labels)) == {0, 1}


def test_xor_train_then_test_from_one_generator():
    task = get_task("bit-xor", n_bits=5, n_train=20, n_test=7, seed=11)
    rng = np.random.default_rng(11)
    tr, te = make_bit_xor(rng, 20, 5), make_bit_xor(rng, 7, 5)
    np.testing.assert_array_equal(task.splits["train"].inputs, tr.inputs)
    np.testing.assert_array_equal(task.splits["test"].inputs, te.inputs)
    assert not np.array_equal(task.splits["test"].inputs, task.splits["train"].inputs[:7])


def test_xor_seeding():
    a = get_task("bit-xor", n_train=100, n_test=20, seed=1)
    b = get_task("bit-xor", n_train=100, n_test=20, seed=1)
    c = get_task("bit-xor", n_train=100, n_test=20, seed=2)
    for name in a.splits:
        np.testing.assert_array_equal(a.splits[name].inputs, b.splits[name].inputs)
        np.testing.assert_array_equal(a.splits[name].labels, b.splits[name].labels)
    assert a.fingerprint == b.fingerprint and len(a.fingerprint) == 64
    assert a.fingerprint != c.fingerprint
    assert not np.array_equal(a.splits["train"].inputs, c.splits["train"].inputs)


@pytest.mark.parametrize(
    "params",
    [{"n_bits": 0}, {"n_bits": 257}, {"n_bits": 2.5}, {"n_bits": True}, {"n_train": 0}, {"n_test": -1},
     {"seed": -1}, {"seed": "0"}],
)  # fmt: skip
def test_xor_bad_params(params):
    with pytest.raises(ReservoirError) as err:
        get_task("bit-xor", **params)
    msg = str(err.value)
    assert "\n" not in msg and list(params)[0] in msg and "found" in msg


def test_unknown_param_rejected():
    with pytest.raises(ReservoirError) as err:
        get_task("bit-xor", n_bitz=3)
    assert "n_bitz" in str(err.value) and "\n" not in str(err.value)
    with pytest.raises(ReservoirError):
        get_task("bit-memory", n_bits_per_token=10)


# -------------------------------------------------------------------- memory


def test_memory_defaults_shapes_and_dtypes():
    task = get_task("bit-memory")
    assert (task.kind, task.d_in, task.n_classes, task.n_out_tokens) == ("continuous", 50, 2, 20)
    tr, te = task.splits["train"], task.splits["test"]
    assert tr.inputs.shape == (2000, 120, 50) and te.inputs.shape == (500, 120, 50)
    assert tr.inputs.dtype == np.float32
    assert tr.lengths.dtype == np.int64 and np.all(tr.lengths == 120)
    assert tr.labels.shape == (2000, 20, 50) and tr.labels.dtype == np.int64
    assert task.label_shape == (20, 50)
    assert set(np.unique(tr.labels)) == {0, 1}


def _unpack_memory(split, n_bits, n_patterns):
    n = len(split)
    seq = split.inputs.reshape(n, n_patterns + 1, n_bits)  # tokens back to bitstrings
    return seq[:, :n_patterns], seq[:, n_patterns], split.labels.reshape(n, n_bits)


@pytest.mark.parametrize("n_bits,n_patterns,bpt", [(1000, 5, 50), (60, 3, 4), (7, 1, 7), (12, 2, 1)])
def test_memory_query_matches_label_pattern(n_bits, n_patterns, bpt):
    task = get_task("bit-memory", n_bits=n_bits, n_patterns=n_patterns, bits_per_token=bpt, n_train=200, n_test=40)
    assert task.n_out_tokens == n_bits // bpt
    for split in task.splits.values():
        assert split.inputs.shape == (len(split), (n_patterns + 1) * n_bits // bpt, bpt)
        patterns, query, labels = _unpack_memory(split, n_bits, n_patterns)
        assert set(np.unique(patterns)) <= {-1.0, 1.0}
        assert set(np.unique(query)) <= {-1.0, 0.0, 1.0}
        target = 2 * labels - 1  # {0,1} -> ±1
        shown = query != 0
        np.testing.assert_array_equal(query[shown], target[shown])
        # the label is exactly one of the shown patterns, for every example
        matches = np.all(patterns == target[:, None, :], axis=2)  # (N, P)
        assert np.all(matches.any(axis=1))


def test_memory_mask_and_choice_statistics():
    task = get_task("bit-memory", n_train=400, n_test=10, seed=5)
    patterns, query, labels = _unpack_memory(task.splits["train"], 1000, 5)
    masked = np.mean(query == 0)
    assert 0.48 < masked < 0.52
    chosen = np.argmax(np.all(patterns == (2 * labels - 1)[:, None, :], axis=2), axis=1)
    counts = np.bincount(chosen, minlength=5)
    assert counts.min() > 40  # uniform over 5 patterns: about 80 each


def test_memory_train_then_test_from_one_generator():
    task = get_task("bit-memory", n_bits=20, n_patterns=3, bits_per_token=5, n_train=9, n_test=4, seed=2)
    rng = np.random.default_rng(2)
    tr, te = make_bit_memory(rng, 9, 20, 3, 5), make_bit_memory(rng, 4, 20, 3, 5)
    np.testing.assert_array_equal(task.splits["train"].inputs, tr.inputs)
    np.testing.assert_array_equal(task.splits["test"].labels, te.labels)


def test_memory_seeding():
    kw = dict(n_bits=100, bits_per_token=10, n_train=50, n_test=10)
    a = get_task("bit-memory", seed=0, **kw)
    b = get_task("bit-memory", seed=0, **kw)
    c = get_task("bit-memory", seed=1, **kw)
    np.testing.assert_array_equal(a.splits["train"].inputs, b.splits["train"].inputs)
    np.testing.assert_array_equal(a.splits["test"].labels, b.splits["test"].labels)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    assert not np.array_equal(a.splits["train"].inputs, c.splits["train"].inputs)


@pytest.mark.parametrize(
    "params,word",
    [({"n_bits": 1001}, "multiple"), ({"bits_per_token": 0}, "bits_per_token"), ({"n_patterns": 0}, "n_patterns"),
     ({"n_bits": -50}, "n_bits"), ({"n_train": 0}, "n_train"), ({"n_bits": 30, "bits_per_token": 7}, "multiple")],
)  # fmt: skip
def test_memory_bad_params(params, word):
    with pytest.raises(ReservoirError) as err:
        get_task("bit-memory", **params)
    msg = str(err.value)
    assert "\n" not in msg and word in msg and "found" in msg


@pytest.mark.parametrize("task, params, made", [
    ("bit-memory", {"n_patterns": 10**6, "n_train": 1}, "501 rows of 1,000,001,000 bits"),
    ("bit-memory", {"n_patterns": 8000}, "2,500 rows of 8,001,000 bits"),  # 119 GiB: filled, not just reserved
    ("bit-xor", {"n_bits": 256, "n_train": 10**8}, "100,001,000 rows of 512 bits"),
])  # fmt: skip
def test_parameters_whose_arrays_exceed_the_memory_are_refused_before_any_is_made(task, params, made, monkeypatch):
    import reservoir.io

    monkeypatch.setattr(reservoir.io.system, "available_memory", lambda: 16 << 30)
    with pytest.raises(ReservoirError) as err:
        get_task(task, **params)
    assert str(err.value).startswith(f"task {task!r}: expected arrays ({made}) that fit in the 16.0 GiB of memory "
                                     "available; found ")


def test_fingerprints_are_pinned():
    """Fingerprints recorded before the task modules were reorganized: same params, same arrays, on any machine."""
    assert get_task("bit-xor", n_train=50, n_test=20).fingerprint == (
        "8be8bc109ab4dfb38aba1a24f99f2003342ea091a60cb7ae67e11f859c477a36")
    assert get_task("bit-xor", n_bits=17, n_train=30, n_test=10, seed=5).fingerprint == (
        "7b9b4ec4cf30a1f04d9a1065a752b7a66a3122a8ab25afd266f3eb4e2da1f0d5")
    memory = get_task("bit-memory", n_bits=60, n_patterns=3, bits_per_token=4, n_train=20, n_test=10, seed=2)
    assert memory.fingerprint == "8a870f978a9804340c7238e98215e2926fb956558903090852bf6b5b3bb49b1b"
