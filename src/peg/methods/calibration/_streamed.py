"""Temperature scaling fitted on logits streamed batch by batch: dense outputs and tokens.

A segmentation net's logits `[B, C, H, W]` over a validation set, or a language model's `[B, T,
V]` at V = 50,257, are too large to gather (48 frames of 512 × 1024 with 19 classes are 1.9 GB
of float32; 16k tokens at V = 50,257 are 3.3 GB). The NLL of softmax(s / T) and its first two
derivatives in log β (β = 1/T) are sums over the positions, so `fit_temperature`'s search
(bracket the root of the derivative in steps of log 10, then Newton's method on log β
safeguarded by bisection) needs only those sums: each of its evaluations is one pass over the
batches, accumulating them. The peak is one batch (and one copy of its kept positions) and a
chunk of work over `chunk` elements (`[rows, C]`, rows = chunk // C; float64, or float32 with
`dtype`), never `[N, C]`; the accumulators are float64 on the logits' device, read once per
pass (one exp per element: the rows centred on their largest score).

Each pass runs the batches again (`batches()` is called once per pass; six to nine passes:
two or three to bracket, four to six of Newton). Where one forward costs more than reading its
logits back, `cache=` a folder: the first pass writes each batch's kept rows there (float32,
`[R_j, C]`, labels `[R_j]`), the others read them, memory-mapped (the disk then holds N × C
floats; the forwards run once). Under `torch.distributed` (a process group initialised: each
rank reads its own shard) the per-pass sums are all-reduced, so every rank follows the same
search and returns the same T as one process over the whole set.
"""

from __future__ import annotations

import math
import os
import shutil
import tempfile
import warnings
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from peg.methods._predictors import labelled_batches

BOUNDS = (1e-3, 1e3)  # as temperature.BOUNDS: T searched in [1e-3, 1e3]
LOG10 = math.log(10.0)
CHUNK = 1 << 22  # float64 elements of one chunk of work (32 MB each temporary)
IGNORE_INDEX = -100

Batches = Callable[[], Iterable[tuple[Tensor, Tensor]]]

__all__ = ["StreamedSums", "fit_temperature_streamed", "predictor_batches", "streamed_sums"]


class StreamedSums:
    """The sums of one pass at β = 1/T over the positions kept (float64, on the logits'
    device until `reduced`): `n` positions, `nll` Σ −log p_y, `g` Σ (E_p[s] − s_y) (the
    NLL's derivative in β), `h` Σ Var_p[s] (its second derivative), and what says why an
    optimum lies beyond a bound: `wrong` (positions whose label's score is below its row's
    largest), `uniform` Σ (mean_c s − s_y) (the derivative at β = 0) and `spread` (the largest
    max − min of a row)."""

    FIELDS = ("n", "nll", "g", "h", "wrong", "uniform")

    def __init__(self) -> None:
        self.sums: Tensor | None = None  # [6] float64
        self.spread: Tensor | None = None  # [] float64
        self.values: dict[str, float] = {}

    def add(self, s: Tensor, y: Tensor, beta: float, extras: bool = True) -> None:
        """Add rows `s` `[R, C]` with labels `[R]` (class indices); `extras`: `wrong`,
        `uniform` and `spread` too (they do not depend on β: one pass needs them)."""
        # centred on each row's largest score: one exp, no overflow, and Var_p[s] from the
        # centred moments (less cancellation than E[s²] - E[s]²)
        top = s.amax(-1, keepdim=True)
        d = s - top
        e = torch.exp(d * beta)
        total = e.sum(-1)
        ed = e * d
        mean = ed.sum(-1) / total
        var = ((ed * d).sum(-1) / total - mean.square()).clamp_min(0)
        true = d.gather(1, y[:, None])[:, 0]
        acc = s.new_zeros(6, dtype=torch.float64)
        acc[0] = len(y)
        acc[1] = (torch.log(total) - beta * true).double().sum()  # log Σ e^{β d} - β d_y
        acc[2] = (mean - true).double().sum()
        acc[3] = var.double().sum()
        if extras:
            acc[4] = (true < 0).sum()
            acc[5] = (s.mean(-1) - top[:, 0] - true).double().sum()
            spread = (top[:, 0] - s.amin(-1)).max().double() if len(y) else acc.new_zeros(())
            self.spread = spread if self.spread is None else torch.maximum(self.spread, spread)
        self.sums = acc if self.sums is None else self.sums + acc

    def reduced(self, distributed: bool) -> dict[str, float]:
        """The totals as floats (one read from the device), summed over the ranks when
        `distributed`: every rank gets the same totals."""
        sums = torch.zeros(6, dtype=torch.float64) if self.sums is None else self.sums
        spread = torch.zeros((), dtype=torch.float64) if self.spread is None else self.spread
        if distributed:
            dist.all_reduce(sums, op=dist.ReduceOp.SUM)
            spread = spread.reshape(1).clone()
            dist.all_reduce(spread, op=dist.ReduceOp.MAX)
        self.values = dict(zip(self.FIELDS, sums.tolist(), strict=True))
        self.values["spread"] = float(spread.reshape(()))
        return self.values


