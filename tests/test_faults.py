"""Faults: a writer killed mid-write leaves the previous archive intact; `peg bench` killed with
SIGKILL at several points resumes to results identical to an uninterrupted run.

The victims are real processes of their own (the code run as `python -c` runs it, one torch
thread, forked in a fresh Python's state by conftest's `fork_server`, which imported torch and peg
once) killed with SIGKILL, so no `finally`/`except` block of theirs runs: only what is on disk
counts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import time
from pathlib import Path

import pytest
import torch

import peg
from docs_run import Forked, Server
from peg.apps.bench.runner import run_spec
from peg.apps.bench.spec import parse_spec
from peg.archive import ArchiveError, read_header

from conftest import mlp, moons, run_bench

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "PYTHONHASHSEED": "0"}
POLL = 0.001  # seconds between looks at the disk
PATIENCE = 120.0  # seconds a child may take to reach its kill point


def _spawn(server: Server, code: str, *args: str, cwd: Path) -> Forked:
    return server.spawn(code, *args, cwd=cwd, stderr=cwd.parent / f"{cwd.name}.err", env=ENV)


def _kill_when(child: Forked, reached, what: str, may_finish: bool = False) -> bool:
    """SIGKILL `child` as soon as `reached()` is true and return True; fail if it exits or times
    out first. With `may_finish`, a child that ends successfully before the kill lands (the
    parent looked too late: a busy machine) returns False instead of failing."""
    deadline = time.monotonic() + PATIENCE
    while not reached():
        if child.poll() is not None:
            if may_finish and child.returncode == 0:
                return False
            pytest.fail(f"the child exited ({child.returncode}) before {what}:\n{child.error()}")
        if time.monotonic() > deadline:
            child.kill()
            child.wait()
            pytest.fail(f"the child did not reach {what} in {PATIENCE:.0f} s")
        time.sleep(POLL)
    os.kill(child.pid, signal.SIGKILL)
    child.wait()
    if may_finish and child.returncode == 0:
        return False
    assert child.returncode == -signal.SIGKILL, f"the child ended before the kill ({what})"
    return True


PROBE = r"""
import os, sys
import numpy, torch
print(os.getpid(), os.getppid(), os.getcwd(), sys.argv, os.environ.get("PROBE"),
      numpy.random.randint(2**31), torch.rand(1).item(), torch.initial_seed(), sep="|",
      file=sys.stderr)
if sys.argv[1] == "raise":
    raise RuntimeError("from the child")
if sys.argv[1] == "sleep":
    print("asleep", file=sys.stderr, flush=True)
    import time; time.sleep(600)
sys.exit(int(sys.argv[1]))
"""


def test_the_victims_are_separate_processes_as_python_c_starts_them(tmp_path, fork_server):
    """The harness: a spawned child is a process of its own, not the test's nor the server's,
    run from its folder with `python -c`'s argv and its environment, with numpy's seed drawn
    anew and torch's as a fresh Python's (drawn, or where torch has one, its fixed default); its
    exit status, an uncaught
    exception's (1, traceback on stderr) and SIGKILL's come back as `subprocess` gives them."""
    (tmp_path / "a").mkdir()
    lines = []
    for i in range(2):
        env = {**ENV, "PROBE": f"probe-{i}"}
        child = fork_server.spawn(PROBE, "3", cwd=tmp_path / "a", stderr=tmp_path / f"{i}.err",
                                  env=env)  # fmt: skip
        assert child.wait() == 3
        pid, parent, cwd, argv, probe, drawn, rand, seed = child.error().strip().split("|")
        assert int(pid) == child.pid and int(parent) == fork_server.process.pid != os.getpid()
        assert cwd == str(tmp_path / "a") and argv == "['-c', '3']" and probe == f"probe-{i}"
        lines.append((drawn, rand, int(seed)))
    assert lines[0][0] != lines[1][0]
    default = torch.Generator().initial_seed()  # a fresh torch's fixed seed, where it has one
    assert lines[0][1:] == lines[1][1:] if lines[0][2] == default else lines[0][1] != lines[1][1]
    raised = fork_server.spawn(PROBE, "raise", cwd=tmp_path, stderr=tmp_path / "r.err", env=ENV)
    assert raised.wait() == 1 and "RuntimeError: from the child" in raised.error()
    asleep = fork_server.spawn(PROBE, "sleep", cwd=tmp_path, stderr=tmp_path / "s.err", env=ENV)
    assert _kill_when(asleep, lambda: "asleep" in asleep.error(), "its sleep")
    assert asleep.returncode == -signal.SIGKILL


# --- (a) atomic archive writes -----------------------------------------------------------------

# Writes an ensemble of `members` random members of the conftest MLP to `path` and is killed:
#   "before-write": the temporary file is created, nothing written yet;
#   "mid-write": the serialised archive is written slowly, the kill comes after its first tenth;
#   "before-rename": the temporary file is written and fsynced, `os.replace` not yet called;
#   "real-write": the real writer, killed once its temporary file has bytes in it (the write
#       is faster than the parent can look, so this usually lands in the fsync). Where the kill
#       lands depends on the machine's load and disk: mid-write, in the fsync, or after the
#       rename (or the writer finishes first); the archive must then be the original or the
#       complete new one, nothing in between.
# The child touches `marker` when it reaches the kill point (not for "real-write").
WRITER = r"""
import os, sys, time
import torch
torch.set_num_threads(1)
from torch import nn
import peg, peg.utils.io
from safetensors.torch import save

