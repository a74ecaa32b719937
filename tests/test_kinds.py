"""The kinds of problem (`peg.source._kinds`): each read from its shapes, into canonical rows and
back to the input's shape; ignored labels left out; every refusal names what settles it."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch

from bad_inputs import raises_test
from peg.source._kinds import IGNORE_INDEX, KINDS, TASKS, Kind, read_kind, rows_count


def _g(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def test_the_constants_are_the_calibrators_own():
    from peg.methods.calibration._calibrator import KINDS as CALIBRATOR_KINDS

    assert KINDS == CALIBRATOR_KINDS
    assert TASKS[0] == "auto" and set(TASKS) - {"auto"} < set(KINDS)
    assert IGNORE_INDEX == -100


@pytest.mark.parametrize(
    ("shape", "labels", "expected"),
    [
        ((6,), (6,), ("binary", 2, 1, 1)),
        ((6, 1), (6,), ("binary", 2, 1, 1)),
        ((6, 1), (6, 1), ("binary", 2, 1, 1)),
        ((6, 4), (6,), ("multiclass", 4, 4, 1)),
        ((6, 2), (6,), ("multiclass", 2, 2, 1)),
        ((6, 4), (6, 4), ("multilabel", 2, 4, 1)),
        ((6, 3, 5, 7), (6, 5, 7), ("dense", 3, 3, 1)),
        ((6, 3, 5), (6, 5), ("dense", 3, 3, 1)),
        ((6, 5, 11), (6, 5), ("dense", 11, 11, -1)),  # a language model's [B, T, V]
    ],
)
def test_each_kind_is_read_from_its_shapes(shape, labels, expected):
    kind = read_kind(shape, torch.zeros(labels))
    assert (kind.kind, kind.width, kind.outputs, kind.class_dim) == expected
    assert kind.ignore_index == IGNORE_INDEX
    kind.check(shape)  # its own shape is one it accepts


def test_without_labels_the_shape_decides():
    assert read_kind((5,), None).kind == "binary"
    assert read_kind((5, 3), None).kind == "multiclass"
    assert read_kind((5, 3), None, task="multilabel").kind == "multilabel"
    assert read_kind((5, 3, 4), None).class_dim == 1


def test_task_settles_the_square_layout_and_class_dim_the_dense_one():
    assert read_kind((4, 5, 5), torch.zeros(4, 5), class_dim=-1).class_dim == -1
    assert read_kind((4, 5, 5), torch.zeros(4, 5), class_dim=1).class_dim == 1
    assert read_kind((4, 1), torch.zeros(4, 1), task="multilabel").kind == "multilabel"


def test_binary_rows_are_zero_and_the_score():
    kind = read_kind((7,), torch.zeros(7))
    s = torch.randn(3, 7, generator=_g())
    rows = kind.rows(s)
    assert rows.shape == (3, 7, 2)
    assert torch.equal(rows[..., 0], torch.zeros(3, 7)) and torch.equal(rows[..., 1], s)
    probs = rows.softmax(-1)
    assert torch.allclose(kind.back(probs, (7,)), s.sigmoid(), atol=1e-6)
    assert torch.allclose(kind.native(rows, (7,)), s)
    assert kind.back(probs[0], (7, 1)).shape == (7, 1)  # [N, 1] in, [N, 1] out


def test_multilabel_rows_are_n_major():
    kind = read_kind((5, 3), torch.zeros(5, 3))
    s = torch.randn(2, 5, 3, generator=_g(1))
    rows = kind.rows(s)
    assert rows.shape == (2, 15, 2) and rows_count(kind, (5, 3)) == 15
    for k in range(3):  # label k's rows are rows[:, k::K]
        assert torch.equal(rows[:, k::3, 1], s[:, :, k])
    y = torch.randint(0, 2, (5, 3), generator=_g(2))
    assert torch.equal(kind.row_labels(y)[1::3], y[:, 1])
    assert torch.allclose(kind.native(rows, (5, 3)), s)
    assert torch.allclose(kind.proba(s), s.sigmoid().mean(0))
    assert torch.equal(kind.decide(s.sigmoid()[0]), (s[0] > 0).long())


@pytest.mark.parametrize("class_dim", [1, -1])
def test_dense_rows_follow_the_labels_order_and_go_back(class_dim):
    b, c, h, w = 2, 4, 3, 5
    shape = (b, c, h, w) if class_dim == 1 else (b, h, w, c)
    kind = read_kind(shape, torch.zeros(b, h, w))
    logits = torch.randn(3, *shape, generator=_g(3))
    rows = kind.rows(logits)
    assert rows.shape == (3, b * h * w, c) and rows_count(kind, shape) == b * h * w
    per_class = logits.movedim(2, -1) if class_dim == 1 else logits
    assert torch.equal(rows[:, 1 * h * w + 2 * w + 4], per_class[:, 1, 2, 4])  # position (1, 2, 4)
    y = torch.randint(0, c, (b, h, w), generator=_g(4))
    assert kind.row_labels(y)[1 * h * w + 2 * w + 4] == y[1, 2, 4]
    assert torch.equal(kind.native(rows, shape), logits)
    probs = kind.back(rows.softmax(-1), shape)
    dim = 2 if class_dim == 1 else -1
    assert torch.allclose(probs, logits.softmax(dim))
    assert torch.allclose(kind.proba(logits), logits.softmax(dim).mean(0))
    assert torch.equal(
        kind.decide(kind.proba(logits)), kind.proba(logits).argmax(1 if class_dim == 1 else -1)
    )


def test_ignored_labels_are_left_out_of_the_rows_a_fit_reads():
    kind = read_kind((2, 3, 4), torch.zeros(2, 4), ignore_index=255)
    y = torch.tensor([[0, 255, 2, 1], [255, 255, 1, 0]])
    rows = kind.rows(torch.randn(1, 2, 3, 4, generator=_g(5)))
    flat = kind.row_labels(y)
    kept_rows, kept_y = kind.kept(rows, flat)
    assert kept_y.tolist() == [0, 2, 1, 1, 0]
    assert torch.equal(kept_rows, rows[:, flat != 255])
    same_rows, same_y = kind.kept(rows[:, :1], flat[:1])  # nothing ignored: as they are
    assert same_rows.data_ptr() == rows.data_ptr() and same_y.tolist() == [0]


def test_binary_labels_may_be_floats_bools_and_numpy():
    kind = read_kind((4,), None)
    assert kind.row_labels(np.array([0.0, 1.0, 1.0, 0.0])).tolist() == [0, 1, 1, 0]
    assert kind.row_labels(torch.tensor([True, False, True, True])).tolist() == [1, 0, 1, 1]
    assert kind.row_labels(torch.tensor([[1], [IGNORE_INDEX]])).tolist() == [1, IGNORE_INDEX]


def test_the_kind_round_trips_as_json():
    import json

    kind = read_kind((3, 5, 7), torch.zeros(3, 5), ignore_index=255)
    back = Kind.from_entry(json.loads(json.dumps(kind.entry())))
    assert back == kind and back.class_dim == -1


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    ("kinds", "unknown task", lambda: read_kind((4, 3), None, task="regression"), ValueError,
     r"task: expected one of \['auto', 'multiclass', 'binary', 'multilabel'\], got 'regression'"),
    ("kinds", "one score per row as multiclass",
     lambda: read_kind((4, 1), torch.zeros(4), task="multiclass"), ValueError,
     r"task: 'multiclass' needs logits \[N, C\] with C >= 2, got one score per row \(4, 1\)"),
    ("kinds", "binary scores with labels of another shape",
     lambda: read_kind((4,), torch.zeros(4, 2)), ValueError,
     r"val: binary scores \(4,\) need labels \[N\] or \[N, 1\] \(0 or 1\), got shape \(4, 2\)"),
    ("kinds", "two columns as binary", lambda: read_kind((4, 2), torch.zeros(4), task="binary"),
     ValueError, r"task: 'binary' needs one score per row \[N\] or \[N, 1\], got logits \(4, 2\)"),
    ("kinds", "[N, K] labels as multiclass",
     lambda: read_kind((4, 3), torch.zeros(4, 3), task="multiclass"), ValueError,
     r"task: 'multiclass' needs labels \[N\] \(class indices\).*labels.argmax\(1\)"),
    ("kinds", "[N] labels as multilabel",
     lambda: read_kind((4, 3), torch.zeros(4), task="multilabel"), ValueError,
     r"task: 'multilabel' needs multi-hot labels \[N, K\] like the logits \(4, 3\)"),
    ("kinds", "[N, C] logits with labels of a third shape",
     lambda: read_kind((4, 3), torch.zeros(4, 2)), ValueError,
     r"val: logits \(4, 3\) need labels \[N\] .* or \[N, K\] .*got shape \(4, 2\)"),
    ("kinds", "labels of another N", lambda: read_kind((4, 3), torch.zeros(5)), ValueError,
     r"val: 4 rows of logits \(4, 3\) but labels of shape \(5,\)"),
    ("kinds", "dense logits as binary",
     lambda: read_kind((2, 3, 4), torch.zeros(2, 4), task="binary"), ValueError,
     r"task: 'binary' takes scores \[N\] or \[N, K\], got logits \(2, 3, 4\)"),
    ("kinds", "dense labels of no layout", lambda: read_kind((2, 3, 4), torch.zeros(2, 5)),
     ValueError, r"val: logits \(2, 3, 4\) need labels \[B, \*S\] .*got labels of shape \(2, 5\)"),
    ("kinds", "dense layout ambiguous", lambda: read_kind((2, 4, 4), torch.zeros(2, 4)),
     ValueError, r"class_dim: logits \(2, 4, 4\) with labels \(2, 4\) from val read both"),
    ("kinds", "dense with one class", lambda: read_kind((2, 1, 4), torch.zeros(2, 4)),
     ValueError, r"val: dense logits \(2, 1, 4\) have C = 1 class"),
    ("kinds", "ignore_index a class", lambda: read_kind((4, 3), torch.zeros(4), ignore_index=1),
     ValueError, r"ignore_index: 1 is a class of these labels \(in \[0, 3\)\)"),
    ("kinds", "binary labels not 0/1",
     lambda: read_kind((3,), None).row_labels(torch.tensor([0, 1, 2]), "val labels"), ValueError,
     r"val labels: expected binary labels, 0 or 1 \(the negative or the positive class\), or "
     r"ignore_index -100; got 2 \(1 of 3 entries\)"),
    ("kinds", "multi-hot labels not 0/1",
     lambda: read_kind((2, 2), torch.zeros(2, 2)).row_labels(torch.tensor([[0, 1], [3, 1]])),
     ValueError, r"labels: expected multi-hot labels, 0 or 1"),
    ("kinds", "dense labels out of range",
     lambda: read_kind((2, 3, 4), torch.zeros(2, 4)).row_labels(torch.full((2, 4), 7)),
     ValueError, r"labels: expected class labels, class indices in \[0, 3\) \(C = 3\)"),
    ("kinds", "fractional labels",
     lambda: read_kind((3,), None).row_labels(torch.tensor([0.0, 0.5, 1.0])), ValueError,
     r"labels: expected integer labels, got non-integer values \(e.g. 0.5\)"),
    ("kinds", "logits of another shape than the kind's",
     lambda: read_kind((4, 3), torch.zeros(4)).rows(torch.zeros(1, 4, 5)), ValueError,
     r"logits: this was fitted on multiclass logits \[N, 3\] \(C = 3\), got logits of shape "
     r"\(4, 5\)"),
    ("kinds", "unknown class_dim", lambda: read_kind((2, 3, 4), None, class_dim=2), ValueError,
     r"class_dim: expected None, 1 or -1, got 2"),
]  # fmt: skip

test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
