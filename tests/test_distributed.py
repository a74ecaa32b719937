"""`peg.distributed` on CPU: 2 processes over gloo give what one process gives, bit for bit.

(a) `member_logits` shards batches and equals the single-process tensor, and the kernels the
ranks ran had the shapes one process ran (so the equality holds by construction, on any CPU);
(b) `torchrun ... peg bench SPEC.yaml` with 2 ranks writes the results of one process;
(c) a rank raising part-way stops every rank with an error naming it, and no results are written.
The ranks are real processes of their own (one torch thread each): (a) and (c) run in one pair
launched by hand with torchrun's environment variables (forked, as `python -c` runs them, by
conftest's `fork_server`, which imported torch and peg once), (b) through the torchrun launcher
itself.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import torch
import yaml
from safetensors.torch import load_file
from torch.utils._python_dispatch import TorchDispatchMode

import peg
from docs_run import Server
from peg import distributed, models
from peg.apps.bench.runner import run_spec, work_units
from peg.apps.bench.spec import parse_spec
from peg.methods._predictors import member_logits_of

from conftest import mlp, moons

TESTS = Path(__file__).resolve().parent
LAUNCHER_VARS = (
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
)
ENV = {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS} | {
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
    "PYTHONHASHSEED": "0",
    "PEG_DIST_TIMEOUT": "90",
}
PATIENCE = 120  # seconds a launch may take before the test gives up on it
BATCH = 64

SPEC = {
    "name": "tiny-dist",
    "data": "digits",
    "model": {"name": "mlp", "hidden": [16]},
    "train": {"epochs": 3, "lr": 0.05, "batch_size": 64},
    "swa": {
        "epochs": 4,
        "lr": 0.05,
        "batch_size": 64,
        "schedule": "swa",
        "swa_start": 2,
        "swa_lr": 0.01,
    },
    "seeds": [0, 1],
    "score_points": None,
    "swag_samples": 3,
    "methods": ["Single", "Temp-scaled", "PEG-4", "SWA", {"name": "MC-Dropout-3", "insert": 0.1}],
    "shift": {"rotations": [30]},
}


# Kernels whose result bits can depend on the shapes they run on (the CPU picks the blocking or
# the oneDNN implementation by shape and instruction set).
SHAPED_KERNELS = {
    "convolution", "addmm", "mm", "bmm", "baddbmm", "matmul", "linear", "sum", "mean",
    "_softmax", "_log_softmax", "native_batch_norm", "_native_batch_norm_legit_no_training",
    "native_layer_norm", "native_group_norm",
}  # fmt: skip


class KernelTrace(TorchDispatchMode):
    """Counts `(kernel, argument shapes and options)` of every shape-sensitive aten call."""

    def __init__(self) -> None:
        super().__init__()
        self.calls: Counter[str] = Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func.overloadpacket.__name__
        if name in SHAPED_KERNELS:
            described = [tuple(a.shape) if isinstance(a, torch.Tensor) else a for a in args]
            self.calls[repr((name, described))] += 1
        return func(*args, **(kwargs or {}))


def traced(compute) -> tuple[torch.Tensor, Counter[str]]:
    """`compute()` and the shaped kernels it ran, after one untraced call that fills the
    per-architecture caches of `auto` (FLOP count, folding check) as any first call does."""
    compute()
    with KernelTrace() as trace:
        out = compute()
    return out, trace.calls


def cnn(seed: int) -> torch.nn.Module:
    """A small CNN whose members vmap and a loop predict a few ulps apart."""
    torch.manual_seed(seed)
    net = models.build("small-cnn", num_classes=3, in_channels=1, width=4)
    with torch.no_grad():
        for p in net.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return net.eval()


class Counted(torch.utils.data.Dataset):
    """Items of a tensor, each read recorded: which points a rank read."""

    def __init__(self, X: torch.Tensor) -> None:
        self.X = X
        self.read: list[int] = []

    def __len__(self) -> int:
        return len(self.X)

    def __getitem__(self, i: int) -> torch.Tensor:
        self.read.append(int(i))
        return self.X[i]


def predictors() -> dict[str, tuple[object, Any]]:
    """Name → (predictor, inputs) compared (built the same way in every process)."""
    X, y = moons(300, 3)
    images = torch.rand(150, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    ensemble = peg.Ensemble.from_models([mlp(s, classes=3) for s in range(5)])
    return {
        "ensemble-5": (ensemble, X),  # members 0, 2, 4 on rank 0 and 1, 3 on rank 1
        # one member per rank, which must be vectorised as the pair is, not looped
        "cnn-ensemble-2": (peg.Ensemble.from_models([cnn(0), cnn(1)]), images),
        "module": (mlp(7), X),  # 5 batches of 64 rows: 0, 2, 4 on rank 0 and 1, 3 on rank 1
        "temperature": (peg.TemperatureScaling().fit(ensemble, (X, y)), X),  # batches
        "mc-dropout": (peg.MCDropout(n_members=3, seed=0, insert=0.2).fit(mlp(8)), X),  # whole
        # read by index: each rank reads the items of its own batches only
        "loader": (ensemble, torch.utils.data.DataLoader(Counted(X), batch_size=BATCH)),
    }


# Rank RANK of 2: (a) writes its distributed member logits and the kernels they ran, then (c)
# runs a bench in which rank 1 fails while building PEG-4 for seed 1 (in the first round; SWA
# would come in the second).
WORKER = r"""
import json, os, sys
import torch
torch.set_num_threads(1)
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from safetensors.torch import save_file
from peg import distributed
from peg.apps.bench import runner
from peg.apps.bench.spec import parse_spec
from test_distributed import BATCH, predictors, traced

