"""Data sets without a network: the MNIST family from IDX files, digits, the PEG paper's toy sets.

    from peg import data
    X, y = data.load("fashion-mnist", "test")     # [10000, 1, 28, 28] float32 in [0, 1], int64
    X_tr, y_tr, X_val, y_val = data.train_val_split(*data.load("digits"), 0.2, seed=0)

Data roots and the PEG_DATA / PEG_DATA_ONLY environment variables: see `peg.data.roots`.
"""

from __future__ import annotations

from peg.data.idx import read_idx, write_idx
from peg.data.registry import input_shape, load, names, num_classes, train_val_split
from peg.data.roots import data_roots, find
from peg.data.toy import linear, three_moons, two_moons

__all__ = [
    "data_roots",
    "find",
    "input_shape",
    "linear",
    "load",
    "names",
    "num_classes",
    "read_idx",
    "three_moons",
    "train_val_split",
    "two_moons",
    "write_idx",
]
