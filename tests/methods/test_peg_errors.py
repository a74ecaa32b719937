"""Bad input to PEG and PEP (arguments, inputs, models): each case raises the documented error,
before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader

import peg
from bad_inputs import (
    _bad_batch_3,
    _bn_mlp,
    _fitted_peg,
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
from peg.archive import ArchiveError
from peg.output import OutputFnError


class _DictOut(_TupleOut):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"logits": self.lin(x), "hidden_states": x}


class _ScoresOut(_TupleOut):
    """A mapping without "logits": the output_fn hook is needed."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"scores": self.lin(x), "hidden_states": x}


def _recipe_other_loader() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = _fitted_peg().save(str(Path(tmp) / "r"))
        X, y = _val()
        other = DataLoader(torch.utils.data.TensorDataset(X + 1, y), batch_size=32)
        peg.load(path, _mlp(), val=other)


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    ("PEG", "n_members < 1", lambda: peg.PEG(n_members=0), ValueError, "n_members"),
    ("PEG", "eta <= 0", lambda: peg.PEG(eta=-1.0), ValueError, "eta"),
    (
        "PEG",
        "grad_batch_size < 1",
        lambda: peg.PEG(grad_batch_size=0),
        ValueError,
        "grad_batch_size",
    ),
    ("PEG", "unknown variant", lambda: peg.PEG(variant="fancy"), ValueError, "variant"),
    ("PEG", "unknown bn mode", lambda: peg.PEG(bn="frozen"), ValueError, "bn"),
    ("PEG", "seed not an integer", lambda: peg.PEG(seed="a"), ValueError, "seed"),
    ("PEG", "negative seed", lambda: peg.PEG(seed=-1), ValueError, "seed"),
    (
        "ScaleSearch",
        "race < 0",
        lambda: peg.ScaleSearch(race=-1.0),
        ValueError,
        r"race: expected a finite number >= 0",
    ),
    ("ScaleSearch", "race not a number", lambda: peg.ScaleSearch(race="z"), ValueError, "race"),
    ("ScaleSearch", "holdout of 1", lambda: peg.ScaleSearch(holdout=1.0), ValueError, "holdout"),
    ("ScaleSearch", "a grid with 0", lambda: peg.ScaleSearch(grid=[0, 1]), ValueError, "grid"),
    (
        "ScaleSearch",
        "unknown unsure rule",
        lambda: peg.ScaleSearch(unsure="more"),
        ValueError,
        r"unsure: expected one of \['points', 'stop'\]",
    ),
    ("PEG", "unknown search", lambda: peg.PEG(search="exhaustive"), ValueError, "search"),
    (
        "PEP",
        "a search option given to the method",
        lambda: peg.PEP(criterion="ece"),
        TypeError,
        r"criterion: now an option of the scale search; pass search=peg.ScaleSearch",
    ),
    (
        "PEG",
        "unknown direction",
        lambda: peg.PEG(direction="up"),
        ValueError,
        r"direction: expected one of \['descent', 'ascent'\]",
    ),
    (
        "PEG",
        "ascent with the unbiased variant",
        lambda: peg.PEG(variant="unbiased", direction="ascent"),
        ValueError,
        r"direction: 'ascent' applies to variant='vanilla' only",
    ),
    (
        "PEG",
        "unknown search",
        lambda: peg.PEG(search="grid"),
        ValueError,
        r"search: expected one of \['surrogate', 'golden'\]",
    ),
    (
        "PEG",
        "unknown on_nonfinite",
        lambda: peg.PEG(on_nonfinite="skip"),
        ValueError,
        "on_nonfinite",
    ),
    (
        "PEG",
        "labels out of range",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0], _val()[1] + 3)
        ),
        ValueError,
        r"labels must lie in \[0, 3\)",
    ),
    (
        "PEG",
        "validation set smaller than K",
        lambda: peg.PEG(n_members=2, grad_batch_size=128, eta=0.1).fit(_mlp(), _val(50)),
        ValueError,
        "the mini-batch size",
    ),
    (
        "PEG",
        "empty validation set",
        lambda: peg.PEG(n_members=2, eta=0.1).fit(
            _mlp(), (torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
        ),
        ValueError,
        "val",
    ),
    (
        "PEG",
        "model without trainable parameters",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_frozen(), _val()),
        ValueError,
        "no trainable parameters",
    ),
    (
        "PEG",
        "forward returns a tuple",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_TupleOut().eval(), _val()),
        TypeError,
        "must return a Tensor",
    ),
    (
        "PEG",
        "regression model without a Gaussian head",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0], torch.randn(200))
        ),
        ValueError,
        "Gaussian head",
    ),
    ("PEP", "sigma <= 0", lambda: peg.PEP(sigma=0.0), ValueError, "sigma"),
    # ---------------------------------------------------------------- PEG / PEP: data
    (
        "PEG",
        "X with the wrong number of features",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_mlp(), _wide()),
        ValueError,
        r"val: the model cannot run on inputs of shape \[N, 5\]",
    ),
    (
        "PEG",
        "1-D X",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (torch.randn(200), _val()[1])
        ),
        ValueError,
        r"X\.unsqueeze\(1\)",
    ),
    (
        "PEG",
        "integer X for a float model",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (torch.randint(0, 5, (200, 2)), _val()[1])
        ),
        ValueError,
        r"X\.float\(\)",
    ),
    (
        "PEG",
        "NaN in X",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_mlp(), _nan_x()),
        ValueError,
        r"val: the inputs contain NaN or inf \(1 of 200",
    ),
    (
        "PEG",
        "float class labels that are not whole numbers",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0], _val()[1].float() + 0.5)
        ),
        ValueError,
        r"pass class indices in \[0, 3\)",
    ),
    (
        "PEG",
        "one-hot labels",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0], nn.functional.one_hot(_val()[1], 3))
        ),
        ValueError,
        r"vector \[N\]",
    ),
    (
        "PEG",
        "negative labels",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0], _val()[1] - 1)
        ),
        ValueError,
        "min -1",
    ),
    (
        "PEG",
        "X and y of different lengths",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0], _val()[1][:-1])
        ),
        ValueError,
        "200 inputs but 199 labels",
    ),
    (
        "PEG",
        "inputs without labels",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_mlp(), _val()[0]),
        ValueError,
        "labels are needed",
    ),
    (
        "PEG",
        "val of the wrong type",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_mlp(), {1, 2, 3}),
        TypeError,
        "val: expected a tuple",
    ),
    (
        "PEG",
        "model not an nn.Module",
        lambda: peg.PEG(n_members=2, eta=0.1).fit("resnet18", _val()),
        TypeError,
        "model: expected an nn.Module",
    ),
    (
        "PEG",
        "base models with different numbers of classes",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            [_mlp(), nn.Sequential(nn.Linear(2, 4)).eval()], _val()
        ),
        ValueError,
        "disagree on the number of classes",
    ),
    (
        "PEG",
        "NaN regression targets",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            nn.Linear(2, 2).eval(), (_val()[0], torch.full((200,), float("nan")))
        ),
        ValueError,
        "labels contain NaN or inf",
    ),
    (
        "PEG",
        "classification criterion for regression",
        lambda: peg.PEG(
            n_members=2, grad_batch_size=8, eta=0.1, search=peg.ScaleSearch(criterion="ece")
        ).fit(nn.Linear(2, 2).eval(), (_val()[0], torch.randn(200))),
        ValueError,
        "criterion: 'ece' is for classification",
    ),
    (
        "PEG",
        "bn='refresh' without bn_data",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1, bn="refresh").fit(
            _bn_mlp(), _val()
        ),
        ValueError,
        "bn_data",
    ),
    ("PEG", "unknown eta string", lambda: peg.PEG(eta="grid"), ValueError, "eta"),
    (
        "ScaleSearch",
        "unknown criterion",
        lambda: peg.ScaleSearch(criterion="auc"),
        ValueError,
        "criterion",
    ),
    ("PEG", "unknown params filter", lambda: peg.PEG(params="bias"), ValueError, "params"),
    ("PEG", "n_members not an integer", lambda: peg.PEG(n_members=2.5), ValueError, "n_members"),
    ("PEG", "batch_size < 1", lambda: peg.PEG(batch_size=0), ValueError, "batch_size"),
    (
        "ScaleSearch",
        "max_points < 1",
        lambda: peg.ScaleSearch(max_points=0),
        ValueError,
        "max_points",
    ),
    ("PEG", "loss not callable", lambda: peg.PEG(loss="mse"), ValueError, "loss"),
    ("PEG", "unknown reduction", lambda: peg.PEG(reduction="max"), ValueError, "reduction"),
    # ---------------------------------------------------------------- devices and output_fn
    (
        "PEG",
        "data on another device (meta, no values)",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0].to("meta"), _val()[1])
        ),
        ValueError,
        "val: on the meta device .* and the model is on cpu",
    ),
    (
        "PEG",
        "labels on another device (meta)",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0], _val()[1].to("meta"))
        ),
        ValueError,
        "val labels: on the meta device .* cpu",
    ),
    (
        "PEG",
        "model on another device (meta, no weights)",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_meta_mlp(), _val()),
        ValueError,
        "model: weights on the meta device .* val is on cpu",
    ),
    (
        "PEG",
        "forward returns a dict without 'logits'",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_ScoresOut().eval(), _val()),
        TypeError,
        r"peg\.with_output\(model, 'scores'\)",
    ),
    (
        "PEG",
        "output_fn naming a missing key",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            peg.with_output(_DictOut().eval(), "logit"), _val()
        ),
        OutputFnError,
        "no key 'logit'",
    ),
    (
        "PEG",
        "output_fn index out of range",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            peg.with_output(_TupleOut().eval(), 2), _val()
        ),
        OutputFnError,
        "out of range",
    ),
    (
        "batches",
        "mapping batch without 'labels' or 'label' where labels are needed",
        lambda: peg.evaluate(_mlp(), DataLoader([{"x": torch.zeros(4, 2)}], batch_size=None)),
        ValueError,
        r"X: batch 0 is a mapping without 'labels' or 'label' \(keys: \['x'\]\); pass batch_fn",
    ),
    (
        "batches",
        "inputs disagreeing on the number of rows",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(
            {"x": torch.zeros(4, 2), "mask": torch.zeros(3)}
        ),
        ValueError,
        r"X: the inputs disagree on the number of rows \(\['x'\]: 4, \['mask'\]: 3\)",
    ),
    (
        "batches",
        "batch_fn not returning a pair (inputs, y)",
        lambda: peg.evaluate(
            _mlp(), DataLoader([_val()], batch_size=None), batch_fn=lambda batch: batch[0]
        ),
        TypeError,
        r"batch_fn: must return a pair \(inputs, y\), got Tensor",
    ),
    (
        "batches",
        "batch_fn not callable",
        lambda: peg.TemperatureScaling(batch_fn="labels"),
        TypeError,
        r"batch_fn: expected None or a callable",
    ),
    (
        "batches",
        "batch neither a tensor, a tuple nor a mapping",
        lambda: peg.Ensemble.from_models([_mlp()]).member_logits(
            DataLoader(["a", "b"], batch_size=None)
        ),
        TypeError,
        r"X: batch 0: expected inputs that are a Tensor, a numpy array or a mapping",
    ),
    (
        "PEG",
        "an IterableDataset as validation data (mini-batches need indexing)",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_mlp(), _Stream()),
        TypeError,
        "val: PEG draws its mini-batches by index, and an IterableDataset cannot be indexed",
    ),
    (
        "PEG",
        "labels out of range in a later batch of a loader",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), DataLoader(_bad_batch_3(), batch_size=20)
        ),
        ValueError,
        r"val: batch 3 \(points 60–79\): labels must lie in \[0, 3\)",
    ),
    (
        "PEG",
        "NaN inputs in a later batch of a loader",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), DataLoader(_nan_batch_3(), batch_size=20)
        ),
        ValueError,
        r"val: batch 3 \(points 60–79\): the inputs contain NaN or inf",
    ),
    (
        "PEG",
        "a recipe loaded with other data (a DataLoader)",
        lambda: _recipe_other_loader(),
        ArchiveError,
        "val: not the validation data this ensemble was built from",
    ),
    (
        "with_output",
        "output_fn neither a key, an index nor a callable",
        lambda: peg.with_output(_DictOut(), 1.5),
        TypeError,
        "output_fn",
    ),
    (
        "with_output",
        "output_fn giving no Tensor",
        lambda: peg.with_output(_TupleOut(), lambda out: out)(torch.zeros(2, 2)),
        OutputFnError,
        "must give a Tensor",
    ),
    (
        "with_output",
        "model not an nn.Module",
        lambda: peg.with_output("model", 0),
        TypeError,
        "model",
    ),
    # ---------------------------------------------------------------- PEP
    ("PEP", "a negative sigma in the list", lambda: peg.PEP(sigma=[0.1, -1]), ValueError, "sigma"),
    ("PEP", "n_members < 1", lambda: peg.PEP(n_members=0), ValueError, "n_members"),
    ("PEP", "seed not an integer", lambda: peg.PEP(seed=1.5), ValueError, "seed"),
    (
        "PEP",
        "labels out of range",
        lambda: peg.PEP(n_members=2, sigma=0.1).fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"labels must lie in \[0, 3\)",
    ),
    (
        "PEP",
        "X with the wrong number of features",
        lambda: peg.PEP(n_members=2, sigma=0.1).fit(_mlp(), _wide()),
        ValueError,
        "cannot run on inputs",
    ),
]

# the same, for calls that take a temporary folder
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    (
        "PEG",
        "save(materialize=) not a bool",
        lambda tmp: _fitted_peg().save(str(tmp / "x.peg"), materialize="no"),
        TypeError,
        "materialize",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)
