"""A causal language model as peg reads a predictor: next-token logits aligned with their labels.

A causal LM's logits at position t predict the token at t + 1: its loss compares
`logits[:, :-1]` with `labels[:, 1:]` (HuggingFace shifts inside the model; the labels are the
input ids, -100 where a position is not scored: padding, a prompt). Read as they come, position
t's logits would be scored against token t, every number silently wrong. `NextToken(model)`
makes the shift once: its `member_logits` are the aligned next-token logits `[1, B, V, T - 1]`
(dense outputs, the class dimension after the batch's), and a labelled source it reads records
the shifted labels `[B, T - 1]`, so `peg.evaluate(NextToken(model), batches)` scores what the
model's loss scores. `batches(data)` gives the aligned `(logits [B, T - 1, V], labels [B, T -
1])` pairs pass after pass: what `fit_temperature_streamed(..., class_dim=-1)` reads, without
ever holding `[N, V]`.

Labels: a batch's "labels" where it has them; otherwise its `input_ids` (HuggingFace's `labels =
input_ids`), with the positions its `attention_mask` masks set to -100.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import torch
from torch import Tensor, nn

from peg.methods.calibration._streamed import IGNORE_INDEX, fit_temperature_streamed
from peg.output import logits_of, model_output
from peg.source import Source, Tapped
from peg.source._devices import move, weights_device
from peg.source.batches import BatchFn, call_model

__all__ = ["NextToken"]


def shifted_labels(inputs: Any, labels: Tensor | None, ignore_index: int) -> Tensor:
    """The labels `[B, T - 1]` the logits of positions 0..T-2 are scored against: `labels[:,
    1:]`, or, without labels, the inputs' `input_ids[:, 1:]` with the masked positions set to
    `ignore_index`."""
    if labels is None:
        ids = inputs.get("input_ids") if isinstance(inputs, Mapping) else inputs
        if not isinstance(ids, Tensor) or ids.ndim != 2:
            raise ValueError(
                "NextToken: a batch without labels needs input_ids [B, T] (a tensor, or a "
                "mapping's 'input_ids') to score the next tokens against"
            )
        labels = ids
        mask = inputs.get("attention_mask") if isinstance(inputs, Mapping) else None
        if isinstance(mask, Tensor):
            labels = labels.masked_fill(mask.to(labels.device) == 0, ignore_index)
    if labels.ndim != 2 or labels.is_floating_point():
        raise ValueError(
            f"NextToken: expected integer labels [B, T] (token ids, {ignore_index} where not "
            f"scored), got {labels.dtype} of shape {tuple(labels.shape)}"
        )
    return labels[:, 1:]


class NextToken:
    """A causal LM (HuggingFace's `*ForCausalLM`, or any model whose output's logits are `[B,
    T, V]`) whose outputs are its next-token logits, aligned with their labels.

    Args:
        model: the causal LM, called as `model(**batch)` on mapping batches (`input_ids`,
            `attention_mask`, ...; "labels" taken out, so the model computes no loss) or
            `model(input_ids)`.
        ignore_index: the label of the positions not scored (-100, as transformers' losses).

    `member_logits(X) -> [1, B, V, T - 1]`: the logits of positions 0..T-2, the class
    dimension moved before the positions (dense outputs, `[M, B, C, *S]`); read from a labelled
    source (`peg.evaluate`, a calibrator's `fit`), the labels recorded are `labels[:, 1:]`
    `[B, T - 1]`. `pairs(data)` / `batches(data)`: `(logits [B, T - 1, V], labels [B, T -
    1])` per batch, class dimension last, for `fit_temperature_streamed(class_dim=-1)`;
    `fit_temperature(data)` runs it.

    Examples:
        >>> lm = NextToken(gpt2)                                   # doctest: +SKIP
        >>> peg.evaluate(lm, loader)["nll"]   # = the model's own mean loss  # doctest: +SKIP
        >>> lm.fit_temperature(loader)        # T, streamed: [N, V] never held  # doctest: +SKIP
    """

    def __init__(self, model: nn.Module, *, ignore_index: int = IGNORE_INDEX) -> None:
        if not isinstance(model, nn.Module):
            raise TypeError(f"model: expected a causal LM (an nn.Module), got {model!r}")
        self.model = model
        self.ignore_index = int(ignore_index)

    @property
    def device(self) -> torch.device:
        return weights_device(self.model)

    def aligned(self, inputs: Any, labels: Tensor | None = None) -> tuple[Tensor, Tensor]:
        """One batch's next-token logits `[B, T - 1, V]` and labels `[B, T - 1]` (on the
        logits' device), the model in eval mode, without autograd."""
        was_training = self.model.training
        self.model.eval()
        try:
            with torch.no_grad():
                out = logits_of(call_model(self.model, move(inputs, self.device, "X")))
        finally:
            self.model.train(was_training)
        if not isinstance(out, Tensor) or out.ndim != 3:
            model_output(out, "NextToken")  # the one message for a forward without logits
            raise ValueError(
                f"NextToken: expected the model's logits [B, T, V], got {tuple(out.shape)}"
            )
        y = shifted_labels(inputs, labels, self.ignore_index).to(out.device)
        if tuple(y.shape) != (out.shape[0], out.shape[1] - 1):
            raise ValueError(
                f"NextToken: expected labels [B, T] = {tuple(out.shape[:2])} for logits of "
                f"shape {tuple(out.shape)}, got {(y.shape[0], y.shape[1] + 1)}"
            )
        return out[:, :-1], y

    def pairs(
        self, data: Any, batch_size: int = 8, batch_fn: BatchFn | None = None
    ) -> Iterator[tuple[Tensor, Tensor]]:
        """`aligned` on every batch of `data` (a loader, a Dataset, a mapping of tensors,
        `input_ids` `[N, T]`; `peg.source.batches`' conventions, or `batch_fn`)."""
        for inputs, y in Source.of(data, batch_fn).batches(batch_size):
            yield self.aligned(inputs, y)

    def batches(
        self, data: Any, batch_size: int = 8, batch_fn: BatchFn | None = None
    ) -> Callable[[], Iterable[tuple[Tensor, Tensor]]]:
        """`pairs(data)` as a function called once per pass (`fit_temperature_streamed`)."""
        return lambda: self.pairs(data, batch_size, batch_fn)

    def fit_temperature(
        self, data: Any, batch_size: int = 8, batch_fn: BatchFn | None = None, **options: Any
    ) -> float:
        """T minimising the next-token NLL over `data`, streamed
        (`fit_temperature_streamed(self.batches(data), class_dim=-1, **options)`)."""
        options.setdefault("ignore_index", self.ignore_index)
        return fit_temperature_streamed(
            self.batches(data, batch_size, batch_fn), class_dim=-1, **options
        )

    def iter_member_logits(
        self, X: Any, batch_size: int = 8, batch_fn: BatchFn | None = None, **_: Any
    ) -> Iterator[Tensor]:
        """`[1, B, V, T - 1]` per batch; a `Tapped` source records each batch's shifted labels."""
        tapped = X if isinstance(X, Tapped) else None
        source = tapped.untapped() if tapped is not None else Source.of(X, batch_fn)
        for j, (inputs, y) in enumerate(source.batches(batch_size)):
            logits, labels = self.aligned(inputs, y)
            if tapped is not None:
                tapped.record(labels, len(labels), j)
            yield logits.movedim(-1, 1).unsqueeze(0)

    def member_logits(
        self, X: Any, batch_size: int = 8, batch_fn: BatchFn | None = None, **_: Any
    ) -> Tensor:
        """`iter_member_logits` joined: `[1, N, V, T - 1]` (every batch of one length T)."""
        return torch.cat(list(self.iter_member_logits(X, batch_size, batch_fn)), 1)

    def __repr__(self) -> str:
        return f"NextToken({type(self.model).__name__})"
