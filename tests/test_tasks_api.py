"""The task API: a task from arrays, defaults read from the builders, the registry, Split's checks, param checks."""

import json
import subprocess
import sys

import numpy as np
import pytest
import torch
from click.testing import CliRunner

from reservoir.backbones import load_backbone
from reservoir.errors import ReservoirError
from reservoir.tasks import TASKS, Split, TaskData, TaskSpec, get_task, register
from reservoir.tasks.base import fingerprint
from reservoir.tasks.params import choice_param, int_param


def one_line(exc_info, *fragments):
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


def token_splits(seed=0):
    """Token ids (N, L) right-padded with 0, lengths, labels: train ids reach 6, test ids only 4."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, n, top in (("train", 12, 7), ("test", 5, 5)):
        ids = rng.integers(1, top, size=(n, 9))
        lengths = rng.integers(1, 10, size=n)
        ids[np.arange(9)[None, :] >= lengths[:, None]] = 0
        ids[0, : lengths[0]] = top - 1  # the largest id appears
        out[name] = (ids, lengths, rng.integers(0, 3, size=n))
    out["train"][2][0] = 3  # labels reach 3: four classes
    return out


# ---------------------------------------------------------------- from arrays


def test_tokens_inferred_from_integer_arrays():
    raw = token_splits()
    task = TaskData.from_arrays("toy-tokens", raw)
    assert (task.name, task.kind, task.d_in, task.n_classes, task.n_out_tokens) == ("toy-tokens", "tokens", 7, 4, 1)
    assert list(task.splits) == ["train", "test"] and task.params == {} and task.vocab is None
    for name, (ids, lengths, labels) in raw.items():
        s = task.splits[name]
        assert s.inputs.dtype == np.int64 and s.lengths.dtype == np.int64 and s.labels.dtype == np.int64
        np.testing.assert_array_equal(s.inputs, ids)
        np.testing.assert_array_equal(s.lengths, lengths)
        np.testing.assert_array_equal(s.labels, labels)
    assert task.max_length == max(int(ln.max()) for _, ln, _ in raw.values())
    assert task.label_shape == ()


def test_token_dtypes_the_backbone_reads_are_kept_others_become_int64():
    raw = token_splits()
    for dtype, kept in ((np.uint8, np.uint8), (np.int16, np.int16), (np.int32, np.int32), (np.int8, np.int64),
                        (np.uint16, np.int64), (np.uint32, np.int64)):  # fmt: skip
        splits = {k: (ids.astype(dtype), ln, y) for k, (ids, ln, y) in raw.items()}
        task = TaskData.from_arrays("toy", splits)
        assert task.splits["train"].inputs.dtype == kept, dtype
    u8 = raw["train"][0].astype(np.uint8)
    assert TaskData.from_arrays("toy", {"train": (u8, [9] * 12, [0, 1] * 6), "test": (u8, None, [1] * 12)}
                                ).splits["train"].inputs is u8  # no copy


def test_continuous_inferred_full_lengths_float32():
    rng = np.random.default_rng(1)
    x = rng.normal(size=(30, 5, 3))  # float64
    y = (x[:, -1, 0] > 0).astype(np.int32)
    task = TaskData.from_arrays("toy-vectors", {"train": (x[:20], y[:20]), "test": (x[20:], None, y[20:])})
    assert (task.kind, task.d_in, task.n_classes) == ("continuous", 3, 2)
    assert task.splits["train"].inputs.dtype == np.float32 and task.splits["test"].labels.dtype == np.int64
    np.testing.assert_array_equal(task.splits["test"].inputs, x[20:].astype(np.float32))
    assert task.splits["train"].lengths.tolist() == [5] * 20 and task.splits["test"].lengths.tolist() == [5] * 10
    f32 = x.astype(np.float32)
    kept = TaskData.from_arrays("toy", {"train": (f32, y), "test": (f32, y)})
    assert kept.splits["train"].inputs is f32  # float32 inputs are not copied
    ints = TaskData.from_arrays("toy", {"train": ((x * 10).astype(np.int16), y), "test": (f32, y)})
    assert ints.kind == "continuous" and ints.splits["train"].inputs.dtype == np.float32  # (N, L, d) ints are vectors


def test_explicit_facts_extra_splits_vocab_and_params():
    raw = token_splits()
    vocab = [f"t{i}" for i in range(10)]
    task = TaskData.from_arrays("toy", {"train": raw["train"], "val": raw["test"], "test": Split(*raw["test"])},
                                d_in=10, n_classes=6, vocab=vocab, params={"source": "notebook", "rows": 17})
    assert list(task.splits) == ["train", "val", "test"]
    assert (task.d_in, task.n_classes, task.vocab) == (10, 6, vocab)
    assert task.params == {"source": "notebook", "rows": 17}
    assert TaskData.from_arrays("toy", raw, vocab=vocab).d_in == 10  # vocab alone sets d_in
    # params as a store records them (through JSON): a tuple comes back a list, a key a str
    again = TaskData.from_arrays("toy", raw, params={"window": (2, 3), "by": {1: "one"}})
    assert again.params == {"window": [2, 3], "by": {"1": "one"}}
    assert again.fingerprint == TaskData.from_arrays("toy", raw, params=again.params).fingerprint


def test_several_output_tokens():
    rng = np.random.default_rng(2)
    x = rng.normal(size=(8, 6, 2)).astype(np.float32)
    y = rng.integers(0, 2, size=(8, 3, 4))  # (N, n_out_tokens, heads)
    task = TaskData.from_arrays("toy", {"train": (x, [6, 5, 4, 3, 6, 6, 6, 6], y), "test": (x, y)}, n_out_tokens=3)
    assert task.n_out_tokens == 3 and task.label_shape == (3, 4) and task.n_classes == 2


def test_fingerprint_is_computed_as_for_built_in_tasks():
    raw = token_splits()
    a = TaskData.from_arrays("toy", raw, params={"v": 1})
    assert a.fingerprint == fingerprint("toy", {"v": 1}, a.splits)
    same = TaskData.from_arrays("toy", token_splits(), params={"v": 1})
    assert same.fingerprint == a.fingerprint
    assert TaskData.from_arrays("toy", raw, params={"v": 2}).fingerprint != a.fingerprint
    assert TaskData.from_arrays("toy2", raw, params={"v": 1}).fingerprint != a.fingerprint
    changed = {k: (ids.copy(), ln, y) for k, (ids, ln, y) in raw.items()}
    changed["test"][0][0, 0] = 1 if changed["test"][0][0, 0] != 1 else 2
    assert TaskData.from_arrays("toy", changed, params={"v": 1}).fingerprint != a.fingerprint
    # the built-in tasks' fingerprint is the same function of their arrays
    xor = get_task("bit-xor", n_train=16, n_test=8)
    assert xor.fingerprint == fingerprint("bit-xor", xor.params, xor.splits)
    assert TaskData.from_arrays("xor-copy", xor.splits, params=xor.params).fingerprint == fingerprint(
        "xor-copy", xor.params, xor.splits)


@pytest.mark.parametrize("kind", ["tokens", "continuous"])
def test_a_task_from_arrays_runs_through_a_backbone(kind):
    """The arrays come out in dtypes the backbone reads: features at the last real token of every row."""
    if kind == "tokens":
        int8 = {k: (ids.astype(np.int8), ln, y) for k, (ids, ln, y) in token_splits().items()}
        task = TaskData.from_arrays("toy", int8)
    else:
        x = np.random.default_rng(3).normal(size=(6, 5, 3))
        task = TaskData.from_arrays("toy", {"train": (x, [5, 4, 3, 2, 1, 5], [0, 1] * 3), "test": (x, [1] * 6)})
    bb = load_backbone("tiny-gpt2", d_in=task.d_in, depth=1)
    s = task.splits["train"]
    with torch.no_grad():
        feats = bb.features(torch.from_numpy(s.inputs), torch.from_numpy(s.lengths), [0, 1])
        alone = bb.features(torch.from_numpy(s.inputs[1:2, : s.lengths[1]]), torch.from_numpy(s.lengths[1:2]), [0, 1])
    assert feats.shape == (len(s), 2, 1, 32)
    torch.testing.assert_close(feats[1:2], alone, atol=1e-5, rtol=1e-5)  # padding never moves the read position


def _bad_cases():
    ids = np.array([[1, 2, 0], [3, 1, 2]])
    lengths, labels = np.array([2, 3]), np.array([0, 1])
    ok = (ids, lengths, labels)
    x = np.zeros((2, 3, 4), np.float32)
    return [
        ("", {"train": ok, "test": ok}, {}, "task name"),
        ("bit-xor", {"train": ok, "test": ok}, {}, "registered task"),
        ("t", {"train": ok}, {}, "'train' and 'test'"),
        ("t", [ok, ok], {}, "mapping"),
        ("t", {"train": ok, "test": ok, 3: ok}, {}, "split names"),
        ("t", {"train": ok, "test": (ids,)}, {}, "(inputs, lengths, labels) or (inputs, labels); found 1 items"),
        ("t", {"train": ok, "test": "abc"}, {}, "found str"),
        ("t", {"train": ok, "test": (ids.astype(float), lengths, labels)}, {}, "add a last axis of size 1"),
        ("t", {"train": ok, "test": (ids[0], [2], [0])}, {}, "found int64 of shape (3,)"),
        ("t", {"train": ok, "test": (ids.astype(str), lengths, labels)}, {}, "integer token ids (N, L)"),
        ("t", {"train": ok, "test": ([[1, 2], [1]], [2, 1], [0, 1])}, {}, "rectangular"),
        ("t", {"train": ok, "test": (np.zeros((0, 3), int), [], [])}, {}, "at least one row"),
        ("t", {"train": ok, "test": (np.zeros((2, 0), int), [1, 1], [0, 1])}, {}, "at least one row, one position"),
        ("t", {"train": (x[:, :, :0], labels), "test": (x, labels)}, {}, "(vectors) one number; found shape (2, 3, 0)"),
        ("t", {"train": ok, "test": (ids, lengths, np.zeros((2, 0), int))}, {}, "each at least one label"),
        ("t", {"train": ok, "validation": ok, "test": ok}, {},
         "expected the validation split named 'val' (what training and readouts select on); found 'validation'"),
        ("t", {"train": ok, "": ok, "test": ok}, {}, "expected split names of letters, digits, '_' and '-'"),
        ("t", {"train": ok, "a/b": ok, "test": ok}, {}, "found 'a/b'"),
        ("t", {"train": ok, "test": ok}, {"kind": "continuous"}, "kind 'continuous'"),
        ("t", {"train": (x, labels), "test": (x, labels)}, {"kind": "tokens"}, "kind 'tokens'"),
        ("t", {"train": ok, "test": ok}, {"kind": "images"}, "kind one of"),
        ("t", {"train": ok, "test": (x, labels)}, {}, "one kind; found continuous and tokens"),
        ("t", {"train": ok, "test": (ids, [2, 4], labels)}, {}, "lengths in 1..3"),
        ("t", {"train": ok, "test": (ids, [0, 3], labels)}, {}, "found 0 at row 0"),
        ("t", {"train": ok, "test": (ids, [2, 3, 3], labels)}, {}, "lengths, integers of shape (2,)"),
        ("t", {"train": ok, "test": (ids, [2.0, 3.0], labels)}, {}, "found float64"),
        ("t", {"train": ok, "test": (ids, lengths, [0])}, {}, "labels with 2 rows"),
        ("t", {"train": ok, "test": (ids, lengths, [0.0, 1.0])}, {}, "integer labels"),
        ("t", {"train": ok, "test": (ids, lengths, 1)}, {}, "integer labels"),
        ("t", {"train": ok, "test": (ids, lengths, [0, -1])}, {}, "labels >= 0; found -1"),
        ("t", {"train": ok, "test": (ids, lengths, [[0, 1], [1, 1]])}, {}, "one shape per row"),
        ("t", {"train": ok, "test": (ids - 2, lengths, labels)}, {}, "token ids >= 0"),
        ("t", {"train": ok, "test": ok}, {"d_in": 3}, "below the vocabulary size d_in=3; found id 3"),
        ("t", {"train": ok, "test": ok}, {"d_in": 0}, "d_in must be an integer >= 1"),
        ("t", {"train": ok, "test": ok}, {"vocab": ["a", "b"]}, "d_in=2; found id 3"),
        ("t", {"train": ok, "test": ok}, {"vocab": "abcd"}, "sequence of token strings"),
        ("t", {"train": ok, "test": ok}, {"vocab": list("abcde"), "d_in": 4}, "len(vocab)=5"),
        ("t", {"train": (x, labels), "test": (x, labels)}, {"vocab": ["a"]}, "vocab=None"),
        ("t", {"train": (x, labels), "test": (x, labels)}, {"d_in": 5}, "d_in=5, the inputs' last axis; found 4"),
        ("t", {"train": (x, labels), "test": (x[:, :, :2], labels)}, {}, "train 4, test 2"),
        ("t", {"train": (x, labels), "test": (x + np.nan, labels)}, {}, "finite"),
        ("t", {"train": ok, "test": ok}, {"n_classes": 1}, "n_classes must be an integer >= 2; found 1"),
        ("t", {"train": ok, "test": ok}, {"n_classes": True}, "n_classes must be an integer >= 2; found True"),
        ("t", {"train": (ids, [1, 1], [0, 0]), "test": (ids, [1, 1], [0, 0])}, {}, "at least 2 classes"),
        ("t", {"train": ok, "test": (ids, lengths, [0, 4])}, {"n_classes": 4}, "below n_classes=4; found 4"),
        ("t", {"train": ok, "test": ok}, {"n_out_tokens": 0}, "n_out_tokens must be an integer >= 1"),
        ("t", {"train": ok, "test": ok}, {"n_out_tokens": 3}, "lengths in 3..3"),
        ("t", {"train": (ids, [3, 3], labels), "test": (ids, [3, 3], labels)}, {"n_out_tokens": 3},
         "labels of shape (2, 3, ...)"),
        ("t", {"train": ok, "test": ok}, {"params": {"f": object()}}, "params that JSON can write"),
        ("t", {"train": ok, "test": ok}, {"params": {"f": float("nan")}}, "params that JSON can write"),
        ("t", {"train": ok, "test": ok}, {"params": [1]}, "params a mapping"),
    ]  # fmt: skip


@pytest.mark.parametrize("name,splits,kwargs,fragment", _bad_cases())
def test_from_arrays_refusals_are_one_line(name, splits, kwargs, fragment):
    with pytest.raises(ReservoirError) as err:
        TaskData.from_arrays(name, splits, **kwargs)
    one_line(err, fragment)


def test_refusals_name_the_split():
    ok = (np.array([[1, 2]]), [2], [1])
    with pytest.raises(ReservoirError) as err:
        TaskData.from_arrays("mine", {"train": ok, "test": (np.array([[1, 2]]), [5], [0])})
    one_line(err, "task 'mine', split 'test': expected lengths in 1..2", "found 5 at row 0")


# ------------------------------------------------------- defaults, registry


def test_defaults_are_the_builders_signatures():
    import inspect

    assert TASKS, "no task registered"
    for name, spec in TASKS.items():
        sig = inspect.signature(spec.build).parameters
        assert spec.defaults == {k: p.default for k, p in sig.items()}, name
        assert list(spec.defaults) == list(sig), name


def test_reservoir_tasks_lists_the_same_defaults_as_before():
    """The ``params:`` lines of ``reservoir tasks`` as they were when every spec repeated its builder's defaults."""
    from reservoir.cli import main

    expected = {
        "bit-memory": {"n_bits": 1000, "n_patterns": 5, "bits_per_token": 50, "n_train": 2000, "n_test": 500,
                       "seed": 0},
        "bit-xor": {"n_bits": 5, "n_train": 4000, "n_test": 1000, "seed": 0},
        "cifar10": {"data_dir": None, "download": False, "n_train": None, "n_test": None, "patch": 4},
        "cifar10-lra": {"data_dir": None, "download": False, "n_train": None, "n_test": None},
        "data": {"path": None, "input_column": "inputs", "label_column": "label"},
        "digits": {"test_fraction": 0.2, "seed": 0, "patch": 2},
        "fashion-mnist": {"data_dir": "/usr/share/datasets/fashion-mnist", "size": 32, "patch": 4, "download": False,
                          "n_train": None, "n_test": None},
        "listops": {"source": "generate", "data_dir": None, "tokenization": "lra", "min_length": 20,
                    "max_length": 300, "n_train": 4000, "n_val": 0, "n_test": 1000, "seed": 0, "max_tokens": None},
        "mnist": {"data_dir": None, "size": 32, "patch": 4, "download": False, "n_train": None, "n_test": None},
        "remote-homology": {"data_dir": None, "splits": ["train", "valid", "test_fold_holdout",
                                                         "test_superfamily_holdout", "test_family_holdout"],
                            "test_split": "test_fold_holdout", "format": "auto", "max_length": 1024,
                            "n_per_split": None},
    }  # fmt: skip
    result = CliRunner().invoke(main, ["tasks"])
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    names = [ln.split()[0] for ln in lines if ln and not ln.startswith(" ")]
    params = [ln.split("params: ", 1)[1] for ln in lines if "params: " in ln]
    assert names == sorted(expected)
    for name, text in zip(names, params):
        assert text == json.dumps(expected[name]), name  # same values, same key order


