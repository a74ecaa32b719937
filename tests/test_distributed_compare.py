"""`peg.compare` under torchrun: 2 ranks over gloo share the predictions (each rank its batches,
`peg.distributed.member_logits`) and give the table one process gives, metric for metric; only
rank 0 writes the results. Launched by hand with torchrun's environment variables, as in
tests/test_distributed.py (one torch thread per rank)."""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import peg
from peg.apps.compare import method
from test_distributed import TESTS, _launch

from conftest import moons

WORKER = r"""
import json, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from peg import distributed
from test_distributed_compare import compared, numbers

out = Path(sys.argv[2])
rank, size = distributed.world()
assert size == 2, size
result = compared(out / "results")
(out / f"table-{rank}.json").write_text(json.dumps(numbers(result)))
distributed.end_process(0)
"""


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(2, 16), nn.ReLU(), nn.Dropout(0.2), nn.Linear(16, 2)).eval()


def compared(out: Path | None = None) -> peg.compare:
    """The comparison both launches run: tensors for val, a loader for test (Tapped labels),
    batches of 32 so that each rank predicts several."""
    test = DataLoader(TensorDataset(*moons(100, 2)), batch_size=32)
    methods = [
        "Model",
        "TS",
        method("PEG", "peg", eta=0.05, n_members=4, grad_batch_size=16),
        method("MC dropout", "mc-dropout", n_members=3),
        method("Last-layer PEG", "peg", params="last_layer", n_members=4, grad_batch_size=16),
    ]
    return peg.compare(
        net(), moons(120, 1), test, methods, batch_size=32, say=None, progress=False, out=out
    )


def numbers(result) -> list[dict[str, float]]:
    """Every row's metrics and costs but the timed ones."""
    timed = {"fit_seconds", "predict_seconds"}
    return [
        {k: v for k, v in row.items() if k not in timed and isinstance(v, (int, float, str))}
        for row in result.table
    ]


def test_compare_on_two_ranks_gives_the_table_of_one_process(tmp_path, fork_server):
    statuses = _launch(fork_server, WORKER, str(TESTS), str(tmp_path), cwd=tmp_path)
    one = numbers(compared())
    for rank in (0, 1):
        path = tmp_path / f"table-{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing:\n{statuses[rank][1][-3000:]}"
        got = json.loads(path.read_text())
        assert [r["method"] for r in got] == [r["method"] for r in one]
        for a, b in zip(got, one, strict=True):
            for k, v in b.items():
                same = v == a[k] or (isinstance(v, float) and math.isnan(v) and math.isnan(a[k]))
                assert same, (rank, a["method"], k, a[k], v)
    written = sorted(p.name for p in (tmp_path / "results").iterdir())
    assert "results.json" in written  # by rank 0 alone (rank 1 writing too would race it)
