"""Bad input to the other methods and the subspace samplers: each case raises the documented
error, before any work. The cases are rendered into docs/errors.md by tests/errors_table.py.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import peg
from bad_inputs import (
    R1,
    _bn_mlp,
    _meta_mlp,
    _mlp,
    _val,
    _wide,
    _write,
    raises_test,
)
from peg import models
from peg.subspace import DropoutSubspace, RandomSubspace
from peg.train import Recipe


def _packed() -> nn.Module:
    torch.manual_seed(0)
    return models.build("mlp", in_features=2, num_classes=3, packed=(2, 2, 1)).eval()


RS = Recipe(epochs=3, batch_size=64, schedule="swa", swa_start=1, swa_lr=0.01)


class _NoLaplace:
    """A meta-path finder for which laplace-torch is not installed."""

    def find_spec(self, name: str, *_: object) -> None:
        if name == "laplace" or name.startswith("laplace."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


def _without_laplace() -> object:
    """`peg.Laplace().fit` where `import laplace` fails as on a machine without laplace-torch."""
    saved = {k: v for k, v in sys.modules.items() if k == "laplace" or k.startswith("laplace.")}
    for name in saved:
        del sys.modules[name]
    finder = _NoLaplace()
    sys.meta_path.insert(0, finder)
    try:
        return peg.Laplace().fit(_mlp(), _val())
    finally:
        sys.meta_path.remove(finder)
        sys.modules.update(saved)


# (area, bad input, call, error type, regex the message must match)
ERROR_CASES: list[tuple[str, str, Callable[[], object], type[BaseException], str]] = [
    ("SWAG", "scale <= 0", lambda: peg.SWAG(scale=0.0), ValueError, "scale"),
    (
        "SWAG",
        "max_num_models < 2",
        lambda: peg.SWAG(max_num_models=1),
        ValueError,
        "max_num_models",
    ),
    (
        "SWA",
        "swa_start leaves no epoch",
        lambda: peg.SWA(recipe=Recipe(epochs=5, schedule="swa", swa_start=5, swa_lr=0.01)),
        ValueError,
        "swa_start",
    ),
    (
        "DeepEnsemble",
        "n_members < 1",
        lambda: peg.DeepEnsemble(n_members=0),
        ValueError,
        "n_members",
    ),
    (
        "MCDropout",
        "model without dropout",
        lambda: peg.MCDropout().fit(_mlp()),
        ValueError,
        "insert",
    ),
    ("MCDropout", "insert outside (0, 1)", lambda: peg.MCDropout(insert=1.5), ValueError, "insert"),
    # ---------------------------------------------------------------- Laplace
    (
        "Laplace",
        "unknown subset_of_weights",
        lambda: peg.Laplace(subset_of_weights="subnetwork"),
        ValueError,
        "subset_of_weights: expected one of",
    ),
    (
        "Laplace",
        "unknown hessian_structure",
        lambda: peg.Laplace(hessian_structure="lowrank"),
        ValueError,
        "hessian_structure",
    ),
    (
        "Laplace",
        "unknown prior_optimization",
        lambda: peg.Laplace(prior_optimization="cv"),
        ValueError,
        "prior_optimization",
    ),
    (
        "Laplace",
        "prior_precision <= 0",
        lambda: peg.Laplace(prior_precision=0.0),
        ValueError,
        "prior_precision",
    ),
    (
        "Laplace",
        "unknown link_approx",
        lambda: peg.Laplace(link_approx="logit"),
        ValueError,
        "link_approx",
    ),
    (
        "Laplace",
        "pred_type='nn' with a deterministic link",
        lambda: peg.Laplace(pred_type="nn"),
        ValueError,
        "link_approx: pred_type='nn'",
    ),
    ("Laplace", "n_members < 1", lambda: peg.Laplace(n_members=0), ValueError, "n_members"),
    (
        "Laplace",
        "fast_variance not a bool",
        lambda: peg.Laplace(fast_variance="yes"),
        TypeError,
        r"fast_variance: expected True or False, got 'yes'",
    ),
    (
        "Laplace",
        "last_layer_name with every weight",
        lambda: peg.Laplace(subset_of_weights="all", last_layer_name="fc"),
        ValueError,
        "last_layer_name",
    ),
    (
        "Laplace",
        "laplace-torch not installed",
        _without_laplace,
        ImportError,
        r'peg.Laplace needs laplace-torch.*pip install "peg\[laplace\]" && pip install --no-deps',
    ),
    (
        "Laplace",
        "model of the wrong type",
        lambda: peg.Laplace().fit("mlp", _val()),
        TypeError,
        "model",
    ),
    (
        "Laplace",
        "data without labels",
        lambda: peg.Laplace().fit(_mlp(), _val()[0]),
        ValueError,
        "val: labels are needed",
    ),
    (
        "Laplace",
        "no data",
        lambda: peg.Laplace().fit(_mlp()),
        ValueError,
        "val: the Laplace approximation needs labelled data",
    ),
    (
        "Laplace",
        "grid search without validation data",
        lambda: peg.Laplace(prior_optimization="gridsearch").fit(_mlp(), train_data=_val()),
        ValueError,
        "val: prior_optimization='gridsearch' needs",
    ),
    (
        "Laplace",
        "validation data the marglik prior does not use",
        lambda: peg.Laplace().fit(_mlp(), _val(), train_data=_val()),
        ValueError,
        "val: with train_data, only used by prior_optimization='gridsearch'",
    ),
    # ---------------------------------------------------------------- DeepEnsemble, SWA, SWAG
    (
        "DeepEnsemble",
        "recipe of the wrong type",
        lambda: peg.DeepEnsemble(recipe={"epochs": 1}),
        TypeError,
        "recipe",
    ),
    ("DeepEnsemble", "negative seed", lambda: peg.DeepEnsemble(seed=-1), ValueError, "seed"),
    (
        "DeepEnsemble",
        "labels out of range",
        lambda: peg.DeepEnsemble(n_members=2, recipe=R1).fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"labels must lie in \[0, 3\)",
    ),
    (
        "DeepEnsemble",
        "X with the wrong number of features",
        lambda: peg.DeepEnsemble(n_members=2, recipe=R1).fit(_mlp(), _wide()),
        ValueError,
        "cannot run on inputs",
    ),
    (
        "DeepEnsemble",
        "a factory that returns no module",
        lambda: peg.DeepEnsemble(n_members=2, recipe=R1).fit(lambda: 3, _val()),
        TypeError,
        "factory",
    ),
    (
        "DeepEnsemble",
        "model neither a module nor a factory",
        lambda: peg.DeepEnsemble(n_members=2, recipe=R1).fit("mlp", _val()),
        TypeError,
        "model",
    ),
    (
        "DeepEnsemble",
        "inputs without labels",
        lambda: peg.DeepEnsemble(n_members=2, recipe=R1).fit(_mlp(), _val()[0]),
        ValueError,
        "train_data",
    ),
    (
        "DeepEnsemble",
        "data on another device (meta)",
        lambda: peg.DeepEnsemble(n_members=2, recipe=R1).fit(
            _mlp(), (_val()[0].to("meta"), _val()[1])
        ),
        ValueError,
        "train_data: on the meta device .* cpu",
    ),
    (
        "SWA",
        "recipe without swa_start",
        lambda: peg.SWA(recipe=Recipe(epochs=3)),
        ValueError,
        "swa_start",
    ),
    ("SWA", "recipe of the wrong type", lambda: peg.SWA(recipe={"epochs": 3}), TypeError, "recipe"),
    ("SWA", "batch_size < 1", lambda: peg.SWA(recipe=RS, batch_size=0), ValueError, "batch_size"),
    (
        "SWA",
        "labels out of range",
        lambda: peg.SWA(recipe=RS).fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"labels must lie in \[0, 3\)",
    ),
    (
        "SWA",
        "X with the wrong number of features",
        lambda: peg.SWA(recipe=RS).fit(_mlp(), _wide()),
        ValueError,
        "cannot run on inputs",
    ),
    (
        "SWA",
        "model on the meta device",
        lambda: peg.SWA(recipe=RS).fit(_meta_mlp(), _val()),
        ValueError,
        "model: weights on the meta device",
    ),
    ("SWAG", "n_members < 1", lambda: peg.SWAG(recipe=RS, n_members=0), ValueError, "n_members"),
    ("SWAG", "unknown bn mode", lambda: peg.SWAG(recipe=RS, bn="batch"), ValueError, "bn"),
    (
        "SWAG",
        "one collected epoch",
        lambda: peg.SWAG(recipe=RS.replace(swa_start=2)),
        ValueError,
        "at least 2 collected epochs",
    ),
    (
        "SWAG",
        "data on another device (meta)",
        lambda: peg.SWAG(recipe=RS).fit(_mlp(), (_val()[0].to("meta"), _val()[1])),
        ValueError,
        "train_data: on the meta device .* cpu",
    ),
    (
        "SWAG",
        "sampling before fit",
        lambda: peg.SWAG(recipe=RS).sample_vectors(3),
        peg.NotFittedError,
        "fit",
    ),
    (
        "SWAG",
        "predict before fit",
        lambda: peg.SWAG(recipe=RS).predict_proba(torch.zeros(2, 2)),
        peg.NotFittedError,
        "fit",
    ),
    # ---------------------------------------------------------------- MC dropout, patching, packed
    ("MCDropout", "n_members < 1", lambda: peg.MCDropout(n_members=0), ValueError, "n_members"),
    ("MCDropout", "model of the wrong type", lambda: peg.MCDropout().fit("m"), TypeError, "model"),
    (
        "MCDropout",
        "val with the wrong number of features",
        lambda: peg.MCDropout(insert=0.2).fit(_mlp(), torch.randn(10, 5)),
        ValueError,
        r"val: the model cannot run on inputs of shape \[N, 5\]",
    ),
    (
        "MCDropout",
        "X with the wrong number of features",
        lambda: peg.MCDropout(insert=0.2).fit(_mlp()).member_logits(torch.randn(10, 5)),
        ValueError,
        r"X: the model cannot run on inputs of shape \[N, 5\]",
    ),
    (
        "MCDropout",
        "X on another device (meta)",
        lambda: (
            peg.MCDropout(insert=0.2).fit(_mlp()).member_logits(torch.zeros(4, 2, device="meta"))
        ),
        ValueError,
        "X: on the meta device .* cpu",
    ),
    (
        "MCDropout",
        "insert into a single layer",
        lambda: peg.MCDropout(insert=0.2).fit(nn.Linear(2, 3)),
        ValueError,
        "single layer",
    ),
    (
        "MCDropout",
        "predict before fit",
        lambda: peg.MCDropout().predict_proba(torch.zeros(2, 2)),
        peg.NotFittedError,
        "fit",
    ),
    ("MCPatched", "model not patched", lambda: peg.MCPatched().fit(_mlp()), ValueError, "patch"),
    ("MCPatched", "n_members < 1", lambda: peg.MCPatched(n_members=0), ValueError, "n_members"),
    ("MCPatched", "seed not an integer", lambda: peg.MCPatched(seed=1.5), ValueError, "seed"),
    (
        "PackedEnsemble",
        "model not packed",
        lambda: peg.PackedEnsemble().fit(_mlp()),
        ValueError,
        "not a packed model",
    ),
    (
        "PackedEnsemble",
        "batch_size < 1",
        lambda: peg.PackedEnsemble(batch_size=0),
        ValueError,
        "batch_size",
    ),
    (
        "PackedEnsemble",
        "predict before fit",
        lambda: peg.PackedEnsemble().predict_proba(torch.zeros(2, 2)),
        peg.NotFittedError,
        "fit",
    ),
    (
        "PackedEnsemble",
        "X with the wrong number of features",
        lambda: peg.PackedEnsemble().fit(_packed()).member_logits(torch.randn(4, 5)),
        ValueError,
        "X: the model cannot run on inputs",
    ),
    # ---------------------------------------------------------------- subspace samplers
    ("RandomSubspace", "radius <= 0", lambda: RandomSubspace(radius=0), ValueError, "radius"),
    (
        "RandomSubspace",
        "n_members < 1",
        lambda: RandomSubspace(n_members=0),
        ValueError,
        "n_members",
    ),
    (
        "RandomSubspace",
        "min_accuracy outside [0, 1]",
        lambda: RandomSubspace(min_accuracy=2),
        ValueError,
        "min_accuracy",
    ),
    ("RandomSubspace", "unknown bn mode", lambda: RandomSubspace(bn="batch"), ValueError, "bn"),
    (
        "RandomSubspace",
        "min_accuracy without val",
        lambda: RandomSubspace(min_accuracy=0.5).fit(_mlp()),
        ValueError,
        "val",
    ),
    (
        "RandomSubspace",
        "bn='refresh' without bn_data",
        lambda: RandomSubspace(bn="refresh").fit(_bn_mlp()),
        ValueError,
        "bn_data",
    ),
    (
        "RandomSubspace",
        "val labels out of range",
        lambda: RandomSubspace(min_accuracy=0.1).fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"val labels: expected labels in \[0, 3\)",
    ),
    (
        "RandomSubspace",
        "val with the wrong number of features",
        lambda: RandomSubspace(min_accuracy=0.1).fit(_mlp(), _wide()),
        ValueError,
        "val: the model cannot run",
    ),
    (
        "DropoutSubspace",
        "keep range reversed",
        lambda: DropoutSubspace(keep=(0.8, 0.2)),
        ValueError,
        "keep",
    ),
    ("DropoutSubspace", "keep = 0", lambda: DropoutSubspace(keep=0), ValueError, "keep"),
]

# the same, for calls that take a temporary folder
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    (
        "DeepEnsemble",
        "checkpoint_dir is a file",
        lambda tmp: peg.DeepEnsemble(
            n_members=2, recipe=R1, checkpoint_dir=_write(tmp / "f", "x")
        ).fit(_mlp(), _val()),
        ValueError,
        "checkpoint_dir: .* is a file",
    ),
]


test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)
test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)