def predictor_batches(
    predictor: Any, data: Any, batch_size: int, batch_fn: Any, class_dim: int, name: str = "val"
) -> Batches:
    """A predictor's dense outputs on labelled `data` as `fit_temperature_streamed` reads them,
    the forwards run again on every pass: `(scores [B, C, *S] (or [B, *S, C]), labels [B, *S])`
    per batch, the scores a one-member predictor's logits (log p̄ up to a per-position constant,
    which temperature scaling ignores) or the members' log p̄ (float64), on their device."""

    def batches() -> Iterator[tuple[Tensor, Tensor]]:
        for logits, labels in labelled_batches(predictor, data, batch_size, batch_fn, name):
            if logits.shape[0] == 1:
                yield logits[0], labels
                continue
            dim = 2 if class_dim == 1 else -1  # the class dimension of [M, B, ...]
            log_p = torch.log_softmax(logits.detach().double(), dim)
            yield torch.logsumexp(log_p, 0) - math.log(logits.shape[0]), labels

    return batches


def _rows(logits: Tensor, labels: Tensor, class_dim: int, ignore_index: int, where: str):
    """A batch's kept rows `[R, C]` (the class dimension moved last, positions flattened) and
    labels `[R]`: labels equal to `ignore_index` and rows with a non-finite score left out."""
    if not isinstance(logits, Tensor) or not logits.is_floating_point() or logits.ndim < 2:
        got = type(logits).__name__ if not isinstance(logits, Tensor) else tuple(logits.shape)
        raise ValueError(
            f"{where}: expected floating-point logits with a class dimension, got {got}"
        )
    dim = class_dim % logits.ndim
    c = logits.shape[dim]
    positions = logits.shape[:dim] + logits.shape[dim + 1 :]
    labels = torch.as_tensor(labels, device=logits.device)
    if tuple(labels.shape) != tuple(positions) or labels.is_floating_point():
        raise ValueError(
            f"{where}: expected integer labels of shape {tuple(positions)} for logits of shape "
            f"{tuple(logits.shape)} (class_dim={class_dim}), got {labels.dtype} of shape "
            f"{tuple(labels.shape)}"
        )
    # one copy of the batch at most: the kept positions picked from a view, class last
    z, keep = logits.detach().movedim(dim, -1), labels != ignore_index
    if bool(keep.all()):
        z, y = z.reshape(-1, c), labels.reshape(-1).long()
    else:
        z, y = z[keep], labels[keep].long()
    if len(y) and (int(y.min()) < 0 or int(y.max()) >= c):
        bad = int(y[(y < 0) | (y >= c)][0])
        raise ValueError(
            f"{where}: expected labels in [0, {c}) or ignore_index={ignore_index}, got {bad}"
        )
    return z, y


