"""The one label-shift resampling (`_shifts.resample`) behind the interval's synthetic shifts
(`_shifts.shifted_sets`) and auto's learned mode (`_learned.training_sets`): both paths draw
exactly what their own copies drew before they were merged (the copies are kept here), the
same indices and the same random numbers consumed, a class absent from the labels included."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from peg.methods.estimation import _learned, _shifts


def _shifts_before(rng: np.random.Generator, y: np.ndarray, classes: int, priors: np.ndarray):
    """`shifted_sets`' local `resampled` before the merge."""
    by_class = [np.nonzero(y == c)[0] for c in range(classes)]
    present = np.array([len(i) > 0 for i in by_class])
    p = priors * present
    counts = rng.multinomial(len(y), p / p.sum())
    return np.concatenate([rng.choice(by_class[c], k, True) for c, k in enumerate(counts) if k > 0])


def _learned_before(rng: np.random.Generator, y: np.ndarray, alpha: float) -> np.ndarray:
    """`_learned._resample` before the merge."""
    classes = np.unique(y)
    counts = rng.multinomial(len(y), rng.dirichlet(np.full(len(classes), alpha)))
    picks = [
        rng.choice(np.nonzero(y == c)[0], k) for c, k in zip(classes, counts, strict=True) if k > 0
    ]
    return np.concatenate(picks)


def _labels(seed: int, absent: bool) -> np.ndarray:
    y = np.random.default_rng(seed).integers(0, 6, 200)
    return np.where(y == 3, 4, y) if absent else y  # class 3 absent


@pytest.mark.parametrize("absent", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_learned_mode_resamples_as_before(seed, absent):
    y = _labels(seed, absent)
    for alpha in (0.3, 1.0):
        old, new = np.random.default_rng(seed), np.random.default_rng(seed)
        np.testing.assert_array_equal(
            _learned._resample(new, y, alpha), _learned_before(old, y, alpha)
        )
        assert new.bit_generator.state == old.bit_generator.state


@pytest.mark.parametrize("absent", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_synthetic_shifts_resample_as_before(seed, absent):
    y = _labels(seed, absent)
    scores = torch.from_numpy(np.random.default_rng(seed).standard_normal((len(y), 7)))
    labels = torch.from_numpy(y)
    sets = list(_shifts.shifted_sets(scores, labels, seed))
    # the same draws replayed with the copy before the merge: the generator's calls in order
    rng = np.random.default_rng(seed)
    conf = scores.softmax(-1).max(-1).values.numpy()

    def tilted(lam: float, idx: np.ndarray) -> np.ndarray:
        w = np.exp(-lam * (conf[idx] - conf[idx].max()))
        return idx[rng.choice(len(idx), len(idx), True, w / w.sum())]

    rng.standard_normal(tuple(scores.shape))  # the noise
    for lam in _shifts.TILTS:
        tilted(lam, np.arange(len(y)))
    shifted = [s for s in sets if s[0].startswith("label shift") or "+" in s[0]]
    expected = []
    for _ in range(_shifts.N_LABEL_SHIFTS):
        expected.append(_shifts_before(rng, y, 7, rng.dirichlet(np.full(7, _shifts.DIRICHLET))))
    for lam in _shifts.TILTS[:2]:
        idx = _shifts_before(rng, y, 7, rng.dirichlet(np.full(7, _shifts.DIRICHLET)))
        expected.append(tilted(lam, idx))
    assert len(shifted) == len(expected)
    # exact: both sides are rows gathered by the same integer indices, no arithmetic (any CPU)
    for (_, s, lab), idx in zip(shifted, expected, strict=True):
        torch.testing.assert_close(s, scores[torch.from_numpy(idx)], rtol=0, atol=0)
        assert torch.equal(lab, labels[torch.from_numpy(idx)])
