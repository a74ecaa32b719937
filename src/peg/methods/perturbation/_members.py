"""How a PEG/PEP ensemble holds its members θ_r + scale · D_r[i]: two implementations, one use.

Both hold the base weights θ_r (`Bases`) and answer the same four questions: how many members
(`len`), the ensemble at a scale (`ensemble_at`), every member's logits at the chosen scale
(`member_logits`), and the members' fingerprints (`fingerprints`, for recipes).

- `StackedMembers` keeps every direction row (`[S, P]` per base): trying another scale costs
  forward passes only, which is what the scale search needs; the members at the chosen scale
  are built once and kept. When the perturbed entries form a head after a fixed trunk
  (`peg.runtime.heads`), `search_target` gives the search the trunk's features of the scoring
  points, computed once, and the heads alone at each scale.
- `RegeneratedMembers` (`lazy=True`, `peg.methods.perturbation._lazy`) holds no member: each
  prediction builds the members `chunk_size` at a time from their rows, predicts every batch with
  them and frees them, so memory holds the bases, the rows as `lazy_store` keeps them (in full,
  rounded to 16 bits, or none: recomputed, PEG's gradients) and one chunk instead of all S·R
  stacked members.

A `RowSource` computes any subset of one base's rows; the method (PEG or PEP) supplies them.
"""

from __future__ import annotations

import copy
import functools
import itertools
import math
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor, nn

from peg._params import entry_views, refresh_bn, runs_channels_last, to_channels_last
from peg.ensemble import Ensemble, _stack_states
from peg.methods.base import FittedEnsemble
from peg.methods.perturbation._bn_fold import FoldedBatchNorm, fold_batch_norm
from peg.output import logits_of
from peg.recipe import displacement_fingerprints
from peg.runtime.heads import find_split
from peg.source import Data, ValSource
from peg.source.batches import batch_rows, call_model, take_rows

# The search's members run with eval-mode BatchNorm folded into the convolution before it, where
# provable (`peg.methods.perturbation._bn_fold`); False: as the model is (for comparisons).
FOLD_BATCH_NORM = True

# Members regenerated at a time by a lazy ensemble when `chunk_size` is not given.
LAZY_CHUNK_SIZE = 5

# what PEG/PEP are fitted around: one model, a list of models, an `Ensemble`, a fitted method
Models = nn.Module | Sequence[nn.Module] | Ensemble

# member indices i (k of them) -> their direction rows D[i], `[k, P]`
RowSource = Callable[[Sequence[int]], Tensor]


def base_models(model: Models) -> list[nn.Module]:
    """One model, a list of models (an ensemble, PEG's Algorithm 2), or an `Ensemble`."""
    if isinstance(model, FittedEnsemble):  # a fitted SWAG, DeepEnsemble, PEG, ...
        model = model.ensemble()
    if isinstance(model, Ensemble):
        return [model.member_model(i) for i in range(len(model))]
    if isinstance(model, nn.Module):
        return [model]
    if (
        isinstance(model, Sequence)
        and len(model) > 0
        and all(isinstance(m, nn.Module) for m in model)
    ):
        return list(model)
    raise TypeError(
        "model: expected an nn.Module, a non-empty list of nn.Modules or a peg.Ensemble, "
        f"got {type(model).__name__}"
    )


@dataclass(frozen=True)
class DirectionData:
    """The validation points that feed the directions, read by index and never gathered:
    points `index` of `source` (a `peg.source._rows.ValSource`: tensors, a Dataset or a loader's
    dataset), or all of them when `index` is None."""

    source: ValSource
    index: Tensor | None = None

    def __len__(self) -> int:
        return self.source.count if self.index is None else len(self.index)

    @property
    def regression(self) -> bool:
        """Float targets (regression), from the first batch."""
        return self.source.regression

    def rows(self, idx: Tensor) -> tuple[Any, Tensor]:
        """Points `idx` (positions in [0, len(self))): inputs `[B, ...]` (or a mapping of
        them) and labels `[B]`."""
        return self.source.rows(idx if self.index is None else self.index[idx])


def finite_rows(D: Tensor) -> list[bool]:
    """Whether each row of D `[k, P]` is free of NaN and inf."""
    return [bool(torch.isfinite(row).all()) for row in D]


