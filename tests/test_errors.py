"""Bad input across the public API: each case raises the documented error, before any work.

`docs/errors.md` is this table rendered (`python tests/test_errors.py` rewrites it); a test
checks the file matches, so the documentation cannot drift from what the library does.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import peg
from peg import data, metrics, models
from peg.archive import ArchiveError
from peg.bench.spec import SpecError, parse_spec
from peg.data import corruptions
from peg.metrics import diversity, ood, regression
from peg.train import Recipe

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


probs_bad = torch.tensor([[0.5, 0.4, 0.3]])
logits = torch.randn(2, 4, 3)

# (area, bad input, call, error type, regex the message must match)
CASES: list[tuple[str, str, Callable[..., object], type[Exception], str]] = [
    ("PEG", "size < 1", lambda: peg.PEG(size=0), ValueError, "size"),
    ("PEG", "eta <= 0", lambda: peg.PEG(eta=-1.0), ValueError, "eta"),
    ("PEG", "batch_size < 1", lambda: peg.PEG(batch_size=0), ValueError, "batch_size"),
    ("PEG", "unknown variant", lambda: peg.PEG(variant="fancy"), ValueError, "variant"),
    ("PEG", "unknown bn mode", lambda: peg.PEG(bn="frozen"), ValueError, "bn"),
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
        lambda: peg.PEG(size=2, batch_size=8, eta=0.1).fit(_mlp(), (_val()[0], _val()[1] + 3)),
        ValueError,
        r"labels must lie in \[0, 3\)",
    ),
    (
        "PEG",
        "validation set smaller than K",
        lambda: peg.PEG(size=2, batch_size=128, eta=0.1).fit(_mlp(), _val(50)),
        ValueError,
        "the mini-batch size",
    ),
    (
        "PEG",
        "empty validation set",
        lambda: peg.PEG(size=2, eta=0.1).fit(
            _mlp(), (torch.zeros(0, 2), torch.zeros(0, dtype=torch.long))
        ),
        ValueError,
        "val",
    ),
    (
        "PEG",
        "model without trainable parameters",
        lambda: peg.PEG(size=2, batch_size=8, eta=0.1).fit(_frozen(), _val()),
        ValueError,
        "no trainable parameters",
    ),
    (
        "PEG",
        "forward returns a tuple",
        lambda: peg.PEG(size=2, batch_size=8, eta=0.1).fit(_TupleOut().eval(), _val()),
        TypeError,
        "must return a Tensor",
    ),
    (
        "PEG",
        "regression model without a Gaussian head",
        lambda: peg.PEG(size=2, batch_size=8, eta=0.1).fit(_mlp(), (_val()[0], torch.randn(200))),
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
        lambda: peg.SWA(Recipe(epochs=5, schedule="swa", swa_start=5, swa_lr=0.01)),
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
    ("DeepEnsemble", "size < 1", lambda: peg.DeepEnsemble(size=0), ValueError, "size"),
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
        lambda: corruptions.corrupt(torch.rand(1, 1, 8, 8), "fog", 3),
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
]


def _message(call: Callable[[], object]) -> tuple[type[Exception], str]:
    try:
        call()
    except Exception as e:
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
        "| area | bad input | error | message |",
        "|---|---|---|---|",
    ]
    rows = [(a, w, lambda c=c: c()) for a, w, c, _, _ in CASES]
    rows += [(a, w, lambda c=c: c(tmp)) for a, w, c, _, _ in FILE_CASES]
    for area, what, call in rows:
        kind, message = _message(call)
        message = re.sub(r"/tmp\S*", "<path>", message).replace("|", "\\|")
        lines.append(f"| {area} | {what} | `{kind.__name__}` | {message} |")
    return "\n".join(lines) + "\n"


def test_docs_errors_md_is_up_to_date(tmp_path):
    assert DOC.read_text() == render(tmp_path), "run: python tests/test_errors.py"


if __name__ == "__main__":
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        DOC.write_text(render(Path(tmp)))
    print(f"wrote {DOC}", file=sys.stderr)
