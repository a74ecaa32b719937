"""Bad input to patch() and packed layers: each case raises the documented error,
before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable

from bad_inputs import (
    _bn_mlp,
    _mlp,
    raises_test,
)
from peg.layers import patch
from peg.models._packed import Packing, as_packing

# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    ("patch()", "k < 1", lambda: patch(_bn_mlp(), k=0), ValueError, "k"),
    ("patch()", "unknown mode", lambda: patch(_bn_mlp(), mode="fancy"), ValueError, "mode"),
    ("patch()", "unknown layers", lambda: patch(_bn_mlp(), layers="conv"), ValueError, "layers"),
    ("patch()", "no BatchNorm to patch", lambda: patch(_mlp()), ValueError, "BatchNorm"),
    ("patch()", "negative noise", lambda: patch(_bn_mlp(), noise=-1), ValueError, "noise"),
    ("patch()", "patched twice", lambda: patch(patch(_bn_mlp())), ValueError, "already patched"),
    ("patch()", "model of the wrong type", lambda: patch("model"), TypeError, "model"),
    ("Packing", "alpha <= 0", lambda: Packing(0, 2), ValueError, "alpha"),
    ("Packing", "num_estimators < 1", lambda: Packing(2, 0), ValueError, "num_estimators"),
    ("Packing", "gamma < 1", lambda: Packing(2, 2, 0), ValueError, "gamma"),
    (
        "Packing",
        "packed= mapping without num_estimators",
        lambda: as_packing({"alpha": 2}),
        ValueError,
        "packed",
    ),
    ("Packing", "packed= a string", lambda: as_packing("2,4"), ValueError, "packed"),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
