"""Bad input across the public API: each case raises the documented error, before any work.

`docs/errors.md` is this table rendered (`python tests/test_errors.py` rewrites it); a test
checks the file matches, so the documentation cannot drift from what the library does.
"""

from __future__ import annotations

import contextlib
import copy
import io
import math
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader

import peg
from peg import data, metrics, models, plots
from peg.apps.bench.runner import check_methods
from peg.apps.bench.spec import SpecError, load_specs, parse_spec
from peg.apps.cli import main as cli
from peg.archive import ArchiveError
from peg.data import corruptions
from peg.data._corruption_weather import frost_photos
from peg.layers import patch
from peg.metrics import diversity, ood, regression
from peg.metrics.streaming import StreamingMetrics, StreamingOOD
from peg.models._packed import Packing, as_packing
from peg.output import OutputFnError
from peg.subspace import DropoutSubspace, RandomSubspace
from peg.train import Recipe, train

DOC = Path(__file__).resolve().parents[1] / "docs" / "errors.md"


def _mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 3)).eval()


def _val(n: int = 200, classes: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 2, generator=g), torch.randint(0, classes, (n,), generator=g)


class _TupleOut(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.lin(x), x


class _DictOut(_TupleOut):
    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"logits": self.lin(x), "hidden_states": x}


class _ScoresOut(_TupleOut):
    """A mapping without "logits": the output_fn hook is needed."""

    def forward(self, x: torch.Tensor) -> dict[str, torch.Tensor]:  # type: ignore[override]
        return {"scores": self.lin(x), "hidden_states": x}


class _Scaled(nn.Module):
    """Holds a parameter itself: no folded form."""

    def __init__(self) -> None:
        super().__init__()
        self.scale = nn.Parameter(torch.randn(3))
        self.fc = nn.Linear(2, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x) * self.scale


class _Stream(torch.utils.data.IterableDataset):
    def __iter__(self):  # type: ignore[no-untyped-def]
        X, y = _val()
        return iter(zip(X, y, strict=True))


def _bad_batch_3() -> torch.utils.data.TensorDataset:
    X, y = _val()
    y = y.clone()
    y[65] = 7  # in batch 3 of 20 points
    return torch.utils.data.TensorDataset(X, y)


def _nan_batch_3() -> torch.utils.data.TensorDataset:
    X, y = _val()
    X = X.clone()
    X[70, 1] = float("nan")
    return torch.utils.data.TensorDataset(X, y)


def _recipe_other_loader() -> None:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        path = _fitted_peg().save(str(Path(tmp) / "r"))
        X, y = _val()
        other = DataLoader(torch.utils.data.TensorDataset(X + 1, y), batch_size=32)
        peg.load(path, _mlp(), val=other)


def _bn_mlp() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 3)).eval()


def _meta_mlp() -> nn.Module:
    return copy.deepcopy(_mlp()).to("meta")


def _wide() -> tuple[torch.Tensor, torch.Tensor]:
    """Validation data with 5 features, for a model that takes 2."""
    return torch.randn(200, 5), _val()[1]


def _nan_x() -> tuple[torch.Tensor, torch.Tensor]:
    X, y = _val()
    X = X.clone()
    X[3, 0] = float("nan")
    return X, y


def _packed() -> nn.Module:
    torch.manual_seed(0)
    return models.build("mlp", in_features=2, num_classes=3, packed=(2, 2, 1)).eval()


R1 = Recipe(epochs=1, batch_size=64)
RS = Recipe(epochs=3, batch_size=64, schedule="swa", swa_start=1, swa_lr=0.01)


@contextlib.contextmanager
def _no_data_roots() -> Iterator[None]:
    """Search only the explicit root: a machine without any data set installed."""
    saved = {k: os.environ.get(k) for k in ("PEG_DATA_ONLY", "PEG_DATA")}
    os.environ["PEG_DATA_ONLY"], os.environ["PEG_DATA"] = "1", ""
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _cli(*argv: str) -> None:
    """Run `peg ARGV`; an argparse exit becomes SystemExit("exit N: <what it printed>")."""
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err):
            cli(list(argv))
    except SystemExit as e:
        printed = err.getvalue().strip().splitlines()
        raise SystemExit(f"exit {e.code}: {printed[-1] if printed else ''}") from None


def _frozen() -> nn.Module:
    net = _mlp()
    for p in net.parameters():
        p.requires_grad_(False)
    return net


def _spec(**change: object) -> dict:
    base = {
        "name": "x",
        "data": "digits",
        "model": {"name": "mlp"},
        "train": {"epochs": 1},
        "methods": ["Single"],
    }
    return {**base, **change}


def _not_an_archive(tmp: Path) -> None:
    path = tmp / "notes.txt"
    path.write_text("not a peg archive")
    peg.load(path, _mlp())


