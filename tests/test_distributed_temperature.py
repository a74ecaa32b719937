"""The streamed temperature fit under `torch.distributed` (gloo, CPU): 2 ranks, each passing its
own shard of the batches, all-reduce each pass's sums and return the temperature one process
gets on every batch (to 1e-6: the sums are added in another order)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from peg.methods.calibration._streamed import fit_temperature_streamed
from test_distributed import _launch

TESTS = Path(__file__).resolve().parent

# Rank RANK of 2 fits on batches RANK, RANK + 2, ... (its shard) and writes its T.
WORKER = r"""
import json, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from peg import distributed
from peg.methods.calibration._streamed import fit_temperature_streamed
from test_distributed_temperature import shard

rank, size = distributed.world()
assert size == 2, size
t = fit_temperature_streamed(lambda: shard(rank, size), class_dim=1, ignore_index=255)
Path(sys.argv[2], f"t-{rank}.json").write_text(json.dumps(t))
"""


def batches() -> list[tuple[torch.Tensor, torch.Tensor]]:
    """7 batches of segmentation logits `[2, 4, 12, 16]`, labels drawn at T = 1.5, a border
    labelled 255 (ignored)."""
    g = torch.Generator().manual_seed(0)
    out = []
    for _ in range(7):
        z = 2 * torch.randn(2, 4, 12, 16, generator=g)
        probs = (z / 1.5).movedim(1, -1).softmax(-1).reshape(-1, 4)
        y = torch.multinomial(probs, 1, generator=g).reshape(2, 12, 16)
        y[:, :2] = 255
        out.append((z, y))
    return out


def shard(rank: int, size: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """The batches rank `rank` of `size` reads (unequal shards: 4 and 3 batches)."""
    return batches()[rank::size]


def test_two_ranks_fit_the_temperature_of_one_process(tmp_path, fork_server):
    statuses = _launch(fork_server, WORKER, str(TESTS), str(tmp_path), cwd=tmp_path)
    one = fit_temperature_streamed(batches, class_dim=1, ignore_index=255)
    alone = fit_temperature_streamed(lambda: shard(0, 2), class_dim=1, ignore_index=255)
    assert alone != pytest.approx(one, rel=1e-4)  # a shard alone gives another T
    for rank in (0, 1):
        path = tmp_path / f"t-{rank}.json"
        assert path.exists(), f"rank {rank} wrote nothing:\n{statuses[rank][1][-3000:]}"
        assert json.loads(path.read_text()) == pytest.approx(one, rel=1e-6)
