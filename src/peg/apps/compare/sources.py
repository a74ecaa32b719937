"""What `peg compare` is given on the command line, turned into a model and data.

- A model: `module:function`, imported (the current directory first on `sys.path`, so a file
  `mymodel.py` there is `mymodel:build`; a dotted module name, never a path or a relative
  name) and called without arguments; it returns the trained nn.Module.
- Data, one of:
  - a registry name (`peg.data.load`), `NAME` (its test split) or `NAME:SPLIT` (`train`,
    `test`), e.g. `fashion-mnist` or `fashion-mnist:train`;
  - a `.npz` file with arrays `x` (or `X`) and `y` (labels; OOD sets may leave them out),
    read with `allow_pickle=False`; float64 arrays (NumPy's default) are read as float32;
  - a `.pt` file read with `torch.load(weights_only=True)` (tensors, never pickled objects):
    a dict with `x` (or `X`) and `y`, a pair `(x, y)`, or a tensor of inputs (OOD sets);
  - `module:function` returning a Dataset, a DataLoader or a pair `(X, y)`.
- Saved logits (`saved_logits`, `peg select --val-logits --val-labels`, `peg compare
  --val-logits --val-labels --test-logits --test-labels`: `compared`): two `.npy` files per
  set, logits `[N, C]` memory-mapped (read batch by batch, never loaded whole) and class
  labels `[N]` (integers, or floats whose values are all integers, as the API takes them, in
  [0, C)); `read_npy` is the one reader of such a file (`peg apply --logits` too).
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from peg import data as datasets
from peg._load_checks import torch_file
from peg.apps import kinds
from peg.apps.arguments import printable
from peg.apps.input_checks import COMPARE_LOGITS, check_compare, spelled
from peg.source import is_dataset_or_loader, is_pair
from peg.source.batches import from_numpy
from peg.utils.io import numpy_reason

SPLITS = ("train", "test")


def call(spec: str, what: str) -> Any:
    """The value `function()` of `module:function`; a ValueError naming `what` otherwise."""
    module_name, _, function = spec.partition(":")
    if not all(p.isidentifier() for p in module_name.split(".")) or not function.isidentifier():
        raise ValueError(
            f"{what}: expected module:function (a module name such as mymodel or pkg.mymodel, "
            f"importable from the current folder; not a path), got {spec!r}"
        )
    if os.getcwd() not in sys.path:  # the user's own module, next to where they run peg
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as e:
        raise ValueError(f"{what}: cannot import {module_name!r} ({e})") from None
    fn: Callable[[], Any] | None = getattr(module, function, None)
    if not callable(fn):
        raise ValueError(f"{what}: {module_name!r} has no function {function!r}")
    try:
        inspect.signature(fn).bind()
    except TypeError as e:  # it needs arguments: say so, rather than a traceback of the call
        raise ValueError(f"{what}: {spec} must be callable without arguments ({e})") from None
    except ValueError:  # no signature to read (a builtin): call it and see
        pass
    return fn()


def model(spec: str) -> nn.Module:
    """The model `module:function` returns."""
    built = call(spec, "--model")
    if not isinstance(built, nn.Module):
        raise ValueError(f"--model: {spec} returned a {type(built).__name__}, not an nn.Module")
    return built


def registry_split(spec: str) -> tuple[str, str] | None:
    """`(name, split)` when `spec` names a registry data set (`NAME` or `NAME:SPLIT`)."""
    name, _, split = spec.partition(":")
    if name not in datasets.names():
        return None
    split = split or "test"
    if split not in SPLITS:
        raise ValueError(f"{spec}: unknown split {split!r}; known: {list(SPLITS)}")
    return name, split


def data(spec: str, what: str, labelled: bool = True) -> Any:
    """The data `spec` names (see the module docstring); `what` names the option in errors."""
    found = registry_split(spec)
    if found is not None:
        return datasets.load(*found)
    suffix = Path(spec).suffix.lower()
    if suffix in (".npz", ".pt"):
        path = Path(spec)
        if not path.is_file():
            raise FileNotFoundError(f"{what}: no file at {path}")
        if suffix == ".npz":
            held: Any = _npz(path, what)
        else:
            # never unpickles code; names a blocked global, never relays torch's advice
            held = torch_file(path, what, "file of tensors", "torch.save((X, y), path)")
        return _pair(held, f"{what}: {path}", labelled)
    if ":" in spec:
        got = call(spec, what)
        if not (is_dataset_or_loader(got) or isinstance(got, (Tensor, tuple, list))):
            raise ValueError(
                f"{what}: {spec} returned a {type(got).__name__}; expected a Dataset, a "
                "DataLoader or a pair (X, y)"
            )
        return got
    raise ValueError(
        f"{what}: {spec!r} is neither a data set ({', '.join(datasets.names())}), a .npz or .pt "
        "file, nor module:function"
    )


def saved_logits(
    logits: str,
    labels: str,
    options: tuple[str, str] = ("--logits", "--labels"),
    task: str | None = None,
    ignore_index: int = -100,
) -> tuple[Tensor, Tensor]:
    """Validation logits `[N, C]` (float16/32/64, memory-mapped) and labels `[N]` (integers;
    floats whose values are all integers are read as int64) from two `.npy` files, read
    without pickles and checked before any work; a ValueError naming the option (`options`:
    those of the logits and the labels) otherwise. Logits of another kind (`task`, read
    from the shapes where "auto"; None, the monitor's: multiclass alone): `kinds.read_saved`."""
    what, labels_what = options
    X, y = read_npy(logits, what, mmap=True), read_npy(labels, labels_what, mmap=False)
    if task is not None and not (X.ndim == 2 and y.ndim == 1 and task in ("auto", "multiclass")):
        return kinds.read_saved(X, y, options, task, ignore_index, (logits, labels))
    if X.ndim != 2 or X.dtype.kind != "f" or X.shape[1] < 2:
        raise ValueError(
            f"{what}: expected floating-point logits [N, C] with C >= 2, got an array of "
            f"shape {X.shape} and dtype {X.dtype} in {logits}"
        )
    if y.ndim != 1 or y.dtype.kind not in "iuf":
        raise ValueError(
            f"{labels_what}: expected integer class labels [N], got an array of shape {y.shape} "
            f"and dtype {y.dtype} in {labels}"
        )
    if len(y) != len(X):
        raise ValueError(f"{labels_what}: {len(y)} labels for {len(X)} rows of {what}")
    y = _integral(y, labels, labels_what)
    bad = (y < 0) | (y >= X.shape[1])
    if bad.any():  # here, where the option is known (the library's check says "val labels")
        row = int(np.argmax(bad))
        raise ValueError(
            f"{labels_what}: expected labels in [0, {X.shape[1]}) (the classes of {what}), got "
            f"{y[row].item()!r} at row {row} of {labels}"
        )
    return from_numpy(X), from_numpy(y)


def _integral(y: np.ndarray, path: str, what: str) -> np.ndarray:
    """Labels `y` `[N]` as integers: float labels whose values are all integers (as
    `np.save` of labels kept in a float array gives) as int64, as the API reads them."""
    if y.dtype.kind != "f":
        return y
    bad = ~np.isfinite(y) | (y != np.round(y))
    if bad.any():
        row = int(np.argmax(bad))
        raise ValueError(
            f"{what}: expected integer class labels [N], got the non-integer value "
            f"{y[row].item()!r} at row {row} of {path} (dtype {y.dtype})"
        )
    return y.astype(np.int64)


def compared(args: Any, say: Callable[[str], None]) -> tuple[nn.Module, Any, Any]:
    """`peg compare`'s model, validation and test data: `--model`, `--val` and `--test`, or
    saved logits (`--val-logits`, `--val-labels`, `--test-logits`, `--test-labels`,
    memory-mapped) read through `nn.Identity()`; a ValueError naming the options missing or
    mixed, as typed (`--logits` and `--labels`, the earlier spellings, too:
    `input_checks.check_compare`)."""
    check_compare(args)
    if args.val_logits is not None:
        names = spelled(args, COMPARE_LOGITS)
        read = {
            "task": getattr(args, "task", "auto"),
            "ignore_index": getattr(args, "ignore_index", -100),
        }
        val = saved_logits(args.val_logits, args.val_labels, (names[0], names[1]), **read)
        test = saved_logits(
            args.test_logits, args.test_labels, ("--test-logits", "--test-labels"), **read
        )
        return nn.Identity(), val, test
    return model(args.model), *val_and_test(args.val, args.test, args.seed, say)


def read_npy(path: str, what: str, mmap: bool) -> np.ndarray:
    """The one array of the `.npy` file at `path` (memory-mapped with `mmap`), never a pickle;
    a FileNotFoundError or ValueError naming `what` (the option) otherwise: a missing file, a
    `.npz` or `.pt` archive, text, a truncated or pickled file."""
    if not Path(path).is_file():
        raise FileNotFoundError(f"{what}: no file at {path}")
    with open(path, "rb") as f:
        head = f.read(6)
    if not head.startswith((b"\x93NUMPY", b"PK", b"\x80")):  # .npy, zip (.npz, .pt), pickle
        raise ValueError(
            f"{what}: {path} is not a .npy file (it does not begin as one: text such as a .csv?); "
            "save the array with numpy.save"
        )
    try:
        held = np.load(path, mmap_mode="r" if mmap else None, allow_pickle=False)
    except Exception as e:  # a truncated file, a planted pickle, not a .npy
        reason = numpy_reason(e)
        raise ValueError(f"{what}: {path} is not a readable .npy array ({reason})") from None
    if not isinstance(held, np.ndarray):  # a .npz archive of several arrays (or a .pt: a zip)
        held.close()
        pt = Path(path).suffix == ".pt"
        kind = "a PyTorch file (a zip archive)" if pt else "a .npz archive of arrays"
        raise ValueError(f"{what}: {path} is {kind}; expected one .npy array")
    return held


def _npz(path: Path, what: str) -> dict[str, Tensor]:
    """The arrays of a `.npz` file (never a pickle); a ValueError naming `what` for a damaged,
    truncated or foreign file (NumPy raises BadZipFile, EOFError, OSError or ValueError)."""
    try:
        with np.load(path, allow_pickle=False) as f:
            return {k: torch.from_numpy(_single(f[k])) for k in f.files}
    except Exception as e:  # a truncated zip, a bad member, a planted pickle
        reason = numpy_reason(e)
        raise ValueError(
            f"{what}: {path} is not a readable .npz file of arrays ({reason})"
        ) from None


def _single(a: np.ndarray) -> np.ndarray:
    return a.astype(np.float32) if a.dtype == np.float64 else a


def _pair(held: Any, where: str, labelled: bool) -> Any:
    """`(X, y)` (or X alone where labels may be left out) from what a file held."""
    if isinstance(held, Mapping):
        key = next((k for k in ("x", "X") if k in held), None)
        if key is None:
            raise ValueError(f"{where}: expected arrays 'x' (or 'X') and 'y', got {list(held)}")
        X, y = held[key], held.get("y")
    elif is_pair(held, arrays=False):
        X, y = held
    elif isinstance(held, Tensor):
        X, y = held, None
    else:
        raise ValueError(f"{where}: expected x and y, got a {type(held).__name__}")
    if y is None:
        if labelled:
            raise ValueError(f"{where}: no labels 'y' (only OOD sets may leave them out)")
        return X
    return X, y


def named(specs: list[str] | None, what: str, labelled: bool) -> dict[str, Any]:
    """`{name: data}` from `[NAME=]SPEC` strings (the name defaults to the spec, a file's
    stem for files); an existing file's path is SPEC whole, though it holds `=`. Names are
    `printable` (a file name that is not UTF-8 shown with backslash escapes)."""
    out: dict[str, Any] = {}
    for spec in specs or []:
        whole = "=" not in spec or Path(spec).exists()
        name, _, rest = ("", "", spec) if whole else spec.partition("=")
        if not name:
            name = Path(rest).stem if Path(rest).suffix in (".npz", ".pt") else rest
        name = printable(name)
        if name in ("val", "test"):  # a set of that name would replace --val's or --test's
            shown = printable(spec)
            raise ValueError(
                f"{what}: {shown} would be named {name!r}, as the --{name} set; name it "
                f"NAME={shown}"
            )
        if name in out:
            raise ValueError(f"{what}: two sets named {name!r}; name them NAME=SPEC")
        out[name] = data(rest, what, labelled)
    return out


def val_and_test(val: str, test: str, seed: int, say: Callable[[str], None]) -> tuple[Any, Any]:
    """`--val` and `--test`; the same split of a registry data set for both is cut in two
    seeded, stratified halves, one each (said), so they never share a point."""
    same = registry_split(val)
    if same is not None and same == registry_split(test):
        X, y = datasets.load(*same)
        X_test, y_test, X_val, y_val = datasets.train_val_split(X, y, 0.5, seed=seed)
        say(f"compare: --val and --test are both {':'.join(same)}: half of it each")
        return (X_val, y_val), (X_test, y_test)
    return data(val, "--val"), data(test, "--test")
