"""ListOps: generator vs an independent evaluator, tokenizations, the LRA file reader."""

import csv
import random

import numpy as np
import pytest

from reservoir.errors import ReservoirError
from reservoir.tasks import TASKS, get_task
from reservoir.tasks.listops import (
    FPT_VOCAB,
    LRA_VOCAB,
    evaluate,
    generate_tree,
    read_lra_split,
    sample_trees,
    to_string,
    tokenize_fpt,
    tokenize_lra,
    tree_tokens,
)

EXAMPLE = "[MAX 4 3 [MIN 2 3 ] 1 0 ]"
EXAMPLE_TREE = ("[MAX", (4, 3, ("[MIN", (2, 3)), 1, 0))
EXAMPLE_IDS = [1, 9, 8, 0, 7, 8, 4, 6, 5, 4]  # [MAX 4 3 [MIN 2 3 ] 1 0 ]


def stack_eval(tokens):
    """Evaluate a prefix token list with an explicit stack (independent of the module's tree code)."""
    stack = []  # frames: [operator, args]
    result = None
    for tok in tokens:
        if tok.startswith("["):
            stack.append([tok, []])
        elif tok == "]":
            op, args = stack.pop()
            assert len(args) >= 1, "operator without arguments"
            if op == "[MIN":
                value = min(args)
            elif op == "[MAX":
                value = max(args)
            elif op == "[MED":
                value = int(np.median(args))
            elif op == "[SM":
                value = int(np.sum(args) % 10)
            else:
                raise AssertionError(op)
            if stack:
                stack[-1][1].append(value)
            else:
                assert result is None
                result = value
        else:
            value = int(tok)
            if stack:
                stack[-1][1].append(value)
            else:
                assert result is None
                result = value
    assert not stack and result is not None, "unbalanced expression"
    return result


def row_tokens(split, i, vocab):
    return [vocab[t] for t in split.inputs[i, : split.lengths[i]]]


# ------------------------------------------------------------ known strings


def test_vocabularies_fixed():
    assert LRA_VOCAB == ["[MIN", "[MAX", "[MED", "[SM", "]"] + [str(d) for d in range(10)]
    assert FPT_VOCAB == ["MIN", "MAX", "MED", "SM"] + [str(d) for d in range(10)]


def test_known_string():
    assert tokenize_lra(EXAMPLE) == EXAMPLE_IDS
    assert stack_eval([LRA_VOCAB[i] for i in EXAMPLE_IDS]) == 4
    assert evaluate(EXAMPLE_TREE) == 4
    assert to_string(EXAMPLE_TREE) == EXAMPLE
    assert tree_tokens(EXAMPLE_TREE) == EXAMPLE.split()


def test_lra_parenthesised_format():
    assert to_string(("[MAX", (2, 9)), parens=True) == "( ( ( [MAX 2 ) 9 ) ] )"  # the form in the LRA files
    assert tokenize_lra("( ( ( [MAX 2 ) 9 ) ] )") == [1, 7, 14, 4]
    lra = to_string(EXAMPLE_TREE, parens=True)
    assert lra == "( ( ( ( ( ( [MAX 4 ) 3 ) ( ( ( [MIN 2 ) 3 ) ] ) ) 1 ) 0 ) ] )"
    assert tokenize_lra(lra) == EXAMPLE_IDS
    assert tokenize_lra(EXAMPLE.replace("]", "X")) == EXAMPLE_IDS  # the other spelling of ]


@pytest.mark.parametrize(
    "tree,value",
    [(("[MED", (1, 2, 3, 4)), 2), (("[MED", (0, 9)), 4), (("[MED", (5, 1, 3)), 3), (("[SM", (9, 9, 9)), 7),
     (("[MIN", (7, ("[MAX", (1, 8)))), 7), (("[SM", (("[MED", (2, 7)), 6)), 0), (5, 5)],
)  # fmt: skip
def test_hand_computed_values(tree, value):
    assert evaluate(tree) == value
    assert stack_eval(tree_tokens(tree)) == value