out = Path(sys.argv[2])
rank, size = distributed.world()
assert size == 2, size
logits, kernels = {}, {}
for name, (p, X) in predictors().items():
    logits[name], kernels[name] = traced(lambda: distributed.member_logits(p, X, BATCH))
    if name == "loader":  # the points this rank read in the traced call (after the warm-up)
        read = X.dataset.read[len(X.dataset.read) // 2 :]
save_file(logits, str(out / f"logits-{rank}.safetensors"))
(out / f"kernels-{rank}.json").write_text(json.dumps(kernels))
(out / f"read-{rank}.json").write_text(json.dumps(read))

build = runner.SeedRun.build
def failing(self, method):
    if rank == 1 and method.name == "PEG-4":
        raise ValueError("injected failure")
    return build(self, method)
runner.SeedRun.build = failing
runner.run_spec(parse_spec(json.loads(sys.argv[3])), out, out / "cache", progress=False,
                say=lambda s: None)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch(
    server: Server, code: str, *args: str, cwd: Path, size: int = 2
) -> list[tuple[int, str]]:
    """Run `python -c code args` as ranks 0..size-1 of a gloo group, each a process of its own
    forked by conftest's `fork_server`: (exit code, stderr) each."""
    port = str(_free_port())
    ranks = [
        server.spawn(code, *args, cwd=cwd, stderr=cwd / f"rank-{r}.err",
                     env=ENV | {"RANK": str(r), "WORLD_SIZE": str(size), "LOCAL_RANK": str(r),
                                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
        for r in range(size)
    ]  # fmt: skip
    try:
        codes = [p.wait(PATIENCE) for p in ranks]
        return [(c, p.error(last=100_000)) for c, p in zip(codes, ranks, strict=True)]
    finally:
        for p in ranks:
            if p.poll() is None:
                p.kill()
                p.wait()


@pytest.fixture(scope="module")
def launched(tmp_path_factory, fork_server):
    out = tmp_path_factory.mktemp("ranks")
    return out, _launch(fork_server, WORKER, str(TESTS), str(out), json.dumps(SPEC), cwd=out)


def test_one_process_is_rank_0_of_1():
    assert distributed.world() == (0, 1)
    assert distributed.guarded(lambda: 3) == [3]
    X = moons(50, 0)[0]
    assert torch.equal(distributed.member_logits(mlp(7), X), member_logits_of(mlp(7), X))


def test_an_ensemble_subset_predicts_its_members():
    ensemble, X = predictors()["ensemble-5"]
    part = ensemble.subset([4, 1])
    assert len(part) == 2 and part.meta == ensemble.meta
    assert torch.equal(part.stacked["0.weight"], ensemble.stacked["0.weight"][[4, 1]])
    # 2 members folded together vs 5: other kernel shapes, equal only to rounding on some CPUs
    torch.testing.assert_close(
        part.member_logits(X, BATCH), ensemble.member_logits(X, BATCH)[[4, 1]], rtol=1e-5, atol=1e-6
    )
    with pytest.raises(IndexError, match="indices"):
        ensemble.subset([5])
    with pytest.raises(ValueError, match="indices"):
        ensemble.subset([])


def test_member_logits_on_two_ranks_equal_one_process_bit_for_bit(launched):
    out, statuses = launched
    named = predictors()
    for rank in (0, 1):
        path = out / f"logits-{rank}.safetensors"
        assert path.exists(), f"rank {rank} wrote no logits:\n{statuses[rank][1][-3000:]}"
        got = load_file(str(path))
        assert set(got) == set(named)
        for name, (predictor, X) in named.items():
            assert torch.equal(got[name], member_logits_of(predictor, X, BATCH)), (rank, name)


def test_ranks_run_the_kernel_shapes_one_process_runs(launched):
    """Bit-identity by construction: no rank ran a shape-sensitive kernel on shapes (or with
    options, e.g. convolution groups) that one process does not run, and together they ran
    everything one process runs; so no CPU can make them differ. Sharding by members fails this
    anywhere: a member folded alone is a convolution with `out` channels and groups=1, the pair
    one with 2·out channels and groups=2."""
    out, _ = launched
    ranks = [json.loads((out / f"kernels-{rank}.json").read_text()) for rank in (0, 1)]
    for name, (predictor, X) in predictors().items():
        _, one = traced(lambda p=predictor, X=X: member_logits_of(p, X, BATCH))
        assert one, name  # the trace saw the model's kernels
        shares = [Counter(r[name]) for r in ranks]
        assert all(shares), name  # both ranks worked
        for share in shares:
            assert not share - one, (name, share - one)  # nothing one process does not run
        assert not one - (shares[0] + shares[1]), name  # and all of what it runs


def test_a_loader_is_read_by_index_each_rank_its_own_batches(launched):
    out, _ = launched
    read = [json.loads((out / f"read-{rank}.json").read_text()) for rank in (0, 1)]
    # 300 points in batches of 64: batches 0, 2, 4 on rank 0, batches 1, 3 on rank 1
    assert read[0] == [*range(0, 64), *range(128, 192), *range(256, 300)]
    assert read[1] == [*range(64, 128), *range(192, 256)]


def test_the_kernel_trace_tells_members_folded_alone_from_members_folded_together():
    """The check above can fail: one member folded alone differs from the pair folded."""
    ensemble, images = predictors()["cnn-ensemble-2"]
    _, together = traced(lambda: ensemble.member_logits(images, BATCH, strategy="folded"))
    _, alone = traced(
        lambda: torch.cat(
            [ensemble.subset([i]).member_logits(images, BATCH, strategy="folded") for i in (0, 1)]
        )
    )
    assert together and alone and together != alone


def test_a_rank_failing_part_way_stops_every_rank_and_writes_no_results(launched):
    out, statuses = launched
    for rank, (code, err) in enumerate(statuses):
        # 1: the RankFailure raised; now and then -6: a SIGABRT in the C++ teardown of gloo's
        # threads after it was raised (the group is left first), which torchrun reports alike
        assert code in (1, -6), f"rank {rank} exited with {code}:\n{err[-3000:]}"
        assert "RankFailure: rank 1 of 2 failed" in err, err[-3000:]
        assert "seed 1, Single, Temp-scaled, PEG-4, MC-Dropout-3: ValueError: injected" in err
    assert "ValueError: injected failure" in statuses[1][1]  # the original, chained
    # no results.json, no results.md (the folder is claimed, marked as peg bench's, before)
    assert not any((out / SPEC["name"] / name).exists() for name in ("results.json", "results.md"))
    seeds = out / "cache" / SPEC["name"]
    assert (seeds / "seed-0" / "logits" / "PEG-4" / "test.safetensors").exists()  # rank 0's unit
    assert (seeds / "seed-1" / "logits" / "Single" / "test.safetensors").exists()  # before PEG-4
    assert not (seeds / "seed-0" / "logits" / "SWA").exists()  # the next round never started


def test_work_units_group_methods_sharing_a_training():
    spec = parse_spec({**SPEC, "methods": [*SPEC["methods"], "Packed-(2,2,1)", "SWAG"]})
    units = [(seed, [m.name for m in methods]) for seed, methods in work_units(spec)]
    deep = ["Single", "Temp-scaled", "PEG-4", "MC-Dropout-3"]
    assert units == [
        (0, deep),
        (1, deep),
        (0, ["SWA", "SWAG"]),
        (1, ["SWA", "SWAG"]),
        (0, ["Packed-(2,2,1)"]),
        (1, ["Packed-(2,2,1)"]),
    ]


def test_torchrun_peg_bench_on_two_ranks_writes_the_results_of_one_process(tmp_path):
    reference = run_spec(
        parse_spec(SPEC), tmp_path / "one", tmp_path / "one-cache", progress=False, say=print
    )
    spec_file = tmp_path / "tiny.yaml"
    spec_file.write_text(yaml.safe_dump(SPEC))
    # a rendezvous on a free port (--standalone's fixed 29400 collides with other launches);
    # `-m peg.apps` is the `peg` command run by this interpreter (`python -m peg.apps bench`)
    command = [sys.executable, "-m", "torch.distributed.run", "--rdzv-backend", "c10d"]
    command += ["--rdzv-endpoint", f"localhost:{_free_port()}", "--nnodes", "1"]
    command += ["--nproc-per-node", "2", "-m", "peg.apps", "bench", str(spec_file)]
    command += ["--out", "two"]
    command += ["--cache", "two-cache", "--no-progress"]
    done = subprocess.run(
        command, cwd=tmp_path, env=ENV, capture_output=True, text=True, timeout=PATIENCE
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert "terminate called" not in done.stderr  # every rank left its group before exiting
    assert "rank 0: seed 0" in done.stdout and "rank 1: seed 1" in done.stdout
    saved = json.loads((tmp_path / "two" / SPEC["name"] / "results.json").read_text())
    assert saved["per_seed"] == reference["per_seed"]
    assert saved["datasets"] == reference["datasets"]
    assert (tmp_path / "two" / SPEC["name"] / "results.md").exists()
