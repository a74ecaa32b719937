"""`peg.compare` survives a failing method: a failed method is a row with its error, methods that
cannot apply are left out before fitting, results are saved method by method and a rerun (or a
run killed at any point) resumes to the same table; a damaged data file is a one-line error."""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn

from bad_inputs import raises_test
from docs_run import Server
from peg.apps import registry
from peg.apps.cli import main
from peg.apps.compare import compare, sources
from peg.methods.perturbation.peg import PEG

from conftest import moons, overfit

TIMES = ("fit_seconds", "predict_seconds")
METHODS = ["TS", "PEG", "PEG + TS", "TS → PEG"]


def relu_last(seed: int = 0) -> nn.Module:
    """A classifier whose last module is a ReLU after the output Linear (as the issue's)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2), nn.ReLU())


@pytest.fixture(scope="module")
def data():
    return {"train": moons(200, 0), "val": moons(400, 1), "test": moons(200, 2)}


@pytest.fixture(scope="module")
def model(data):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))
    return overfit(net, *data["train"], steps=200)


def _untimed(table):
    return [{k: v for k, v in r.items() if k not in TIMES} for r in table]


def test_a_failing_method_is_a_row_with_its_error_and_the_run_goes_on(
    model, data, monkeypatch, tmp_path
):
    def broken(self, *args, **kwargs):
        raise ValueError("Use model with a linear last layer.")

    monkeypatch.setattr(PEG, "fit", broken)
    done = compare(model, data["val"], data["test"], METHODS, out=tmp_path, say=None)
    rows = {r["method"]: r for r in done.table}
    assert set(done.failed) == {"PEG", "PEG + TS", "TS → PEG"}
    assert done.failed["PEG"]["type"] == "ValueError"
    assert "Linear" in done.failed["PEG"]["hint"]
    assert "its base, PEG, failed" in done.failed["PEG + TS"]["message"]
    assert rows["TS"]["nll"] > 0 and "nll" not in rows["PEG"]
    assert set(done.predictors) == {"TS"}
    written = json.loads((tmp_path / "results.json").read_text())
    assert set(written["failed"]) == set(done.failed)
    assert "Failed: PEG: ValueError" in (tmp_path / "results.md").read_text()


def test_methods_that_cannot_apply_are_skipped_before_fitting(data, monkeypatch):
    built: list[str] = []
    build = registry.build
    monkeypatch.setattr(registry, "build", lambda k, *a, **o: built.append(k) or build(k, *a, **o))
    done = compare(
        relu_last(), data["val"], data["test"], ["TS", "Laplace", "MC dropout"], say=None
    )
    assert [r["method"] for r in done.table] == ["TS"] and built == ["temperature"]
    assert "dropout" in done.skipped["MC dropout"]
    assert "Laplace" in done.skipped  # not nn.Linear last (or laplace-torch not installed)


def test_a_rerun_with_resume_takes_the_saved_rows_back(model, data, monkeypatch, tmp_path):
    first = compare(model, data["val"], data["test"], METHODS, out=tmp_path, say=None)
    saved = sorted(p.name for p in (tmp_path / ".compare").iterdir())
    assert len(saved) == 4 and (tmp_path / "predictors" / "PEG.peg").is_file()
    fitted: list[str] = []
    build = registry.build
    monkeypatch.setattr(registry, "build", lambda k, *a, **o: fitted.append(k) or build(k, *a, **o))
    again = compare(model, data["val"], data["test"], METHODS, out=tmp_path, say=None, resume=True)
    assert again.table == first.table  # the saved rows, timings included
    # TS → PEG's archive records its Scaled wrapper: loaded around the model, nothing refitted
    assert fitted == []
    X = data["test"][0]
    for name in METHODS:
        assert torch.allclose(
            again.predictors[name].predict_proba(X), first.predictors[name].predict_proba(X),
            atol=1e-5,
        ), name  # fmt: skip
    other = compare(model, data["val"], data["test"], ["TS"], seed=1, out=tmp_path, resume=True,
                    say=None)  # fmt: skip
    assert other.table[0]["fit_seconds"] != first.table[0]["fit_seconds"]  # another key: refit


# --- a run killed at any point resumes to the same table ------------------------------------

# Loads the model and data the test saved, runs compare and stops for good just after saving
# the results whose file name starts with `stop_after`, touching `marker` first.
CHILD = r"""
import sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import peg.utils.io
from peg.apps.compare import compare

