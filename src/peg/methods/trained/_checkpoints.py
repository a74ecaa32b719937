"""The user's own training as peg's trained methods: checkpoints read one at a time and checked
against the model, for `SWA.from_checkpoints`, `SWAG.from_checkpoints` and
`DeepEnsemble.from_checkpoints`.

A checkpoint is a state dict (a mapping of the model's entry names to tensors) or the path of a
file holding one: `.safetensors` (read by safetensors), or `.pt` / `.pth` / `.bin` read by
`torch.load(weights_only=True)` only, which unpickles tensors and containers and nothing that
runs code; no other file is read. Every entry is checked before it is used: the model's names
(no entry missing, none extra), their shapes, the kind of their numbers (floating-point,
complex, integer, boolean: a cast within a kind only), finite values; a checkpoint holding the
same weights as an earlier one is said (a content digest). Each snapshot is loaded into one
working copy of the model and handed on before the next is read: however many checkpoints, one
is held at a time (the averages being what is kept).
"""

from __future__ import annotations

import copy
import hashlib
import os
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from peg._load_checks import torch_file
from peg.errors import InvalidParameterError, NonFiniteError
from peg.source import Source

SAFETENSORS = (".safetensors",)
TORCH_FILES = (".pt", ".pth", ".bin")
# what the trained methods' constructors take for training only: refused by from_checkpoints
TRAINING_ONLY = ("recipe", "checkpoint", "checkpoint_dir", "loss", "reinit")


def refuse_training_arguments(cls: type, params: Mapping[str, Any]) -> None:
    """An argument of training (`recipe`, `loss`, ...) given to `from_checkpoints`, refused."""
    given = [k for k in TRAINING_ONLY if k in params]
    if given:
        raise InvalidParameterError(
            f"{given[0]}: {cls.__name__}.from_checkpoints trains nothing, so it takes none of "
            f"{list(TRAINING_ONLY)}; pass the method's other arguments"
        )


def check_model(model: Any, name: str = "model") -> nn.Module:
    if not isinstance(model, nn.Module):
        raise TypeError(
            f"{name}: expected the nn.Module the checkpoints were saved from (any weights: "
            f"each checkpoint replaces them), got {type(model).__name__}"
        )
    return model


def check_checkpoints(checkpoints: Any, fewest: int, why: str, name: str = "checkpoints") -> list:
    """The checkpoints as a list, each a mapping or an existing file of a kind read here, at
    least `fewest` of them (`why` says what needs them): all said before any is read."""
    if isinstance(checkpoints, (str, os.PathLike, Mapping)) or not isinstance(
        checkpoints, Sequence
    ):
        raise TypeError(
            f"{name}: expected a list of state dicts or checkpoint file paths, got "
            f"{type(checkpoints).__name__}"
        )
    entries = list(checkpoints)
    if len(entries) < fewest:
        raise ValueError(f"{name}: {why} needs at least {fewest}, got {len(entries)}")
    for i, entry in enumerate(entries):
        where = f"{name}[{i}]"
        if isinstance(entry, Mapping):
            continue
        if not isinstance(entry, (str, os.PathLike)):
            raise TypeError(
                f"{where}: expected a state dict or a file path, got {type(entry).__name__}"
            )
        path = Path(entry)
        if not path.is_file():
            raise ValueError(f"{where}: {path} is not a file")
        if path.suffix.lower() not in SAFETENSORS + TORCH_FILES:
            raise ValueError(
                f"{where}: {path.name} is neither a .safetensors file nor a torch weights file "
                f"({', '.join(TORCH_FILES)}, read with torch.load(weights_only=True)); other "
                "files are not read"
            )
    return entries


def read_checkpoint(entry: Any, where: str) -> Mapping[str, Any]:
    """The state dict `entry` is or holds (CPU tensors for a file)."""
    if isinstance(entry, Mapping):
        return entry
    path = Path(entry)
    if path.suffix.lower() in SAFETENSORS:
        from safetensors import SafetensorError
        from safetensors.torch import load_file

        try:
            return load_file(path, device="cpu")
        except (SafetensorError, OSError) as e:
            raise ValueError(f"{where}: {path} is not a readable safetensors file ({e})") from None
    state = torch_file(path, where)
    if not isinstance(state, Mapping):
        raise ValueError(f"{where}: {path} holds a {type(state).__name__}, not a state dict")
    return state