def test_spec_whose_builder_lacks_a_default_is_refused():
    def build(n, seed=0):
        raise AssertionError("never built")

    with pytest.raises(ReservoirError) as err:
        TaskSpec(name="no-default", build=build, summary="", source="")
    one_line(err, "'n'", "no default")

    def build_var(seed=0, **extra):
        raise AssertionError("never built")

    with pytest.raises(ReservoirError) as err:
        TaskSpec(name="var", build=build_var, summary="", source="")
    one_line(err, "'extra'", "variadic keyword")


def test_register_refuses_a_taken_name_and_get_task_an_unknown_one():
    spec = TaskSpec(name="bit-xor", build=TASKS["bit-xor"].build, summary="x", source="x")
    with pytest.raises(ReservoirError) as err:
        register(spec)
    one_line(err, "'bit-xor'", "registered already")
    assert TASKS["bit-xor"] is not spec
    with pytest.raises(ReservoirError) as err:
        get_task("no-such-task")
    one_line(err, "unknown task 'no-such-task'", "bit-xor")


# ----------------------------------------------------------- Split, params


def test_split_checks_its_arrays():
    Split(np.zeros((3, 4)), np.ones(3, np.int64), np.zeros(3, np.int64))
    with pytest.raises(ReservoirError) as err:
        Split(np.zeros((3, 4)), np.ones(2, np.int64), np.zeros(3, np.int64))
    one_line(err, "lengths of shape (3,)", "found (2,)")
    with pytest.raises(ReservoirError) as err:
        Split(np.zeros((3, 4)), np.ones(3, np.int64), np.zeros((4, 2), np.int64))
    one_line(err, "expected 3 labels", "found 4")