def test_unknown_token_named_with_position():
    with pytest.raises(ReservoirError) as err:
        tokenize_lra("[MAX 4 [FOO 2 ] ]")
    msg = str(err.value)
    assert "'[FOO'" in msg and "token 2" in msg and "column 8" in msg and "\n" not in msg
    with pytest.raises(ReservoirError, match="'12'"):
        tokenize_lra("[MAX 4 12 ]")
    with pytest.raises(ReservoirError, match="non-empty"):
        tokenize_lra("( )")
    with pytest.raises(ReservoirError, match="'FOO'"):
        tokenize_fpt("[MAX 4 [FOO 2 ] ]")


def test_fpt_tokenization_drops_brackets():
    ids = tokenize_fpt(EXAMPLE)
    assert [FPT_VOCAB[i] for i in ids] == ["MAX", "4", "3", "MIN", "2", "3", "1", "0"]
    assert tokenize_fpt(to_string(EXAMPLE_TREE, parens=True)) == ids
    assert tokenize_fpt("[MAX 4 3]") == tokenize_fpt("MAX 4 3")  # brackets glued to words are dropped too
    # structure is lost: two different expressions, one sequence
    assert tokenize_fpt("[MAX 1 [MIN 2 3 ] 4 ]") == tokenize_fpt("[MAX 1 [MIN 2 3 4 ] ]")
    long = "[SM " + "1 " * 600 + "]"
    assert len(tokenize_fpt(long)) == 512
    assert len(tokenize_fpt(long, max_tokens=7)) == 7
    assert len(tokenize_fpt(long, max_tokens=None)) == 601


# --------------------------------------------------------------- generator


def test_generator_agrees_with_stack_evaluator_on_10000_trees():
    task = get_task("listops", min_length=3, max_length=60, n_train=10000, n_val=500, n_test=500, seed=7)
    n_checked = 0
    for split in task.splits.values():
        assert np.all((split.lengths > 3) & (split.lengths < 60))
        for i in range(len(split)):
            assert stack_eval(row_tokens(split, i, task.vocab)) == split.labels[i]
            n_checked += 1
    assert n_checked == 11000
    # every operator and every label occur
    labels = task.splits["train"].labels
    assert set(np.unique(labels)) == set(range(10))
    assert set(np.unique(task.splits["train"].inputs)) == set(range(15))


def test_tree_strings_round_trip():
    rng = random.Random(3)
    for tree in sample_trees(rng, 300, 4, 200):
        tokens = tree_tokens(tree)
        ids = [LRA_VOCAB.index(t) for t in tokens]
        assert tokenize_lra(to_string(tree)) == ids
        assert tokenize_lra(to_string(tree, parens=True)) == ids
        assert stack_eval(tokens) == evaluate(tree)


def test_generate_tree_process():
    rng = random.Random(0)
    depths, widths, lengths, leaves = [], [], [], set()

    def walk(t, d):
        if isinstance(t, tuple):
            op, children = t
            widths.append(len(children))
            assert op in ("[MIN", "[MAX", "[MED", "[SM")
            return max(walk(c, d + 1) for c in children)
        leaves.add(t)
        return d

    for _ in range(3000):
        tree, length = generate_tree(rng)
        assert length == len(tree_tokens(tree))
        depths.append(walk(tree, 1))
        lengths.append(length)
    assert max(depths) <= 10  # root at depth 1, leaves forced at depth 10
    assert min(widths) == 2 and max(widths) == 10  # randint(2, 10), inclusive
    assert leaves == set(range(10))  # choice(range(10)): every digit, nothing else
    frac_leaf_roots = np.mean(np.array(lengths) == 1)
    assert 0.72 < frac_leaf_roots < 0.78  # a root is an operator with probability 0.25


def test_abandoning_long_trees():
    rng = random.Random(0)
    for _ in range(2000):
        tree, length = generate_tree(rng, max_length=30)
        if tree is None:
            assert length >= 30
        else:
            assert length < 30 and length == len(tree_tokens(tree))