@dataclass
class Bases:
    """What every member is made from: the base weights θ_r and how a row becomes a member.

    Members are numbered base-major (r·S + i); those in `dropped` (non-finite rows) are left
    out everywhere.
    """

    states: list[dict[str, Tensor]]  # θ_r, one state dict per base model
    skeleton: nn.Module  # the architecture (its own weights are not used)
    names: list[str]  # the perturbed entries, in row order
    n_members: int  # S per base
    bn_batches: Iterable[Any] | None = None  # bn="refresh": input batches, read on each pass
    dropped: set[int] = field(default_factory=set)
    # the search's BatchNorms folded into their convolutions on `own_skeleton` (`_bn_fold`)
    folded: FoldedBatchNorm | None = None

    def __len__(self) -> int:
        return self.n_members * len(self.states) - len(self.dropped)

    def kept(self, r: int) -> list[int]:
        """Indices i of base r's members that are not dropped."""
        return [i for i in range(self.n_members) if r * self.n_members + i not in self.dropped]

    def perturbed(self, r: int, D: Tensor, scale: float) -> dict[str, Tensor]:
        """The perturbed entries of base r's kept members: θ_r[n] + scale·D[kept] per entry
        `[k, *shape]` (D `[S, P]`)."""
        base = self.states[r]
        kept = self.kept(r)
        if len(kept) < len(D):
            D = D.index_select(0, torch.tensor(kept, device=D.device))
        steps = entry_views(scale * D, [base[n].shape for n in self.names])
        return {
            n: base[n] + step.to(base[n].dtype) for n, step in zip(self.names, steps, strict=True)
        }

    def chunks(
        self, sources: Sequence[RowSource], k: int
    ) -> Iterator[tuple[int, list[int], Tensor]]:
        """(base r, member indices, their rows `[len(members), P]`), base-major, at most k
        members at a time, leaving out dropped ones. Only one block is held here; the caller
        must drop its reference before asking for the next."""
        for r, source in enumerate(sources):
            kept = self.kept(r)
            for start in range(0, len(kept), k):
                members = kept[start : start + k]
                with torch.enable_grad():  # PEG's rows are gradients, even under no_grad()
                    D = source(members)
                yield r, members, D
                del D

    def head(self, x: Any) -> str | None:
        """The module holding every perturbed entry after a trunk the members share (run once
        per batch: `peg.runtime.heads`), checked on inputs `x`; None when every member runs
        whole."""
        if self.bn_batches is not None:  # per-member BatchNorm statistics: no shared trunk
            return None
        split = find_split(self.skeleton, set(self.names), self.states, x)
        if split is None:
            return None
        if split.prefix:
            return split.prefix[:-1]
        paths = [n.split(".")[:-1] for n in self.names]  # a Sequential's tail: the module
        same = itertools.takewhile(lambda p: len(set(p)) == 1, zip(*paths, strict=False))
        common = [p[0] for p in same]  # holding them all, else the tail's first child
        return ".".join(common) or next(iter(split.head._modules))

    @functools.cached_property
    def own_skeleton(self) -> nn.Module:
        """A copy of the skeleton that the fit owns (eval mode), shared by the short-lived
        ensembles it builds (`ensemble(..., share=True)`): one deep copy, not one a scale."""
        return copy.deepcopy(self.skeleton).eval()

    def _build(self, share: bool, **entries: Any) -> Ensemble:
        """An `Ensemble` of `entries` (stacked and shared, or states): on `own_skeleton` when
        `share` (the search's, never handed out), else on a copy of its own."""
        if share and self.folded is not None:
            if "states" in entries:
                stacked, shared = _stack_states(entries["states"])
            else:
                stacked, shared = entries["stacked"], entries["shared"]
            stacked, shared = self.folded.entries(stacked, shared)
            return Ensemble._sharing(self.folded.skeleton, stacked, shared)
        if share:
            return Ensemble._sharing(self.own_skeleton, **entries)
        if "states" in entries:
            return Ensemble.from_state_dicts(self.skeleton, entries["states"])
        return Ensemble(self.skeleton, entries["stacked"], entries["shared"])

    def base_ensemble(self, share: bool = False) -> Ensemble:
        """The base models as an `Ensemble` (scale 0 of every member; BatchNorm statistics
        re-estimated when the members' are); `share`: see `_build`."""
        states = self.states
        if self.bn_batches is not None:
            states = [refresh_bn(self.skeleton, dict(s), self.bn_batches) for s in states]
        return self._build(share, states=states)

    def ensemble(self, directions: Sequence[Tensor], scale: float, share: bool = False) -> Ensemble:
        """Members θ_r + scale·D_r[i] for every base r (D_r `[S, P]`), base-major, but the
        dropped ones. One base and no BatchNorm refresh: the perturbed entries stacked, the
        rest shared (θ's own tensors, which the fit owns); otherwise from one state dict per
        member. `share`: on the fit's own skeleton, not a copy (`_build`)."""
        if len(self.states) == 1 and self.bn_batches is None:
            base, stacked = self.states[0], self.perturbed(0, directions[0], scale)
            shared = {k: v for k, v in base.items() if k not in stacked}
            return self._build(share, stacked=stacked, shared=shared)
        shapes = [self.states[0][n].shape for n in self.names]
        states = []
        for r, (base, D) in enumerate(zip(self.states, directions, strict=True)):
            steps = entry_views(scale * D, shapes)  # per parameter: [S, *shape]
            for i in range(D.shape[0]):
                if r * D.shape[0] + i in self.dropped:
                    continue
                state = dict(base)
                for n, step in zip(self.names, steps, strict=True):
                    state[n] = base[n] + step[i].to(base[n].dtype)
                if self.bn_batches is not None:
                    state = refresh_bn(self.skeleton, state, self.bn_batches)
                states.append(state)
        return self._build(share, states=states)


