"""The verbs every fitted method shares: it holds an `Ensemble` and predicts through it."""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor, nn

from peg._inputs import (
    Data,
    check_positive_int,
    diagnose,
    iter_inputs,
    model_device,
    num_batches,
    to_device,
)
from peg._progress import bar
from peg.ensemble import Ensemble, autocast_dtype
from peg.errors import NotFittedError
from peg.output import model_output
from peg.streams import generator


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
        """Averaged member probabilities, `[N, C]` (through `member_logits`)."""
        return self.member_logits(X, batch_size, **kwargs).softmax(-1).mean(0)

    def predict(self, X: Data, batch_size: int = 512, **kwargs: Any) -> Tensor:
        """Predicted classes, `[N]`."""
        return self.predict_proba(X, batch_size, **kwargs).argmax(-1)

    def save(self, path: str) -> str:
        """Save the fitted ensemble (safetensors + JSON); load it with `peg.load(path, model)`."""
        return self.ensemble().save(path)

    def __len__(self) -> int:
        return len(self.ensemble())


class ModulePredictor:
    """Base of the predictors that run one module of their own per batch, not stacked weights.

    MC dropout, MC patching (EMP/ECMP) and Packed-Ensembles keep a copy `model_` and produce all
    member outputs of a batch from it. Subclasses set `model_`, `batch_size`, `progress` and
    `label`, and implement `_prepare()` (module modes before predicting) and
    `_batch_logits(x, j) -> [M, B, C]` for batch j.
    """

    model_: nn.Module
    batch_size: int
    progress: bool | None
    label = "predict"

    def _check_fitted(self) -> None:
        if not hasattr(self, "model_"):
            raise NotFittedError(f"{type(self).__name__}: call fit(model) before predicting")

    def _device(self) -> torch.device:
        return model_device(self.model_)

    def _probe(self, x: Tensor, name: str = "X") -> None:
        """One pass on two rows of `x`, moved to the model's device: a clear error naming `name`
        if they do not fit the model (`peg._inputs.diagnose`); the global RNG is left as it is."""
        from peg.output import model_output

        x = to_device(x, self._device(), name)
        devices = [x.device] if x.device.type == "cuda" else []
        with torch.no_grad(), torch.random.fork_rng(devices=devices):
            model_output(diagnose(self.model_, x, name), name)

    def _prepare(self) -> None:
        self.model_.eval()

    def _batch_logits(self, x: Tensor, j: int) -> Tensor:
        raise NotImplementedError

    @torch.no_grad()
    def member_logits(
        self,
        X: Data,
        batch_size: int | None = None,
        progress: bool | None = None,
        autocast: str | torch.dtype | None = None,
        **_: Any,
    ) -> Tensor:
        """Logits of every member, `[M, N, C]`.

        Args:
            X: inputs `[N, ...]`, an (X, y) tuple, or a Dataset/DataLoader of `x` or `(x, y)`.
            batch_size: rows per forward pass for tensors (default: the constructor's).
            progress: progress bar over batches (default: the constructor's).
            autocast: "bf16" / "fp16": forwards under `torch.autocast`, float32 logits back
                (see `Ensemble.member_logits`).
        """
        amp = autocast_dtype(autocast)
        self._check_fitted()
        size = (
            self.batch_size if batch_size is None else check_positive_int(batch_size, "batch_size")
        )
        self._prepare()  # in case model_ was switched to train/eval by someone since fit
        device = self._device()
        batches = bar(
            iter_inputs(X, size),
            self.label,
            total=num_batches(X, size),
            enabled=self.progress if progress is None else progress,
        )
        chunks = []
        for j, x in enumerate(batches):
            x = to_device(x, device, "X")
            try:
                if amp is None:
                    chunks.append(self._batch_logits(x, j))
                else:
                    with torch.autocast(device.type, dtype=amp):
                        chunks.append(self._batch_logits(x, j).float())
            except Exception:
                self._probe(x)  # the inputs or the model's output at fault: a clear error
                raise
        if not chunks:
            raise ValueError("X: no inputs to predict (0 samples)")
        return torch.cat(chunks, dim=1)

    def predict_proba(self, X: Data, batch_size: int | None = None, **kwargs: Any) -> Tensor:
        """Predictive probabilities `[N, C]`: the member softmax outputs averaged."""
        return self.member_logits(X, batch_size, **kwargs).softmax(-1).mean(0)

    def predict(self, X: Data, batch_size: int | None = None, **kwargs: Any) -> Tensor:
        """Predicted class per input `[N]`."""
        return self.predict_proba(X, batch_size, **kwargs).argmax(-1)


class SampledPredictor(ModulePredictor):
    """A `ModulePredictor` whose members are `samples` stochastic passes (MC dropout, MC patching).

    The randomness of member s on batch j comes from the global RNG reseeded from the stream
    (seed, s, j) inside `torch.random.fork_rng()`: it depends on nothing else (but on the
    batching), and the caller's RNG state is left untouched.
    """

    samples: int
    seed: int

    def _batch_logits(self, x: Tensor, j: int) -> Tensor:
        devices = [x.device] if x.device.type == "cuda" else []
        outs = []
        with torch.random.fork_rng(devices=devices):
            for s in range(self.samples):
                torch.manual_seed(int(generator(self.seed, s, j).initial_seed()))
                outs.append(model_output(self.model_(x), "member_logits"))
        return torch.stack(outs)

    def __len__(self) -> int:
        return self.samples