def test_split_checks_hold_under_python_O():
    """The checks are not ``assert`` statements: ``python -O`` keeps them."""
    code = ("import numpy as np\nfrom reservoir.errors import ReservoirError\nfrom reservoir.tasks import Split\n"
            "try:\n    Split(np.zeros((3, 4)), np.ones(2, np.int64), np.zeros(3, np.int64))\n"
            "except ReservoirError as e:\n    print('refused', e)\n")  # fmt: skip
    out = subprocess.run([sys.executable, "-O", "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.startswith("refused split: expected lengths of shape (3,)"), out


def test_int_param_and_choice_param():
    assert int_param("t", "n", np.int64(7), 1, 10) == 7 and type(int_param("t", "n", np.int64(7), 1)) is int
    assert int_param("t", "n", None, 1, none_ok=True) is None
    for value, found in ((0, "found 0"), (11, "found 11"), (True, "found True"), (2.0, "found 2.0"),
                         (None, "found None"), ("3", "found '3'")):  # fmt: skip
        with pytest.raises(ReservoirError) as err:
            int_param("t", "n", value, 1, 10)
        one_line(err, "task 't': n must be an integer in [1, 10]", found)
    with pytest.raises(ReservoirError) as err:
        int_param("t", "n", -1, 0, none_ok=True)
    one_line(err, "n must be an integer >= 0 or None; found -1")
    assert choice_param("t", "c", "b", ("a", "b")) == "b"
    with pytest.raises(ReservoirError) as err:
        choice_param("t", "c", "z", ("a", "b"))
    one_line(err, "task 't': c must be one of 'a', 'b'; found 'z'")