def _truncated_archive(tmp: Path) -> None:
    path = tmp / "a.peg"
    peg.Ensemble.from_models([_mlp()]).save(str(path))
    path.write_bytes(path.read_bytes()[:-40])
    peg.load(path, _mlp())


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


def _archive(tmp: Path, model: nn.Module | None = None) -> str:
    return peg.Ensemble.from_models([model if model is not None else _mlp()]).save(
        str(tmp / "members.peg")
    )


def _calibrated(tmp: Path, calibration: dict[str, object]) -> str:
    meta = {"calibration": calibration}
    return peg.Ensemble.from_models([_mlp()], meta=meta).save(str(tmp / "calibrated.peg"))


def _fitted_peg() -> peg.PEG:
    return peg.PEG(n_members=2, grad_batch_size=8, eta=0.1, progress=False).fit(_mlp(), _val())


def _recipe(tmp: Path) -> str:
    return _fitted_peg().save(str(tmp / "recipe.peg"))  # the default: base weights + recipe


def _without_data(call: Callable[[], object]) -> object:
    with _no_data_roots():
        return call()


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


def _without_frost_photos(call: Callable[[], object]) -> object:
    """`call()` with torch-uncertainty-assets not importable (and no photographs cached)."""
    saved = sys.modules.get("torch_uncertainty_assets")
    frost_photos.cache_clear()
    sys.modules["torch_uncertainty_assets"] = None  # type: ignore[assignment]  # import fails
    try:
        return call()
    finally:
        if saved is None:
            del sys.modules["torch_uncertainty_assets"]
        else:
            sys.modules["torch_uncertainty_assets"] = saved
        frost_photos.cache_clear()


def _fake_idx(tmp: Path) -> Path:
    """A data root whose Fashion-MNIST files are text, not gzipped IDX."""
    folder = tmp / "root" / "fashion-mnist"
    folder.mkdir(parents=True)
    for name in ("train-images-idx3-ubyte.gz", "train-labels-idx1-ubyte.gz"):
        _write(folder / name, "not an idx file")
    return tmp / "root"


def _empty_cifar(tmp: Path) -> Path:
    (tmp / "root" / "cifar-10-batches-bin").mkdir(parents=True)
    return tmp / "root"


def _two_kinds() -> None:
    stream = StreamingMetrics()
    stream.update(logits, torch.tensor([0, 1, 2, 0]))
    stream.update(torch.full((4, 3), 1 / 3), torch.tensor([0, 1, 2, 0]))


probs_bad = torch.tensor([[0.5, 0.4, 0.3]])
logits = torch.randn(2, 4, 3)