def test_generated_task_shapes_and_bounds():
    task = get_task("listops", n_train=200, n_test=50)
    assert (task.kind, task.d_in, task.n_classes, task.n_out_tokens) == ("tokens", 15, 10, 1)
    assert task.vocab == LRA_VOCAB
    assert list(task.splits) == ["train", "test"]
    for split in task.splits.values():
        assert split.inputs.dtype == np.uint8 and split.lengths.dtype == np.int64
        assert split.labels.dtype == np.int64 and split.labels.shape == (len(split),)
        assert np.all((split.lengths > 20) & (split.lengths < 300))
        assert split.inputs.shape[1] == split.lengths.max()
        pad = np.arange(split.inputs.shape[1])[None, :] >= split.lengths[:, None]
        assert np.all(split.inputs[pad] == 0)
    assert task.params == {
        "source": "generate", "tokenization": "lra", "min_length": 20, "max_length": 300,
        "n_train": 200, "n_val": 0, "n_test": 50, "seed": 0, "max_tokens": None,
    }  # fmt: skip


def test_seeding_and_split_order():
    kw = dict(min_length=5, max_length=80, n_train=100, n_val=20, n_test=30)
    a = get_task("listops", seed=4, **kw)
    b = get_task("listops", seed=4, **kw)
    c = get_task("listops", seed=5, **kw)
    assert list(a.splits) == ["train", "val", "test"]
    assert [len(s) for s in a.splits.values()] == [100, 20, 30]
    for name in a.splits:
        np.testing.assert_array_equal(a.splits[name].inputs, b.splits[name].inputs)
        np.testing.assert_array_equal(a.splits[name].labels, b.splits[name].labels)
    assert a.fingerprint == b.fingerprint != c.fingerprint
    # one generator, train first: the train split does not depend on n_val / n_test
    d = get_task("listops", seed=4, min_length=5, max_length=80, n_train=100, n_val=0, n_test=3)
    np.testing.assert_array_equal(a.splits["train"].inputs, d.splits["train"].inputs)


def test_fpt_task_matches_lra_task_without_brackets():
    kw = dict(min_length=700, max_length=900, n_train=12, n_test=4, seed=1)
    lra = get_task("listops", **kw)
    fpt = get_task("listops", tokenization="fpt", **kw)
    assert fpt.d_in == 14 and fpt.vocab == FPT_VOCAB and fpt.params["max_tokens"] == 512
    for name in lra.splits:
        s_lra, s_fpt = lra.splits[name], fpt.splits[name]
        np.testing.assert_array_equal(s_lra.labels, s_fpt.labels)
        assert s_fpt.lengths.max() == 512 and s_fpt.inputs.shape[1] == 512
        for i in range(len(s_lra)):
            words = [t.lstrip("[") for t in row_tokens(s_lra, i, LRA_VOCAB) if t != "]"]
            assert row_tokens(s_fpt, i, FPT_VOCAB) == words[:512]
    capped = get_task("listops", max_tokens=100, **kw)
    assert capped.splits["train"].lengths.max() == 100 and capped.params["max_tokens"] == 100


@pytest.mark.parametrize(
    "params,word",
    [({"source": "web"}, "source"), ({"tokenization": "bpe"}, "tokenization"),
     ({"min_length": 10, "max_length": 11}, "bounds"), ({"min_length": 1, "max_length": 4}, "bounds"),
     ({"n_train": 0}, "n_train"), ({"n_val": -1}, "n_val"),
     ({"max_tokens": 0}, "max_tokens"), ({"seed": 1.5}, "seed"), ({"no_such": 1}, "no_such"),
     # a folder a generated task would ignore; bounds no tree meets in practice (minutes of draws before a refusal)
     ({"data_dir": "/tmp"}, "source=lra"), ({"min_length": 99_999_998, "max_length": 100_000_000}, "at most 3,000"),
     ({"n_train": 10**8, "n_val": 10**8, "n_test": 10**8, "max_length": 2000}, "memory available")],
)  # fmt: skip
def test_bad_params(params, word):
    with pytest.raises(ReservoirError) as err:
        get_task("listops", **params)
    assert word in str(err.value) and "\n" not in str(err.value)