path, members, stop, marker = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
skeleton = nn.Sequential(nn.Linear(2, 20), nn.ReLU(), nn.Linear(20, 2))
g = torch.Generator().manual_seed(1)
stacked = {k: torch.randn(members, *v.shape, generator=g) for k, v in skeleton.state_dict().items()}
big = peg.Ensemble(skeleton, stacked, meta={"method": "big"})

def wait(*args, **kwargs):
    open(marker, "w").close()
    time.sleep(600)

def slow_save_file(tensors, filename, metadata=None):
    data = save(tensors, metadata=metadata)
    with open(filename, "wb") as f:
        f.write(data[: len(data) // 10])
        f.flush()
        os.fsync(f.fileno())
        wait()
        f.write(data[len(data) // 10 :])

if stop == "before-write":
    peg.utils.io.save_file = wait
elif stop == "mid-write":
    peg.utils.io.save_file = slow_save_file
elif stop == "before-rename":
    os.replace = wait
big.save(path)
"""

BIG = 300_000  # members for "real-write": 300k x 102 float32 = 122 MB, a write that takes a while


@pytest.mark.parametrize("stop", ["before-write", "mid-write", "before-rename", "real-write"])
def test_a_writer_killed_mid_write_leaves_the_previous_archive_intact(tmp_path, fork_server, stop):
    X = moons(64, 3)[0]
    original = peg.Ensemble.from_models([mlp(0), mlp(1), mlp(2)], meta={"method": "original"})
    path = tmp_path / "archive"
    original.save(str(path))
    expected = original.member_logits(X)
    marker = tmp_path / "marker"
    members = BIG if stop == "real-write" else 1000
    child = _spawn(fork_server, WRITER, str(path), str(members), stop, str(marker), cwd=tmp_path)

    def temporaries() -> list[Path]:
        return sorted(tmp_path.glob(".archive.*.tmp"))

    def writing() -> bool:
        for t in temporaries():
            try:
                if t.stat().st_size > 0:
                    return True
            except FileNotFoundError:  # renamed meanwhile: the kill comes too late
                pass
        return False

    real = stop == "real-write"
    _kill_when(child, writing if real else marker.exists, stop, may_finish=real)

    leftovers = temporaries()
    assert len(leftovers) == 1 or (real and not leftovers), leftovers
    if real and not leftovers:
        # The rename came first (the kill landed after it, or the writer finished): the archive
        # at `path` is the new one, whole (a truncated file is refused with ArchiveError).
        header = read_header(path)
        assert header["members"] == members and header["meta"]["method"] == "big"
    else:
        # The archive at `path` is still the original, bit for bit in its predictions.
        loaded = peg.load(path, mlp(9))
        assert len(loaded) == 3 and loaded.meta["method"] == "original"
        assert torch.equal(loaded.member_logits(X), expected)

    # The killed writer leaves its temporary file (nothing ran to remove it). An empty or
    # truncated one is refused with ArchiveError; a complete one is the new archive, whole.
    if stop in ("before-write", "mid-write"):
        with pytest.raises(ArchiveError):
            peg.load(leftovers[0], mlp(9))
    elif stop == "before-rename":
        assert len(peg.load(leftovers[0], mlp(9))) == members
    elif leftovers:
        with contextlib.suppress(ArchiveError):  # truncated: refused; else complete
            assert read_header(leftovers[0])["members"] == members

    # A later save over the same path is unaffected by the leftover, and removes it (its
    # writer's process is gone: `peg.utils.io.remove_stale`).
    replacement = peg.Ensemble.from_models([mlp(3), mlp(4)], meta={"method": "replacement"})
    replacement.save(str(path))
    again = peg.load(path, mlp(9))
    assert len(again) == 2 and again.meta["method"] == "replacement"
    assert torch.equal(again.member_logits(X), replacement.member_logits(X))
    assert temporaries() == []  # the killed writer's removed; the new save left none


# --- (b) `peg bench` killed and resumed ----------------------------------------------------------

SPEC = {
    "name": "tiny-faults",
    "data": "digits",
    "model": {"name": "mlp", "hidden": [32]},
    "train": {"epochs": 6, "lr": 0.05, "batch_size": 64},
    "seeds": [0],
    "score_points": None,
    "methods": ["Single", "DeepEns-2", "PEG-4"],
}

# Runs SPEC and stops for good just after writing `stop_after` (the kill point), touching
# `marker` first: the parent kills it there whatever the machine's speed or load (the work after
# some kill points takes milliseconds, which a parent polling the disk could miss).
BENCH = r"""
import json, sys, time
from pathlib import Path
import torch
torch.set_num_threads(1)
import peg.utils.io
from peg.apps.bench.runner import run_spec
from peg.apps.bench.spec import parse_spec

stop_after, marker = Path(sys.argv[4]).resolve(), sys.argv[5]
write = peg.utils.io.atomic_save_file  # every cache file and checkpoint goes through it

def write_then_stop(tensors, metadata, path):
    write(tensors, metadata, path)
    if Path(path).resolve() == stop_after:
        open(marker, "w").close()
        time.sleep(600)

peg.utils.io.atomic_save_file = write_then_stop
spec = parse_spec(json.loads(sys.argv[1]))
run_spec(spec, sys.argv[2], sys.argv[3], progress=False, say=lambda s: None)
"""


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The uninterrupted run (in this process, one thread, as the children)."""
    out = tmp_path_factory.mktemp("bench-reference")
    return run_bench(parse_spec(SPEC), out)


@pytest.mark.parametrize(
    "kill_at",
    [
        "deep-ensemble/member-0.partial.safetensors",  # training member 0, after epoch 1
        "deep-ensemble/member-1.partial.safetensors",  # member 0 done, member 1 after epoch 1
        "logits/Single/test.safetensors",  # the first method's logits cached
        "logits/PEG-4/build.safetensors",  # PEG built, its logits not yet written
    ],
)
def test_bench_killed_at_any_point_resumes_to_identical_results(
    tmp_path, fork_server, reference, kill_at
):
    out, cache, marker = tmp_path / "out", tmp_path / "cache", tmp_path / "marker"
    seed_dir = cache / SPEC["name"] / "seed-0"
    args = (json.dumps(SPEC), str(out), str(cache), str(seed_dir / kill_at), str(marker))
    child = _spawn(fork_server, BENCH, *args, cwd=tmp_path)
    _kill_when(child, marker.exists, kill_at)
    assert (seed_dir / kill_at).exists()
    assert not (out / SPEC["name"] / "results.json").exists()  # killed before the end
    assert not (seed_dir / "logits" / "PEG-4" / "test.safetensors").exists()  # work left to do

    resumed = run_spec(parse_spec(SPEC), out, cache, progress=False, say=lambda _: None)
    assert resumed["datasets"] == reference["datasets"]
    assert resumed["per_seed"] == reference["per_seed"]
    saved = json.loads((out / SPEC["name"] / "results.json").read_text())
    assert saved["datasets"] == reference["datasets"]
