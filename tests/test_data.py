"""Data: toy sets, IDX files, the registry, data roots and the stratified split."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
import torch

from peg import data


def write_idx(path: Path, array: np.ndarray, compress: bool) -> None:
    code = {np.dtype(np.uint8): 0x08, np.dtype(">i4"): 0x0C}[array.dtype]
    header = bytes([0, 0, code, array.ndim]) + np.array(array.shape, ">u4").tobytes()
    raw = header + array.tobytes()
    path.write_bytes(gzip.compress(raw) if compress else raw)


@pytest.mark.parametrize("make", [data.two_moons, data.three_moons, data.linear])
def test_toy_sets(make):
    X, y = make(n=300, seed=1)
    assert X.shape == (300, 2) and X.dtype == torch.float32 and y.dtype == torch.int64
    counts = y.bincount()
    assert counts.min() == counts.max()  # equal class counts
    X2, y2 = make(n=300, seed=1)
    assert torch.equal(X, X2) and torch.equal(y, y2)
    assert not torch.equal(X, make(n=300, seed=2)[0])
    with pytest.raises(ValueError, match="n:"):
        make(n=1)


def test_linear_is_separable():
    X, y = data.linear(n=500, seed=0)
    side = X[:, 0] + X[:, 1]  # the classes lie either side of x0 + x1 = 0
    assert ((side > 0) == (y == 1)).all()


@pytest.mark.parametrize("compress", [True, False])
def test_read_idx_round_trip(tmp_path, compress):
    images = np.random.default_rng(0).integers(0, 256, (7, 5, 4), dtype=np.uint8)
    labels = np.arange(7, dtype=">i4")
    write_idx(tmp_path / "img", images, compress)
    write_idx(tmp_path / "lab", labels, compress)
    assert np.array_equal(data.read_idx(tmp_path / "img"), images)
    assert np.array_equal(data.read_idx(tmp_path / "lab"), labels)


def test_read_idx_rejects_truncated_and_foreign_files(tmp_path):
    images = np.zeros((4, 3, 3), dtype=np.uint8)
    write_idx(tmp_path / "img", images, compress=False)
    raw = (tmp_path / "img").read_bytes()
    (tmp_path / "short").write_bytes(raw[:-5])
    with pytest.raises(ValueError, match="short.*truncated"):
        data.read_idx(tmp_path / "short")
    (tmp_path / "text").write_bytes(b"hello world")
    with pytest.raises(ValueError, match="not an IDX file"):
        data.read_idx(tmp_path / "text")


def test_registry_loads_idx_from_an_explicit_root(tmp_path):
    folder = tmp_path / "fashion-mnist"
    folder.mkdir()
    rng = np.random.default_rng(0)
    write_idx(
        folder / "t10k-images-idx3-ubyte.gz",
        rng.integers(0, 256, (20, 28, 28), dtype=np.uint8),
        True,
    )
    write_idx(folder / "t10k-labels-idx1-ubyte.gz", (np.arange(20) % 10).astype(np.uint8), True)
    X, y = data.load("fashion-mnist", "test", root=tmp_path)
    assert X.shape == (20, 1, 28, 28) and X.dtype == torch.float32
    assert float(X.min()) >= 0 and float(X.max()) <= 1
    assert y.tolist() == [i % 10 for i in range(20)]


def test_missing_data_set_says_what_to_install(tmp_path, monkeypatch):
    monkeypatch.setenv("PEG_DATA_ONLY", "1")
    monkeypatch.delenv("PEG_DATA", raising=False)
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist") as info:
        data.load("fashion-mnist", "train", root=tmp_path)
    assert str(tmp_path) in str(info.value)


def test_data_roots_order(tmp_path, monkeypatch):
    monkeypatch.setenv("PEG_DATA", str(tmp_path / "env"))
    monkeypatch.delenv("PEG_DATA_ONLY", raising=False)
    roots = data.data_roots(tmp_path / "explicit")
    assert roots[:2] == [(tmp_path / "explicit").resolve(), (tmp_path / "env").resolve()]
    assert Path("/usr/share/datasets") in roots
    assert roots.index(Path.home().resolve() / ".cache" / "peg") < roots.index(
        Path("/usr/share/datasets")
    )


def test_unknown_names_and_splits():
    with pytest.raises(ValueError, match="unknown data set 'cifar-1000'"):
        data.load("cifar-1000")
    with pytest.raises(FileNotFoundError, match="mnist"):
        data.load("mnist", "train", root="/nonexistent")  # only if its files are installed
    with pytest.raises(ValueError, match="split"):
        data.load("two-moons", "val")


def test_digits_and_toy_splits():
    Xtr, _ = data.load("digits", "train")
    Xte, _ = data.load("digits", "test")
    assert Xtr.shape[1:] == (1, 8, 8) and len(Xtr) + len(Xte) == 1797
    assert float(Xtr.max()) <= 1.0
    a, b = data.load("two-moons", "train"), data.load("two-moons", "test")
    assert not torch.equal(a[0], b[0])
    assert data.num_classes("three-moons") == 3 and data.input_shape("digits") == (1, 8, 8)


def test_train_val_split_is_stratified_and_disjoint():
    X = torch.arange(1000).float().unsqueeze(1)
    y = torch.arange(1000) % 4
    Xtr, _, Xva, yva = data.train_val_split(X, y, 0.2, seed=3)
    assert len(Xva) == 200 and yva.bincount().tolist() == [50] * 4
    assert set(Xtr.flatten().tolist()).isdisjoint(Xva.flatten().tolist())
    assert torch.equal(data.train_val_split(X, y, 0.2, seed=3)[2], Xva)
    with pytest.raises(ValueError, match="val_fraction"):
        data.train_val_split(X, y, 1.0)


FASHION = Path("/usr/share/datasets/fashion-mnist/t10k-images-idx3-ubyte.gz")


@pytest.mark.skipif(
    not FASHION.exists(), reason="Debian package dataset-fashion-mnist not installed"
)
def test_fashion_mnist_real_files():
    X, y = data.load("fashion-mnist", "test")
    assert X.shape == (10000, 1, 28, 28) and X.dtype == torch.float32
    assert y.bincount().tolist() == [1000] * 10
    assert float(X.min()) == 0.0 and float(X.max()) == 1.0


def test_shared_mnist_and_notmnist_test_sets():
    try:
        X, y = data.load("notmnist", "test")
        Xm, ym = data.load("mnist", "test")
    except FileNotFoundError:
        pytest.skip("../shared/data not beside the checkout")
    assert X.shape == Xm.shape == (10000, 1, 28, 28)
    assert y.bincount().tolist() == [1000] * 10
    assert len(ym.unique()) == 10
