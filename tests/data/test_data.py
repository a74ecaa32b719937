"""Data: toy sets, IDX files, data roots, the registry and the stratified split."""

from __future__ import annotations

import gzip
import math
import os
import struct
from pathlib import Path

import numpy as np
import pytest
import torch

from peg import data
from peg.data import mnist, roots

SYSTEM_FASHION = Path("/usr/share/datasets/fashion-mnist")
SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"


@pytest.fixture()
def no_default_roots(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Search only explicit roots: simulates a machine without any data."""
    monkeypatch.setenv("PEG_DATA_ONLY", "1")
    monkeypatch.delenv("PEG_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    return tmp_path


# ---------------------------------------------------------------------------- toy sets
@pytest.mark.parametrize(
    ("make", "n", "classes"),
    [(data.linear, 400, 2), (data.two_moons, 400, 2), (data.three_moons, 600, 3)],
)
def test_toy_shapes_dtypes_counts_and_seeds(make, n, classes) -> None:
    X, y = make()
    assert X.shape == (n, 2) and X.dtype == torch.float32
    assert y.shape == (n,) and y.dtype == torch.int64
    assert torch.bincount(y).tolist() == [n // classes] * classes
    X2, y2 = make(seed=0)
    assert torch.equal(X, X2) and torch.equal(y, y2)
    X3, _ = make(seed=1)
    assert not torch.equal(X, X3)
    assert torch.isfinite(X).all()


def test_toy_uneven_counts_and_bad_arguments() -> None:
    _, y = data.three_moons(n=10)
    assert torch.bincount(y).tolist() == [4, 3, 3]
    _, y = data.linear(n=7)
    assert torch.bincount(y).tolist() == [3, 4]
    with pytest.raises(ValueError, match="n"):
        data.three_moons(n=2)
    with pytest.raises(ValueError, match="noise"):
        data.two_moons(noise=-0.1)
    with pytest.raises(ValueError, match="seed"):
        data.linear(seed=-1)
    with pytest.raises(ValueError, match="margin"):
        data.linear(margin=float("nan"))


def test_linear_has_the_margin() -> None:
    X, y = data.linear(n=2000, margin=1.0, seed=3)
    proj = (X.double() @ torch.tensor([1.0, 1.0], dtype=torch.float64)) / math.sqrt(2)
    assert proj[y == 1].min() >= 0.5 - 1e-5
    assert proj[y == 0].max() <= -0.5 + 1e-5


def test_three_moons_layout() -> None:
    X, y = data.three_moons(n=300, noise=0.0)
    for k in range(3):  # moon k is centred at x = k
        assert abs(float(X[y == k, 0].mean()) - k) < 0.05


# ---------------------------------------------------------------------------- IDX files
def _idx_bytes(array: np.ndarray, code: int) -> bytes:
    header = struct.pack(">BBBB", 0, 0, code, array.ndim)
    header += struct.pack(f">{array.ndim}I", *array.shape)
    return header + array.astype(array.dtype.newbyteorder(">")).tobytes()


@pytest.mark.parametrize("compressed", [False, True])
def test_read_idx_round_trip(tmp_path: Path, compressed: bool) -> None:
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(5, 4, 3), dtype=np.uint8)
    labels = rng.integers(0, 10, size=5, dtype=np.uint8)
    for name, array in (("images", images), ("labels", labels)):
        raw = _idx_bytes(array, 0x08)
        path = tmp_path / f"{name}.idx"  # compression is detected from the content
        path.write_bytes(gzip.compress(raw) if compressed else raw)
        out = data.read_idx(path)
        assert out.dtype == np.uint8 and out.shape == array.shape
        np.testing.assert_array_equal(out, array)
        out[0] = 0  # writable


def test_read_idx_other_dtypes_and_write_idx(tmp_path: Path) -> None:
    arrays = {
        0x0B: np.arange(-6, 6, dtype=np.int16).reshape(3, 4),
        0x0C: np.array([1, -2, 3 << 20], dtype=np.int32),
        0x0D: np.linspace(-1, 1, 6, dtype=np.float32).reshape(2, 3),
        0x0E: np.array([[math.pi]], dtype=np.float64),
        0x09: np.array([-128, 0, 127], dtype=np.int8),
    }
    for code, array in arrays.items():
        path = tmp_path / f"a{code}.idx"
        path.write_bytes(_idx_bytes(array, code))
        out = data.read_idx(path)
        assert out.dtype == array.dtype and out.dtype.isnative
        np.testing.assert_array_equal(out, array)
        written = data.write_idx(tmp_path / f"b{code}.idx.gz", array)
        assert written.read_bytes()[:2] == b"\x1f\x8b"
        assert gzip.decompress(written.read_bytes()) == path.read_bytes()
        np.testing.assert_array_equal(data.read_idx(written), array)


def test_read_idx_rejects_damaged_files(tmp_path: Path) -> None:
    raw = _idx_bytes(np.zeros((4, 3, 3), dtype=np.uint8), 0x08)
    cases = {
        "truncated.idx": raw[:-5],
        "trailing.idx": raw + b"\x00",
        "header.idx": raw[:9],
        "magic.idx": b"\x01" + raw[1:],
        "dtype.idx": raw[:2] + b"\x42" + raw[3:],
        "truncated.gz": gzip.compress(raw)[:-12],
        "truncated-inner.gz": gzip.compress(raw[:-1]),
        "empty.idx": b"",
    }
    for name, content in cases.items():
        path = tmp_path / name
        path.write_bytes(content)
        with pytest.raises(ValueError, match=name):
            data.read_idx(path)
    with pytest.raises(FileNotFoundError):
        data.read_idx(tmp_path / "missing.idx")
    with pytest.raises(ValueError, match="dtype"):
        data.write_idx(tmp_path / "x.idx", np.zeros(3, dtype=np.int64))


# ---------------------------------------------------------------------------- data roots
def test_data_roots_order_and_dedup(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    monkeypatch.setenv("PEG_DATA", f"{b}{os.pathsep}{a}")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PEG_DATA_ONLY", raising=False)
    monkeypatch.chdir(tmp_path)
    found = data.data_roots(a)
    assert found[:3] == [a.resolve(), b.resolve(), (tmp_path / "home/.cache/peg").resolve()]
    assert Path("/usr/share/datasets").resolve() in found
    assert (tmp_path / ".." / "shared" / "data").resolve() in found
    repo_shared = (Path(roots.__file__).resolve().parents[3] / ".." / "shared" / "data").resolve()
    assert found[-1] == repo_shared
    assert repo_shared == SHARED.resolve()
    assert len(found) == len(set(found))
    monkeypatch.setenv("PEG_DATA_ONLY", "1")
    assert data.data_roots([a, a]) == [a.resolve(), b.resolve()]


def test_find(no_default_roots: Path) -> None:
    root = no_default_roots / "root"
    (root / "set").mkdir(parents=True)
    (root / "set" / "f.bin").write_bytes(b"x")
    assert data.find("set/f.bin", root) == (root / "set" / "f.bin").resolve()
    with pytest.raises(FileNotFoundError, match="install me") as e:
        data.find("set/g.bin", root, hint="install me")
    assert str(root.resolve()) in str(e.value)


# ---------------------------------------------------------------------------- registry
def _fake_mnist_root(root: Path, folder: str, prefix: str, n: int) -> None:
    rng = np.random.default_rng(1)
    images = rng.integers(0, 256, size=(n, 28, 28), dtype=np.uint8)
    images[0, 0, 0], images[0, 0, 1] = 0, 255
    data.write_idx(root / folder / f"{prefix}-images-idx3-ubyte.gz", images)
    data.write_idx(root / folder / f"{prefix}-labels-idx1-ubyte.gz", np.arange(n, dtype=np.uint8))


def test_load_idx_set_from_an_explicit_root(no_default_roots: Path) -> None:
    root = no_default_roots / "data"
    _fake_mnist_root(root, "fashion-mnist", "t10k", 12)
    X, y = data.load("fashion-mnist", "test", root=root)
    assert X.shape == (12, 1, 28, 28) and X.dtype == torch.float32
    assert float(X.min()) == 0.0 and float(X.max()) == 1.0
    assert y.dtype == torch.int64 and y.tolist() == list(range(12))
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        data.load("fashion-mnist", "train", root=root)  # only the test files are there
    _fake_mnist_root(root, "mnist", "train", 3)  # mnist: a training split if present
    assert data.load("mnist", "train", root=root)[0].shape == (3, 1, 28, 28)


def test_missing_data_set_names_what_to_install(no_default_roots: Path) -> None:
    with pytest.raises(FileNotFoundError) as e:
        data.load("fashion-mnist", "test", root=no_default_roots / "nothing")
    message = str(e.value)
    assert "fashion-mnist" in message.splitlines()[0]
    assert "apt-get install dataset-fashion-mnist" in message
    assert str((no_default_roots / "nothing").resolve()) in message
    with pytest.raises(FileNotFoundError, match="notmnist"):
        data.load("notmnist", "test", root=no_default_roots / "nothing")


def test_unknown_name_split_and_options() -> None:
    with pytest.raises(ValueError, match="fashion-mnist"):
        data.load("cifar-1000")
    with pytest.raises(ValueError, match="split"):
        data.load("digits", "validation")
    with pytest.raises(ValueError, match="options"):
        data.load("digits", n=5)
    with pytest.raises(ValueError, match="known"):
        data.num_classes("nope")


def test_names_classes_shapes() -> None:
    base = ["fashion-mnist", "mnist", "notmnist", "digits", "two-moons", "three-moons", "linear"]
    assert set(base) <= set(data.names())  # the file-format sets: tests/data/test_data_formats.py
    assert data.names() == sorted(data.names())
    assert data.num_classes("three-moons") == 3
    assert data.num_classes("Fashion_MNIST") == 10
    assert data.input_shape("digits") == (1, 8, 8)
    assert data.input_shape("two-moons") == (2,)


@pytest.mark.skipif(not SYSTEM_FASHION.exists(), reason="dataset-fashion-mnist not installed")
def test_fashion_mnist_from_the_system_package(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("PEG_DATA_ONLY", raising=False)
    X, y = data.load("fashion-mnist", "test", root="/usr/share/datasets")
    assert X.shape == (10000, 1, 28, 28) and X.dtype == torch.float32
    assert float(X.min()) >= 0.0 and float(X.max()) <= 1.0
    assert y.dtype == torch.int64
    assert torch.bincount(y, minlength=10).tolist() == [1000] * 10


@pytest.mark.parametrize(
    ("name", "folder"), [("mnist", "mnist_test"), ("notmnist", "notmnist_test")]
)
def test_shared_test_sets(monkeypatch: pytest.MonkeyPatch, name: str, folder: str) -> None:
    if not (SHARED / folder).exists():
        pytest.skip(f"{SHARED / folder} is not there")
    monkeypatch.delenv("PEG_DATA_ONLY", raising=False)
    X, y = data.load(name, "test", root=SHARED)
    assert X.shape == (10000, 1, 28, 28) and X.dtype == torch.float32
    assert float(X.min()) >= 0.0 and float(X.max()) <= 1.0
    assert y.dtype == torch.int64 and set(y.unique().tolist()) == set(range(10))
    if name == "notmnist":
        assert torch.bincount(y).tolist() == [1000] * 10


def test_digits() -> None:
    X, y = data.load("digits", "train")
    Xt, yt = data.load("digits", "test")
    assert X.shape == (1437, 1, 8, 8) and Xt.shape == (360, 1, 8, 8)
    assert X.dtype == torch.float32 and y.dtype == torch.int64
    assert float(X.min()) == 0.0 and float(X.max()) == 1.0
    assert torch.bincount(yt).min() >= 35
    assert torch.equal(data.load("digits", "test", seed=0)[0], Xt)
    assert not torch.equal(data.load("digits", "test", seed=1)[0], Xt)
    assert len(X) + len(Xt) == 1797


def test_toy_sets_in_the_registry() -> None:
    X, _ = data.load("three-moons", "train", seed=4)
    Xt, _ = data.load("three-moons", "test", seed=4)
    assert X.shape == Xt.shape == (1200, 2)
    assert not torch.equal(X, Xt)
    assert torch.equal(Xt, data.three_moons(n=1200, seed=10_004)[0])
    X, _ = data.load("two-moons", n=50, noise=0.3)
    assert X.shape == (50, 2) and torch.equal(X, data.two_moons(n=50, noise=0.3)[0])


# ---------------------------------------------------------------------------- splitting
def test_train_val_split_is_stratified_disjoint_and_seeded() -> None:
    y = torch.arange(10).repeat_interleave(torch.tensor([50, 50, 50, 50, 50, 30, 30, 30, 7, 3]))
    X = torch.arange(len(y), dtype=torch.float32)[:, None].expand(-1, 3).clone()
    Xtr, ytr, Xva, yva = data.train_val_split(X, y, 0.2, seed=0)
    assert len(yva) == math.ceil(0.2 * len(y)) and len(ytr) + len(yva) == len(y)
    ids_tr, ids_va = set(Xtr[:, 0].long().tolist()), set(Xva[:, 0].long().tolist())
    assert not ids_tr & ids_va and len(ids_tr | ids_va) == len(y)
    assert torch.equal(y[Xva[:, 0].long()], yva)  # labels travel with their inputs
    counts = torch.bincount(yva, minlength=10).tolist()
    assert counts[:8] == [10, 10, 10, 10, 10, 6, 6, 6]
    assert all(abs(c - 0.2 * n) <= 1 for c, n in zip(counts, torch.bincount(y), strict=True))
    again = data.train_val_split(X, y, 0.2, seed=0)
    assert all(torch.equal(a, b) for a, b in zip(again, (Xtr, ytr, Xva, yva), strict=True))
    assert not torch.equal(data.train_val_split(X, y, 0.2, seed=1)[2], Xva)
    assert torch.all(Xtr[1:, 0] > Xtr[:-1, 0])  # original order kept


def test_train_val_split_checks_its_arguments() -> None:
    X, y = torch.zeros(10, 2), torch.arange(10) % 2
    for bad in (0, 1, 1.5, -0.1, True, "0.2"):
        with pytest.raises(ValueError, match="val_fraction"):
            data.train_val_split(X, y, bad)
    with pytest.raises(ValueError, match="labels"):
        data.train_val_split(X, y[:5])
    with pytest.raises(ValueError, match="stratify"):
        data.train_val_split(X, y.double())
    _, ytr, Xva, _ = data.train_val_split(X, y.double(), 0.3, stratify=False)
    assert len(Xva) == 3 and ytr.dtype == torch.float64
    Xtr, _, Xva, _ = data.train_val_split(X.numpy(), y.numpy(), 0.5)
    assert isinstance(Xtr, torch.Tensor) and len(Xva) == 5


def test_idx_reads_are_cached_but_results_independent(no_default_roots: Path) -> None:
    root = no_default_roots / "data"
    _fake_mnist_root(root, "notmnist_test", "t10k", 4)
    X1, y1 = data.load("notmnist", "test", root=root)
    X1.zero_()
    y1.zero_()
    X2, y2 = data.load("notmnist", "test", root=root)
    assert float(X2.max()) == 1.0 and y2.tolist() == [0, 1, 2, 3]
    assert mnist._read_cached.cache_info().hits >= 2