# (area, bad input, call, error type, regex the message must match)
CASES: list[tuple[str, str, Callable[..., object], type[Exception], str]] = [
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
        "PEG",
        "race < 0",
        lambda: peg.PEG(race=-1.0),
        ValueError,
        r"race: expected a finite number >= 0",
    ),
    ("PEP", "race not a number", lambda: peg.PEP(race="z"), ValueError, "race"),
    (
        "PEG",
        "unknown direction",
        lambda: peg.PEG(direction="up"),
        ValueError,
        r"direction: expected 'descent' or 'ascent'",
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
        r"search: expected one of \('surrogate', 'golden'\)",
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
    (
        "metrics",
        "probabilities not summing to 1",
        lambda: metrics.nll(probs_bad, torch.tensor([0])),
        ValueError,
        "sum to 1",
    ),
    (
        "metrics",
        "NaN in predictions",
        lambda: metrics.nll(torch.full((1, 2, 3), float("nan")), torch.tensor([0, 1])),
        ValueError,
        "finite",
    ),
    (
        "metrics",
        "labels out of range",
        lambda: metrics.error(logits, torch.tensor([0, 1, 2, 3])),
        ValueError,
        "y",
    ),
    (
        "metrics",
        "labels of the wrong length",
        lambda: metrics.ece(logits, torch.tensor([0, 1])),
        ValueError,
        "labels",
    ),
    (
        "metrics",
        "wrong rank",
        lambda: metrics.brier(torch.zeros(3), torch.tensor([0])),
        ValueError,
        r"\[N, C\]",
    ),
    (
        "ood",
        "empty OOD scores",
        lambda: ood.auroc(torch.ones(3), torch.ones(0)),
        ValueError,
        "scores_out",
    ),
    (
        "ood",
        "mutual information without members",
        lambda: ood.mutual_information(torch.full((2, 3), 1 / 3)),
        ValueError,
        "member",
    ),
    (
        "regression",
        "negative variance",
        lambda: regression.log_predictive_density(torch.zeros(3), -torch.ones(3), torch.zeros(3)),
        ValueError,
        "var",
    ),
    (
        "diversity",
        "fewer than 2 members",
        lambda: diversity.disagreement(torch.randn(1, 4, 3)),
        ValueError,
        "at least 2 members",
    ),
    ("data", "unknown data set", lambda: data.load("imagenet"), ValueError, "unknown"),
    ("data", "unknown split", lambda: data.load("digits", "validation"), ValueError, "split"),
    (
        "corruptions",
        "unknown corruption",
        lambda: corruptions.corrupt(torch.rand(1, 1, 8, 8), "hail", 3),
        ValueError,
        "name",
    ),
    (
        "corruptions",
        "severity outside 1..5",
        lambda: corruptions.corrupt(torch.rand(1, 1, 8, 8), "contrast", 6),
        ValueError,
        "severity",
    ),
    (
        "corruptions",
        "frost without the package torch-uncertainty-assets",
        lambda: _without_frost_photos(
            lambda: corruptions.corrupt(torch.rand(1, 3, 8, 8), "frost", 1)
        ),
        ModuleNotFoundError,
        "name: 'frost' needs .*pip install torch-uncertainty-assets",
    ),
    (
        "models",
        "unknown architecture",
        lambda: models.build("transformer"),
        ValueError,
        "unknown model",
    ),
    (
        "peg bench spec",
        "unknown method",
        lambda: parse_spec(_spec(methods=["Bayes-by-backprop"])),
        SpecError,
        r"methods\[0\]",
    ),
    (
        "peg bench spec",
        "negative epochs",
        lambda: parse_spec(_spec(train={"epochs": -3})),
        SpecError,
        r"train\.epochs",
    ),
    (
        "peg bench spec",
        "unknown data set",
        lambda: parse_spec(_spec(data="imagenet")),
        SpecError,
        r"\.data",
    ),
    (
        "peg bench spec",
        "unknown OOD set",
        lambda: parse_spec(_spec(ood=["svhn-extra"])),
        SpecError,
        r"\.ood",
    ),
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
        "float class labels",
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(
            _mlp(), (_val()[0], _val()[1].float())
        ),
        ValueError,
        r"y\.long\(\)",
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
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1).fit(_mlp(), [1, 2, 3]),
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
        lambda: peg.PEG(n_members=2, grad_batch_size=8, eta=0.1, criterion="ece").fit(
            nn.Linear(2, 2).eval(), (_val()[0], torch.randn(200))
        ),
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
    ("PEG", "unknown criterion", lambda: peg.PEG(criterion="auc"), ValueError, "criterion"),
    ("PEG", "unknown params filter", lambda: peg.PEG(params="bias"), ValueError, "params"),
    ("PEG", "n_members not an integer", lambda: peg.PEG(n_members=2.5), ValueError, "n_members"),
    ("PEG", "batch_size < 1", lambda: peg.PEG(batch_size=0), ValueError, "batch_size"),
    (
        "PEG",
        "max_score_points < 1",
        lambda: peg.PEG(max_score_points=0),
        ValueError,
        "max_score_points",
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
        r"y\.long\(\)",
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
    # ---------------------------------------------------------------- TemperatureScaling
    (
        "TemperatureScaling",
        "max_iter < 1",
        lambda: peg.TemperatureScaling(max_iter=0),
        ValueError,
        "max_iter",
    ),
    (
        "TemperatureScaling",
        "batch_size < 1",
        lambda: peg.TemperatureScaling(batch_size=0),
        ValueError,
        "batch_size",
    ),
    (
        "TemperatureScaling",
        "labels out of range",
        lambda: peg.TemperatureScaling().fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"val labels: expected labels in \[0, 3\)",
    ),
    (
        "TemperatureScaling",
        "non-integer labels",
        lambda: peg.TemperatureScaling().fit(_mlp(), (_val()[0], _val()[1] + 0.5)),
        ValueError,
        "val labels: expected integer labels",
    ),
    (
        "TemperatureScaling",
        "predictor of the wrong type",
        lambda: peg.TemperatureScaling().fit(42, _val()),
        TypeError,
        "predictor",
    ),
    (
        "TemperatureScaling",
        "fit without validation data",
        lambda: peg.TemperatureScaling().fit(_mlp()),
        ValueError,
        "val: temperature scaling needs labelled validation data",
    ),
    (
        "TemperatureScaling",
        "predict before fit",
        lambda: peg.TemperatureScaling().predict_proba(torch.zeros(2, 2)),
        peg.NotFittedError,
        "fit",
    ),
    (
        "TemperatureScaling",
        "val on another device (meta)",
        lambda: peg.TemperatureScaling().fit(_mlp(), (_val()[0].to("meta"), _val()[1])),
        ValueError,
        "val: on the meta device .* cpu",
    ),
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
        ValueError,
        r"fast_variance: expected one of \[True, False\]",
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
        "data: labels are needed",
    ),
    (
        "Laplace",
        "grid search without validation data",
        lambda: peg.Laplace(prior_optimization="gridsearch").fit(_mlp(), _val()),
        ValueError,
        "val: prior_optimization='gridsearch' needs",
    ),
    (
        "Laplace",
        "validation data the marglik prior does not use",
        lambda: peg.Laplace().fit(_mlp(), _val(), val=_val()),
        ValueError,
        "val: only used by prior_optimization='gridsearch'",
    ),
    (
        "calibrators",
        "vector scaling on unknown scores",
        lambda: peg.VectorScaling(scores="probs"),
        ValueError,
        r"scores: expected one of \('auto', 'log_probs'\), got 'probs'",
    ),
    (
        "calibrators",
        "a negative ODIR weight",
        lambda: peg.MatrixScaling(reg_lambda=-1.0),
        ValueError,
        "reg_lambda: expected a finite number >= 0, got -1.0",
    ),
    (
        "calibrators",
        "a non-finite L2 weight",
        lambda: peg.DirichletCalibration(l2=float("nan")),
        ValueError,
        "l2: expected a finite number >= 0, got nan",
    ),
    (
        "calibrators",
        "no bins",
        lambda: peg.HistogramBinning(n_bins=0),
        ValueError,
        "n_bins: expected an integer >= 1, got 0",
    ),
    (
        "calibrators",
        "an unknown binning strategy",
        lambda: peg.HistogramBinning(strategy="kmeans"),
        ValueError,
        "strategy: expected one of",
    ),
    (
        "calibrators",
        "a probability floor of 1",
        lambda: peg.IsotonicCalibration(floor=1.0),
        ValueError,
        r"floor: expected a number in \(0, 1\), got 1.0",
    ),
    (
        "calibrators",
        "fit without validation data",
        lambda: peg.DirichletCalibration().fit(_mlp()),
        ValueError,
        "val: Dirichlet calibration needs labelled validation data",
    ),
    (
        "calibrators",
        "one label fewer than inputs",
        lambda: peg.IsotonicCalibration().fit(_mlp(), (_val()[0], _val()[1][:-1])),
        ValueError,
        "val: 200 inputs but 199 labels",
    ),
    (
        "calibrators",
        "labels beyond the model's classes",
        lambda: peg.HistogramBinning().fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"val labels: expected labels in \[0, 3\)",
    ),
    (
        "calibrators",
        "binning a one-class model",
        lambda: peg.HistogramBinning().fit(nn.Linear(2, 1), (_val()[0], _val()[1] * 0)),
        ValueError,
        "val: histogram binning needs at least 2 classes, got 1",
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
    # ---------------------------------------------------------------- metrics
    (
        "metrics",
        "non-integer float labels",
        lambda: metrics.nll(logits, torch.tensor([0.5, 1, 2, 0])),
        ValueError,
        "integer labels",
    ),
    (
        "metrics",
        "one-hot labels",
        lambda: metrics.nll(logits, torch.zeros(4, 3)),
        ValueError,
        r"shape \[4\]",
    ),
    (
        "metrics",
        "negative probabilities",
        lambda: metrics.nll(torch.tensor([[1.5, -0.5]]), torch.tensor([0])),
        ValueError,
        "negative",
    ),
    (
        "metrics",
        "empty predictions",
        lambda: metrics.nll(torch.zeros(0, 3), []),
        ValueError,
        "empty",
    ),
    ("metrics", "bins < 1", lambda: metrics.ece(logits, [0, 1, 2, 0], bins=0), ValueError, "bins"),
    ("metrics", "predictions of the wrong type", lambda: metrics.nll("p", [0]), TypeError, "pred"),
    (
        "metrics",
        "ragged nested lists",
        lambda: metrics.nll([[0.5, 0.5], [1.0]], [0, 1]),
        ValueError,
        "pred: not a rectangular array",
    ),
    (
        "metrics",
        "probabilities where member logits are needed",
        lambda: metrics.member_nll(torch.full((2, 3), 1 / 3), torch.tensor([0, 1])),
        ValueError,
        r"\[M, N, C\]",
    ),
    (
        "metrics",
        "predictions on the meta device",
        lambda: metrics.nll(logits.to("meta"), torch.tensor([0, 1, 2, 0])),
        ValueError,
        "pred: on the meta device",
    ),
    (
        "metrics",
        "labels on another device than the predictions (meta)",
        lambda: metrics.ece(logits, torch.tensor([0, 1, 2, 0], device="meta")),
        ValueError,
        "y: on the meta device .* pred is on cpu",
    ),
    ("streaming metrics", "bins < 1", lambda: StreamingMetrics(bins=0), ValueError, "bins"),
    (
        "streaming metrics",
        "min_count < 1",
        lambda: StreamingMetrics(min_count=0),
        ValueError,
        "min_count",
    ),
    (
        "streaming metrics",
        "compute before any batch",
        lambda: StreamingMetrics().compute(),
        ValueError,
        "no batches",
    ),
    (
        "streaming metrics",
        "a batch of another kind",
        lambda: _two_kinds(),
        ValueError,
        "same kind",
    ),
    (
        "streaming metrics",
        "labels out of range",
        lambda: StreamingMetrics().update(logits, torch.tensor([0, 1, 2, 3])),
        ValueError,
        r"labels in \[0, 3\)",
    ),
    (
        "streaming metrics",
        "an unknown metric key",
        lambda: StreamingMetrics(metrics=["nll", "AURC"]),
        ValueError,
        r"metrics: unknown \['AURC'\]",
    ),
    (
        "metrics",
        "adaptive ECE with bins < 1",
        lambda: metrics.adaptive_ece(logits, [0, 1, 2, 0], bins=0),
        ValueError,
        "bins",
    ),
    (
        "metrics",
        "classwise ECE with bins < 1",
        lambda: metrics.classwise_ece(logits, [0, 1, 2, 0], bins=0),
        ValueError,
        "bins",
    ),
    (
        "metrics",
        "an unknown metric key",
        lambda: metrics.classification_metrics(logits, [0, 1, 2, 0], metrics=["auc"]),
        ValueError,
        r"metrics: unknown \['auc'\]; known: \['nll'",
    ),
    (
        "selective",
        "confidence of the wrong shape",
        lambda: metrics.aurc(logits, [0, 1, 2, 0], confidence=torch.zeros(4, 3)),
        ValueError,
        r"confidence: expected one score per point, shape \[4\]",
    ),
    (
        "selective",
        "confidence with NaN",
        lambda: metrics.augrc(logits, [0, 1, 2, 0], confidence=torch.full((4,), math.nan)),
        ValueError,
        "confidence: expected finite",
    ),
    (
        "selective",
        "coverage outside (0, 1]",
        lambda: metrics.risk_at_coverage(logits, [0, 1, 2, 0], 1.5),
        ValueError,
        r"coverage: expected a number in \(0, 1\]",
    ),
    (
        "selective",
        "unknown AURC interpolation",
        lambda: metrics.aurc(logits, [0, 1, 2, 0], interpolation="spline"),
        ValueError,
        "interpolation: expected 'exact' or 'linear'",
    ),
    (
        "selective",
        "coverage 0",
        lambda: metrics.risk_at_coverage(logits, [0, 1, 2, 0], 0),
        ValueError,
        r"coverage: expected a number in \(0, 1\]",
    ),
    (
        "plots",
        "risk-coverage curves without the counts",
        lambda: plots.risk_coverage({"m": {"coverage": [1.0], "risk": [0.1]}}),
        ValueError,
        r"curves\['m'\]: missing keys",
    ),
    (
        "plots",
        "risk-coverage into something that is not an Axes",
        lambda: plots.risk_coverage(
            {"m": metrics.risk_coverage_curve(logits, [0, 1, 2, 0])}, ax="left"
        ),
        ValueError,
        "ax: expected a matplotlib Axes",
    ),
    ("streaming OOD", "unknown score", lambda: StreamingOOD("energy"), ValueError, "score"),
    (
        "streaming OOD",
        "compute without OOD batches",
        lambda: StreamingOOD().compute(),
        ValueError,
        "both",
    ),
    (
        "ood",
        "tpr outside (0, 1]",
        lambda: ood.fpr_at_tpr(torch.ones(3), torch.ones(3), 1.5),
        ValueError,
        "tpr",
    ),
    (
        "ood",
        "unknown score",
        lambda: ood.ood_metrics(logits, logits, "energy"),
        ValueError,
        "score",
    ),
    (
        "ood",
        "NaN scores",
        lambda: ood.auroc(torch.tensor([float("nan")]), torch.ones(2)),
        ValueError,
        "finite",
    ),
    (
        "regression",
        "targets of the wrong length",
        lambda: regression.rmse(torch.zeros(3), torch.zeros(4)),
        ValueError,
        "y",
    ),
    (
        "regression",
        "NaN targets",
        lambda: regression.rmse(torch.zeros(3), torch.tensor([0, float("nan"), 0])),
        ValueError,
        "finite",
    ),
    (
        "regression",
        "outputs that are not Gaussian heads",
        lambda: regression.split_gaussian(torch.zeros(3, 3)),
        ValueError,
        r"\[\.\.\., 2\]",
    ),
    (
        "regression",
        "y_scale <= 0",
        lambda: regression.rmse(torch.zeros(3), torch.zeros(3), y_scale=-1),
        ValueError,
        "y_scale",
    ),
    (
        "regression",
        "coverage levels outside (0, 1)",
        lambda: regression.interval_coverage(
            torch.zeros(3), torch.ones(3), torch.zeros(3), levels=[1.5]
        ),
        ValueError,
        "levels",
    ),
    (
        "diversity",
        "state dicts of different architectures",
        lambda: diversity.weight_matrix([_mlp().state_dict(), nn.Linear(2, 4).state_dict()]),
        ValueError,
        "differs",
    ),
    # ---------------------------------------------------------------- data and models
    ("data", "name not a string", lambda: data.load(3), ValueError, "name"),
    (
        "data",
        "an option the set does not take",
        lambda: data.load("digits", n=3),
        ValueError,
        "options",
    ),
    ("data", "negative seed", lambda: data.load("digits", seed=-1), ValueError, "seed"),
    (
        "data",
        "root of the wrong type",
        lambda: data.load("fashion-mnist", root=3),
        ValueError,
        "root",
    ),
    (
        "data",
        "unknown cifar100 labels",
        lambda: data.load("cifar100", labels="medium"),
        ValueError,
        "labels",
    ),
    (
        "data",
        "train_val_split fraction outside (0, 1)",
        lambda: data.train_val_split(*_val(), 1.5),
        ValueError,
        "val_fraction",
    ),
    (
        "data",
        "train_val_split with X and y of different lengths",
        lambda: data.train_val_split(_val()[0], _val()[1][:5], 0.2),
        ValueError,
        "200 inputs but 5 labels",
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
    # ---------------------------------------------------------------- peg bench specs
    ("peg bench spec", "not a mapping", lambda: parse_spec([1, 2]), SpecError, "mapping"),
    (
        "peg bench spec",
        "unknown field",
        lambda: parse_spec(_spec(lr=0.1)),
        SpecError,
        "unknown field",
    ),
    (
        "peg bench spec",
        "missing required field",
        lambda: parse_spec({k: v for k, v in _spec().items() if k != "model"}),
        SpecError,
        r"\.model: missing",
    ),
    (
        "peg bench spec",
        "name not file-name-safe",
        lambda: parse_spec(_spec(name="a/b")),
        SpecError,
        r"\.name",
    ),
    (
        "peg bench spec",
        "unknown model",
        lambda: parse_spec(_spec(model={"name": "gpt"})),
        SpecError,
        r"\.model\.name",
    ),
    (
        "peg bench spec",
        "unknown model argument",
        lambda: parse_spec(_spec(model={"name": "mlp", "depth": 3})),
        SpecError,
        r"\.model: mlp: unknown argument",
    ),
    (
        "peg bench spec",
        "an unknown metric row",
        lambda: parse_spec(_spec(metrics=["nll", "auroc"])),
        SpecError,
        r"\.metrics: unknown \['auroc'\]",
    ),
    ("peg bench spec", "no methods", lambda: parse_spec(_spec(methods=[])), SpecError, "methods"),
    (
        "peg bench spec",
        "duplicate method names",
        lambda: parse_spec(_spec(methods=["Single", "Single"])),
        SpecError,
        "duplicate",
    ),
    (
        "peg bench spec",
        "method entry of the wrong type",
        lambda: parse_spec(_spec(methods=[3])),
        SpecError,
        r"methods\[0\]",
    ),
    (
        "peg bench spec",
        "impossible method option",
        lambda: check_methods(parse_spec(_spec(methods=[{"name": "PEG-15", "eta": -1}]))),
        ValueError,
        r"methods\[0\] \(PEG-15\): eta",
    ),
    ("peg bench spec", "empty seeds", lambda: parse_spec(_spec(seeds=[])), SpecError, "seeds"),
    (
        "peg bench spec",
        "val_fraction outside (0, 1)",
        lambda: parse_spec(_spec(val_fraction=1.5)),
        SpecError,
        "val_fraction",
    ),
    (
        "peg bench spec",
        "corruption severity outside 1..5",
        lambda: parse_spec(_spec(shift={"severities": [7]})),
        SpecError,
        "severities",
    ),
    (
        "peg bench spec",
        "SWAG without an SWA recipe",
        lambda: parse_spec(_spec(methods=["SWAG"])),
        SpecError,
        r"\.swa",
    ),
    (
        "peg bench spec",
        "unknown train field",
        lambda: parse_spec(_spec(train={"epochs": 1, "learnrate": 3})),
        SpecError,
        r"\.train",
    ),
    (
        "peg bench spec",
        "data_options not a mapping",
        lambda: parse_spec(_spec(data_options=3)),
        SpecError,
        "data_options",
    ),
    # ---------------------------------------------------------------- the peg command
    (
        "peg (CLI)",
        "peg bench with an unknown spec",
        lambda: _cli("bench", "nonexistent.yaml"),
        SystemExit,
        "exit 2: peg bench: error: .*neither a file nor a preset",
    ),
    ("peg (CLI)", "no subcommand", lambda: _cli(), SystemExit, "exit 2"),
    ("peg (CLI)", "peg bench without a spec", lambda: _cli("bench"), SystemExit, "spec"),
    (
        "peg (CLI)",
        "peg bench --seeds not integers",
        lambda: _cli("bench", "quick", "--seeds", "x"),
        SystemExit,
        "--seeds",
    ),
    (
        "peg (CLI)",
        "peg demo with an unknown data set",
        lambda: _cli("demo", "--data", "imagenet"),
        SystemExit,
        "--data",
    ),
    (
        "peg.compare",
        "an unknown method name",
        lambda: peg.compare(_mlp(), _val(), _val(), methods=["PEG-9000"], say=None),
        ValueError,
        r"methods\[0\]: unknown method 'PEG-9000'",
    ),
    (
        "peg.compare",
        "a model that is not a module",
        lambda: peg.compare("model.pt", _val(), _val(), say=None),
        TypeError,
        "model: expected a trained nn.Module",
    ),
    (
        "peg.compare",
        "an unknown metric column",
        lambda: peg.compare(_mlp(), _val(), _val(), metrics=["nll", "auroc"], say=None),
        ValueError,
        "metrics: expected a list of keys among",
    ),
    (
        "peg.compare",
        "float labels",
        lambda: peg.compare(_mlp(), (_val()[0], _val()[1].float()), _val(), say=None),
        ValueError,
        "integer class labels",
    ),
]

FILE_CASES: list[tuple[str, str, Callable[[Path], None], type[Exception], str]] = [
    (
        "load",
        "a file that is not a peg archive",
        _not_an_archive,
        ArchiveError,
        "not a peg archive",
    ),
    ("load", "a truncated archive", _truncated_archive, ArchiveError, "archive"),
    (
        "load",
        "no file at the path",
        lambda tmp: peg.load(tmp / "missing.peg", _mlp()),
        FileNotFoundError,
        "no peg archive",
    ),
    ("load", "a folder", lambda tmp: peg.load(tmp, _mlp()), FileNotFoundError, "no peg archive"),
    ("load", "model of the wrong type", lambda tmp: peg.load(tmp, "mlp"), TypeError, "model"),
    (
        "load",
        "Laplace.load of an ensemble archive",
        lambda tmp: peg.Laplace.load(_archive(tmp), _mlp()),
        ArchiveError,
        "an ensemble archive, not a saved peg.Laplace",
    ),
    (
        "load",
        "a model of another architecture",
        lambda tmp: peg.load(_archive(tmp), nn.Linear(2, 3)),
        ArchiveError,
        "does not match the archive's architecture",
    ),
    (
        "load",
        "the bare model for an archive of a wrapped one",
        lambda tmp: peg.load(_archive(tmp, peg.with_output(_TupleOut(), 0)), _TupleOut()),
        ArchiveError,
        r"peg\.with_output",
    ),
    (
        "load",
        "a PEG recipe (PEG/PEP's default save) without val",
        lambda tmp: peg.load(_recipe(tmp), _mlp()),
        ArchiveError,
        r"val: .* is a PEG-2 recipe .*validation points.*materialize=True",
    ),
    (
        "PEG",
        "save(materialize=) not a bool",
        lambda tmp: _fitted_peg().save(str(tmp / "x.peg"), materialize="no"),
        TypeError,
        "materialize",
    ),
    (
        "load",
        "a PEG recipe with other validation data",
        lambda tmp: peg.load(_recipe(tmp), _mlp(), val=(_val()[0] + 1, _val()[1])),
        ArchiveError,
        "not the validation data",
    ),
    (
        "load",
        "a calibrated archive of an unknown calibrator",
        lambda tmp: peg.load(_calibrated(tmp, {"method": "platt"}), _mlp()),
        ArchiveError,
        "calibration: unknown kind 'platt'",
    ),
    (
        "load",
        "a temperature-scaled archive without a valid temperature",
        lambda tmp: peg.load(
            _calibrated(tmp, {"method": "temperature", "temperature": -1}), _mlp()
        ),
        ArchiveError,
        "calibration: expected a temperature > 0",
    ),
    (
        "load",
        "a Dirichlet-calibrated archive without its weights",
        lambda tmp: peg.load(_calibrated(tmp, {"method": "dirichlet", "params": {}}), _mlp()),
        ArchiveError,
        "calibration: the archive has no 'bias' tensor",
    ),
    (
        "load",
        "a calibrated archive with arguments the calibrator refuses",
        lambda tmp: peg.load(
            _calibrated(tmp, {"method": "histogram-binning", "params": {"n_bins": 0}}), _mlp()
        ),
        ArchiveError,
        "calibration: the archive's arguments do not fit HistogramBinning: n_bins",
    ),
    (
        "TemperatureScaling",
        "save of a predictor without stacked weights (MC dropout)",
        lambda tmp: (
            peg.TemperatureScaling()
            .fit(peg.MCDropout(insert=0.2).fit(_mlp()), _val())
            .save(tmp / "ts.peg")
        ),
        TypeError,
        "predictor: save writes an ensemble archive",
    ),
    (
        "DeepEnsemble",
        "checkpoint_dir is a file",
        lambda tmp: peg.DeepEnsemble(
            n_members=2, recipe=R1, checkpoint_dir=_write(tmp / "f", "x")
        ).fit(_mlp(), _val()),
        ValueError,
        "checkpoint_dir: .* is a file",
    ),
    (
        "train",
        "checkpoint is a folder",
        lambda tmp: train(_mlp(), _val(), R1, checkpoint=tmp),
        ValueError,
        "checkpoint: .* is a folder",
    ),
    (
        "data",
        "a data set not installed (missing folder)",
        lambda tmp: _without_data(lambda: data.load("fashion-mnist", root=tmp / "missing")),
        FileNotFoundError,
        "'fashion-mnist' .* not found",
    ),
    (
        "data",
        "an IDX file that is not IDX",
        lambda tmp: _without_data(lambda: data.load("fashion-mnist", root=_fake_idx(tmp))),
        ValueError,
        "gzip|IDX",
    ),
    (
        "data",
        "a CIFAR-10 binary folder missing batches",
        lambda tmp: _without_data(lambda: data.load("cifar10", "test", root=_empty_cifar(tmp))),
        FileNotFoundError,
        "test_batch.bin",
    ),
    (
        "data",
        "read_idx of a text file",
        lambda tmp: data.read_idx(_write(tmp / "t.idx", "hello")),
        ValueError,
        "not an IDX file",
    ),
    (
        "peg bench spec",
        "invalid YAML",
        lambda tmp: load_specs(_write(tmp / "bad.yaml", "name: [unclosed")),
        SpecError,
        "not valid YAML",
    ),
    (
        "peg bench spec",
        "no file",
        lambda tmp: load_specs(tmp / "missing.yaml"),
        FileNotFoundError,
        "spec: no file",
    ),
    (
        "peg (CLI)",
        "peg bench with an invalid spec",
        lambda tmp: _cli("bench", str(_write(tmp / "s.yaml", "name: s\ndata: imagenet\n"))),
        SystemExit,
        "exit 2: peg bench: error: .*missing",
    ),
]


def _message(call: Callable[[], object]) -> tuple[type[Exception], str]:
    try:
        call()
    except (Exception, SystemExit) as e:
        return type(e), str(e).splitlines()[0]
    raise AssertionError("no error raised")


@pytest.mark.parametrize(("area", "what", "call", "kind", "pattern"), CASES)
def test_bad_input_raises_a_clear_error(area, what, call, kind, pattern):
    with pytest.raises(kind, match=pattern):
        call()


@pytest.mark.parametrize(("area", "what", "call", "kind", "pattern"), FILE_CASES)
def test_bad_files_raise_a_clear_error(area, what, call, kind, pattern, tmp_path):
    with pytest.raises(kind, match=pattern):
        call(tmp_path)


def render(tmp: Path) -> str:
    """docs/errors.md: every case with the error type and the message it produces."""
    lines = [
        "# Errors: what bad input gets",
        "",
        "Generated from `tests/test_errors.py` (`python tests/test_errors.py` rewrites this file;",
        "the test suite fails if it is out of date). Every error is raised before any long work",
        "starts and names the argument at fault.",
        "",
        "- **Devices**: data follows the model. Inputs and labels are moved, batch by batch, to",
        "  the device of the model's weights (labels to the predictions' device in the metrics);",
        "  what no move can fix is refused, naming both devices. Here the `meta` device (shapes",
        "  without values) stands for it, as the tests run on a CPU.",
        "- **Models returning a tuple or a dict** are wrapped with the `output_fn` hook,",
        "  `peg.with_output(model, output_fn)` (a key, an index or a callable).",
        "- `(RuntimeError: ...)` stands for torch's own account of why the model could not run on",
        "  the inputs (its wording changes between torch versions); `$TMP` for a temporary folder.",
        "- `peg` on the command line: a `SystemExit` row shows the exit status and what argparse",
        "  printed; other rows are the exception `peg` ends with.",
        "",
        "| area | bad input | error | message |",
        "|---|---|---|---|",
    ]
    rows = [(a, w, lambda c=c: c()) for a, w, c, _, _ in CASES]
    rows += [(a, w, lambda c=c: c(tmp)) for a, w, c, _, _ in FILE_CASES]
    order = {area: i for i, (area, _, _) in reversed(list(enumerate(rows)))}
    rows.sort(key=lambda row: order[row[0]])  # stable: grouped by area, in the order given
    for area, what, call in rows:
        kind, message = _message(call)
        message = message.replace(str(tmp), "$TMP")
        # torch's own words for why a forward failed change between versions: not pinned here
        message = re.sub(r"\((\w+): .*\); pass inputs", r"(\1: ...); pass inputs", message)
        message = message.replace("|", "\\|")
        lines.append(f"| {area} | {what} | `{kind.__name__}` | {message} |")
    return "\n".join(lines) + "\n"


def test_docs_errors_md_is_up_to_date(tmp_path):
    assert DOC.read_text() == render(tmp_path), "run: python tests/test_errors.py"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        DOC.write_text(render(Path(tmp)))
    print(f"wrote {DOC}", file=sys.stderr)
