"""What a lazy PEG/PEP (`lazy=True` or `"auto"`) keeps of its members, and when it is lazy.

A lazy ensemble never stacks its members: each prediction builds them a chunk at a time from
their direction rows (`RegeneratedMembers` below). Where those rows come from is
`lazy_store`'s choice:

- `"full"` (default): every row kept as computed, `[S, P]` per base (float32 for a float32
  model). The members built from them are the eager ones bit for bit, and predicting costs what
  the eager ensemble's does plus one copy of the rows per call; memory holds S·P entries where
  the eager ensemble holds 2·S·P (its rows and its stacked members).
- `"bfloat16"` / `"float16"`: the rows rounded to 16 bits (half that memory). bfloat16 keeps
  float32's range and 8 significant bits (each entry of a displacement η·D_i within 2⁻⁹ of its
  value, relative); float16 keeps 11 bits (2⁻¹²), each parameter tensor of a row scaled by a
  power of two so its largest entry sits near 2¹⁵ (no underflow, and the scaling is exact).
  The members differ from the eager ones by that rounding of their displacement from the base,
  a small fraction of how far apart the members are.
- `"regenerate"`: no row kept: each prediction recomputes them (PEG: the S gradients), the least
  memory (the bases and one chunk) at the price of that computation at every call.

`lazy="auto"` is eager when the stacked members fit in `memory_budget` bytes (default
`MEMORY_FRACTION` of the memory available on the model's device when `fit` starts); else lazy
with `lazy_store`, or `"regenerate"` when even those rows would not fit.

Every store's fingerprints are taken from the full-precision rows during `fit`, so a recipe
saved from a lazy ensemble is the eager one's, and rebuilds the eager members.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from peg._params import entry_views, module_like
from peg.ensemble import STRATEGIES, Ensemble, Strategy, autocast_dtype
from peg.errors import NotStreamable
from peg.methods.perturbation._members import (
    LAZY_CHUNK_SIZE,
    Bases,
    RowSource,
    StackedMembers,
    _check_scale,
    finite_rows,
)
from peg.recipe import fingerprint_probe, fingerprint_rows
from peg.source import Data, Source, Tapped
from peg.source.batches import BatchFn
from peg.utils.memory import available_memory, require_memory
from peg.utils.progress import counter
from peg.utils.scalars import check_positive_int

LAZY_STORES = ("full", "bfloat16", "float16", "regenerate")
# lazy="auto" without memory_budget: this fraction of the memory available when fit starts
MEMORY_FRACTION = 0.5
_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}
_FP16_TOP = 15  # float16 rows: each tensor's largest entry scaled into [2^14, 2^15)


def choose_store(method: Any, bases: Bases) -> str | None:
    """How `method` (a PEG/PEP being fitted) holds the members of `bases`: None (stacked,
    eager) or a `lazy_store` value.

    The eager ensemble holds its rows and its stacked members, 2·S·R·P entries of the
    parameters' size; `lazy="auto"` takes that when it fits in `memory_budget`, else the rows in
    `lazy_store` when they fit, else `"regenerate"`.
    """
    lazy, store, budget = method.lazy, method.lazy_store, method.memory_budget
    if lazy is False:
        return None
    if lazy is True:
        return store
    base = bases.states[0]
    entries = bases.n_members * len(bases.states) * sum(base[n].numel() for n in bases.names)
    itemsize = max(base[n].element_size() for n in bases.names)
    if budget is None:
        budget = MEMORY_FRACTION * available_memory(base[bases.names[0]].device)
    if 2 * entries * itemsize <= budget:
        return None
    kept = itemsize if store == "full" else 2  # bytes an entry of the stored rows takes
    if store != "regenerate" and entries * kept <= budget:
        return store
    return "regenerate"


# bytes each member costs beyond its rows, whatever the store: its fingerprint, its index in
# the bookkeeping lists (Python floats and ints), rounded up
MEMBER_BOOKKEEPING = 128


def check_memory(method: Any, bases: Bases, store: str | None) -> None:
    """A ValueError naming `n_members` before any row is computed where what `fit` would hold
    cannot fit in the memory available on the model's device: the eager ensemble's 2·S·R·P
    entries (rows and stacked members), the S·R·P rows a search stacks, the rows a lazy store
    keeps, and `MEMBER_BOOKKEEPING` bytes a member (not the allocator's raw "can't allocate ...
    bytes" after the work has started)."""
    base = bases.states[0]
    members = bases.n_members * len(bases.states)
    entries = members * sum(base[n].numel() for n in bases.names)
    itemsize = max(base[n].element_size() for n in bases.names)
    if store is None:
        per_entry, what = 2 * itemsize, "the members' rows and stacked weights"
    elif method.searches:
        per_entry, what = itemsize, "every member's row, stacked for the search"
    else:
        per_entry = {"full": itemsize, "regenerate": 0}.get(store, 2)
        what = f"the rows a lazy_store={store!r} ensemble keeps"
    need = entries * per_entry + members * MEMBER_BOOKKEEPING
    advice = "lower n_members" + (", or pass lazy='auto'" if store is None else "")
    device = base[bases.names[0]].device
    require_memory(
        "n_members", bases.n_members, need, device, f"{what}, for {members:,} members", advice
    )


class StoredRows:
    """Every row of one base, `[S, P]`, kept in a `lazy_store` precision; `rows(members)`
    gives rows back in the precision they were computed in, `[k, P]` (a `RowSource`): a new
    tensor, which the caller may consume."""

    def __init__(self, S: int, shapes: Sequence[torch.Size], store: str) -> None:
        self.S, self.shapes, self.store = S, list(shapes), store
        self.data: Tensor | None = None  # [S, P], allocated by the first `put`
        self.unscale: Tensor | None = None  # float16: row i's tensor t was stored × 1/unscale[i, t]

    def put(self, members: Sequence[int], D: Tensor) -> None:
        """Store rows D `[k, P]` as those of `members`."""
        if self.data is None:
            self.dtype = D.dtype  # what `rows` gives back
            kept = D.dtype if self.store == "full" else _DTYPES[self.store]
            self.data = torch.zeros(self.S, D.shape[1], dtype=kept, device=D.device)
            if self.store == "float16":  # its narrow range: each tensor scaled
                self.unscale = torch.ones(self.S, len(self.shapes), device=D.device)
        idx = torch.as_tensor(list(members), device=D.device)
        if self.unscale is None:
            self.data[idx] = D.to(self.data.dtype)
            return
        parts = []
        for t, part in enumerate(entry_views(D, self.shapes)):
            flat = part.reshape(len(D), -1).float()
            _, exp = torch.frexp(flat.abs().amax(1).nan_to_num(0.0, 1.0, 1.0))
            shift = (_FP16_TOP - exp).clamp(-126, 126)  # a power of two: exact both ways
            one = torch.ones_like(flat[:, 0])
            parts.append(flat * torch.ldexp(one, shift)[:, None])
            self.unscale[idx, t] = torch.ldexp(one, -shift)
        self.data[idx] = torch.cat(parts, 1).to(torch.float16)

    def entries(self, members: Sequence[int]) -> list[Tensor]:
        """The rows of `members` per parameter tensor, `[k, *shape]` each, contiguous, in the
        precision the rows were computed in: views of one new buffer (one allocation, so the
        heap is neither grown nor trimmed by a chunk: far fewer page faults per call)."""
        assert self.data is not None, "entries before put"
        idx = torch.as_tensor(list(members), device=self.data.device)
        k = len(idx)
        buf = torch.empty(k * self.data.shape[1], dtype=self.dtype, device=self.data.device)
        out, at = [], 0
        for t, view in enumerate(entry_views(self.data, self.shapes)):
            block = buf[at : at + view[0].numel() * k].view(k, *view.shape[1:])
            at += block.numel()
            if view.dtype == block.dtype:
                torch.index_select(view, 0, idx, out=block)
            else:
                block.copy_(view.index_select(0, idx))
            if self.unscale is not None:
                block.mul_(self.unscale[idx, t].to(block.dtype).view(-1, *[1] * (block.dim() - 1)))
            out.append(block)
        return out

    def rows(self, members: Sequence[int]) -> Tensor:
        assert self.data is not None, "rows before put"
        idx = torch.as_tensor(list(members), device=self.data.device)
        D = self.data.index_select(0, idx).to(self.dtype)  # a copy, even when kept in full
        if self.unscale is not None:
            for t, part in enumerate(entry_views(D, self.shapes)):
                part.mul_(self.unscale[idx, t].to(D.dtype).view(-1, *[1] * (part.dim() - 1)))
        return D


@dataclass
class LazyRows:
    """What a lazy `fit` keeps of the rows: `stored` (one `StoredRows` per base; None with
    "regenerate") and every member's fingerprint, taken from the full-precision rows."""

    stored: list[StoredRows] | None
    fingerprints: list[list[float]]


def collect_rows(
    bases: Bases, sources: list[RowSource], store: str, scale: float
) -> tuple[LazyRows, list[int]]:
    """Every row computed one at a time (never all S·R at once), checked, fingerprinted at
    `scale` and, unless `store` is "regenerate", stored: (`LazyRows`, the members whose rows
    are not finite, base-major)."""
    S = bases.n_members
    shapes = [bases.states[0][n].shape for n in bases.names]
    keep = store != "regenerate"
    stored = [StoredRows(S, shapes, store) for _ in sources] if keep else None
    bad: list[int] = []
    found: dict[int, list[float]] = {}
    probe: Tensor | None = None
    for r, members, D in bases.chunks(sources, 1):
        probe = fingerprint_probe(D.shape[1]) if probe is None else probe
        fps = fingerprint_rows(D, scale, probe)
        for i, ok, fp in zip(members, finite_rows(D), fps, strict=True):
            found[r * S + i] = fp
            bad += [] if ok else [r * S + i]
        if stored is not None:
            stored[r].put(members, D.detach())
        del D
    return LazyRows(stored, [found[i] for i in range(len(found))]), bad


def lazy_members(
    rows: StackedMembers | LazyRows,
    bases: Bases,
    store: str,
    scale: float,
    regenerate: Callable[[], list[RowSource]],
) -> RegeneratedMembers:
    """The members of a lazy ensemble: from `rows` (stacked ones, as the search left them, are
    fingerprinted and stored in `store`, then let go) or from `regenerate()`."""
    if isinstance(rows, StackedMembers):
        keep = store != "regenerate"
        stored = store_directions(rows.directions, store, bases) if keep else None
        rows = LazyRows(stored, rows.fingerprints(scale))
    stored = rows.stored
    if stored is None:
        return RegeneratedMembers(bases, regenerate, rows.fingerprints)
    return RegeneratedMembers(bases, lambda: [s.rows for s in stored], rows.fingerprints, stored)


def store_directions(directions: list[Tensor], store: str, bases: Bases) -> list[StoredRows]:
    """Stacked rows (`[S, P]` per base) as `StoredRows`: kept as they are in full precision,
    else rounded one base at a time."""
    shapes = [bases.states[0][n].shape for n in bases.names]
    out = []
    for D in directions:
        rows = StoredRows(len(D), shapes, store)
        if store == "full":
            rows.data, rows.dtype = D, D.dtype
        else:
            rows.put(range(len(D)), D)
        out.append(rows)
    return out


class RegeneratedMembers:
    """No member held: the rows of a chunk of members are read from `stored` or recomputed by
    `sources()` whenever members are needed (`lazy_store`, `peg.methods.perturbation._lazy`).

    `skeleton` runs on the meta device (no memory); `fingerprints` are every member's, taken
    from the full-precision rows during `fit`. With `stored` rows, predicting reads each
    parameter's entries of a chunk straight from them (`entries(members)`, `[k, *shape]`,
    contiguous, as the eager ensemble's stacked weights are), never a `[k, P]` block.
    """

    def __init__(
        self,
        bases: Bases,
        sources: Callable[[], list[RowSource]],
        fingerprints: list[list[float]],
        stored: Sequence[Any] | None = None,
    ) -> None:
        self.bases, self.sources, self._fingerprints = bases, sources, fingerprints
        # the rows kept (`peg.methods.perturbation._lazy.StoredRows`, one per base)
        self.stored = stored
        self.skeleton = _meta_like(bases.skeleton, bases.states[0])

    def __len__(self) -> int:
        return len(self.bases)

    def ensemble_at(self, scale: float) -> Ensemble:
        """Every member at `scale` (S·R × member size of memory), from its rows."""
        _check_scale(scale)
        with torch.enable_grad():
            directions = [source(range(self.bases.n_members)) for source in self.sources()]
        return self.bases.ensemble(directions, scale)

    ensemble = ensemble_at  # nothing is kept: each call builds every member

    def fingerprints(self, scale: float) -> list[list[float]]:
        """Every member's fingerprint (`displacement_fingerprints`; NaN for dropped ones) at the
        scale `fit` chose (`scale` is that one), taken by `fit`."""
        return self._fingerprints

    def _chunks(self, k: int, scale: float) -> Iterator[tuple[list[int], Ensemble]]:
        """(members, their `Ensemble`), base-major, at most k at a time, dropped ones left out:
        from the stored rows' entries, or from rows regenerated. A chunk is let go before the
        next is built, once the caller has dropped it too."""
        if self.stored is None or self.bases.bn_batches is not None:
            for r, members, D in self.bases.chunks(self.sources(), k):
                chunk = self._chunk_ensemble(r, D, scale)
                del D
                yield members, chunk
                del chunk
            return
        for r, stored in enumerate(self.stored):
            kept = self.bases.kept(r)
            for start in range(0, len(kept), k):
                members = kept[start : start + k]
                chunk = self._stack(r, stored.entries(members), scale)
                yield members, chunk
                del chunk

    def _chunk_ensemble(self, r: int, D: Tensor, scale: float) -> Ensemble:
        """Members θ_r + scale·D[j] of base r as an `Ensemble` of len(D) members: D `[k, P]` is
        consumed (`_stack` of its views: nothing of size k·P is allocated)."""
        base, names = self.bases.states[r], self.bases.names
        if self.bases.bn_batches is not None:
            one = Bases([base], self.bases.skeleton, names, len(D), self.bases.bn_batches)
            return one.ensemble([D], scale)
        return self._stack(r, entry_views(D, [base[n].shape for n in names]), scale)

    def _stack(self, r: int, entries: list[Tensor], scale: float) -> Ensemble:
        """Members θ_r + scale·entries of base r (one `[k, *shape]` per perturbed parameter,
        consumed: scaled and shifted in place), the skeleton on the meta device. The same
        arithmetic as `Bases.ensemble`, so the same weights bit for bit."""
        base, names = self.bases.states[r], self.bases.names
        stacked = {
            n: e.mul_(scale).to(base[n].dtype).add_(base[n])
            for n, e in zip(names, entries, strict=True)
        }
        shared = {k: v for k, v in base.items() if k not in stacked}
        return Ensemble(self.skeleton, stacked, shared)

    def iter_member_logits(self, *_: Any, **__: Any) -> Iterator[Tensor]:
        """Never: every batch needs every chunk of members, regenerated (see `member_logits`)."""
        raise NotStreamable(
            "a lazy ensemble regenerates chunks of members outside its batches: it cannot give "
            "the members of one batch at a time without regenerating every chunk per batch; use "
            "member_logits"
        )

    @torch.no_grad()
    def member_logits(
        self,
        X: Data,
        scale: float,
        batch_size: int = 512,
        strategy: Strategy = "auto",
        progress: bool | None = None,
        chunk_size: int | None = None,
        autocast: str | torch.dtype | None = None,
        batch_fn: BatchFn | None = None,
    ) -> Tensor:
        """Logits `[M, N, C]`: chunks of `chunk_size` members (default `LAZY_CHUNK_SIZE`)
        outside, batches inside. A chunk is regenerated, predicts every batch of X (`strategy`
        within the chunk), and is freed. A Dataset or DataLoader is read once per chunk, never
        gathered (⌈M / chunk_size⌉ passes over it: cheap next to the forward passes when the
        data is in memory, a cost to weigh when each item is loaded or made anew); it must
        yield the same rows on every pass (no shuffling), which is checked by their number."""
        autocast_dtype(autocast)  # checked before any member is built
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy: expected one of {STRATEGIES}, got {strategy!r}")
        batch_size = check_positive_int(batch_size, "batch_size")
        k = LAZY_CHUNK_SIZE if chunk_size is None else check_positive_int(chunk_size, "chunk_size")
        # a Tapped source records labels: only on the first pass
        later = X.untapped() if isinstance(X, Tapped) else Source.of(X, batch_fn)
        M = len(self)
        out: Tensor | None = None
        start = 0
        shown = counter(f"predict ({M} members, {k} at a time)", progress)
        # no bar around the chunks: its iterator would hold the last chunk while making the next
        # (`_chunks` lets go of one when asked for the next, after `del ensemble` here)
        for members, ensemble in self._chunks(k, scale):
            shown.update(len(members))
            logits = ensemble.member_logits(
                X if out is None else later,
                batch_size,
                strategy,
                False,
                len(members),
                autocast,
                batch_fn=batch_fn,  # a Source keeps its own
            )
            del ensemble
            if out is None:
                out = logits.new_empty((M, *logits.shape[1:]))
            elif logits.shape[1:] != out.shape[1:]:
                raise ValueError(
                    f"X: {out.shape[1]} rows on the first pass, {logits.shape[1]} on a later one; "
                    "a lazy ensemble reads X once per chunk of members: pass data that yields "
                    "the same rows on every pass (no shuffling)"
                )
            out[start : start + len(members)] = logits
            start += len(members)
            del logits
        shown.close()
        assert out is not None and start == M
        return out


def _meta_like(skeleton: nn.Module, state: dict[str, Tensor]) -> nn.Module:
    """A copy of `skeleton` with meta-device tensors: structure without memory."""
    return module_like(skeleton, {k: torch.empty_like(v, device="meta") for k, v in state.items()})
