"""The verbs every fitted method shares: it holds an `Ensemble` and predicts through it."""

from __future__ import annotations

from typing import Any

from torch import Tensor

from peg._inputs import Data
from peg.ensemble import Ensemble


class NotFittedError(RuntimeError):
    """A method was asked to predict before `fit`."""


class FittedEnsemble:
    """Mixin: `member_logits`, `predict_proba`, `predict` and `save` delegate to `ensemble_`."""

    ensemble_: Ensemble

    def ensemble(self) -> Ensemble:
        """The fitted `Ensemble` (raises NotFittedError before `fit`)."""
        try:
            return self.ensemble_
        except AttributeError:
            raise NotFittedError(
                f"{type(self).__name__}: call fit(...) before predicting"
            ) from None

    def member_logits(self, X: Data, batch_size: int = 512, **kwargs: Any) -> Tensor:
        """Logits of every member, `[M, N, C]` (see `Ensemble.member_logits`)."""
        return self.ensemble().member_logits(X, batch_size, **kwargs)

    def predict_proba(self, X: Data, batch_size: int = 512, **kwargs: Any) -> Tensor:
        """Averaged member probabilities, `[N, C]`."""
        return self.ensemble().predict_proba(X, batch_size, **kwargs)

    def predict(self, X: Data, batch_size: int = 512, **kwargs: Any) -> Tensor:
        """Predicted classes, `[N]`."""
        return self.ensemble().predict(X, batch_size, **kwargs)

    def save(self, path: str) -> str:
        """Save the fitted ensemble (safetensors + JSON); load it with `peg.load(path, model)`."""
        return self.ensemble().save(path)

    def __len__(self) -> int:
        return len(self.ensemble())