@dataclass(frozen=True)
class SearchTarget:
    """What the scale search scores: the members at a scale (`at`) on `inputs` (the scoring
    points, or a fixed trunk's features of them); `bases()` holds one member per base model
    at scale 0 (the bases themselves), `member_base[j]` the base of member j."""

    at: Callable[[float], Ensemble]
    inputs: Any  # a tensor [N, ...] or a mapping of them
    bases: Callable[[], Ensemble]
    member_base: list[int]


def _check_scale(scale: Any) -> None:
    if not (isinstance(scale, (int, float)) and math.isfinite(scale) and scale >= 0):
        raise ValueError(f"scale: expected a finite number >= 0, got {scale!r}")


class StackedMembers:
    """Every direction row held (`[S, P]` per base); the members at one scale built once."""

    def __init__(self, bases: Bases, directions: list[Tensor]) -> None:
        self.bases, self.directions = bases, directions
        self._built: tuple[float, Ensemble] | None = None

    def __len__(self) -> int:
        return len(self.bases)

    def ensemble_at(self, scale: float, share: bool = False) -> Ensemble:
        """The members at `scale`, built anew (the search's, on the fit's own skeleton:
        `share`; `ensemble_at`'s, on a copy)."""
        _check_scale(scale)
        return self.bases.ensemble(self.directions, scale, share)

    def ensemble(self, scale: float) -> Ensemble:
        """The members at `scale`, kept: the fitted ensemble."""
        if self._built is None or self._built[0] != scale:
            self._built = (scale, self.ensemble_at(scale))
        return self._built[1]

    def member_logits(self, X: Data, scale: float, batch_size: int, **kwargs: Any) -> Tensor:
        return self.ensemble(scale).member_logits(X, batch_size, **kwargs)

    def iter_member_logits(
        self, X: Data, scale: float, batch_size: int, **kwargs: Any
    ) -> Iterator[Tensor]:
        return self.ensemble(scale).iter_member_logits(X, batch_size, **kwargs)

    @torch.no_grad()
    def search_target(self, X: Any, batch_size: int) -> SearchTarget:
        """What the scale search scores (`SearchTarget`).

        With one base, no per-member BatchNorm statistics, and the perturbed entries in a head
        after a fixed trunk (`peg.runtime.heads.find_split`, checked on X): the heads alone at each
        scale (the members' head entries, computed as `ensemble_at`'s), and the trunk's
        features of X, computed once, `batch_size` rows at a time. Otherwise `ensemble_at`
        and X themselves, channels-last where the CPU runs that faster
        (`peg._params.runs_channels_last`: the members and X laid out so, the search's own
        skeleton too; the fitted ensemble keeps the model's layout).
        """
        bases = self.bases
        member_base = [r for r in range(len(bases.states)) for _ in bases.kept(r)]
        split = None
        if len(bases.states) == 1 and bases.bn_batches is None:
            split = find_split(bases.skeleton, set(bases.names), bases.states, X)
        if split is None:
            if runs_channels_last(bases.skeleton, X) and to_channels_last(bases.own_skeleton, X):
                X = X.contiguous(memory_format=torch.channels_last)  # the members follow
            if FOLD_BATCH_NORM and bases.folded is None and isinstance(X, Tensor):
                probe = take_rows(X, 0, 2)
                bases.folded = fold_batch_norm(bases.own_skeleton, bases.states[0], probe)
            return SearchTarget(
                functools.partial(self.ensemble_at, share=True),
                X,
                functools.partial(bases.base_ensemble, share=True),
                member_base,
            )
        base, D = bases.states[0], self.directions[0]
        trunk = split.trunk_module(base)
        rows = batch_rows(X, "val")  # X: a tensor or a mapping of them (dict batches)
        features = torch.cat(
            [
                logits_of(call_model(trunk, take_rows(X, a, a + batch_size)))
                for a in range(0, rows, batch_size)
            ]
        )

        shared = split.head_entries({k: v for k, v in base.items() if k not in bases.names})

        def heads(stacked: dict[str, Tensor]) -> Ensemble:
            return Ensemble(split.head, split.head_entries(stacked), shared)

        def heads_at(scale: float) -> Ensemble:
            _check_scale(scale)
            return heads(bases.perturbed(0, D, scale))

        def base_head() -> Ensemble:
            return heads({n: base[n].unsqueeze(0) for n in bases.names})

        return SearchTarget(heads_at, features, base_head, member_base)

    def fingerprints(self, scale: float) -> list[list[float]]:
        return displacement_fingerprints(self.directions, scale)
