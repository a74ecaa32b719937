"""Shared fixtures: small, fast models and data (seconds, not minutes)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from sklearn.datasets import make_moons
from torch import nn

from docs_run import Server

CUDA = torch.cuda.is_available()
if not CUDA:
    # registers `fakegpu` before autograd's engine starts (its device queues are sized then).
    # Never beside CUDA: a second accelerator backend breaks autograd's streams there
    # ("opt_ready_stream && opt_parent_stream INTERNAL ASSERT FAILED") and pinned memory.
    from fake_gpu import fake_gpu

# The test models are tiny: one thread is faster than two and immune to a busy machine.
torch.set_num_threads(1)


def run_bench(spec: Any, out: Path) -> dict[str, Any]:
    """`peg bench` of a parsed spec into `out` (cache `out/cache`), without progress or output."""
    from peg.apps.bench.runner import run_spec

    return run_spec(spec, out, out / "cache", progress=False, command="test", say=lambda _: None)


def moons(n: int, seed: int, noise: float = 0.25) -> tuple[torch.Tensor, torch.Tensor]:
    X, y = make_moons(n_samples=n, noise=noise, random_state=seed)
    return torch.tensor(X, dtype=torch.float32), torch.tensor(y, dtype=torch.int64)


def mlp(seed: int = 0, hidden: int = 20, classes: int = 2) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(2, hidden), nn.ReLU(), nn.Linear(hidden, classes))


def overfit(model: nn.Module, X: torch.Tensor, y: torch.Tensor, steps: int = 1500) -> nn.Module:
    """Full-batch Adam without regularisation: an over-confident base model."""
    opt = torch.optim.Adam(model.parameters(), lr=0.02)
    for _ in range(steps):
        opt.zero_grad()
        nn.functional.cross_entropy(model(X), y).backward()
        opt.step()
    return model.eval()


class BNNet(nn.Module):
    """A tiny net with BatchNorm and dropout, to check eval-mode handling."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Linear(2, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Dropout(0.5), nn.Linear(16, 3)
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)


@pytest.fixture(scope="session")
def moons_data() -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
    return {"train": moons(200, 0), "val": moons(600, 1), "test": moons(1000, 2)}


@pytest.fixture(scope="session")
def overfit_mlp(moons_data) -> nn.Module:
    return overfit(mlp(0), *moons_data["train"])


@pytest.fixture()
def bn_net() -> BNNet:
    torch.manual_seed(0)
    net = BNNet()
    net.train()
    with torch.no_grad():  # give BatchNorm non-trivial running statistics
        for _ in range(5):
            net(torch.randn(64, 2) * 3 + 1)
    return net.eval()


@pytest.fixture(autouse=True)
def _seed() -> None:
    torch.manual_seed(0)
    np.random.seed(0)


@pytest.fixture()
def gpu():
    """The second device: CUDA where there is one (TF32 off), `fakegpu` elsewhere
    (tests/fake_gpu.py: CUDA's placement rules, the CPU's numbers)."""
    if CUDA:
        before = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False
        yield torch.device("cuda", torch.cuda.current_device())  # as tensors report it
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = before
        return
    with fake_gpu() as device:
        yield device


@pytest.fixture(scope="session")
def fork_server(tmp_path_factory) -> Iterator[Server]:
    """A Python that imported torch, numpy and peg once (tests/docs_run.py), forking the fault
    tests' victims (`fork_server.spawn(code, *args, ...)`, as `python -c` runs them): each a
    separate process in a fresh Python's state, without the seconds of imports each paid. Its
    hash seed is 0 (PYTHONHASHSEED, as the victims' environment said)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
    server = Server(tmp_path_factory.mktemp("fork-server") / "server.log", env)
    yield server
    server.close()