out, stop_after, marker, given = Path(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
write = peg.utils.io.atomic_save_file

def write_then_stop(tensors, metadata, path):
    write(tensors, metadata, path)
    if Path(path).name.startswith(stop_after):
        open(marker, "w").close()
        time.sleep(600)

peg.utils.io.atomic_save_file = write_then_stop
model, val, test = torch.load(given, weights_only=False)
compare(model, val, test, METHODS, out=out, say=None, progress=False)
""".replace("METHODS", repr(METHODS))


def _run_killed(server: Server, tmp_path: Path, stop_after: str, model, data) -> Path:
    """CHILD, a process of its own (forked by conftest's `fork_server`, as `python -c` runs it),
    given the test's model and data and killed with SIGKILL once it has saved `stop_after`'s
    results: its output folder."""
    out, marker, given = tmp_path / "out", tmp_path / "marker", tmp_path / "given.pt"
    torch.save((model, data["val"], data["test"]), given)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    child = server.spawn(CHILD, str(out), stop_after, str(marker), str(given), cwd=tmp_path,
                         stderr=tmp_path / "child.err", env=env)  # fmt: skip
    deadline = time.monotonic() + 120
    while not marker.exists():
        if child.poll() is not None:
            pytest.fail(f"the child ended first: {child.error()}")
        if time.monotonic() > deadline:
            child.kill()
            pytest.fail("the child did not reach its kill point")
        time.sleep(0.005)
    os.kill(child.pid, signal.SIGKILL)
    assert child.wait() == -signal.SIGKILL
    assert not (out / "results.json").exists()
    return out


@pytest.fixture(scope="module")
def uninterrupted(model, data):
    """The run that is never killed: the table every resumed run must give."""
    return compare(model, data["val"], data["test"], METHODS, say=None, progress=False).table


@pytest.mark.parametrize("stop_after", ["000-TS", "001-PEG.", "002-PEG___TS"])
def test_a_run_killed_at_any_point_resumes_to_the_same_table(
    tmp_path, fork_server, model, data, uninterrupted, stop_after
):
    out = _run_killed(fork_server, tmp_path, stop_after, model, data)
    resumed = compare(
        model, data["val"], data["test"], METHODS, out=out, resume=True, say=None, progress=False
    )
    assert _untimed(resumed.table) == _untimed(uninterrupted)
    assert (out / "results.json").is_file()


# --- the command line -------------------------------------------------------------------------


def test_peg_compare_exits_3_when_a_method_failed(tmp_path, monkeypatch, data, capsys):
    X, y = data["val"]
    np.savez(tmp_path / "val.npz", x=X.numpy(), y=y.numpy())
    (tmp_path / "failmodel_cmp.py").write_text(
        "import torch\nfrom torch import nn\n"
        "def build():\n    torch.manual_seed(0)\n"
        "    return nn.Sequential(nn.Linear(2, 8), nn.ReLU(), nn.Linear(8, 2))\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "failmodel_cmp", raising=False)

    def broken(self, *args, **kwargs):
        raise RuntimeError("out of memory")

    monkeypatch.setattr(PEG, "fit", broken)
    argv = ["compare", "--model", "failmodel_cmp:build", "--val", "val.npz", "--test",
            "val.npz", "--methods", "TS", "PEG", "--out", "out", "--no-progress"]  # fmt: skip
    assert main(argv) == 3
    err = capsys.readouterr().err
    assert "PEG failed: RuntimeError: out of memory" in err
    assert (tmp_path / "out" / "results.json").is_file()


def _truncated_npz(tmp_path: Path) -> str:
    path = tmp_path / "val.npz"
    np.savez(path, x=np.zeros((50, 2), np.float32), y=np.zeros(50, np.int64))
    path.write_bytes(path.read_bytes()[:300])
    return str(path)


def test_a_truncated_npz_is_a_one_line_error_with_exit_2(tmp_path, monkeypatch, capsys):
    path = _truncated_npz(tmp_path)
    (tmp_path / "npzmodel_cmp.py").write_text(
        "from torch import nn\ndef build():\n    return nn.Linear(2, 2)\n"
    )
    monkeypatch.chdir(tmp_path)
    monkeypatch.delitem(sys.modules, "npzmodel_cmp", raising=False)
    with pytest.raises(SystemExit) as stopped:
        main(["compare", "--model", "npzmodel_cmp:build", "--val", path, "--test", path])
    err = capsys.readouterr().err
    assert stopped.value.code == 2 and "--val" in err and len(err.strip().splitlines()) == 1


ERROR_CASES: list[tuple[str, str, Callable[[], object], type[Exception], str]] = [
    ("compare", "resume without out",
     lambda: compare(nn.Linear(2, 2), moons(20, 0), moons(20, 1), ["TS"], resume=True, say=None),
     ValueError, r"resume: needs out="),
    ("compare", "every method left out (MC dropout, no dropout)",
     lambda: compare(nn.Linear(2, 2), moons(20, 0), moons(20, 1), ["MC dropout"], say=None),
     ValueError, r"methods: every method is left out \(MC dropout: the model has no dropout"),
]  # fmt: skip
FILE_ERROR_CASES: list[tuple[str, str, Callable[[Path], object], type[Exception], str]] = [
    ("compare", "a truncated .npz given to --val",
     lambda tmp: sources.data(_truncated_npz(tmp), "--val"),
     ValueError, r"--val: .*val\.npz is not a readable \.npz file"),
]  # fmt: skip


test_bad_input = raises_test(ERROR_CASES)
test_bad_files = raises_test(FILE_ERROR_CASES, files=True)
