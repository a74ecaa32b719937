"""What every predictor derives the same way from its `member_logits` (the predictor protocol,
`peg.methods.base`): `predict_proba` and `predict` (`Predicts`), the `autocast=` argument read
(`autocast_dtype`), per-batch logits put together (`_cat_batches`), and the refusal to be traced.
`Ensemble` is the first of them; `peg.ensemble` re-exports `Predicts` and `autocast_dtype`.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch
from torch import Tensor

from peg.source import Data
from peg.source._kinds import read_kind
from peg.source._namespace import like_input

AUTOCAST = {"bf16": torch.bfloat16, "fp16": torch.float16}


def _cat_batches(batches: Iterable[Tensor]) -> Tensor:
    """The per-batch logits `[M, B_j, C]` of an `iter_member_logits`, as one `[M, N, C]`; a
    single batch's own tensor (fresh per call) is not copied again."""
    parts = list(batches)
    return parts[0].contiguous() if len(parts) == 1 else torch.cat(parts, dim=1)


def autocast_dtype(autocast: str | torch.dtype | None) -> torch.dtype | None:
    """The `torch.autocast` dtype an `autocast=` argument names (None: no autocast)."""
    if autocast is None:
        return None
    if isinstance(autocast, str) and autocast in AUTOCAST:
        return AUTOCAST[autocast]
    if isinstance(autocast, torch.dtype) and autocast in AUTOCAST.values():
        return autocast
    raise ValueError(
        f"autocast: expected None, 'bf16', 'fp16', torch.bfloat16 or torch.float16, "
        f"got {autocast!r}"
    )


class Predicts:
    """`predict_proba` and `predict` from `member_logits`: the verbs of the predictor protocol
    (`peg.methods.base`) that every predictor derives the same way."""

    def member_logits(self, X: Data, batch_size: int | None = None, **options: Any) -> Tensor:
        raise NotImplementedError

    def predict_proba(self, X: Data, batch_size: int | None = None, **options: Any) -> Any:
        """Predictive probabilities `[N, C]`: the members' softmax outputs averaged (arguments
        as `member_logits`); a NumPy array for NumPy inputs, a tensor otherwise
        (`peg.source._namespace`). Refused under `torch.jit.trace`, which would bake the
        batching of the traced call into the graph."""
        refuse_tracing(type(self).__name__)
        logits = self.member_logits(X, batch_size, **options)
        if logits.ndim == 3:
            return like_input(logits.softmax(-1).mean(0), X)
        # a model of another kind (`peg.source._kinds`, read from the shape alone): binary
        # scores [M, N] give P(y = 1) [N], dense logits [M, B, C, *S] a softmax over C
        return like_input(read_kind(tuple(logits.shape[1:]), None).proba(logits), X)

    def predict(self, X: Data, batch_size: int | None = None, **options: Any) -> Any:
        """Predicted class per input `[N]` (argmax of `predict_proba`; NumPy for NumPy); for
        binary scores 1 where P(y = 1) > 1/2 (`[N]`), for dense logits the class per position
        `[B, *S]`."""
        probs = self.predict_proba(X, batch_size, **options)
        if probs.ndim == 1 or (probs.ndim == 2 and probs.shape[-1] == 1):
            return (probs > 0.5) * 1
        return probs.argmax(1 if probs.ndim > 2 else -1)


def refuse_tracing(owner: str) -> None:
    """A RuntimeError under `torch.jit.trace`: peg reads its inputs batch by batch in Python,
    so a trace records the traced call's batches (4 rows traced: 512 rows back for 1,000)."""
    if torch.jit.is_tracing():
        raise RuntimeError(
            f"{owner}.predict_proba: cannot be traced (torch.jit.trace would record the batches "
            "of this call and give wrong rows for inputs of another size); export a "
            "calibrator's map with to_module(), an nn.Module from logits [N, C] to "
            "probabilities, and trace or export that (torch.export.export, torch.onnx.export)"
        )