def _chunks(
    z: Tensor, y: Tensor, chunk: int, dtype: torch.dtype
) -> Iterator[tuple[Tensor, Tensor]]:
    """Rows `[r, C]` in `dtype`, `r` = chunk // C, the non-finite rows left out (as
    `fit_temperature` leaves them out)."""
    step = max(1, chunk // max(1, z.shape[1]))
    for start in range(0, len(y), step):
        s = z[start : start + step].to(dtype)
        t = y[start : start + step]
        finite = torch.isfinite(s).all(-1)
        if not bool(finite.all()):
            s, t = s[finite], t[finite]
        yield s, t


class _Pass:
    """One reading of the batches: from `batches()`, or from the cache written by the first."""

    def __init__(
        self,
        batches: Batches,
        class_dim: int,
        ignore_index: int,
        chunk: int,
        cache: Path | None,
        dtype: torch.dtype = torch.float64,
    ) -> None:
        self.batches, self.class_dim, self.ignore_index = batches, class_dim, ignore_index
        self.chunk, self.cache, self.cached, self.dtype = chunk, cache, 0, dtype
        self.passes = 0

    def rows(self) -> Iterator[tuple[Tensor, Tensor]]:
        """Every batch's kept rows `[R_j, C]`, `[R_j]`."""
        self.passes += 1
        if self.cache is not None and self.cached:
            for j in range(self.cached):
                part = torch.load(self.cache / f"{j}.pt", mmap=True, weights_only=True)
                yield part["z"], part["y"]
            return
        count = 0
        for j, (logits, labels) in enumerate(self.batches()):
            z, y = _rows(logits, labels, self.class_dim, self.ignore_index, f"batch {j}")
            if self.cache is not None:
                torch.save({"z": z.float().cpu(), "y": y.cpu()}, self.cache / f"{j}.pt")
            count += 1
            yield z, y
        self.cached = count

    def sums(self, beta: float, distributed: bool) -> dict[str, float]:
        acc, first = StreamedSums(), self.passes == 0
        with torch.no_grad():
            for z, y in self.rows():
                for s, t in _chunks(z, y, self.chunk, self.dtype):
                    acc.add(s, t, beta, extras=first)
        values = acc.reduced(distributed)
        if first:  # what does not depend on β, kept for the warning at a bound
            self.extras = {k: values[k] for k in ("wrong", "uniform", "spread")}
        return values | self.extras


def streamed_sums(
    batches: Batches,
    temperature: float = 1.0,
    *,
    class_dim: int = -1,
    ignore_index: int = IGNORE_INDEX,
    chunk: int = CHUNK,
    distributed: bool | None = None,
    dtype: torch.dtype = torch.float64,
) -> dict[str, float]:
    """One pass of `fit_temperature_streamed`'s sums at `temperature`: `n` (positions kept),
    `nll` (Σ −log p_y: the mean NLL is nll / n), `g`, `h`, `wrong`, `uniform`, `spread`
    (`StreamedSums`). The NLL of a model's logits, streamed: `sums["nll"] / sums["n"]`."""
    reader = _Pass(batches, class_dim, ignore_index, chunk, None, dtype)
    return reader.sums(1.0 / float(temperature), _distributed(distributed))


def _distributed(value: bool | None) -> bool:
    """Whether to all-reduce the sums: a process group of more than one rank (None: when one
    is initialised)."""
    if value is None:
        value = dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1
    return bool(value)


def fit_temperature_streamed(
    batches: Batches,
    *,
    class_dim: int = -1,
    ignore_index: int = IGNORE_INDEX,
    bounds: tuple[float, float] = BOUNDS,
    max_iter: int = 100,
    tol: float | None = None,
    chunk: int = CHUNK,
    cache: str | os.PathLike[str] | bool | None = None,
    distributed: bool | None = None,
    dtype: torch.dtype = torch.float64,
    label: str | None = "temperature scaling",
) -> float:
    """argmin_T NLL(softmax(s / T), y) over the positions of a stream of batches, T in `bounds`.

    Args:
        batches: called once per pass, gives `(logits, labels)` pairs: logits with a class
            dimension `class_dim` (`[B, C, *S]` with `class_dim=1`, `[B, T, V]` or `[N, C]`
            with `class_dim=-1`) and integer labels of the other dimensions' shape (`[B, *S]`,
            `[B, T]`, `[N]`). Positions labelled `ignore_index` are left out, as are rows with a
            non-finite score.
        bounds, max_iter: as `fit_temperature` (the same search and the same warning where the
            optimum lies at or beyond a bound; `label` names the calibrator, None: no warning).
        tol: the search stops when a Newton step on log T is below it (each step is a pass);
            None: 1e-9 for float64 work, 1e-5 for float32 (whose rounding leaves steps of
            ~1e-7 that never settle: T to 1e-5 changes the NLL by ~1e-10).
        chunk: float64 elements of one chunk of work (the peak beyond one batch is a few times
            8 × chunk bytes).
        cache: None (each pass calls `batches()`: the forwards run again), a folder (created;
            the first pass writes each batch's kept rows there as float32, the others read
            them; the files are left) or True (a temporary folder, removed after).
        distributed: all-reduce each pass's sums over the process group (each rank passing
            its own shard; `torch.distributed` initialised); None: when a group of more than
            one rank is initialised.
        dtype: the chunks' work: float64 (as `fit_temperature`) or float32 (about twice as
            fast where the exponentials dominate; each row's terms are summed in float64).

    Returns T (a float): equal to `fit_temperature` on the gathered rows up to the float64
    rounding of the sums' order.
    """
    folder = Path(tempfile.mkdtemp(prefix="peg-ts-")) if cache is True else None
    if isinstance(cache, (str, os.PathLike)):
        folder = Path(os.fspath(cache))
        folder.mkdir(parents=True, exist_ok=True)
    reader = _Pass(batches, class_dim, ignore_index, int(chunk), folder, dtype)
    try:
        if tol is None:
            tol = 1e-9 if dtype == torch.float64 else 1e-5
        return _search(reader, _distributed(distributed), bounds, int(max_iter), tol, label)
    finally:
        if cache is True and folder is not None:
            shutil.rmtree(folder, ignore_errors=True)


def _search(
    reader: _Pass,
    distributed: bool,
    bounds: tuple[float, float],
    max_iter: int,
    tol: float,
    label: str | None,
) -> float:
    """`fit_temperature`'s bracketed, safeguarded Newton search on u = log β, each evaluation of
    (dNLL/du, d²NLL/du²) one pass."""
    last_sums: dict[str, float] = {}

    def slope(u: float) -> tuple[float, float]:
        beta = math.exp(u)
        sums = reader.sums(beta, distributed)
        last_sums.update(sums)
        n = sums["n"]
        g, h = (sums["g"] / n, sums["h"] / n) if n else (0.0, 0.0)
        return g * beta, (g + h * beta) * beta

    low, high = -math.log(bounds[1]), -math.log(bounds[0])
    u = min(max(0.0, low), high)
    g, h = slope(u)
    direction = -1.0 if g > 0 else 1.0
    last = u
    while (g > 0) == (direction < 0) or g == 0:
        edge = u <= low + 1e-9 or u >= high - 1e-9
        last, u = u, min(max(u + direction * LOG10, low), high)
        if edge or u == last or g == 0:
            u = last
            if label is not None:
                _warn_bound(label, math.exp(-u), last_sums, direction)
            return math.exp(-u)
        g, h = slope(u)
    lo, hi = min(last, u), max(last, u)
    for _ in range(max_iter):
        if g == 0:
            break
        step = g / h if h > 0 else math.inf
        if abs(step) <= tol:  # converged at u: the next pass would not move it
            break
        new = u - step
        if not lo < new < hi:
            new, step = 0.5 * (lo + hi), u - 0.5 * (lo + hi)
        u = new
        g, h = slope(u)
        lo, hi = (lo, u) if g > 0 else (u, hi)
        if abs(step) <= tol or hi - lo <= 1e-12:
            break
    return math.exp(-u)


def _warn_bound(label: str, t: float, sums: dict[str, float], direction: float) -> None:
    """`temperature._warn_bound`'s warning from the streamed sums (no rows are held)."""
    n = sums.get("n", 0.0)
    spread = sums.get("spread", 0.0)
    if not n or spread == 0:
        message = (
            f"{label}: the scores are equal within every validation row (constant logits): "
            f"they say nothing of the labels and the NLL does not depend on the temperature; "
            f"T = {t:g} is kept"
        )
    else:
        largest = f"their largest spread within a row is {spread:.3g}"
        if direction > 0 and sums.get("wrong", 1.0) == 0:
            cause = (
                "every validation point is predicted right (its label has its row's largest "
                "score): the NLL falls as T → 0, towards one-hot predictions"
            )
        elif direction > 0:
            cause = f"the optimum is a smaller T: the scores' scale is small ({largest})"
        elif sums.get("uniform", 0.0) >= 0:
            cause = (
                "the scores are anti-correlated with the labels (a label's score is at or "
                "below its row's mean on average): the NLL falls towards the uniform "
                "prediction (T → ∞)"
            )
        else:
            cause = f"the optimum is a larger T: the scores' scale is large ({largest})"
        message = (
            f"{label}: the optimal temperature is at or beyond T = {t:g} (a bound of the "
            f"search, or where the NLL stops changing in float64): {cause}; widen `bounds` "
            f"to reach it; T = {t:g} is used"
        )
    warnings.warn(message, stacklevel=4)
