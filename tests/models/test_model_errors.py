"""Bad input to model building: each case raises the documented error,
before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable

from bad_inputs import raises_test
from peg import models

# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    (
        "models",
        "unknown architecture",
        lambda: models.build("transformer"),
        ValueError,
        "unknown model",
    ),
    (
        "models",
        "unknown constructor argument",
        lambda: models.build("mlp", width=3),
        TypeError,
        "width",
    ),
    (
        "models",
        "an argument the name fixes",
        lambda: models.build("resnet20", depth=32),
        ValueError,
        "fixed to 20",
    ),
    (
        "models",
        "num_classes < 1",
        lambda: models.build("mlp", in_features=2, num_classes=0),
        ValueError,
        "num_classes",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
