"""Beyond one machine: the process group, sharded member logits, and a failure protocol.

Launched with `torchrun --nproc-per-node N script.py` (or `torchrun ... --no-python peg bench
SPEC.yaml`), every process ("rank") runs the same program; torchrun describes the group in the
environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT). `world()` joins that group on first use
(gloo, so it works on CPU); without those variables everything runs as one process, unchanged.

    logits = peg.distributed.member_logits(ens, X)   # [M, N, C] on every rank, work split

Sharding never changes a number: each rank computes whole batches of exactly the rows one
process would use, every member on them, with the same code, strategy and kernel shapes, so the
gathered tensor equals the single-process one bit for bit (same machine kind, thread count and
library versions; see docs/determinism.md).

Failures: every collective of this module goes through `guarded`, which shares each rank's
outcome. If one rank raises, all ranks raise a `RankFailure` naming it and its error, instead of
waiting forever for it. A rank that dies outright (killed, segfault) is caught by torchrun, which
stops the others; a rank that hangs is given up on after the group's timeout (`PEG_DIST_TIMEOUT`
seconds, default 7200: long enough for one rank to wait while another finishes a long unit).
"""

from __future__ import annotations

import atexit
import os
import sys
from collections.abc import Callable, Iterator
from datetime import timedelta
from typing import Any, NoReturn, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor, nn

from peg.ensemble import Ensemble
from peg.errors import RankFailure
from peg.methods._predictors import logits_and_labels, member_logits_of
from peg.methods.base import FittedEnsemble, ModulePredictor, SampledPredictor, is_fitted
from peg.methods.calibration._calibrator import Calibrator
from peg.source import Data, Source, Tapped
from peg.source._values import check_labels
from peg.source.batches import BatchFn, check_batch_fn, split_batch

T = TypeVar("T")
TIMEOUT_ENV = "PEG_DIST_TIMEOUT"
DEFAULT_TIMEOUT = 7200.0  # seconds a rank waits for the others in one collective
_state = {"owned": False, "left": False}  # whether `init` created the group, and it was left

__all__ = [
    "RankFailure",
    "end_process",
    "guarded",
    "init",
    "joined",
    "member_logits",
    "shutdown",
    "world",
]


def init(backend: str = "gloo", timeout: float | None = None) -> bool:
    """Join the process group torchrun describes, once; True when a group of >1 ranks is active.

    Idempotent: a group already initialised (by this function or by the caller, e.g. with
    "nccl") is used as it is. Without torchrun's variables (WORLD_SIZE unset or 1) nothing is
    initialised and the answer is False. A group this function creates is left (`shutdown`)
    after a `RankFailure` or at exit, and not joined again in the same process.

    Args:
        backend: "gloo" (CPU, works everywhere) or "nccl" (GPUs; set the device first).
        timeout: seconds a rank waits in a collective before giving up (default:
            `$PEG_DIST_TIMEOUT`, else 7200).
    """
    if not dist.is_available():
        return False
    if dist.is_initialized():
        return dist.get_world_size() > 1
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if _state["left"]:
        raise RuntimeError(
            "peg.distributed: this process left its group (after a RankFailure, or shutdown()); "
            "a group is joined once per run: start a new torchrun"
        )
    seconds = float(os.environ.get(TIMEOUT_ENV, DEFAULT_TIMEOUT)) if timeout is None else timeout
    dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=seconds))
    _state["owned"] = True
    # a gloo group still alive at interpreter exit can abort the process (SIGABRT, "terminate
    # called without an active exception") when its threads are torn down with the interpreter
    atexit.register(shutdown)
    return True


def shutdown() -> None:
    """Leave the group `init` created (a no-op otherwise): at exit, or after a `RankFailure`."""
    if _state["owned"] and dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
        _state["owned"], _state["left"] = False, True


def joined() -> bool:
    """Whether this process joined a group through `init` (and may still hold gloo's threads)."""
    return _state["owned"] or _state["left"]