def test_registered_defaults():
    spec = TASKS["listops"]
    assert spec.defaults == {
        "source": "generate", "data_dir": None, "tokenization": "lra", "min_length": 20, "max_length": 300,
        "n_train": 4000, "n_val": 0, "n_test": 1000, "seed": 0, "max_tokens": None,
    }  # fmt: skip
    assert spec.summary and spec.source


# ------------------------------------------------------------------- files

FIXTURE = [
    (("[MAX", (2, 9)), 9),
    (EXAMPLE_TREE, 4),
    (("[SM", (("[MED", (1, 2, 3, 4)), 9, 9)), 0),
    (7, 7),
]


def write_tsv(path, rows, header=("Source", "Target")):
    with open(path, "w", newline="") as f:  # as LRA writes them: csv, tab, \r\n line ends
        writer = csv.writer(f, delimiter="\t")
        if header is not None:
            writer.writerow(header)
        writer.writerows(rows)


@pytest.fixture
def lra_dir(tmp_path):
    rows = [(to_string(tree, parens=True), value) for tree, value in FIXTURE]
    for name in ("train", "val", "test"):
        write_tsv(tmp_path / f"basic_{name}.tsv", rows)
    return tmp_path


def test_reader_ids_and_labels(lra_dir):
    split = read_lra_split(lra_dir / "basic_train.tsv")
    assert split.labels.tolist() == [9, 4, 0, 7]
    assert split.lengths.tolist() == [4, 10, 10, 1]
    assert split.inputs.shape == (4, 10) and split.inputs.dtype == np.uint8
    assert split.inputs[0, :4].tolist() == [1, 7, 14, 4] and split.inputs[0, 4:].sum() == 0
    assert split.inputs[1, :10].tolist() == EXAMPLE_IDS
    assert [LRA_VOCAB[i] for i in split.inputs[2, :10]] == "[SM [MED 1 2 3 4 ] 9 9 ]".split()
    assert split.inputs[3, :1].tolist() == [12]
    for i in range(4):
        assert stack_eval(row_tokens(split, i, LRA_VOCAB)) == split.labels[i]
    fpt = read_lra_split(lra_dir / "basic_train.tsv", tokenization="fpt", max_tokens=3)
    assert fpt.lengths.tolist() == [3, 3, 3, 1]
    assert [FPT_VOCAB[i] for i in fpt.inputs[2]] == ["SM", "MED", "1"]


def test_task_from_lra_files(lra_dir):
    task = get_task("listops", source="lra", data_dir=str(lra_dir))
    assert list(task.splits) == ["train", "val", "test"]
    assert task.params == {"source": "lra", "tokenization": "lra", "max_tokens": None}
    assert task.splits["test"].labels.tolist() == [9, 4, 0, 7]
    fpt = get_task("listops", source="lra", data_dir=lra_dir, tokenization="fpt")
    assert fpt.d_in == 14 and fpt.params["max_tokens"] == 512


def test_lra_source_needs_files(tmp_path):
    with pytest.raises(ReservoirError) as err:
        get_task("listops", source="lra")
    assert "basic_train.tsv" in str(err.value) and "data_dir" in str(err.value)
    write_tsv(tmp_path / "basic_train.tsv", [("[MAX 1 2 ]", 2)])
    with pytest.raises(ReservoirError) as err:
        get_task("listops", source="lra", data_dir=tmp_path)
    msg = str(err.value)
    assert "basic_val.tsv" in msg and str(tmp_path) in msg and "\n" not in msg


