"""Bad input answered first and clearly, and what was silently accepted now said (issue 32):
AutoSelect's labels checked before any candidate, Laplace on float labels, a model returning
probabilities, validation data with one class, and the temporary files a SIGKILL left behind.
"""

from __future__ import annotations

import os
import signal
import time
import warnings
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg
from bad_inputs import _mlp, _val, raises_test
from peg.apps import registry
from peg.apps.compare import compare
from peg.apps.select import AutoSelect
from peg.utils.io import atomic_write_text


def _bad_labels(n_bad: int) -> tuple[torch.Tensor, torch.Tensor]:
    X, y = _val(120)
    y = y.clone()
    y[:n_bad] = 3  # the model has 3 outputs: classes 0, 1, 2
    return X, y


def _float_labels() -> tuple[torch.Tensor, torch.Tensor]:
    X, y = _val()
    return X, y.float() + 0.5  # whole-number floats are class labels (evaluate, fit, compare)


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    ("select", "one label out of range",
     lambda: AutoSelect(candidates=["TS", "PEG"], cv=3).fit(_mlp(), _bad_labels(1)),
     ValueError, r"val labels: expected labels in \[0, 3\) \(C = 3\), got min 0 and max 3"),
    ("select", "ten labels out of range",
     lambda: AutoSelect(candidates=["TS", "PEG"], cv=3).fit(_mlp(), _bad_labels(10)),
     ValueError, r"val labels: expected labels in \[0, 3\) \(C = 3\), got min 0 and max 3"),
    ("Laplace", "float labels",
     lambda: peg.Laplace(prior_optimization=None).fit(_mlp(), _float_labels()),
     ValueError, r"val: all points: expected integer class labels, got torch\.float32 values that "
     r"are not whole numbers; pass class indices in \[0, C\)"),
    ("Laplace", "float labels in a loader",
     lambda: peg.Laplace(prior_optimization=None).fit(
         _mlp(), torch.utils.data.DataLoader(torch.utils.data.TensorDataset(*_float_labels()),
                                             batch_size=50)),
     ValueError, r"val: .*expected integer class labels, got torch\.float32"),
]  # fmt: skip

test_bad_input = raises_test(ERROR_CASES)


def test_select_checks_labels_before_fitting_any_candidate(monkeypatch):
    built: list[str] = []
    monkeypatch.setattr(registry, "build", lambda k, *a, **o: built.append(k))
    with pytest.raises(ValueError, match="val labels"):
        AutoSelect(candidates=["TS", "PEG"], cv=3).fit(_mlp(), _bad_labels(10))
    assert built == []


# --- a model returning probabilities: one warning, in the probe every entry point runs ----------


def _softmaxed() -> nn.Module:
    return nn.Sequential(_mlp(), nn.Softmax(dim=1))


ENTRY_POINTS: dict[str, Callable[[nn.Module], object]] = {
    "TemperatureScaling": lambda m: peg.TemperatureScaling().fit(m, _val()),
    "PEG": lambda m: peg.PEG(n_members=2, eta=0.1, progress=False).fit(m, _val()),
    "PEP": lambda m: peg.PEP(n_members=2, sigma=0.01, progress=False).fit(m, _val()),
    "MCDropout": lambda m: peg.MCDropout(n_members=2, insert=0.1, progress=False).fit(m, _val()),
    "Laplace": lambda m: peg.Laplace(prior_optimization=None, last_layer_name="0.2").fit(m, _val()),
    "compare": lambda m: compare(m, _val(), _val(60), ["TS"], say=None, progress=False),
    "AutoSelect": lambda m: AutoSelect(candidates=["TS"], cv=2).fit(m, _val()),
}


@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_model_returning_probabilities_is_a_warning(entry):
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        ENTRY_POINTS[entry](_softmaxed())
    said = [str(w.message) for w in seen]
    assert any(s.startswith("model: its outputs look like probabilities") for s in said), said


def test_logits_are_not_taken_for_probabilities():
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails
        peg.TemperatureScaling().fit(_mlp(), _val())
        peg.TemperatureScaling().fit(nn.Sequential(_mlp(), nn.LogSoftmax(dim=1)), _val())


# --- validation data with one class -------------------------------------------------------------


def test_validation_data_with_one_class_is_a_warning_for_peg_and_an_error_for_a_map():
    """PEG's members are the model's, its scale chosen on them (warned); a calibrator's map
    learns nothing of the classes from one (its temperature went to a bound, with a warning)."""
    X, y = _val()
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        peg.PEG(n_members=2, eta=0.1, progress=False).fit(_mlp(), (X, torch.ones_like(y)))
    assert any("val: every label is 1 (one class only)" in str(w.message) for w in seen)
    loader = DataLoader(TensorDataset(X, torch.ones_like(y)), batch_size=64)
    for val in ((X, torch.ones_like(y)), loader):
        with pytest.raises(ValueError, match=r"val labels: every label is 1 \(one class only\)"):
            peg.TemperatureScaling().fit(_mlp(), val)


# --- temporary files a SIGKILL left behind --------------------------------------------------------

CHILD = r"""
import sys, time
from pathlib import Path
from peg.utils.io import atomic_target
with atomic_target(sys.argv[1]) as tmp:
    Path(tmp).write_text("half")
    Path(sys.argv[2]).write_text("")
    time.sleep(600)
"""


def test_a_writer_killed_mid_write_leaves_a_temporary_file_the_next_save_removes(
    tmp_path, fork_server
):
    path, marker = tmp_path / "a.peg", tmp_path / "marker"
    atomic_write_text(path, "good")
    err = tmp_path.parent / f"{tmp_path.name}.err"  # not in the folder the test lists
    child = fork_server.spawn(CHILD, str(path), str(marker), cwd=tmp_path, stderr=err,
                              env=os.environ)  # fmt: skip
    deadline = time.monotonic() + 60
    while not marker.exists() and time.monotonic() < deadline and child.poll() is None:
        time.sleep(0.01)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    left = [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")]
    assert len(left) == 1 and left[0].startswith(f".a.peg.{child.pid}.")
    assert path.read_text() == "good"  # the previous file intact
    atomic_write_text(path, "new")
    assert [p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")] == []


def test_only_stale_temporary_files_of_the_target_are_removed(tmp_path):
    alive = tmp_path / f".a.peg.{os.getppid()}.abcdefgh.tmp"  # a live writer's
    fresh = tmp_path / ".a.peg.abcdefgh.tmp"  # an earlier peg's naming, just written
    old = tmp_path / ".a.peg.ijklmnop.tmp"  # an earlier peg's naming, two hours old
    other = tmp_path / ".a.peg.bak.12345678.tmp"  # another file's (a.peg.bak)
    mine = tmp_path / "a.peg.notes.tmp"  # not peg's naming
    for p in (alive, fresh, old, other, mine):
        p.write_text("")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    atomic_write_text(tmp_path / "a.peg", "x")
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.endswith(".tmp")) == sorted(
        p.name for p in (alive, fresh, other, mine)
    )


def test_nan_weights_are_refused_at_load(tmp_path):
    net = _mlp()
    path = peg.Ensemble.from_models([net]).save(str(tmp_path / "ok.peg"))
    with torch.no_grad():
        net[0].weight[0, 0] = float("nan")
    bad = peg.Ensemble.from_models([net]).save(str(tmp_path / "nan.peg"))
    peg.load(path, _mlp())
    with pytest.raises(peg.ArchiveError, match=r"nan\.peg: .*'0\.weight' holds NaN"):
        peg.load(bad, _mlp())