def end_process(status: int) -> NoReturn:
    """End a process that joined a group: leave it, flush, and exit with `status` at once.

    Interpreter teardown after a gloo group can abort the process ("terminate called without
    an active exception", SIGABRT) when a C++ thread of the group or its store is destroyed
    still joinable; leaving the group first (`shutdown`) makes that rare, not impossible: it
    was seen in about 1 run of `torchrun ... peg bench` in 10 with both cores busy. Nothing is
    left to do after the command's last write (results are written atomically and flushed),
    so the command line ends here with `os._exit`, skipping a teardown that can only fail.
    """
    shutdown()
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


def world() -> tuple[int, int]:
    """(rank, world size) of this process: (0, 1) without a group (see `init`)."""
    if not init():
        return 0, 1
    return dist.get_rank(), dist.get_world_size()


def guarded(fn: Callable[[], T], what: str = "") -> list[T]:
    """Run `fn()` on this rank and gather every rank's return value, in rank order.

    A collective: every rank calls it the same number of times. An exception in `fn` is caught
    and shared; then every rank raises a `RankFailure` naming each failed rank, `what` it was
    doing and its error (chained to the original on the rank that raised it). Values travel by
    pickle (`all_gather_object`): keep them small, tensors on the CPU. With one process this is
    `[fn()]` and exceptions propagate unchanged.
    """
    size = world()[1]
    if size == 1:
        return [fn()]
    error: Exception | None = None
    try:
        outcome: tuple[str | None, Any] = (None, fn())
    except Exception as e:
        error = e
        outcome = (f"{what + ': ' if what else ''}{type(e).__name__}: {e}", None)
    gathered: list[Any] = [None] * size
    dist.all_gather_object(gathered, outcome)
    failures = {r: message for r, (message, _) in enumerate(gathered) if message is not None}
    if failures:
        shutdown()  # every rank is here, none will use the group again: leave it together
        raise RankFailure(failures, size) from error
    return [value for _, value in gathered]


# ------------------------------------------------------------------------- sharded prediction
def _row_wise(predictor: Any) -> bool:
    """Whether a row's outputs do not depend on how the inputs are cut into batches."""
    if isinstance(predictor, SampledPredictor):
        return False  # its randomness is keyed by the batch index
    return isinstance(predictor, (Ensemble, FittedEnsemble, ModulePredictor, nn.Module))


def _own_batches(
    X: Data, batch_size: int, batch_fn: BatchFn | None, rank: int, size: int
) -> Iterator[Any]:
    """The inputs of batches j = rank, rank + size, ... of `X`, as one process cuts them.

    Where the batches are known in advance — a map-style Dataset (cut into `batch_size` items),
    or a DataLoader reading its dataset in index order — each rank reads only its own items, by
    index, and collates them as the loader would: no rank reads the whole data set. Otherwise
    (a shuffling or custom sampler, an IterableDataset) every rank reads the stream in order
    and keeps its batches. Tensors are sliced, which reads nothing.
    """
    source = Source.of(X, batch_fn)
    by_index = source.by_index(batch_size)
    if by_index is None:
        for j, x in enumerate(source.inputs(batch_size)):
            if j % size == rank:
                yield x
        return
    count, batch = by_index
    for j in range(rank, count, size):
        inputs, _ = split_batch(batch(j), source.batch_fn, name="X", index=j)
        yield inputs


def _batches_part(
    predictor: Any, X: Data, batch_size: int, rank: int, size: int, batch_fn: BatchFn | None
) -> list[Tensor]:
    """Logits `[M, B_j, C]` of batches j = rank, rank + size, ... (the batches one process uses;
    structured inputs, e.g. a mapping, are handed on as they are)."""
    if isinstance(predictor, nn.Module):
        predictor = Ensemble.from_models([predictor])  # as member_logits_of does, copied once
    if batch_fn is None:
        batch_fn = getattr(predictor, "batch_fn", None)  # a method's constructor argument
    return [
        predictor.member_logits(x, batch_size, progress=False).cpu()
        for x in _own_batches(X, batch_size, batch_fn, rank, size)
    ]


