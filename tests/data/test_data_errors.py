"""Bad input to data sets and corruptions: each case raises the documented error,
before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import torch

from bad_inputs import (
    _val,
    _write,
    raises_test,
)
from peg import data
from peg.data import corruptions
from peg.data._corruption_weather import frost_photos


@contextlib.contextmanager
def _no_data_roots() -> Iterator[None]:
    """Search only the explicit root: a machine without any data set installed."""
    saved = {k: os.environ.get(k) for k in ("PEG_DATA_ONLY", "PEG_DATA")}
    os.environ["PEG_DATA_ONLY"], os.environ["PEG_DATA"] = "1", ""
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _without_data(call: Callable[[], object]) -> object:
    with _no_data_roots():
        return call()


def _without_frost_photos(call: Callable[[], object]) -> object:
    """`call()` with torch-uncertainty-assets not importable (and no photographs cached)."""
    saved = sys.modules.get("torch_uncertainty_assets")
    frost_photos.cache_clear()
    sys.modules["torch_uncertainty_assets"] = None  # type: ignore[assignment]  # import fails
    try:
        return call()
    finally:
        if saved is None:
            del sys.modules["torch_uncertainty_assets"]
        else:
            sys.modules["torch_uncertainty_assets"] = saved
        frost_photos.cache_clear()


def _fake_idx(tmp: Path) -> Path:
    """A data root whose Fashion-MNIST files are text, not gzipped IDX."""
    folder = tmp / "root" / "fashion-mnist"
    folder.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        _write(folder / name, "not an idx file")
    return tmp / "root"


def _empty_cifar(tmp: Path) -> Path:
    (tmp / "root" / "cifar-10-batches-bin").mkdir(parents=True)
    return tmp / "root"


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    ("data", "unknown data set", lambda: data.load("imagenet"), ValueError, "unknown"),
    ("data", "unknown split", lambda: data.load("digits", "validation"), ValueError, "split"),
    (
        "corruptions",
        "unknown corruption",
        lambda: corruptions.corrupt(torch.rand(1, 1, 8, 8), "hail", 3),
        ValueError,
        "name",
    ),
    (
        "corruptions",
        "severity outside 1..5",
        lambda: corruptions.corrupt(torch.rand(1, 1, 8, 8), "contrast", 6),
        ValueError,
        "severity",
    ),
    (
        "corruptions",
        "frost without the package torch-uncertainty-assets",
        lambda: _without_frost_photos(
            lambda: corruptions.corrupt(torch.rand(1, 3, 8, 8), "frost", 1)
        ),
        ModuleNotFoundError,
        "name: 'frost' needs .*pip install torch-uncertainty-assets",
    ),
    # ---------------------------------------------------------------- data and models
    ("data", "name not a string", lambda: data.load(3), ValueError, "name"),
    (
        "data",
        "an option the set does not take",
        lambda: data.load("digits", n=3),
        ValueError,
        "options",
    ),
    ("data", "negative seed", lambda: data.load("digits", seed=-1), ValueError, "seed"),
    (
        "data",
        "root of the wrong type",
        lambda: data.load("fashion-mnist", root=3),
        ValueError,
        "root",
    ),
    (
        "data",
        "unknown cifar100 labels",
        lambda: data.load("cifar100", labels="medium"),
        ValueError,
        "labels",
    ),
    (
        "data",
        "train_val_split fraction outside (0, 1)",
        lambda: data.train_val_split(*_val(), 1.5),
        ValueError,
        "val_fraction",
    ),
    (
        "data",
        "train_val_split with X and y of different lengths",
        lambda: data.train_val_split(_val()[0], _val()[1][:5], 0.2),
        ValueError,
        "200 inputs but 5 labels",
    ),
]

# the same, for calls that take a temporary folder
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    (
        "data",
        "a data set not installed (missing folder)",
        lambda tmp: _without_data(lambda: data.load("fashion-mnist", root=tmp / "missing")),
        FileNotFoundError,
        "'fashion-mnist' .* not found",
    ),
    (
        "data",
        "an IDX file that is not IDX",
        lambda tmp: _without_data(lambda: data.load("fashion-mnist", root=_fake_idx(tmp))),
        ValueError,
        "gzip|IDX",
    ),
    (
        "data",
        "a CIFAR-10 binary folder missing batches",
        lambda tmp: _without_data(lambda: data.load("cifar10", "test", root=_empty_cifar(tmp))),
        FileNotFoundError,
        "test_batch.bin",
    ),
    (
        "data",
        "read_idx of a text file",
        lambda tmp: data.read_idx(_write(tmp / "t.idx", "hello")),
        ValueError,
        "not an IDX file",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)
