"""What a fitted predictor costs once fitted: prediction compute and the memory it holds.

- `forwards(predictor, model, rows)`: prediction cost in forwards of the model per input,
  measured, not assumed: the FLOPs (matrix products and convolutions, as
  `torch.utils.flop_counter` counts them) of the predictor on two input rows over the FLOPs of
  the model itself on the same rows. An ensemble of S full members costs S, MC dropout with S
  samples S, temperature scaling what its predictor costs; an ensemble whose members differ
  only in a head after a shared trunk (last-layer PEG) runs the trunk once and S heads, so it
  costs 1 + (S - 1) × (the head's share of the model's FLOPs), a little over 1.
- `held_bytes(predictor)`: the bytes of the tensors the predictor keeps to predict (weights
  and buffers; an ensemble's per-member entries and its shared ones once; a Laplace
  approximation's posterior too; each storage counted once, so temperature scaling holds what
  its predictor holds).
"""

from __future__ import annotations

import itertools
from typing import Any

from torch import Tensor, nn
from torch.utils.flop_counter import FlopCounterMode

from peg.ensemble import Ensemble
from peg.methods._predictors import member_logits_of
from peg.methods.base import FittedEnsemble, ModulePredictor
from peg.methods.calibration._calibrator import Calibrator
from peg.methods.laplace.laplace import Laplace
from peg.source import Data, Source
from peg.source.batches import BatchFn, take_rows

PROBE_ROWS = 2


def probe_rows(data: Data, batch_fn: BatchFn | None = None) -> Any:
    """The inputs of the first `PROBE_ROWS` rows of labelled or unlabelled data (a loader's
    first batch, cut)."""
    first = next(Source(data, batch_fn).inputs(PROBE_ROWS))
    return take_rows(first, 0, PROBE_ROWS)


def flops(predictor: Any, rows: Any) -> int:
    """FLOPs of predicting `rows` with `predictor` (counted on the second of two runs: the first
    may fill per-process caches, e.g. the strategy checks of `Ensemble`, with forwards of their
    own that predicting does not repeat)."""
    total = 0
    for _ in range(2):
        counter = FlopCounterMode(display=False)
        with counter:
            member_logits_of(predictor, rows)
        total = counter.get_total_flops()
    return int(total)


def forwards(predictor: Any, model: nn.Module, rows: Any) -> float | None:
    """Forwards of `model` per input that predicting with `predictor` costs (see the module
    docstring); None when the model's forward counts no FLOPs."""
    own = flops(model, rows)
    return flops(predictor, rows) / own if own else None


def _tensors(predictor: Any) -> list[Tensor]:
    if isinstance(predictor, nn.Module):
        return list(itertools.chain(predictor.parameters(), predictor.buffers()))
    if isinstance(predictor, Ensemble):
        return [*predictor.stacked.values(), *predictor.shared.values()]
    if isinstance(predictor, Calibrator):
        return _tensors(predictor.predictor_)
    if isinstance(predictor, FittedEnsemble) and "ensemble_" in predictor.__dict__:
        return _tensors(predictor.ensemble_)  # stacked members held (a lazy PEG/PEP holds none)
    if isinstance(predictor, Laplace):  # the model and the posterior's factors
        return [*_tensors(predictor.model_), *predictor.posterior_tensors()]
    if isinstance(predictor, ModulePredictor):
        return _tensors(predictor.model_)
    return []


def held_bytes(predictor: Any) -> int | None:
    """Bytes of the tensors `predictor` holds to predict (see the module docstring); None for a
    predictor this does not know how to look into (e.g. a lazy PEG, which keeps no members)."""
    storages = {}
    for t in _tensors(predictor):
        s = t.untyped_storage()
        storages[(s.device, s.data_ptr())] = s.nbytes()
    return sum(storages.values()) if storages else None