@pytest.mark.parametrize(
    "rows,header,line,words",
    [
        ([("[MAX 1 2 ]", 2)], ("Src", "Tgt"), 1, ["header", "Src"]),
        ([("[MAX 1 2 ]", 2), ("[MIN 1 2 ]", "x")], None, 3, ["integer", "'x'"]),
        ([("[MAX 1 2 ]", 2), ("[MIN 1 2 ]", 10)], None, 3, ["0..9", "10"]),
        ([("[MAX 1 2 ]", 2), ("[MIN 1 2 ]", -1)], None, 3, ["0..9", "-1"]),
        ([("[MAX 1 2 ]", "+2")], None, 2, ["integer", "'+2'"]),
        ([("[MAX 1 2 ]", "0_2")], None, 2, ["integer", "'0_2'"]),
        ([("[MAX 1 2 ]", "\u0662")], None, 2, ["integer"]),  # an Arabic-Indic 2
        ([("[MAX 1 [AVG 2 3 ] ]", 2)], None, 2, ["'[AVG'", "token 2"]),
        ([("[MAX 1 2 ]", 2, "extra")], None, 2, ["2 tab-separated", "found 3"]),
        ([("", 2)], None, 2, ["non-empty"]),
        ([], None, 1, ["at least one example"]),
        # read as token ids before, not one tree: refused, as is a Target that is not the value
        ([("( ( [MAX 2 ) 3 )", 3)], None, 2, ["1 operator never closed"]),
        ([("[MAX 2 3 ] ] ]", 3)], None, 2, ["tokens after it ends at token 3"]),
        ([("[MAX ]", 3)], None, 2, ["closed with no argument at token 1"]),
        ([("1 2 3", 3)], None, 2, ["tokens after it ends at token 0"]),
        ([("] 3", 3)], None, 2, ["] at token 0 with nothing open"]),
        ([("[MAX 1 2 ]", 2), ("[MAX 2 3 ]", 7)], None, 3, ["the expression's value, 3; found 7"]),
    ],
)
def test_reader_rejects_malformed(tmp_path, rows, header, line, words):
    path = tmp_path / "basic_train.tsv"
    write_tsv(path, rows, header=header or ("Source", "Target"))
    with pytest.raises(ReservoirError) as err:
        read_lra_split(path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "expected" in msg
    if rows:
        assert f"line {line}" in msg
    for w in words:
        assert w in msg, (w, msg)


def test_reader_missing_and_empty(tmp_path):
    with pytest.raises(ReservoirError) as err:
        read_lra_split(tmp_path / "basic_test.tsv")
    assert "basic_test.tsv" in str(err.value) and "not found" in str(err.value) and "\n" not in str(err.value)
    empty = tmp_path / "basic_val.tsv"
    empty.write_text("")
    with pytest.raises(ReservoirError) as err:
        read_lra_split(empty)
    msg = str(err.value)
    assert "empty file" in msg and "line 1" in msg and "\n" not in msg


def test_fingerprints_are_pinned(tmp_path):
    """Fingerprints recorded before the ListOps module was split: same params and files, same arrays and ids."""
    assert get_task("listops", n_train=300, n_test=100).fingerprint == (
        "c814b970544e7b575a0c10b6e5a1ad816ff9342c36d3a64c69876f9449f2fabc")
    fpt = get_task("listops", tokenization="fpt", min_length=5, max_length=60, n_train=1200, n_val=50, n_test=40,
                   seed=3, max_tokens=30)  # fmt: skip
    assert fpt.fingerprint == "18c3aa2cb872530de65e126a6f8a12deb4946b46e267c6484a3fe0579a780530"
    rows = [("( ( ( [MAX 2 ) 9 ) ] )", 9), ("( ( ( [MIN 4 ) ( ( [SM 3 ) 8 ) ] ) ] )", 1), ("7", 7)]
    for name in ("train", "val", "test"):
        write_tsv(tmp_path / f"basic_{name}.tsv", rows)
    assert get_task("listops", source="lra", data_dir=str(tmp_path)).fingerprint == (
        "b81d1408248d28ddf4a9d54a9983436876fbf03642d53a2479c6af3858757c6f")
    assert get_task("listops", source="lra", data_dir=str(tmp_path), tokenization="fpt").fingerprint == (
        "1e16cead0d80e823ea32f00c6edd29f36ad149ada5512d5cba90b101160978d2")


def test_old_import_paths_still_work():
    from reservoir.tasks import listops
    from reservoir.tasks.arrays import encode
    from reservoir.tasks.listops.task import build_listops

    for name in listops.__all__:
        assert hasattr(listops, name), name
    assert listops.encode is encode and listops.build_listops is build_listops is TASKS["listops"].build
