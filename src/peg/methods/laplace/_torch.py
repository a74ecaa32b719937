"""How `peg.Laplace` talks to laplace-torch: importing it (optional, `INSTALL`), the batches
its `fit` and grid search read, its warnings, and the global RNG its random steps draw from.

Mapping inputs (HuggingFace-style `{"input_ids": ..., "attention_mask": ...}`): laplace-torch
0.3 passes a `MutableMapping` batch whole to the model (`model(batch)`, no `[:1]` slice, no
move to the device) and reads its labels at `dict_key_y` and its number of rows at
`dict_key_x` (curvlinops' `batch_size_fn`, its non-empty check). So peg hands it the model
wrapped in `Keywords` (`forward(x)` = the logits of `model(**inputs)`, the entry `ROWS` left
out) and batches `{**inputs, ROWS: y}` on the model's device, with `dict_key_x = dict_key_y =
ROWS`: the labels, whose first dimension is the batch's rows. At prediction `ROWS` holds zeros.
"""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from types import ModuleType
from typing import Any

import torch
from torch import Tensor, nn

from peg.output import logits_of
from peg.source import ValSource
from peg.source._devices import move
from peg.source.batches import batch_rows, call_model, describe_inputs
from peg.streams import LAPLACE_FIT, generator

INSTALL = (
    'pip install "peg[laplace]" && pip install --no-deps laplace-torch==0.3 '
    "backpack-for-pytorch==1.7.1 curvlinops-for-pytorch==3.0.1"
)
# laplace-torch warns on every classification prior fit that its predictive should use the same
# link approximation; this class passes its own link to both, so the warning says nothing here
_LINK_WARNING = "By default `link_approx` is `probit`"


def require_laplace() -> ModuleType:
    """The `laplace` package (laplace-torch); an ImportError saying how to install it."""
    try:
        return importlib.import_module("laplace")
    except ImportError as e:
        raise ImportError(
            f"peg.Laplace needs laplace-torch, which is not installed ({e}); install it with: "
            f"{INSTALL}"
        ) from e


ROWS = "__peg_rows__"  # laplace-torch's dict_key_x and dict_key_y for mapping batches
PREFIX = "model."  # module names inside `Keywords`


class Keywords(nn.Module):
    """`model` for laplace-torch on mapping inputs: `forward(x)` is the logits (`logits_of`) of
    `model(**x)` without the entry `ROWS` (of `model(x)` for a tensor). A child `model`: names
    gain the prefix `model.`."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, x: Any) -> Any:
        if isinstance(x, Mapping):
            x = {k: v for k, v in x.items() if k != ROWS}
        return logits_of(call_model(self.model, x))


def keyed(x: Mapping[str, Any], rows: Tensor) -> dict[str, Any]:
    """A mapping batch as laplace-torch reads it (see the module doc)."""
    return {**x, ROWS: rows}


def check_inputs(x: Any, name: str) -> None:
    """Tensors or mappings: laplace-torch takes nothing else (tuples, lists)."""
    if not isinstance(x, (Tensor, Mapping)):
        raise TypeError(
            f"{name}: laplace-torch takes tensor or mapping inputs, got batches of "
            f"{describe_inputs(x)}"
        )


class Batches:
    """What laplace-torch's `fit` and grid search read of a DataLoader: `len(dataset)` (N, the
    likelihood's weight) and `(x, y)` batches (mappings `keyed` with the labels for mapping
    inputs), here those of a `ValSource` (any labelled data peg takes, each batch checked as it
    is read), on `device`."""

    def __init__(self, source: ValSource, batch_size: int, device: torch.device) -> None:
        self.source, self.batch_size, self.device = source, batch_size, device
        if source.n is None:  # an IterableDataset: one pass to count its points
            for _ in source.batches(batch_size):
                pass
        self.dataset = range(source.count)

    def pairs(self) -> Iterator[tuple[Any, Tensor]]:
        """`(x, y)` on the device, x a tensor or a `keyed` mapping."""
        for _, x, y in self.source.batches(self.batch_size):
            check_inputs(x, self.source.name)
            x, y = move(x, self.device, self.source.name), move(y, self.device, "labels")
            yield (keyed(x, y) if isinstance(x, Mapping) else x), y

    def paired(self) -> Iterable[tuple[Any, Tensor]]:
        """`pairs` as an iterable read again at every iteration (the grid search's)."""
        return _Pairs(self)

    def __iter__(self) -> Iterator[Any]:
        for x, y in self.pairs():
            yield x if isinstance(x, Mapping) else (x, y)


class _Pairs:
    def __init__(self, batches: Batches) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[tuple[Any, Tensor]]:
        return self.batches.pairs()


@contextmanager
def quiet() -> Iterator[None]:
    """laplace-torch's link-approximation reminder silenced (see `_LINK_WARNING`)."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=_LINK_WARNING)
        yield


@contextmanager
def seeded(seed: int, device: torch.device) -> Iterator[None]:
    """The global RNG, which laplace-torch's own random steps draw from (none for the default
    options; MC grid search), reseeded from the stream (seed, LAPLACE_FIT) and restored after."""
    with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
        torch.manual_seed(int(generator(seed, LAPLACE_FIT).initial_seed()))
        yield


def wrapped(network: nn.Module, source: ValSource, pred_type: str) -> tuple[nn.Module, bool]:
    """The network laplace-torch runs, and whether it takes mapping inputs: `Keywords(network)`
    when `source`'s batches are mappings (refused for `pred_type="nn"`: laplace-torch's sampled
    networks move their inputs with `x.to(device)`, which a dict lacks)."""
    x, _ = source.first()
    check_inputs(x, source.name)
    if not isinstance(x, Mapping):
        return network, False
    if pred_type == "nn":
        raise ValueError(
            f"{source.name}: pred_type='nn' is laplace-torch's sampled networks, which take "
            "tensor inputs only (it moves them with x.to(device)); use pred_type='glm' for "
            "mapping batches"
        )
    return Keywords(network).eval(), True


def inner_name(name: str | None, keywords: bool) -> str | None:
    """A module name of the caller's model as laplace-torch sees it (inside `Keywords`)."""
    return PREFIX + name if name is not None and keywords else name


def outer_name(name: str | None, keywords: bool) -> str | None:
    """laplace-torch's module name in the caller's model (without `Keywords`' prefix)."""
    if name is not None and keywords and name.startswith(PREFIX):
        return name[len(PREFIX) :]
    return name


def predict_inputs(x: Any, keywords: bool, device: torch.device) -> Any:
    """Inputs to predict on as laplace-torch takes them: a mapping `keyed` with placeholder
    labels (its paths count rows through them); a TypeError for a mapping when the fit took
    tensors."""
    check_inputs(x, "X")
    if not isinstance(x, Mapping):
        return x
    if not keywords:
        raise TypeError(
            f"X: this Laplace was fitted on tensor inputs, got {describe_inputs(x)}; fit it on "
            "mapping batches to predict on them"
        )
    return keyed(x, torch.zeros(batch_rows(x), device=device))
