"""Bad input to Recipe and train: each case raises the documented error,
before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from bad_inputs import (
    R1,
    _bad_batch_3,
    _frozen,
    _meta_mlp,
    _mlp,
    _nan_batch_3,
    _nan_x,
    _Stream,
    _TupleOut,
    _val,
    _wide,
    raises_test,
)
from peg.train import Recipe, train

# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "Recipe",
        "swa_start past the last epoch",
        lambda: Recipe(epochs=5, swa_start=9),
        ValueError,
        "past the last epoch",
    ),
    ("Recipe", "lr not finite", lambda: Recipe(lr=float("nan")), ValueError, "lr"),
    (
        "Recipe",
        "unknown field",
        lambda: Recipe().replace(learning_rate=0.1),
        TypeError,
        "unknown field",
    ),
    # ---------------------------------------------------------------- train
    (
        "train",
        "X with the wrong number of features",
        lambda: train(_mlp(), _wide(), R1),
        ValueError,
        r"data: the model cannot run on inputs of shape \[N, 5\]",
    ),
    (
        "train",
        "labels out of range",
        lambda: train(_mlp(), (_val()[0], _val()[1] + 3), R1),
        ValueError,
        r"data: labels must lie in \[0, 3\)",
    ),
    (
        "train",
        "float labels with cross-entropy",
        lambda: train(_mlp(), (_val()[0], _val()[1].float()), R1),
        ValueError,
        r"y\.long\(\)",
    ),
    ("train", "NaN in X", lambda: train(_mlp(), _nan_x(), R1), ValueError, "NaN or inf"),
    ("train", "inputs without labels", lambda: train(_mlp(), _val()[0], R1), ValueError, "labels"),
    (
        "train",
        "model without trainable parameters",
        lambda: train(_frozen(), _val(), R1),
        ValueError,
        "no trainable parameters",
    ),
    (
        "train",
        "recipe of the wrong type",
        lambda: train(_mlp(), _val(), {"epochs": 1}),
        TypeError,
        "recipe",
    ),
    (
        "train",
        "unknown recipe field as keyword",
        lambda: train(_mlp(), _val(), R1, learning_rate=0.1),
        TypeError,
        "unknown field",
    ),
    ("train", "loss not callable", lambda: train(_mlp(), _val(), R1, loss="ce"), TypeError, "loss"),
    (
        "train",
        "a bad label in one batch of a Dataset (shuffled)",
        lambda: train(_mlp(), _bad_batch_3(), R1.replace(batch_size=20)),
        ValueError,
        "batch",
    ),
    (
        "train",
        "NaN in one batch of a Dataset (shuffled)",
        lambda: train(_mlp(), _nan_batch_3(), R1.replace(batch_size=20)),
        ValueError,
        "NaN",
    ),
    (
        "train",
        "cosine schedule on a stream without length",
        lambda: train(_mlp(), _Stream(), R1.replace(schedule="cosine")),
        ValueError,
        "cosine",
    ),
    (
        "train",
        "forward returns a tuple",
        lambda: train(_TupleOut(), _val(), R1),
        TypeError,
        r"peg\.with_output\(model, 0\)",
    ),
    (
        "train",
        "data on another device (meta)",
        lambda: train(_mlp(), (_val()[0].to("meta"), _val()[1]), R1),
        ValueError,
        "data: on the meta device .* cpu",
    ),
    (
        "train",
        "model on the meta device",
        lambda: train(_meta_mlp(), _val(), R1),
        ValueError,
        "model: weights on the meta device .* data is on cpu",
    ),
    # ---------------------------------------------------------------- Recipe
    ("Recipe", "epochs < 1", lambda: Recipe(epochs=0), ValueError, "epochs"),
    ("Recipe", "batch_size < 1", lambda: Recipe(batch_size=0), ValueError, "batch_size"),
    ("Recipe", "unknown optimizer", lambda: Recipe(optimizer="rmsprop"), ValueError, "optimizer"),
    ("Recipe", "unknown schedule", lambda: Recipe(schedule="step"), ValueError, "schedule"),
    (
        "Recipe",
        "schedule='swa' without swa_start",
        lambda: Recipe(schedule="swa"),
        ValueError,
        "swa_start",
    ),
    ("Recipe", "negative momentum", lambda: Recipe(momentum=-0.1), ValueError, "momentum"),
    ("Recipe", "augment not a bool", lambda: Recipe(augment="yes"), ValueError, "augment"),
    ("Recipe", "swa_lr <= 0", lambda: Recipe(swa_lr=0.0), ValueError, "swa_lr"),
]

# the same, for calls that take a temporary folder
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    (
        "train",
        "checkpoint is a folder",
        lambda tmp: train(_mlp(), _val(), R1, checkpoint=tmp),
        ValueError,
        "checkpoint: .* is a folder",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)
