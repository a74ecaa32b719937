"""What the conformal predictors share (`ConformalClassifier`, `ConformalRegressor`).

A conformal predictor wraps a fitted predictor and leaves its predictions alone:
`member_logits` / `iter_member_logits` / `predict_proba` are the predictor's, so `peg.evaluate`
gives the same numbers for both. It is saved like a calibrator (`Calibrator.save`: the
predictor's ensemble, the fitted quantiles in the meta's `"calibration"` entry and as tensors);
a calibrator under it (temperature scaling, Dirichlet, ...) is saved with it, its own entry
under `"inner"` and its arrays under `inner/`, and `peg.load` rebuilds both
(`peg.methods.calibration._wraps.WrapsCalibrator`, which `peg.LabelShift` shares).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from torch import Tensor

from peg.errors import NotStreamable
from peg.methods._predictors import iter_member_logits_of, member_logits_of
from peg.methods.calibration._wraps import WrapsCalibrator
from peg.source import Data
from peg.source.batches import BatchFn


class ConformalBase(WrapsCalibrator):
    """A `Calibrator` whose map is the identity: the predictor's outputs pass through."""

    def member_logits(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Tensor:  # fmt: skip
        """The predictor's member outputs `[M, N, C]`, unchanged."""
        self._check_fitted()
        size, split = self._reading(batch_size, batch_fn)
        return self._widthed(member_logits_of(self.predictor_, X, size, split, **options))

    def iter_member_logits(
        self, X: Data, batch_size: int | None = None, batch_fn: BatchFn | None = None,
        **options: Any,
    ) -> Iterator[Tensor]:  # fmt: skip
        """The predictor's member outputs batch by batch, `[M, B_j, C]`."""
        self._check_fitted()
        size, split = self._reading(batch_size, batch_fn)
        batches = iter_member_logits_of(self.predictor_, X, size, split, **options)  # may refuse
        return (self._widthed(logits) for logits in batches)

    def _widthed(self, logits: Tensor) -> Tensor:
        self._check_width(logits, "X")
        return logits

    def _batches(
        self, X: Data, batch_size: int | None, batch_fn: BatchFn | None
    ) -> Iterator[Tensor]:
        """`iter_member_logits`, or the whole `member_logits` for a predictor that cannot
        stream."""
        try:
            return self.iter_member_logits(X, batch_size, batch_fn)
        except NotStreamable:
            return iter([self.member_logits(X, batch_size, batch_fn)])

    def _mapped(self, logits: Tensor, name: str = "logits", start: int | None = None) -> Tensor:
        return logits

    def __len__(self) -> int:
        self._check_fitted()
        base = self.predictor_  # an nn.Module is one member (a Sequential's len is its layers)
        return len(base) if hasattr(base, "member_logits") and hasattr(base, "__len__") else 1


class CachedLogits:
    """A predictor whose inputs are its own member logits, rows first: `X` `[N, M, C]` gives
    `member_logits(X) = X.transpose(0, 1)` `[M, N, C]`. Conformal prediction from logits
    already computed (the bench's and `peg.compare`'s caches) without running a model:
    `ConformalClassifier().fit(CachedLogits(), (logits.transpose(0, 1), y))`."""

    def member_logits(self, X: Tensor, batch_size: int = 512, **_: Any) -> Tensor:
        return X.transpose(0, 1)

    def iter_member_logits(self, X: Tensor, batch_size: int = 512, **_: Any) -> Iterator[Tensor]:
        for start in range(0, len(X), batch_size):
            yield X[start : start + batch_size].transpose(0, 1)
