"""Calibration maps in archives (issue 46, items 1, 3, 6 and 7, the archive part of 5 and the
spline archive's silent gap): a weightless model other than `nn.Identity()` is recorded with
its architecture, every map refuses logits of another width than it was fitted on, the header
(where a map of scalars lives) is covered by a digest, a conformal q̂ is checked against its
score's range, and maps that overflow on large logits are refused at load, inner maps too. Each
test failed before its fix."""

from __future__ import annotations

import warnings
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from torch import nn

import peg
from bad_inputs import edit_header, raises_test, retensor, tamper
from peg import archive
from peg._load_checks import check_calibrated
from peg.archive import ArchiveError

C = 5
ETS = peg.EnsembleTemperatureScaling
PARAMS = peg.ConformalClassifier().get_params()


def saved(n: int, seed: int, c: int = C) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, c, (n,), generator=g)
    return torch.randn(n, c, generator=g) * 2 + 3 * nn.functional.one_hot(y, c), y


class Times5(nn.Module):
    """A module without parameters whose outputs are not its inputs."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return 5 * x


class Plain(nn.Module):
    """Weights kept as a plain tensor attribute: not in the state dict."""

    def __init__(self) -> None:
        super().__init__()
        self.w = torch.eye(C) * 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.w


def _times5(tmp: Path) -> str:
    X, y = saved(300, 0)
    return peg.TemperatureScaling().fit(Times5(), (X / 5, y)).save(tmp / "t5.peg")


def _on_logits(tmp: Path, calibrator: Callable[[], object] = peg.TemperatureScaling) -> str:
    return calibrator().fit(nn.Identity(), saved(300, 0)).save(tmp / "map.peg")  # type: ignore


def _conformal(tmp: Path, score: str = "lac") -> str:
    ts = peg.TemperatureScaling().fit(nn.Identity(), saved(300, 0))
    return peg.ConformalClassifier(score=score).fit(ts, saved(300, 2)).save(tmp / "cp.peg")


def _calibration(path: str, **entry: object) -> str:
    """The calibration entry changed, the header digest rewritten (a crafted file)."""
    return tamper(path, lambda h: h["meta"]["calibration"].update(entry))


def _edited(path: str, **entry: object) -> str:
    """The calibration entry changed after the write (the digest kept)."""
    return edit_header(path, lambda h: h["meta"]["calibration"].update(entry))


def _ts_on(classes: int) -> peg.TemperatureScaling:
    return peg.TemperatureScaling().fit(nn.Identity(), saved(300, 0, classes))


def _inner_t(tmp: Path) -> object:
    def change(header: dict) -> None:
        header["meta"]["calibration"]["inner"]["temperature"] = 1e-300

    return peg.load(tamper(_conformal(tmp), change))


def _ops_times(tmp: Path, factor: float) -> object:
    path = _on_logits(tmp, peg.OrderPreservingScaling)
    big = ("calibration/slopes", "calibration/knots")
    return peg.load(retensor(path, lambda k, t: t * factor if k in big else t))


LOAD, TAMPERED = "load", "load (tampered)"
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[BaseException], str]] = [
    # item 1: a weightless module other than nn.Identity() is not saved logits
    (LOAD, "a map over a weightless module's outputs, loaded without the module",
     lambda t: peg.load(_times5(t)),
     TypeError, r"model: .*t5\.peg holds a map fitted on the outputs of a Times5 \(a module "
     r"without weights, not saved logits\); pass an instance of it: peg\.load\(path, model\)"),
    (LOAD, "a map over saved logits loaded around nn.Softmax(-1)",
     lambda t: peg.load(_on_logits(t), nn.Softmax(-1)),
     ArchiveError, r"model: .*map\.peg holds a map fitted on saved logits \(nn\.Identity\(\)\); "
     r"got Softmax\(dim=-1\), another architecture: pass the module it was fitted on or none"),
    (LOAD, "a map over Times5's outputs loaded around nn.Identity()",
     lambda t: peg.load(_times5(t), nn.Identity()),
     ArchiveError, r"model: .* fitted on the outputs of Times5\(\); got Identity\(\), another "
     r"architecture"),
    (TAMPERED, "the architecture edited (Times5 to Identity)",
     lambda t: peg.load(edit_header(_times5(t), lambda h: h.update(architecture="Identity"))),
     ArchiveError, r"t5\.peg: damaged peg archive \(its header does not match the SHA-256 it "
     r"records: changed after it was written\)"),
    # item 6: the header is covered; a conformal q̂ within its score's range
    (TAMPERED, "a conformal quantile edited to -5",
     lambda t: peg.load(_edited(_conformal(t), quantile=-5.0)),
     ArchiveError, r"cp\.peg: damaged peg archive \(its header does not match the SHA-256"),
    (TAMPERED, "a conformal score edited from lac to aps",
     lambda t: peg.load(_edited(_conformal(t), params={**PARAMS, "score": "aps"})),
     ArchiveError, r"cp\.peg: damaged peg archive \(its header does not match the SHA-256"),
    (TAMPERED, "a temperature edited (the TS archive's tensors: none)",
     lambda t: peg.load(_edited(_on_logits(t), temperature=0.5)),
     ArchiveError, r"map\.peg: damaged peg archive \(its header does not match the SHA-256"),
    (TAMPERED, "a conformal LAC quantile of -5 (digest rewritten)",
     lambda t: peg.load(_calibration(_conformal(t), quantile=-5.0)),
     ArchiveError, r"cp\.peg: calibration: 'meta\.calibration\.quantile': expected LAC "
     r"thresholds in \[0, 1\] \(its scores' range\), got -5"),
    (TAMPERED, "a conformal APS quantile of 1.5 (digest rewritten)",
     lambda t: peg.load(_calibration(_conformal(t, "aps"), quantile=1.5)),
     ArchiveError, r"expected APS thresholds in \[0, 1\] \(its scores' range\), got 1\.5"),
    (TAMPERED, "an ETS temperature of 1e-300 (digest rewritten)",
     lambda t: peg.load(_calibration(_on_logits(t, ETS), temperature=1e-300)),
     ArchiveError, r"map\.peg: calibration: header field 'meta\.calibration\.temperature': "
     r"expected a temperature in \[0\.001, 1000\] \(its fit's\), got float 1e-300"),
    # item 7: maps that overflow, inner maps
    (TAMPERED, "order-preserving slopes and knots × 1e300 (digest rewritten)",
     lambda t: _ops_times(t, 1e300),
     ArchiveError, r"map\.peg: calibration: 'slopes' and 'knots' overflow: the map is not finite "
     r"on the scores of float32 logits"),
    (TAMPERED, "a conformal predictor's inner temperature of 1e-300 (digest rewritten)",
     _inner_t,
     ArchiveError, r"cp\.peg: the calibration map \(TemperatureScaling under "
     r"'meta\.calibration\.inner'\) is degenerate: .* meta\.calibration\.inner\.temperature = "
     r"1e-300"),
    # item 5, the archive part, and item 3: C of the header bound by the map's arrays
    (TAMPERED, "vector scaling's n_classes 2e8 over a bias of 5 (digest rewritten)",
     lambda t: peg.load(_calibration(_on_logits(t, peg.VectorScaling), n_classes=200_000_000)),
     ArchiveError, r"header field 'meta\.calibration\.n_classes': expected 5, the classes of the "
     r"map's arrays, got int 200000000"),
    (TAMPERED, "ETS n_classes 2e8 written as a float (digest rewritten)",
     lambda t: peg.load(_calibration(_on_logits(t, ETS), n_classes=2e8)),
     ArchiveError, r"header field 'meta\.calibration\.n_classes': expected an integer >= 1, got "
     r"float 200000000\.0"),
]  # fmt: skip

test_bad_files_raise_a_clear_error = raises_test(FILE_ERROR_CASES, files=True)

ERROR_CASES = [
    ("calibrators", "a temperature fitted on 10 classes applied to 5 columns",
     lambda: _ts_on(10).predict_proba(saved(4, 1)[0]),
     ValueError, r"X: this TemperatureScaling was fitted on 10 classes, got logits with 5 "
     r"columns from X \(shape \(1, 4, 5\)\)"),
]  # fmt: skip

test_bad_input_raises_a_clear_error = raises_test(ERROR_CASES)


# ------------------------------------------------------------------ item 1
def test_a_weightless_module_is_recorded_with_its_architecture(tmp_path):
    """Fitted on `5 * x`, the map acts on 5 × the inputs: loaded around a Times5 it predicts
    as fitted (before: `peg.load(path)` loaded it around nn.Identity(), 0.56 apart)."""
    X, y = saved(300, 0)
    fitted = peg.TemperatureScaling().fit(Times5(), (X / 5, y))
    path = fitted.save(tmp_path / "t5.peg")
    header = archive.read_header(path)
    assert header["architecture"] == "Times5"
    assert header["meta"]["inputs"] == "module" and header["meta"]["module"] == "Times5()"
    loaded = peg.load(path, Times5())
    Xt = saved(50, 1)[0] / 5
    torch.testing.assert_close(loaded.predict_proba(Xt), fitted.predict_proba(Xt))


def test_only_identity_makes_a_map_over_logits(tmp_path):
    path = _on_logits(tmp_path)
    assert archive.read_header(path)["meta"]["inputs"] == "logits"
    assert isinstance(peg.load(path).predictor_, nn.Identity)
    assert isinstance(peg.load(path, nn.Identity()).predictor_, nn.Identity)


def test_a_module_of_another_configuration_is_refused(tmp_path):
    """Same class, another `repr`: LogSoftmax over dim 0 is not the LogSoftmax(-1) it was
    fitted on."""
    X, y = saved(300, 0)
    path = peg.TemperatureScaling().fit(nn.LogSoftmax(-1), (X, y)).save(tmp_path / "s.peg")
    assert isinstance(peg.load(path, nn.LogSoftmax(-1)), peg.TemperatureScaling)
    with pytest.raises(ArchiveError, match=r"model: .* fitted on the outputs of "
                       r"LogSoftmax\(dim=-1\); got LogSoftmax\(dim=0\)"):  # fmt: skip
        peg.load(path, nn.LogSoftmax(0))


def test_plain_tensor_attributes_are_warned_of_at_save(tmp_path):
    """Their values are not in the archive (before: saved without them, silently)."""
    fitted = peg.TemperatureScaling().fit(Plain(), saved(300, 0))
    with pytest.warns(UserWarning, match=r"model: Plain keeps tensors as plain attributes \(w\)"):
        path = fitted.save(tmp_path / "plain.peg")
    with pytest.raises(TypeError, match=r"holds a map fitted on the outputs of a Plain"):
        peg.load(path)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        peg.TemperatureScaling().fit(Times5(), saved(300, 0)).save(tmp_path / "t5.peg")


def test_a_forged_architecture_still_needs_the_module(tmp_path):
    """Digest rewritten and the architecture renamed: the recorded `repr` still says Times5."""
    path = tamper(_times5(tmp_path), lambda h: h.update(architecture="Identity"))
    with pytest.raises(TypeError, match=r"outputs of a Identity"):
        peg.load(path)
    with pytest.raises(ArchiveError, match=r"fitted on the outputs of Times5\(\); got Identity"):
        peg.load(path, nn.Identity())


# ------------------------------------------------------------------ item 3
WIDTH = {
    "TS": peg.TemperatureScaling,
    "spline": peg.SplineCalibration,
    "order-preserving": peg.OrderPreservingScaling,
    "ETS": peg.EnsembleTemperatureScaling,
    "vector": peg.VectorScaling,
    "binning": peg.HistogramBinning,
    "isotonic": peg.IsotonicCalibration,
    "conformal": peg.ConformalClassifier,
}


@pytest.mark.parametrize("name", list(WIDTH))
def test_every_map_refuses_logits_of_another_width_fitted_and_loaded(name, tmp_path):
    fitted = WIDTH[name]().fit(nn.Identity(), saved(300, 0))
    loaded = peg.load(fitted.save(tmp_path / "m.peg"))
    assert archive.read_header(tmp_path / "m.peg")["meta"]["calibration"]["n_classes"] == C
    for m in (fitted, loaded):
        assert m.predict_proba(saved(4, 1)[0]).shape == (4, C)
        for width in (3, 8):
            with pytest.raises(ValueError, match=rf"X: this .* was fitted on {C} classes, got "
                               rf"logits with {width} columns from X"):  # fmt: skip
                m.predict_proba(torch.zeros(4, width))


def test_label_shift_refuses_another_width_too():
    shift = peg.LabelShift().fit(nn.Identity(), saved(300, 0), target=saved(100, 3)[0])
    with pytest.raises(ValueError, match=r"X: this LabelShift was fitted on 5 classes, got "
                       r"logits with 3 columns"):  # fmt: skip
        shift.predict_proba(torch.zeros(4, 3))


def test_a_header_c_without_arrays_to_bound_it_is_not_allocated_for(tmp_path):
    """ETS's arrays (3 weights) do not fix C: a header's 2e8 classes loads at once (the probe
    capped) and refuses other widths (before: a raw RuntimeError from the probe's allocation)."""
    path = _calibration(_on_logits(tmp_path, peg.EnsembleTemperatureScaling), n_classes=200_000_000)
    loaded = peg.load(path)
    with pytest.raises(ValueError, match=r"fitted on 200000000 classes, got logits with 5"):
        loaded.predict_proba(saved(4, 1)[0])


# ------------------------------------------------------------------ item 6
def test_new_archives_carry_a_digest_of_their_header(tmp_path):
    header = archive.read_header(_conformal(tmp_path))
    assert header["header_sha256"] == archive.header_digest(header)


def test_a_header_without_its_digest_loads_unchecked(tmp_path):
    """As archives written before it (the digest guards against damage, not a forger)."""
    path = edit_header(_on_logits(tmp_path), lambda h: h.pop("header_sha256"))
    assert isinstance(peg.load(path), peg.TemperatureScaling)


def test_the_probe_meets_large_logits(tmp_path):
    """A map that breaks only beyond the old probe's 0…50 (NaN where |logit| > 1000) is
    refused at load."""
    fitted = peg.TemperatureScaling().fit(nn.Identity(), saved(300, 0))

    class Fragile(peg.TemperatureScaling):
        def _apply(self, scores: torch.Tensor) -> torch.Tensor:
            out = super()._apply(scores)
            return torch.where(scores.abs() > 1000, torch.nan, out)

    fragile = Fragile()
    fragile.__dict__.update({k: v for k, v in vars(fitted).items() if k.endswith("_")})
    check_calibrated(tmp_path / "m.peg", fitted, torch.device("cpu"))
    said = r"is degenerate: it predicts NaN, .* on logits of magnitudes 0 to 10000"
    with pytest.raises(ArchiveError, match=said):
        check_calibrated(tmp_path / "m.peg", fragile, torch.device("cpu"))


# ------------------------------------------------------------------ the spline's silent gap
def test_a_spline_map_is_bounded_whatever_the_number_of_points(tmp_path):
    """At most 129 (confidence, calibrated) pairs, not every validation confidence (before:
    5,000 points, 80 kB, the validation data)."""
    sizes = []
    for n in (500, 5_000):
        fitted = peg.SplineCalibration().fit(nn.Identity(), saved(n, 0))
        assert fitted.confidences_.shape == fitted.calibrated_.shape == (129,)
        path = Path(fitted.save(tmp_path / f"s{n}.peg"))
        sizes.append(path.stat().st_size)
    assert sizes[0] == sizes[1] < 4_000
