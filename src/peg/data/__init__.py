"""Data sets without a network: MNIST family, CIFAR-10/100, SVHN, STL-10, UCI regression, toys.

    from peg import data
    X, y = data.load("fashion-mnist", "test")     # [10000, 1, 28, 28] float32 in [0, 1], int64
    X, y = data.load("cifar10", "test")           # [10000, 3, 32, 32]
    X, y = data.load("uci-yacht", "train", split_index=3)    # [277, 6] float32, [277] float32
    X_tr, y_tr, X_val, y_val = data.train_val_split(*data.load("digits"), 0.2, seed=0)
    augment = data.Augment(mean=data.CIFAR10_MEAN, std=data.CIFAR10_STD, seed=0)

The table of data sets, options and file formats: `peg.data.registry`. Data roots and the
PEG_DATA / PEG_DATA_ONLY environment variables: see `peg.data.roots`; decoded-archive caches
(PEG_CACHE): `peg.data._cache`.
"""

from __future__ import annotations

from peg.data.cifar import CIFAR10_CLASSES, RestrictedUnpickler, cifar10_source, cifar100_source
from peg.data.idx import read_idx, write_idx
from peg.data.registry import (
    input_shape,
    load,
    names,
    num_classes,
    task,
    train_val_split,
)
from peg.data.roots import data_roots, find
from peg.data.stl10 import STL10_CLASSES, STL10_TO_CIFAR10
from peg.data.toy import linear, three_moons, two_moons
from peg.data.transforms import (
    CIFAR10_MEAN,
    CIFAR10_STD,
    CIFAR100_MEAN,
    CIFAR100_STD,
    MNIST_MEAN,
    MNIST_STD,
    STATS,
    Augment,
    denormalize,
    normalize,
    pad_to,
    random_crop,
    random_hflip,
)
from peg.data.uci import UCI_SETS, Standardisation, uci_n_splits, uci_normalise

__all__ = [
    "CIFAR10_CLASSES",
    "CIFAR10_MEAN",
    "CIFAR10_STD",
    "CIFAR100_MEAN",
    "CIFAR100_STD",
    "MNIST_MEAN",
    "MNIST_STD",
    "STATS",
    "STL10_CLASSES",
    "STL10_TO_CIFAR10",
    "UCI_SETS",
    "Augment",
    "RestrictedUnpickler",
    "Standardisation",
    "cifar10_source",
    "cifar100_source",
    "data_roots",
    "denormalize",
    "find",
    "input_shape",
    "linear",
    "load",
    "names",
    "normalize",
    "num_classes",
    "pad_to",
    "random_crop",
    "random_hflip",
    "read_idx",
    "task",
    "three_moons",
    "train_val_split",
    "two_moons",
    "uci_n_splits",
    "uci_normalise",
    "write_idx",
]
