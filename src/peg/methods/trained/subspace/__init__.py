"""Subspace samplers around one solution (Fort et al. 2019, "Deep Ensembles: A Loss Landscape
Perspective", §4.2): random directions, dropout on the weights, diagonal and low-rank Gaussians.

Every sampler builds full state dicts from a base state dict in which only the sampled trainable
parameters change, and holds them as an `Ensemble` (`ensemble_`). Parameters are handled as one
flat vector `[P]` (`peg._params`): the selected parameters in `named_parameters()` order, each
flattened row-major (`reshape(-1)`); `mean_`, `std_` and `components_` use that order (names in
`param_names_`).

BatchNorm: `bn="eval"` (default) keeps the base running statistics in every sample;
`bn="refresh"` re-estimates them per sample on `bn_data` (`torch.optim.swa_utils.update_bn`, as
SWAG does), under a seeded RNG so dropout during that pass stays reproducible.

Random streams: draw d of a sampler uses `generator(seed, d)`, so the members depend only on
(base weights, hyper-parameters, seed).

- `around_solution`: `RandomSubspace`, `DropoutSubspace` (around one trained model θ₀).
- `iterates`: `DiagonalGaussian`, `LowRankGaussian` (fitted to a trajectory's last checkpoints).
- `_sampler`: what they share (checks, metadata, the BatchNorm refresh).
"""

# the flat-vector helpers of `peg._params` stay importable from here
from peg._params import flatten_state as flatten_state
from peg._params import unflatten_state as unflatten_state
from peg.methods.trained.subspace._sampler import BN_BATCH_SIZE, SubspaceBN
from peg.methods.trained.subspace.around_solution import (
    EVAL_BATCH_SIZE,
    MAX_DRAWS_PER_SAMPLE,
    DropoutSubspace,
    RandomSubspace,
)
from peg.methods.trained.subspace.iterates import DiagonalGaussian, Iterates, LowRankGaussian

__all__ = [
    "BN_BATCH_SIZE",
    "EVAL_BATCH_SIZE",
    "MAX_DRAWS_PER_SAMPLE",
    "DiagonalGaussian",
    "DropoutSubspace",
    "Iterates",
    "LowRankGaussian",
    "RandomSubspace",
    "SubspaceBN",
]
