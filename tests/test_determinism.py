"""Same seed → bit-identical members and metrics: twice in one process and in two fresh processes.

DeepEnsemble (trained), PEG and PEP (η and σ searched) on a tiny MLP, one torch thread, on CPU.
The members are compared through their saved archives (`torch.equal` on every tensor, then the
files byte for byte; PEG/PEP's default recipe archives too) and the metrics with `==`. See
docs/determinism.md for what is not covered.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open
from torch import nn

import peg
from peg import metrics
from peg.train import Recipe

from conftest import moons

TESTS = Path(__file__).resolve().parent
METHODS = ("deep-ensemble", "peg", "pep")
RECIPES = ("peg", "pep")  # also saved as recipes (their default archive)
SEED = 3


def _net() -> nn.Module:
    """The architecture, unseeded: DeepEnsemble seeds each member's initialisation itself."""
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Linear(16, 2))


def build(out: str | Path, seed: int = SEED) -> dict[str, dict[str, Any]]:
    """Fit the three methods with `seed`, save their ensembles under `out`, return the metrics."""
    torch.set_num_threads(1)
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    train, val, (X, y) = moons(200, 0), moons(300, 1), moons(300, 2)
    recipe = Recipe(epochs=3, lr=0.05, batch_size=32)
    fitted: dict[str, Any] = {}
    fitted["deep-ensemble"] = peg.DeepEnsemble(n_members=2, recipe=recipe, seed=seed).fit(
        _net, train
    )
    base = fitted["deep-ensemble"].ensemble().member_model(0)
    fitted["peg"] = peg.PEG(n_members=4, grad_batch_size=32, eta="search", seed=seed).fit(base, val)
    fitted["pep"] = peg.PEP(n_members=4, sigma="search", seed=seed).fit(base, val)
    results = {}
    for name, method in fitted.items():
        method.ensemble().save(str(out / f"{name}.safetensors"))  # the members themselves
        if name in RECIPES:  # and what PEG/PEP save by default: base weights + recipe
            method.save(str(out / f"{name}-recipe.safetensors"))
        results[name] = metrics.classification_metrics(method.member_logits(X), y)
    results["peg"]["eta"] = fitted["peg"].eta_
    results["pep"]["sigma"] = fitted["pep"].sigma_
    (out / "metrics.json").write_text(json.dumps(results))
    return results


def _tensors(path: Path) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    with safe_open(str(path), framework="pt") as f:
        return {k: f.get_tensor(k) for k in f.keys()}, dict(f.metadata())  # noqa: SIM118


def _assert_same_members(a: Path, b: Path) -> None:
    """The archives of every method under `a` and `b` hold bit-identical tensors and headers."""
    for name in (*METHODS, *(f"{m}-recipe" for m in RECIPES)):
        file_a, file_b = a / f"{name}.safetensors", b / f"{name}.safetensors"
        (ta, ha), (tb, hb) = _tensors(file_a), _tensors(file_b)
        assert ta.keys() == tb.keys(), name
        for k in ta:
            assert ta[k].dtype == tb[k].dtype and torch.equal(ta[k], tb[k]), (name, k)
        assert json.loads(ha["peg"]) == json.loads(hb["peg"]), name
        assert file_a.read_bytes() == file_b.read_bytes(), name


def test_same_seed_same_members_and_metrics_in_one_process(tmp_path):
    first = build(tmp_path / "a")
    torch.manual_seed(12345)  # the global RNG state must not matter
    second = build(tmp_path / "b")
    assert first == second
    _assert_same_members(tmp_path / "a", tmp_path / "b")


def test_another_seed_gives_other_members(tmp_path):
    """The control: the comparisons above can fail."""
    a, b = build(tmp_path / "a"), build(tmp_path / "b", seed=SEED + 1)
    for name in METHODS:
        assert a[name]["nll"] != b[name]["nll"], name
        ta, _ = _tensors(tmp_path / "a" / f"{name}.safetensors")
        tb, _ = _tensors(tmp_path / "b" / f"{name}.safetensors")
        assert any(not torch.equal(ta[k], tb[k]) for k in ta), name


def test_same_seed_same_members_and_metrics_in_two_fresh_processes(tmp_path):
    """Two interpreters (different hash seeds) and this one agree bit for bit."""
    code = f"import sys; sys.path.insert(0, {str(TESTS)!r}); import test_determinism as t; "
    code += "t.build(sys.argv[1])"
    children = []
    for hash_seed in ("1", "2"):
        env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
        env["PYTHONHASHSEED"] = hash_seed
        out = tmp_path / f"process-{hash_seed}"
        cmd = [sys.executable, "-c", code, str(out)]
        children.append((out, subprocess.Popen(cmd, cwd=tmp_path, env=env, stderr=subprocess.PIPE)))
    here = build(tmp_path / "here")
    for _, child in children:
        _, err = child.communicate(timeout=300)
        assert child.returncode == 0, err.decode(errors="replace")[-2000:]
    one, two = (json.loads((out / "metrics.json").read_text()) for out, _ in children)
    assert one == two
    _assert_same_members(children[0][0], children[1][0])
    assert json.loads(json.dumps(here)) == one  # JSON round-trips floats exactly
    _assert_same_members(tmp_path / "here", children[0][0])