def check_state(state: Mapping[str, Any], expected: Mapping[str, Tensor], where: str) -> None:
    """`state` has exactly `expected`'s entries, of their shapes, with finite values."""
    nested = [k for k, v in state.items() if isinstance(v, Mapping)]
    if nested:
        raise ValueError(
            f"{where}: holds nested entries {nested[:5]}, not the model's weights; pass the "
            f"one that holds them (e.g. checkpoint[{nested[0]!r}])"
        )
    missing = [k for k in expected if k not in state]
    extra = [k for k in state if k not in expected]
    if missing or extra:
        hint = _prefix_hint(list(state), list(expected))
        raise ValueError(
            f"{where}: its entries are not the model's: missing {missing[:5]}, unexpected "
            f"{extra[:5]} ({len(missing)} and {len(extra)} in all){hint}"
        )
    for k, ref in expected.items():
        value = state[k]
        if not isinstance(value, Tensor):
            raise ValueError(f"{where}: entry {k!r} is a {type(value).__name__}, not a tensor")
        if value.shape != ref.shape:
            raise ValueError(
                f"{where}: entry {k!r} has shape {tuple(value.shape)}, the model's "
                f"{tuple(ref.shape)}"
            )
        if _kind(value) != _kind(ref):  # a cast would change what the numbers mean
            raise ValueError(
                f"{where}: entry {k!r} is {value.dtype}, the model's {ref.dtype}: "
                f"{_kind(value)} values are not the model's {_kind(ref)} weights (a quantized "
                "or converted checkpoint?); save the model's own state dict"
            )
        if (value.is_floating_point() or value.is_complex()) and not bool(
            torch.isfinite(value).all()
        ):
            raise NonFiniteError(f"{where}: entry {k!r} holds NaN or infinite values")


def _kind(t: Tensor) -> str:
    """What a dtype's numbers are: within a kind a cast keeps them (float16 -> float32), across
    kinds it does not (int8 codes read as float weights, a complex entry losing its imaginary
    part)."""
    if t.dtype == torch.bool:
        return "boolean"
    if t.is_complex():
        return "complex"
    return "floating-point" if t.is_floating_point() else "integer"


def digest(state: Mapping[str, Tensor]) -> str:
    """A content digest of a checked state dict: names, dtypes, shapes and bytes."""
    h = hashlib.blake2b(digest_size=16)
    for k in sorted(state):
        t = state[k].detach().reshape(-1).contiguous().cpu()
        h.update(f"{k}|{t.dtype}|{tuple(state[k].shape)}|".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


def _prefix_hint(got: list[str], expected: list[str]) -> str:
    """A prefix the checkpoint's names carry beyond the model's (Lightning's "model."), said."""
    if not got or not expected:
        return ""
    for name in got:
        if name.endswith(expected[0]) and name != expected[0]:
            prefix = name[: -len(expected[0])]
            if all(prefix + k in got for k in expected):
                return (
                    f"; its names carry the prefix {prefix!r}: pass "
                    f"{{k.removeprefix({prefix!r}): v for k, v in state.items()}}"
                )
    return ""


def snapshots(model: nn.Module, entries: list, name: str = "checkpoints") -> Iterator[nn.Module]:
    """One working copy of `model` (never `model` itself) carrying each checkpoint in turn."""
    net = copy.deepcopy(model)
    expected = net.state_dict()
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{name}[{i}]"
        state = read_checkpoint(entry, where)
        check_state(state, expected, where)
        first = seen.setdefault(digest(state), i)
        if first != i:
            warnings.warn(
                f"{where}: the same weights as {name}[{first}]: identical checkpoints add "
                "nothing to an average or an ensemble (a degenerate SWA, SWAG or Deep "
                "Ensemble: no spread between them); pass distinct snapshots",
                stacklevel=4,
            )
        net.load_state_dict(dict(state))
        yield net


def collect(
    method: Any, model: nn.Module, checkpoints: Any, bn_data: Any, fewest: int, why: str
) -> None:
    """`SWA` / `SWAG.from_checkpoints`: the method's own callbacks (the running average, SWAG's
    moments) run on each checkpoint in turn, as `fit` runs them after epochs 1, 2, ..., then
    the average finished as `fit` finishes it (`_average`: BatchNorm, the fitted state)."""
    model = check_model(model)
    entries = check_checkpoints(checkpoints, fewest, why)
    method._checkpoints = len(entries)
    method._bn_batches = (
        None
        if bn_data is None
        else Source(bn_data, method.batch_fn, "bn_data").replay(int(method.batch_size))
    )
    net = copy.deepcopy(model)
    own = method._callbacks(net, 0)
    for i, snapshot in enumerate(snapshots(model, entries)):
        for callback in own:
            callback(i + 1, snapshot)
    method.history_ = []
    method._average(net)
