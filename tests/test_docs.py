"""The README's Python examples run as written (on two-moons data and tiny models)."""

from __future__ import annotations

import re
from pathlib import Path

import torch

from peg.train import Recipe, Snapshots, train

from conftest import mlp, overfit

README = Path(__file__).resolve().parents[1] / "README.md"


def _python_blocks() -> list[str]:
    return re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)


def test_the_readme_has_python_examples():
    assert len(_python_blocks()) >= 2


def test_readme_examples_run(moons_data, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the examples write archives and checkpoints
    X_train, y_train = moons_data["train"]
    model = overfit(mlp(0), X_train, y_train, steps=300)
    snapshots = Snapshots(after=4)
    train(mlp(3), moons_data["train"], Recipe(epochs=10, batch_size=32), callbacks=[snapshots])
    X, y = moons_data["test"]
    namespace = {
        "model": model,
        "val": moons_data["val"],
        "train": moons_data["train"],
        "X": X,
        "X_test": X,
        "y_test": y,
        "m1": mlp(1),
        "m2": mlp(2),
        "m3": mlp(3),
        "make_model": lambda: mlp(4),
        "snapshots": snapshots,
    }
    for block in _python_blocks():
        exec(compile(block, str(README), "exec"), namespace)
    assert namespace["ens"].member_logits(X).shape == (15, len(X), 2)
    torch.testing.assert_close(
        namespace["ens2"].predict_proba(X), namespace["ens"].predict_proba(X)
    )