def member_logits(
    predictor: Any, X: Data, batch_size: int = 512, batch_fn: BatchFn | None = None
) -> Tensor:
    """Member logits `[M, N, C]`, computed by all ranks together; every rank gets all of them.

    Equal, bit for bit, to `member_logits_of(predictor, X, batch_size)` in one process (an
    `Ensemble`'s `member_logits`, a fitted method's, or an nn.Module's as a one-member
    ensemble), by construction: every rank computes whole batches exactly as one process does.

    - Predictors whose rows do not depend on the batching (an `Ensemble`, a fitted method
      holding one, an nn.Module, Packed-Ensembles): X is cut into
      the batches of `batch_size` rows one process uses, and batch j goes to rank j mod W (W
      ranks). Each rank runs every member on its batches with the same strategy, the same
      members folded together and the same kernel shapes as one process, so no bit can depend
      on the CPU's choice of kernels. (Sharding by members would not: a member folded or
      vectorised alone runs other kernel shapes than the same member folded with its
      partners, and the CPU's instruction set decides whether those agree in the last bits.)
    - Temperature scaling and the other calibrators (`peg.methods.calibration._calibrator`): their
      predictor's member logits are computed as here, gathered, and mapped whole, as one
      process maps them.
    - MC dropout and MC patching (EMP, ECMP) draw member s on batch j from (seed, s, j), so a
      batch predicted apart would get other masks; they, temperature scaling of them, and any
      other object with `member_logits` (whose batching this cannot see) are computed whole on
      every rank: no speed-up, still identical.

    Args:
        predictor: an `Ensemble`, a fitted method, or an nn.Module returning logits `[B, C]`.
        X: inputs `[N, ...]` (Tensor or array), or a Dataset / DataLoader that yields the same
            batches in the same order on every rank (no shuffling); batches of any shape
            (`peg.source.batches`: mappings are the model's keyword inputs). A map-style Dataset,
            or a loader reading one in index order, is read by index: each rank reads only the items
            of its own batches (`_own_batches`).
        batch_size: rows per forward pass when X is a tensor.
        batch_fn: `batch_fn(batch) -> (inputs, y)` for batches of another shape.

    Returns:
        `[M, N, C]`; with several ranks, on the CPU (it is assembled from every rank's share).
    """
    rank, size = world()
    check_batch_fn(batch_fn)
    if size == 1:
        return member_logits_of(predictor, X, batch_size, batch_fn)
    if isinstance(predictor, Calibrator) and is_fitted(predictor):
        # the calibrated predictor's logits shared out, then mapped whole, as one process does
        inner, split = predictor.predictor_, batch_fn or predictor.batch_fn
        return predictor.scale(member_logits(inner, X, batch_size or predictor.batch_size, split))
    if _row_wise(predictor):
        shares = guarded(
            lambda: _batches_part(predictor, X, batch_size, rank, size, batch_fn),
            "member_logits (batches)",
        )
        chunks = [shares[j % size][j // size] for j in range(sum(map(len, shares)))]
        if not chunks:
            raise ValueError("X: no inputs to predict (0 samples)")
        return torch.cat(chunks, dim=1)
    whole: list[Tensor] = []  # each rank computes everything; only the outcomes are shared
    guarded(
        lambda: whole.append(member_logits_of(predictor, X, batch_size, batch_fn)),
        "member_logits",
    )
    return whole[0].cpu()


def labelled_member_logits(
    predictor: Any, data: Data, batch_size: int, batch_fn: BatchFn | None, name: str
) -> tuple[Tensor, Tensor]:
    """Member logits `[M, N, C]` and labels `[N]` of labelled data, computed by all ranks
    together (`member_logits`: each rank its batches; the same bits as one process), every rank
    getting both. One process: `logits_and_labels`, unchanged. Used by `peg compare` under
    torchrun."""
    if world()[1] == 1:
        return logits_and_labels(predictor, data, batch_size, batch_fn, name)
    X, y = Source(data, batch_fn, name).labelled()  # every rank reads the labels of every batch
    if not isinstance(X, Tapped):
        assert y is not None
        return member_logits(predictor, X, batch_size, batch_fn), y
    logits = member_logits(predictor, X, batch_size)
    return logits, check_labels(X.labels(), logits.shape[1], None, name, targets=True)
