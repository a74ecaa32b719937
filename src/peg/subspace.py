"""Subspace samplers around one solution (Fort et al. 2019, §4.2).

- `RandomSubspace`: θ₀ + t·v along random directions v.
- `DropoutSubspace`: dropout applied to the weights of θ₀ with a random keep probability.
- `DiagonalGaussian`: per-weight mean and std of the last iterates of a trajectory.
- `LowRankGaussian`: mean plus the top principal components of the last iterates (PCA).
- `MCDropout`: dropout kept on at prediction (in `peg.methods.dropout`, re-exported here).

Collect iterates with `peg.train.Snapshots` as a training callback.
"""

from peg.methods.dropout import MCDropout
from peg.methods.trained.subspace import (
    DiagonalGaussian,
    DropoutSubspace,
    LowRankGaussian,
    RandomSubspace,
)

__all__ = ["DiagonalGaussian", "DropoutSubspace", "LowRankGaussian", "MCDropout", "RandomSubspace"]
