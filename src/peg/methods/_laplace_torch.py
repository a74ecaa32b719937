"""How `peg.Laplace` talks to laplace-torch: importing it (optional, `INSTALL`), the batches
its `fit` and grid search read, its warnings, and the global RNG its random steps draw from."""

from __future__ import annotations

import importlib
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from types import ModuleType

import torch
from torch import Tensor

from peg._rows import ValSource
from peg.batches import describe_inputs
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


class Batches:
    """What laplace-torch's `fit` and grid search read of a DataLoader: `len(dataset)` (N, the
    likelihood's weight) and `(x, y)` batches, here those of a `ValSource` (any labelled data
    peg takes, each batch checked as it is read)."""

    def __init__(self, source: ValSource, batch_size: int) -> None:
        self.source, self.batch_size = source, batch_size
        if source.n is None:  # an IterableDataset: one pass to count its points
            for _ in source.batches(batch_size):
                pass
        self.dataset = range(source.count)

    def __iter__(self) -> Iterator[tuple[Tensor, Tensor]]:
        for _, x, y in self.source.batches(self.batch_size):
            if not isinstance(x, Tensor):
                raise TypeError(
                    f"{self.source.name}: laplace-torch takes tensor inputs, got batches of "
                    f"{describe_inputs(x)}"
                )
            yield x, y


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
