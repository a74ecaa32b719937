"""What a predictor gives back has the type of what it was given (scikit-learn's
`get_namespace`, read once from the inputs): NumPy arrays in (a memory-mapped `.npy` too; lists
of numbers and pandas objects, read as arrays), NumPy arrays out; tensors, loaders, Datasets or
anything else in, tensors out. Applied at the boundary only, by the verbs users call for
predictions (`predict_proba`, `predict`, `predict_set`); `member_logits`, which peg itself
reads, stays a tensor.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import Tensor

from peg.source.batches import as_array, is_pair


def gives_numpy(X: Any) -> bool:
    """Whether predictions of `X` come back as NumPy arrays: `X` an array or an array-like
    read as one (a pandas object, a list of rows of numbers: `as_array`), or a pair `(X, y)`
    whose inputs are one."""
    if isinstance(X, Tensor):
        return False
    X = as_array(X)
    if is_pair(X, arrays=False):
        X = as_array(X[0])
    return isinstance(X, np.ndarray)


def like_input(out: Tensor, X: Any) -> Any:
    """`out` in the type `X` came in (`gives_numpy`): a NumPy array (on the CPU, detached) for
    NumPy inputs, `out` itself otherwise."""
    return out.detach().cpu().numpy() if gives_numpy(X) else out
