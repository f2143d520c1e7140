"""Image tasks: IDX and CIFAR readers on fixture files in the real formats, patch order, normalization, download."""

import gzip
import io
import json
import os
import pickle
import struct
import tarfile
import urllib.error
import urllib.request

import numpy as np
import pytest

from reservoir.errors import ReservoirError
from reservoir.tasks import TASKS, get_task
from reservoir.tasks.files import load_pickle
from reservoir.tasks.images import CIFAR_MEAN, CIFAR_STD, patchify, read_idx

MNIST_NAMES = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
FASHION = "/usr/share/datasets/fashion-mnist"


def idx_bytes(arr, magic):
    arr = np.asarray(arr, dtype=np.uint8)
    return struct.pack(">I", magic) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.tobytes()


def write_mnist(folder, n_train=6, n_test=4, gz=False, seed=0):
    """Write the four IDX files; returns {split: (images uint8 (N,28,28), labels (N,))}."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    out = {}
    for split, prefix, n in (("train", "train", n_train), ("test", "t10k", n_test)):
        images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
        labels = rng.integers(0, 10, size=n, dtype=np.uint8)
        for name, data in ((f"{prefix}-images-idx3-ubyte", idx_bytes(images, 0x803)),
                           (f"{prefix}-labels-idx1-ubyte", idx_bytes(labels, 0x801))):  # fmt: skip
            if gz:
                (folder / (name + ".gz")).write_bytes(gzip.compress(data))
            else:
                (folder / name).write_bytes(data)
        out[split] = (images, labels.astype(np.int64))
    return out


def reference_patchify(images, p):
    """Loop version: token t = patch (t // (W/p), t % (W/p)), values patch[y, x, c] row-major."""
    x = images[..., None] if images.ndim == 3 else images
    n, h, w, c = x.shape
    out = np.zeros((n, (h // p) * (w // p), p * p * c), dtype=x.dtype)
    for t in range((h // p) * (w // p)):
        r, col = divmod(t, w // p)
        k = 0
        for y in range(p):
            for xx in range(p):
                for ch in range(c):
                    out[:, t, k] = x[:, r * p + y, col * p + xx, ch]
                    k += 1
    return out


def assert_one_line_error(exc_info, *fragments):
    msg = str(exc_info.value)
    assert "\n" not in msg, msg
    for frag in fragments:
        assert frag in msg, (frag, msg)


# ------------------------------------------------------------------ patchify


def test_patchify_order_on_index_image():
    image = np.arange(64).reshape(1, 8, 8)  # pixel value = its row-major index
    tokens = patchify(image, 4)
    assert tokens.shape == (1, 4, 16)
    assert tokens[0, 0].tolist() == [0, 1, 2, 3, 8, 9, 10, 11, 16, 17, 18, 19, 24, 25, 26, 27]  # top-left
    assert tokens[0, 1].tolist() == [4, 5, 6, 7, 12, 13, 14, 15, 20, 21, 22, 23, 28, 29, 30, 31]  # to its right
    assert tokens[0, 2, 0] == 32  # second patch row starts at row 4


def test_patchify_colour_channel_last():
    image = np.arange(4 * 4 * 3).reshape(1, 4, 4, 3)  # value = (y*4 + x)*3 + c
    tokens = patchify(image, 2)
    assert tokens.shape == (1, 4, 12)
    expected = np.concatenate([image[0, 0, 0], image[0, 0, 1], image[0, 1, 0], image[0, 1, 1]])
    assert tokens[0, 0].tolist() == expected.tolist()
    rng = np.random.default_rng(0)
    for shape, p in (((3, 12, 8), 4), ((2, 8, 8, 3), 2), ((2, 6, 6, 2), 3)):
        x = rng.integers(0, 255, size=shape)
        np.testing.assert_array_equal(patchify(x, p), reference_patchify(x, p))


def test_patchify_rejects_non_dividing_patch():
    with pytest.raises(ReservoirError) as e:
        patchify(np.zeros((1, 8, 8)), 3)
    assert_one_line_error(e, "patch=3", "8x8")


# --------------------------------------------------------------------- MNIST


@pytest.mark.parametrize("gz", [False, True])
def test_mnist_shapes_padding_and_values(tmp_path, gz):
    ref = write_mnist(tmp_path, gz=gz)
    task = get_task("mnist", data_dir=str(tmp_path))
    assert list(task.splits) == ["train", "test"]
    assert (task.kind, task.d_in, task.n_classes) == ("continuous", 16, 10)
    for split, (images, labels) in ref.items():
        s = task.splits[split]
        assert s.inputs.shape == (len(images), 64, 16) and s.inputs.dtype == np.float32
        assert s.lengths.dtype == np.int64 and (s.lengths == 64).all()
        assert s.labels.dtype == np.int64 and s.labels.tolist() == labels.tolist()
        # Undo the patching: back to (N, 32, 32).
        full = s.inputs.reshape(-1, 8, 8, 4, 4).transpose(0, 1, 3, 2, 4).reshape(-1, 32, 32)
        assert (full[:, :2] == 0).all() and (full[:, -2:] == 0).all()
        assert (full[:, :, :2] == 0).all() and (full[:, :, -2:] == 0).all()
        np.testing.assert_array_equal(full[:, 2:30, 2:30], images.astype(np.float32) / np.float32(255))
    assert task.params == {"size": 32, "patch": 4, "n_train": None, "n_test": None}
    json.dumps(task.params)

    native = get_task("mnist", data_dir=tmp_path, size=28)
    x = native.splits["train"].inputs
    assert x.shape == (6, 49, 16)
    np.testing.assert_array_equal(x, patchify(ref["train"][0], 4).astype(np.float32) / np.float32(255))


def test_mnist_gz_equals_plain_and_plain_preferred(tmp_path):
    write_mnist(tmp_path / "plain")
    write_mnist(tmp_path / "gz", gz=True)
    a = get_task("mnist", data_dir=tmp_path / "plain")
    b = get_task("mnist", data_dir=tmp_path / "gz")
    assert a.fingerprint == b.fingerprint  # the data, not where it lives
    write_mnist(tmp_path / "gz", seed=1)  # plain files with other content beside the .gz
    c = get_task("mnist", data_dir=tmp_path / "gz")
    assert c.fingerprint != b.fingerprint
    assert read_idx(str(tmp_path / "gz" / "t10k-labels-idx1-ubyte"), 0x801).shape == (4,)


def test_mnist_first_rows(tmp_path):
    ref = write_mnist(tmp_path)
    task = get_task("mnist", data_dir=tmp_path, n_train=3, n_test=2)
    assert task.splits["train"].inputs.shape == (3, 64, 16)
    assert task.splits["test"].labels.tolist() == ref["test"][1][:2].tolist()
    assert task.params["n_train"] == 3
    with pytest.raises(ReservoirError) as e:
        get_task("mnist", data_dir=tmp_path, n_train=7)
    assert_one_line_error(e, "n_train=7", "found 6")


def _corrupt(folder, case):
    img, lab = folder / "train-images-idx3-ubyte", folder / "train-labels-idx1-ubyte"
    if case == "truncated":
        img.write_bytes(img.read_bytes()[:-5])
        return img.name, "truncated"
    if case == "trailing":
        img.write_bytes(img.read_bytes() + b"\0")
        return img.name, "trailing"
    if case == "header":
        img.write_bytes(b"\0\0\x08")
        return img.name, "header"
    if case == "magic":
        img.write_bytes(struct.pack(">I", 0x801) + img.read_bytes()[4:])
        return img.name, "0x00000803"
    if case == "swapped":
        data = img.read_bytes()
        img.write_bytes(lab.read_bytes())
        lab.write_bytes(data)
        return img.name, "magic number"
    if case == "count":
        lab.write_bytes(idx_bytes(np.zeros(5), 0x801))
        return "5 labels for 6 images", "expected as many labels"
    if case == "label":
        lab.write_bytes(idx_bytes(np.full(6, 10), 0x801))
        return lab.name, "0..9"
    if case == "missing":
        img.unlink()
        return img.name, "download=True"
    if case == "oblong":  # read as "expected size >= the image side 28, larger by an even number"
        img.write_bytes(idx_bytes(np.zeros((6, 28, 30)), 0x803))
        return "expected square train images", "found 28 x 30"
    if case == "sizes":  # padded by different amounts otherwise
        img.write_bytes(idx_bytes(np.zeros((6, 26, 26)), 0x803))
        return "expected the test images of the train images' size, 26 x 26", "found 28 x 28"
    if case == "bad-gz":
        img.unlink()
        (folder / "train-images-idx3-ubyte.gz").write_bytes(b"not gzip at all")
        return "train-images-idx3-ubyte.gz", "corrupted"
    if case == "short-gz":
        img.unlink()
        (folder / "train-images-idx3-ubyte.gz").write_bytes(gzip.compress(img.name.encode() * 100)[:20])
        return "train-images-idx3-ubyte.gz", "corrupted"
    raise AssertionError(case)


@pytest.mark.parametrize("case", ["truncated", "trailing", "header", "magic", "swapped", "count", "label", "missing",
                                  "bad-gz", "short-gz", "oblong", "sizes"])  # fmt: skip
def test_mnist_corrupted_files(tmp_path, case):
    write_mnist(tmp_path)
    fragments = _corrupt(tmp_path, case)
    with pytest.raises(ReservoirError) as e:
        get_task("mnist", data_dir=tmp_path)
    assert_one_line_error(e, *fragments)


def test_mnist_without_data_dir_says_where(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(ReservoirError) as e:
        get_task("mnist")
    assert_one_line_error(e, "data_dir=None", "train-images-idx3-ubyte.gz", "download=True")
    with pytest.raises(ReservoirError) as e:
        get_task("mnist", size=30)
    assert_one_line_error(e, "size=30")


def _offline(*args, **kwargs):
    raise urllib.error.URLError("offline")


def test_download_offline_fails_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(urllib.request, "urlopen", _offline)
    folder = tmp_path / "mnist"
    with pytest.raises(ReservoirError) as e:
        get_task("mnist", data_dir=folder, download=True)
    url = "https://ossci-datasets.s3.amazonaws.com/mnist/train-images-idx3-ubyte.gz"
    assert_one_line_error(e, f"could not download {url} (offline); place the files train-images-idx3-ubyte.gz, "
                             f"train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz "
                             f"in {folder}")  # fmt: skip
    assert os.listdir(folder) == []  # no partial file

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(ReservoirError) as e:
        get_task("cifar10", download=True)
    cache = tmp_path / "home" / ".cache" / "reservoir" / "cifar10"
    assert_one_line_error(e, "could not download https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz (offline)",
                          str(cache))  # fmt: skip
    assert os.listdir(cache) == []


class FakeResponse(io.BytesIO):
    def __init__(self, data, length=None):
        super().__init__(data)
        self.headers = {"Content-Length": str(len(data) if length is None else length)}


def test_download_with_fake_server(tmp_path, monkeypatch):
    src = tmp_path / "server"
    ref = write_mnist(src, gz=True)
    served = []

    def urlopen(url, timeout=None):
        served.append(url)
        return FakeResponse((src / url.rsplit("/", 1)[1]).read_bytes())

    monkeypatch.setattr(urllib.request, "urlopen", urlopen)
    folder = tmp_path / "dl"
    write_mnist(folder)  # plain files present: nothing to fetch
    (folder / "t10k-labels-idx1-ubyte").unlink()
    task = get_task("mnist", data_dir=folder, download=True)
    assert served == ["https://ossci-datasets.s3.amazonaws.com/mnist/t10k-labels-idx1-ubyte.gz"]
    assert task.splits["test"].labels.tolist() == ref["test"][1].tolist()
    assert sorted(os.listdir(folder)) == sorted(MNIST_NAMES[:3] + ["t10k-labels-idx1-ubyte.gz"])

    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: FakeResponse(b"abc", length=10))
    (folder / "t10k-labels-idx1-ubyte.gz").unlink()
    with pytest.raises(ReservoirError) as e:
        get_task("mnist", data_dir=folder, download=True)
    assert_one_line_error(e, "received 3 of 10 bytes")
    assert "t10k-labels-idx1-ubyte.gz" not in os.listdir(folder) and not any(".part" in f for f in os.listdir(folder))


@pytest.mark.skipif(not os.path.isdir(FASHION), reason=f"no {FASHION}")
def test_fashion_mnist_real_files():
    task = get_task("fashion-mnist", n_train=100, n_test=50)
    assert task.splits["train"].inputs.shape == (100, 64, 16)
    assert task.splits["test"].inputs.shape == (50, 64, 16)
    for s in task.splits.values():
        assert set(np.unique(s.labels)) <= set(range(10)) and len(np.unique(s.labels)) >= 5
        assert s.inputs.dtype == np.float32 and s.inputs.min() == 0.0 and s.inputs.max() <= 1.0
        x255 = s.inputs * 255  # every value is a byte / 255
        np.testing.assert_allclose(x255, np.round(x255), atol=1e-3)
        full = s.inputs.reshape(-1, 8, 8, 4, 4).transpose(0, 1, 3, 2, 4).reshape(-1, 32, 32)
        assert not full[:, :2].any() and not full[:, :, -2:].any()  # the 2-pixel zero padding
    assert "data_dir" not in task.params and "download" not in task.params


def test_digits():
    task = get_task("digits")
    tr, te = task.splits["train"], task.splits["test"]
    assert tr.inputs.shape == (1437, 16, 4) and te.inputs.shape == (360, 16, 4)
    assert tr.inputs.dtype == np.float32 and tr.inputs.max() == 1.0 and tr.inputs.min() == 0.0
    assert np.bincount(te.labels, minlength=10).min() >= 35  # stratified: about 36 per class
    again = get_task("digits", seed=0)
    assert again.fingerprint == task.fingerprint != get_task("digits", seed=1).fingerprint
    assert task.params == {"test_fraction": 0.2, "seed": 0, "patch": 2}


def test_an_image_size_whose_arrays_exceed_the_memory_is_refused_before_padding(tmp_path, monkeypatch):
    import reservoir.io

    write_mnist(tmp_path, n_train=20, n_test=8)
    monkeypatch.setattr(reservoir.io.system, "available_memory", lambda: 1 << 30)
    with pytest.raises(ReservoirError) as e:
        get_task("mnist", data_dir=tmp_path, size=4000)
    assert_one_line_error(e, "task 'mnist': expected arrays (20 train images of 4000x4000 pixels) that fit in the "
                             "1.0 GiB of memory available; found 1.5 GiB")
    assert get_task("mnist", data_dir=tmp_path, size=64).splits["train"].inputs.shape == (20, 256, 16)


@pytest.mark.parametrize("fraction, found", [(0.999, "1 train, 1796 test"), (0.001, "1795 train, 2 test"),
                                             (0.9945, "9 train, 1788 test")])
def test_digits_test_fraction_leaves_every_class_on_both_sides(fraction, found):
    """A stratified split of ten classes needs ten rows on each side; scikit-learn's own error was a traceback."""
    with pytest.raises(ReservoirError) as e:
        get_task("digits", test_fraction=fraction)
    assert_one_line_error(e, "test_fraction must leave at least 10 of the 1797 images", found)
    assert [len(s) for s in get_task("digits", test_fraction=0.994).splits.values()] == [10, 1787]  # the edge


# ------------------------------------------------------------------ CIFAR-10

CIFAR_FILES = [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]


def write_cifar(folder, per_batch=2, seed=0, sub=True):
    """Tiny batches in the real format: pickle protocol 2, dict with bytes keys."""
    rng = np.random.default_rng(seed)
    target = folder / "cifar-10-batches-py" if sub else folder
    target.mkdir(parents=True, exist_ok=True)
    out = {}
    for f in CIFAR_FILES:
        data = rng.integers(0, 256, size=(per_batch, 3072), dtype=np.uint8)
        labels = rng.integers(0, 10, size=per_batch).tolist()
        batch = {b"batch_label": f.encode(), b"labels": labels, b"data": data,
                 b"filenames": [b"x.png"] * per_batch}  # fmt: skip
        (target / f).write_bytes(pickle.dumps(batch, protocol=2))
        out[f] = (data, labels)
    return out


def test_cifar10_channels_patches_and_normalization(tmp_path):
    ref = write_cifar(tmp_path)
    task = get_task("cifar10", data_dir=tmp_path)
    tr, te = task.splits["train"], task.splits["test"]
    assert tr.inputs.shape == (10, 64, 48) and te.inputs.shape == (2, 64, 48) and tr.inputs.dtype == np.float32
    assert (task.d_in, task.n_classes) == (48, 10)
    assert tr.labels.tolist() == [y for i in range(1, 6) for y in ref[f"data_batch_{i}"][1]]
    data = ref["data_batch_2"][0][1]  # train row 3
    r, g, b = data[:1024].reshape(32, 32), data[1024:2048].reshape(32, 32), data[2048:].reshape(32, 32)
    token = tr.inputs[3, 1]  # patch row 0, column 1: pixels y 0..3, x 4..7
    for k, (y, x, c) in enumerate((y, x, c) for y in range(4) for x in range(4, 8) for c in range(3)):
        raw = (r, g, b)[c][y, x] / 255
        assert token[k] == pytest.approx((raw - CIFAR_MEAN[c]) / CIFAR_STD[c], abs=1e-5)
    assert task.params == {"patch": 4, "n_train": None, "n_test": None}

    flat = get_task("cifar10", data_dir=tmp_path / "cifar-10-batches-py")  # the batch folder itself
    assert flat.fingerprint == task.fingerprint
    first = get_task("cifar10", data_dir=tmp_path, n_train=3, n_test=1)
    np.testing.assert_array_equal(first.splits["train"].inputs, tr.inputs[:3])
    assert first.splits["test"].inputs.shape == (1, 64, 48)


def test_cifar10_lra_grayscale(tmp_path):
    ref = write_cifar(tmp_path, sub=False)
    task = get_task("cifar10-lra", data_dir=tmp_path)
    te = task.splits["test"]
    assert te.inputs.shape == (2, 1024, 1) and te.inputs.dtype == np.float32 and (te.lengths == 1024).all()
    assert task.d_in == 1
    data = ref["test_batch"][0][0].astype(np.float64)
    for pixel in (0, 1, 33, 1023):  # row-major: pixel 33 is (1, 1)
        rgb = data[pixel], data[1024 + pixel], data[2048 + pixel]
        gray = (0.2989 * rgb[0] + 0.5870 * rgb[1] + 0.1140 * rgb[2]) / 255
        assert te.inputs[0, pixel, 0] == pytest.approx(2 * gray - 1, abs=1e-5)
    train = np.concatenate([ref[f"data_batch_{i}"][0] for i in range(1, 6)]).astype(np.float64)  # (10, 3072)
    gray = (0.2989 * train[:, :1024] + 0.5870 * train[:, 1024:2048] + 0.1140 * train[:, 2048:]) / 255
    np.testing.assert_allclose(task.splits["train"].inputs[:, :, 0], 2 * gray - 1, atol=1e-5)
    assert task.params == {"n_train": None, "n_test": None}


class Evil:
    def __reduce__(self):
        return (os.system, ("touch pwned",))


@pytest.mark.parametrize("case", ["garbage", "list", "no-labels", "shape", "dtype", "count", "label", "evil", "empty"])
def test_cifar_malformed_batches(tmp_path, case, monkeypatch):
    write_cifar(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    data = np.zeros((2, 3072), np.uint8)
    obj = {
        "garbage": None, "list": [1, 2], "no-labels": {b"data": data},
        "shape": {b"data": np.zeros((2, 100), np.uint8), b"labels": [0, 1]},
        "dtype": {b"data": data.astype(np.float32), b"labels": [0, 1]},
        "count": {b"data": data, b"labels": [0]}, "label": {b"data": data, b"labels": [0, 10]},
        "evil": {b"data": data, b"labels": [0, 1], b"x": Evil()}, "empty": None,
    }[case]  # fmt: skip
    raw = b"\x80\x02garbage" if case == "garbage" else b"" if case == "empty" else pickle.dumps(obj, protocol=2)
    path.write_bytes(raw)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ReservoirError) as e:
        get_task("cifar10", data_dir=tmp_path)
    assert_one_line_error(e, str(path))
    assert not (tmp_path / "pwned").exists()
    if case == "evil":
        assert_one_line_error(e, "refusing to load")


def test_cifar_missing_files(tmp_path, monkeypatch):
    write_cifar(tmp_path)
    (tmp_path / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(ReservoirError) as e:
        get_task("cifar10-lra", data_dir=tmp_path)
    assert_one_line_error(e, "data_batch_1", "test_batch", str(tmp_path), "download=True")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    with pytest.raises(ReservoirError) as e:
        get_task("cifar10")
    assert_one_line_error(e, "data_dir=None")


def _tarball(members):
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members:
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def test_cifar_download_extracts_safely(tmp_path, monkeypatch):
    ref = write_cifar(tmp_path / "src")
    good = _tarball([(f"cifar-10-batches-py/{f}", (tmp_path / "src" / "cifar-10-batches-py" / f).read_bytes())
                     for f in CIFAR_FILES])  # fmt: skip
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: FakeResponse(good))
    task = get_task("cifar10", data_dir=tmp_path / "dl", download=True)
    assert task.splits["test"].labels.tolist() == ref["test_batch"][1]
    assert os.listdir(tmp_path / "dl") == ["cifar-10-batches-py"]  # archive removed, no temp folder left

    evil = _tarball([("cifar-10-batches-py/test_batch", b"x"), ("../evil", b"x")])
    monkeypatch.setattr(urllib.request, "urlopen", lambda url, timeout=None: FakeResponse(evil))
    with pytest.raises(ReservoirError) as e:
        get_task("cifar10", data_dir=tmp_path / "dl2", download=True)
    assert_one_line_error(e, "'../evil'", "refusing")
    assert not (tmp_path / "evil").exists()
    assert os.listdir(tmp_path / "dl2") == []  # no archive, no temp folder, no batches
    (tmp_path / "dl" / "cifar-10-batches-py" / "test_batch").unlink()
    with pytest.raises(ReservoirError) as e:
        get_task("cifar10", data_dir=tmp_path / "dl", download=True)
    assert_one_line_error(e, "incomplete", "remove it")


def test_load_pickle_refuses_code_but_reads_arrays():
    arr = np.arange(6, dtype=np.int64).reshape(2, 3)
    for protocol in (2, 3, 5):
        back = load_pickle(pickle.dumps({"a": arr, "n": np.int64(3), "b": b"x", "s": {1}}, protocol=protocol))
        np.testing.assert_array_equal(back["a"], arr)
        assert back["n"] == 3 and back["b"] == b"x" and back["s"] == {1}
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system|nt.system"):
        load_pickle(pickle.dumps(Evil()))


@pytest.mark.parametrize("case", ["bytearray", "array", "scalar", "ndarray-call", "codec", "many-arrays"])
def test_load_pickle_refuses_allocations_its_bytes_do_not_pay_for(case):
    """A few bytes asking for gigabytes (bytearray(n), an array or a scalar of a huge shape or dtype) are refused
    before anything is allocated; data pickles (whose bytes hold their data) read as before."""
    import resource

    big = 1_500_000_000
    ops = {  # protocol 2 opcodes by hand: GLOBAL, BININT, TUPLE1/2/3, REDUCE, MARK, PUT/GET
        "bytearray": b"cbuiltins\nbytearray\nJ" + big.to_bytes(4, "little") + b"\x85R",
        "array": b"cnumpy._core.multiarray\n_reconstruct\ncnumpy\nndarray\nJ" + big.to_bytes(4, "little")
                 + b"\x85X\x02\x00\x00\x00u1\x87R",
        "scalar": b"cnumpy._core.multiarray\nscalar\ncnumpy\ndtype\nX\x0b\x00\x00\x00V1500000000\x85R\x85R",
        "ndarray-call": b"cnumpy\nndarray\nJ" + big.to_bytes(4, "little") + b"\x85\x85R",
        "codec": b"c_codecs\nencode\nX\x01\x00\x00\x00xX\x04\x00\x00\x00zlib\x86R",
        # 400 arrays of 1 MiB each from ~4 KiB: every call is within the pickle's size, their sum is not
        "many-arrays": b"cnumpy._core.multiarray\n_reconstruct\nq\x00cnumpy\nndarray\nq\x01J\x00\x00\x10\x00\x85q"
                       b"\x02X\x02\x00\x00\x00u1q\x03(" + b"h\x00h\x01h\x02h\x03\x87R" * 400 + b"l",
    }
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    with pytest.raises(pickle.UnpicklingError, match="refusing"):
        load_pickle(b"\x80\x02" + ops[case] + b".")
    assert resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before < 100_000  # KiB: nothing large was made
    arr = np.arange(3 << 20, dtype=np.uint8)  # 3 MiB of data in a 3 MiB pickle: read
    for protocol in (2, 4, 5):
        np.testing.assert_array_equal(load_pickle(pickle.dumps({"a": arr, "b": bytearray(b"ab")}, protocol))["a"], arr)


def test_cifar_labels_nested_to_blow_up_are_refused_before_numpy_walks_them(tmp_path):
    write_cifar(tmp_path)
    path = tmp_path / "cifar-10-batches-py" / "data_batch_3"
    laughs = [0] * 10
    for _ in range(8):  # 10^8 leaves behind ~100 bytes of pickle (each level shares one list ten times)
        laughs = [laughs] * 10
    path.write_bytes(pickle.dumps({b"data": np.zeros((2, 3072), np.uint8), b"labels": laughs}, protocol=2))
    with pytest.raises(ReservoirError) as e:
        get_task("cifar10", data_dir=tmp_path)
    assert_one_line_error(e, str(path), "expected 2 integer labels", "found a list of 10 items (list)")


def test_registered_defaults_are_json():
    for name in ("mnist", "fashion-mnist", "digits", "cifar10", "cifar10-lra"):
        json.dumps(TASKS[name].defaults)


def test_fingerprints_are_pinned(tmp_path):
    """Fingerprints recorded before the image module was split: same files and params, same arrays."""
    write_mnist(tmp_path / "m", n_train=20, n_test=8)
    write_mnist(tmp_path / "mgz", n_train=20, n_test=8, gz=True, seed=3)
    write_cifar(tmp_path / "c", per_batch=3)
    pinned = [
        ("mnist", {"data_dir": str(tmp_path / "m")},
         "50c5746c7d887686bebc0a6617b1c770a5e71bf2cac7a38376f5ecd5a3b7710c"),
        ("mnist", {"data_dir": str(tmp_path / "m"), "size": 28, "patch": 7, "n_train": 10, "n_test": 5},
         "ec3a445ed5c9f97b8cfb506c18f288b87035f391d0d07c7d0c0bccbb89c21d0e"),
        ("fashion-mnist", {"data_dir": str(tmp_path / "mgz")},
         "a0e9f0a49dc7560ffc6a4eba596c41a8eb3ffe17e0b417dc439c8c6516b3a029"),
        ("cifar10", {"data_dir": str(tmp_path / "c")},
         "6d79fb999d29b119eac0840cb76f6d22e5373688a4252a9a71e0f3df6ee341ba"),
        ("cifar10", {"data_dir": str(tmp_path / "c"), "patch": 2, "n_train": 7, "n_test": 2},
         "ef3c05d19e603cfe731019296bcf333b14773ac9bd0bdb3deefd4f2c53343fe5"),
        ("cifar10-lra", {"data_dir": str(tmp_path / "c")},
         "9fbf12ed5d8c62a3e4f7776f605035d29b3554839081c7f6b3f4f48662858fe5"),
        ("digits", {}, "f32c9d2ed9aa0f4c965108bf39063c4638ca0e4a0a7234d927839984e9d296c8"),
        ("digits", {"patch": 4, "seed": 7, "test_fraction": 0.3},
         "358bc6274916795c7b8347fca427386eddc18bfb8d169799c292bd49eecf7e83"),
    ]  # fmt: skip
    for name, params, fp in pinned:
        assert get_task(name, **params).fingerprint == fp, (name, params)


def test_counts_of_any_integer_type_are_kept_as_json_ints(tmp_path):
    write_cifar(tmp_path)
    task = get_task("cifar10-lra", data_dir=tmp_path, n_train=np.int64(3), n_test=np.int32(1))
    assert task.params == {"n_train": 3, "n_test": 1} and type(task.params["n_train"]) is int
    assert json.loads(json.dumps(task.params)) == task.params


def test_old_import_paths_still_work():
    from reservoir.tasks import images
    from reservoir.tasks.images.cifar import read_cifar10
    from reservoir.tasks.images.idx import read_idx as idx_read

    for name in images.__all__:
        assert hasattr(images, name), name
    assert images.read_cifar10 is read_cifar10 and images.read_idx is idx_read is read_idx
    assert images.build_cifar10 is TASKS["cifar10"].build


def test_cifar10_options_after_data_dir_are_keywords(tmp_path):
    """``patch`` moved after ``n_test`` (the order ``reservoir tasks`` lists); a positional call fails loudly."""
    from reservoir.tasks.images import build_cifar10

    write_cifar(tmp_path)
    with pytest.raises(TypeError):
        build_cifar10(str(tmp_path), 2)
    assert build_cifar10(str(tmp_path), patch=2).splits["train"].inputs.shape == (10, 256, 12)


def test_files_a_download_left_are_read_where_the_system_folder_lacks_them(tmp_path, monkeypatch):
    """Fashion-MNIST's default folder is the Debian package's; where it is absent, `download=true` fetches the
    files into ~/.cache/reservoir/fashion-mnist. Later runs without download read them there (they used to fail,
    looking only in the system folder), and the task cache's key stamps them."""
    from reservoir.tasks.cache import data_files
    from reservoir.tasks.images.idx import find_mnist

    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    system_folder = tmp_path / "usr-share-datasets-fashion-mnist"  # not there: no Debian package
    system = str(system_folder)
    with pytest.raises(ReservoirError, match="place them there, or pass download=True"):
        find_mnist("fashion-mnist", system, False, system)
    downloaded = tmp_path / "home" / ".cache" / "reservoir" / "fashion-mnist"
    write_mnist(downloaded)
    assert find_mnist("fashion-mnist", system, False, system) == str(downloaded)
    assert find_mnist("fashion-mnist", None, False, system) == str(downloaded)
    other = tmp_path / "mine"
    write_mnist(other)  # a data_dir of the user's own is read as given
    assert find_mnist("fashion-mnist", str(other), False, system) == str(other)
    stamped = data_files("fashion-mnist", {"data_dir": system})
    assert sorted(f[0] for f in stamped) == sorted(MNIST_NAMES)
    write_mnist(system_folder)  # the system folder complete: it is read
    assert find_mnist("fashion-mnist", system, False, system) == system
