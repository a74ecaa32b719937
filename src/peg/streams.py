"""Random streams: every random draw peg makes comes from `generator(seed, *key)`.

A stream is named by the user's `seed` and a key saying what the draw is for, so a member
depends on nothing else (not on the global RNG, not on what was drawn before). The keys in use,
kept exactly as they have always been so every ensemble made before is made again:

- (MEMBER, r, i): member i of base model r: PEG's mini-batches (and the unbiased variant's a),
  PEP's noise.
- (VALIDATION, r, j): PEG-unbiased, mini-batch j estimating ∇L(V).
- (SPLIT,): PEG/PEP, the validation split into gradient and scoring parts.
- (SWAG_SAMPLE, i): SWAG sample i.
- (d,) and (SUBSPACE_BN, d): draw d of a subspace sampler, and its BatchNorm-refresh pass.
- (s, j): MC dropout / MC patching, member s on input batch j (its masks).
- (j,): Laplace's MC samples of input batch j; (LAPLACE_FIT,): the global RNG during its fit.

VALIDATION and SWAG_SAMPLE share the value 1, and (s, j) keys overlap the others' values: they
never meet, because a method only draws from its own streams under its own seed.
"""

from __future__ import annotations

import numpy as np
import torch

MEMBER = 0
VALIDATION = 1
SWAG_SAMPLE = 1
SUBSPACE_BN = 2**30
SPLIT = 2**31
LAPLACE_FIT = 2**32

__all__ = [
    "LAPLACE_FIT",
    "MEMBER",
    "SPLIT",
    "SUBSPACE_BN",
    "SWAG_SAMPLE",
    "VALIDATION",
    "generator",
]


def generator(seed: int, *key: int) -> torch.Generator:
    """An independent, reproducible random stream for (seed, *key) (numpy SeedSequence)."""
    state = np.random.SeedSequence(entropy=seed, spawn_key=key).generate_state(1, np.uint64)[0]
    return torch.Generator().manual_seed(int(state))
