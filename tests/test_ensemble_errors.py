"""Bad input to Ensemble and evaluate: each case raises the documented error,
before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

import peg
from bad_inputs import (
    _meta_mlp,
    _mlp,
    _nan_x,
    _TupleOut,
    _val,
    _wide,
    raises_test,
)


class _Scaled(nn.Module):
    """Holds a parameter itself: no folded form."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(3))
        self.fc = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "Ensemble",
        "unknown strategy",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(
            torch.zeros(2, 2), strategy="threads"
        ),
        ValueError,
        "strategy",
    ),
    (
        "Ensemble",
        "no inputs",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(torch.zeros(0, 2)),
        ValueError,
        "no inputs",
    ),
    # ---------------------------------------------------------------- Ensemble
    ("Ensemble", "no models", lambda: peg.Ensemble.from_models([]), ValueError, "models"),
    (
        "Ensemble",
        "models of different architectures",
        lambda: peg.Ensemble.from_models([_mlp(), nn.Sequential(nn.Linear(2, 4))]),
        ValueError,
        "models: member 1 is not the architecture of member 0",
    ),
    (
        "Ensemble",
        "a model that is not an nn.Module",
        lambda: peg.Ensemble.from_models([_mlp(), "model"]),
        TypeError,
        "models",
    ),
    (
        "Ensemble",
        "stacked entries with different member counts",
        lambda: peg.Ensemble(
            nn.Linear(2, 3), {"weight": torch.zeros(2, 3, 2), "bias": torch.zeros(3, 3)}
        ),
        ValueError,
        "stacked",
    ),
    (
        "Ensemble",
        "stacked entries missing a parameter",
        lambda: peg.Ensemble(nn.Linear(2, 3), {"weight": torch.zeros(2, 3, 2)}),
        ValueError,
        "missing",
    ),
    (
        "Ensemble",
        "X with the wrong number of features (loop)",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(torch.randn(10, 5)),
        ValueError,
        r"X: the model cannot run on inputs of shape \[N, 5\]",
    ),
    (
        "Ensemble",
        "X with the wrong number of features (vmap)",
        lambda: peg.Ensemble.from_models([_mlp(), _mlp()]).member_logits(
            torch.randn(10, 5), strategy="vmap"
        ),
        ValueError,
        r"X: the model cannot run on inputs of shape \[N, 5\]",
    ),
    (
        "Ensemble",
        "X with the wrong number of features (folded)",
        lambda: peg.Ensemble.from_models([_mlp(), _mlp()]).member_logits(
            torch.randn(10, 5), strategy="folded"
        ),
        ValueError,
        r"X: the model cannot run on inputs of shape \[N, 5\]",
    ),
    (
        "Ensemble",
        "strategy='folded' on a model with a layer folding does not know",
        lambda: peg.Ensemble.from_models([_Scaled(), _Scaled()]).member_logits(
            torch.randn(4, 2), strategy="folded"
        ),
        ValueError,
        r"strategy='folded': model: a _Scaled holds per-member tensors \(\['scale'\]\)",
    ),
    (
        "Ensemble",
        "unknown autocast precision",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(
            torch.zeros(2, 2), autocast="int8"
        ),
        ValueError,
        "autocast: expected None, 'bf16', 'fp16'",
    ),
    (
        "Ensemble",
        "batch_size < 1",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(torch.zeros(2, 2), batch_size=0),
        ValueError,
        "batch_size",
    ),
    (
        "Ensemble",
        "strategy='chunked' without chunk_size",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(
            torch.zeros(2, 2), strategy="chunked"
        ),
        ValueError,
        "chunk_size",
    ),
    (
        "Ensemble",
        "X of the wrong type",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits("inputs.npy"),
        TypeError,
        "X: expected a Tensor",
    ),
    (
        "Ensemble",
        "member index out of range",
        lambda: peg.Ensemble.from_models([_mlp()]).member_state(3),
        IndexError,
        "member index",
    ),
    (
        "Ensemble",
        "X on another device (meta)",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(torch.zeros(4, 2, device="meta")),
        ValueError,
        "X: on the meta device .* cpu",
    ),
    (
        "Ensemble",
        "members on the meta device",
        lambda: peg.Ensemble.from_models([_meta_mlp()]).member_logits(torch.zeros(4, 2)),
        ValueError,
        "meta device",
    ),
    (
        "Ensemble",
        "forward returns a tuple (vmap)",
        lambda: peg.Ensemble.from_models([_TupleOut(), _TupleOut()]).member_logits(
            torch.zeros(4, 2), strategy="vmap"
        ),
        TypeError,
        r"peg\.with_output\(model, 0\)",
    ),
    # ---------------------------------------------------------------- evaluate
    ("evaluate", "inputs without labels", lambda: peg.evaluate(_mlp(), _val()[0]), ValueError, "X"),
    (
        "evaluate",
        "labels of the wrong length",
        lambda: peg.evaluate(_mlp(), _val()[0], _val()[1][:10]),
        ValueError,
        "expected 200 labels",
    ),
    (
        "evaluate",
        "float targets for a classifier",
        lambda: peg.evaluate(_mlp(), _val()[0], _val()[1].float() + 0.5),
        ValueError,
        r"floating-point targets that are not class indices .*pass class indices in \[0, 3\)",
    ),
    (
        "evaluate",
        "labels out of range",
        lambda: peg.evaluate(_mlp(), *_val(classes=5)),
        ValueError,
        r"labels in \[0, 3\)",
    ),
    (
        "evaluate",
        "an unknown metric key",
        lambda: peg.evaluate(_mlp(), *_val(), metrics=["nll", "aurc%"]),
        ValueError,
        r"metrics: unknown \['aurc%'\]",
    ),
    (
        "evaluate",
        "metrics selected for regression targets",
        lambda: peg.evaluate(nn.Linear(2, 2), _val()[0], _val()[0][:, 0], metrics=["nll"]),
        ValueError,
        "metrics: selects classification metrics",
    ),
    (
        "evaluate",
        "predictor of the wrong type",
        lambda: peg.evaluate("model.pt", *_val()),
        TypeError,
        "predictor",
    ),
    ("evaluate", "NaN in X", lambda: peg.evaluate(_mlp(), *_nan_x()), ValueError, "NaN or inf"),
    ("evaluate", "bins < 1", lambda: peg.evaluate(_mlp(), *_val(), bins=0), ValueError, "bins"),
    (
        "evaluate",
        "X with the wrong number of features",
        lambda: peg.evaluate(_mlp(), *_wide()),
        ValueError,
        "X: the model cannot run",
    ),
    (
        "evaluate",
        "X on another device (meta)",
        lambda: peg.evaluate(_mlp(), _val()[0].to("meta"), _val()[1]),
        ValueError,
        "X: on the meta device .* cpu",
    ),
    (
        "evaluate",
        "labels on another device than the predictions (meta)",
        lambda: peg.evaluate(_mlp(), _val()[0], _val()[1].to("meta")),
        ValueError,
        "y: on the meta device .* pred is on cpu",
    ),
    (
        "evaluate",
        "model on the meta device",
        lambda: peg.evaluate(_meta_mlp(), *_val()),
        ValueError,
        "predictor: weights on the meta device",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
