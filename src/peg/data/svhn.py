"""SVHN (cropped digits, format 2) from the release's MATLAB files.

`train_32x32.mat` (73,257 images) and `test_32x32.mat` (26,032), looked for in
`<data root>/svhn/` and then directly under each data root. Each holds `X`, uint8
`[32, 32, 3, N]`, and `y`, `[N, 1]` with labels 1..10, where 10 stands for the digit 0: it is
mapped to 0, so labels are the digits themselves.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from peg.data._cache import check_split, find_first, not_found
from peg.data.roots import PathLike

_HINT = (
    "Put the SVHN format-2 files train_32x32.mat and test_32x32.mat "
    "(http://ufldl.stanford.edu/housenumbers/) under $PEG_DATA/svhn/ (or pass root=). "
    "Nothing is downloaded."
)


def load_svhn(
    split: str, root: PathLike | Sequence[PathLike] | None = None
) -> tuple[Tensor, Tensor]:
    """SVHN `(X [N, 3, 32, 32] float32 in [0, 1], y [N] int64 digits 0..9)`.

    Args:
        split: "train" or "test".
        root: data root(s) searched first.
    """
    from scipy.io import loadmat

    check_split(split)
    name = f"{split}_32x32.mat"
    found = find_first([f"svhn/{name}", name], root)
    if found is None:
        raise not_found("svhn", split, root, _HINT)
    path = found[0]
    mat = loadmat(path, variable_names=["X", "y"])
    if "X" not in mat or "y" not in mat:
        raise ValueError(f"{path}: expected variables X and y, got {sorted(mat)}")
    images, labels = np.asarray(mat["X"]), np.asarray(mat["y"]).reshape(-1)
    if images.ndim != 4 or images.shape[:3] != (32, 32, 3) or images.dtype != np.uint8:
        raise ValueError(
            f"{path}: expected X uint8 [32, 32, 3, N], got {images.dtype} {images.shape}"
        )
    if labels.shape != (images.shape[3],):
        raise ValueError(f"{path}: {images.shape[3]} images but {labels.size} labels")
    labels = labels.astype(np.int64)
    if labels.size and (labels.min() < 1 or labels.max() > 10):
        raise ValueError(f"{path}: expected labels 1..10, got {labels.min()}..{labels.max()}")
    X = torch.from_numpy(np.ascontiguousarray(images.transpose(3, 2, 0, 1)))
    return X.to(torch.float32).div_(255.0), torch.from_numpy(labels % 10)
