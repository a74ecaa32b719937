"""How an `Ensemble` runs its members on one batch: the strategies ("loop", "vmap", "folded",
"chunked"), each member's module built once for a loop that runs many batches, and the plain
call that reuses the last one's verdict. The fixed rule by which "auto" picks a strategy
(`AUTO_VECTORISE_FLOPS`, the fold check), remembering per process what failed on an
architecture, is `peg.runtime.auto_strategy`.

Members that differ only in a head after a shared trunk (`peg.runtime.heads`: last-layer PEG, ...)
run the trunk once per batch, with the shared weights, and only the heads per member, with the
strategy asked for (or the one "auto" picks for the heads), at every batch size.

`MemberStrategies` is the part of `peg.ensemble.Ensemble` that does this; it works on the
ensemble's `skeleton`, `stacked` and `shared` entries, `member_state(i)` and `len()`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Literal

import torch
from torch import Tensor, nn
from torch.func import vmap

from peg._forward import diagnose
from peg.errors import NotFoldable
from peg.output import logits_of, model_output
from peg.runtime.auto_strategy import (
    AUTO_VECTORISE_FLOPS,
    AUTO_VECTORISE_FLOPS_CONV,
    AUTO_VECTORISE_ROWS_CONV,
    AutoStrategy,
)
from peg.runtime.folded import Folded, fold
from peg.runtime.heads import checked, find_split
from peg.source.batches import call_functional, call_model

Strategy = Literal["auto", "loop", "vmap", "folded", "chunked"]
STRATEGIES = ("auto", "loop", "vmap", "folded", "chunked")
# "loop" runs each member by `functional_call` (its tensors swapped into the skeleton per call)
# on an ensemble's first batches, and builds one module per member (`_member_modules`) from
# this batch on: a module copy costs what ~45 swaps do (ResNet-50: 64 ms against 1.4 ms), and
# the ensembles of a scale search predict a few batches each (building them took 2.5 of
# PEG-15's 11.9 s fit on a GPU). That holds for the short-lived ensembles a fit builds
# (`Ensemble._sharing`); an ensemble a user holds builds its modules on its first batch
# (LOOP_MODULES_AFTER_HELD): swapping costs every call, while the modules cost less than one
# such call to build (docs/performance.md, "Building PEG"); and every batch then runs the same
# kernels, whichever batches a process gets (under torchrun each rank's first batch is another:
# a later switch would run other kernels than one process on the same rows,
# tests/test_distributed.py)
LOOP_MODULES_AFTER = 16
LOOP_MODULES_AFTER_HELD = 0


def call_key(X: Any, strategy: Any, batch_size: Any, *others: Any) -> tuple[Any, ...] | None:
    """What `MemberStrategies._ready_again` compares for a plain call (a tensor `X`, a string
    strategy, an int or None batch size, the other options None): the input's shape, dtype and
    device, the two arguments and the thresholds of "auto"'s rule; None for any other call."""
    if not isinstance(X, Tensor) or type(strategy) is not str or any(o is not None for o in others):
        return None
    if batch_size is not None and type(batch_size) is not int:
        return None
    rule = (AUTO_VECTORISE_FLOPS, AUTO_VECTORISE_FLOPS_CONV, AUTO_VECTORISE_ROWS_CONV)
    return strategy, batch_size, X.shape, X.dtype, X.device, rule


def _run_modules(modules: list[nn.Module], x: Any) -> Tensor:
    """Logits `[M, B, C]` of the member modules on one batch, one after another: the forwards
    under `torch.inference_mode` (less per-operation bookkeeping than `no_grad`), the logits
    stacked after it (an ordinary tensor, fit for autograd later: temperature scaling)."""
    with torch.inference_mode():
        if isinstance(x, Tensor):  # `call_model`'s Mapping test costs ~1 µs a member
            outs = [model_output(m(x), "member_logits", shaped=True) for m in modules]
        else:
            outs = [model_output(call_model(m, x), "member_logits", shaped=True) for m in modules]
    return torch.stack(outs)


class MemberStrategies(AutoStrategy):
    """The strategies of `Ensemble.member_logits`, and the choice "auto" makes among them
    (`AutoStrategy`).

    Mixed into `Ensemble`, whose `skeleton`, `stacked`, `shared`, `member_state`, `_eval` and
    `__len__` it uses.
    """

    skeleton: nn.Module
    stacked: dict[str, Tensor]
    shared: dict[str, Tensor]
    _eval: Callable[[], AbstractContextManager[None]]  # the skeleton in eval mode inside a block

    def _folded(self) -> Folded:
        """The members folded into the batch (`peg.runtime.folded`), built once per storage."""
        cached = self.__dict__.get("_fold_cache")
        if cached is None or cached[0] is not self.stacked or cached[1] is not self.shared:
            try:
                cached = (self.stacked, self.shared, fold(self.skeleton, self.stacked, self.shared))
            except NotFoldable as e:
                raise NotFoldable(f"strategy='folded': {e}; use 'vmap' or 'loop'") from None
            self._fold_cache = cached
        return cached[2]

    def _member_modules(self) -> list[nn.Module] | None:
        """One module per member, its tensors views of the stacked ones (nothing copied but the
        module structure), built once per storage: the loop without `functional_call`'s
        per-call swapping of every tensor. None where a module refuses its tensors."""
        cached = self.__dict__.get("_modules_cache")
        if cached is None or cached[0] is not self.stacked or cached[1] is not self.shared:
            own = [*self.skeleton.parameters(), *self.skeleton.buffers()]
            modules: list[nn.Module] | None = []
            try:
                for i in range(len(self)):
                    module = copy.deepcopy(self.skeleton, memo={id(t): t for t in own})
                    module.load_state_dict(self.member_state(i), assign=True)
                    modules.append(module)
            except Exception:  # e.g. a module whose state dict hooks reject views
                modules = None
            cached = self._modules_cache = (self.stacked, self.shared, modules)
        return cached[2]

    def _ready_again(self, key: tuple[Any, ...] | None) -> list[nn.Module] | None:
        """The member modules `_ready_loop` gave the last call that took them, if this call has
        its `key` (the arguments; the input's shape, dtype and device) on the same storage: that
        call's checks and choice hold, and are not made again (between large forwards, with cold
        caches, they cost ~100 µs a call: docs/performance.md). None otherwise."""
        memo = self.__dict__.get("_ready_memo")
        if memo is None or key is None or memo[0] is not self.stacked:
            return None
        if memo[1] is not self.shared or memo[2] != key:
            return None
        self._loop_batches += 1
        return self._member_modules()  # the cached ones

    def _run_ready(self, modules: list[nn.Module], x: Tensor) -> Tensor:
        """`_run_modules` on the members `_ready_loop` gave (their forwards under
        `inference_mode`: no grad mode needed); a failure gets `_diagnose`'s clear error."""
        try:
            return _run_modules(modules, x)
        except Exception:
            with torch.no_grad(), self._eval():
                self._diagnose(x)  # the inputs or the model's output at fault: a clear error
            raise

    def _ready_loop(
        self, x: Any, strategy: str, key: tuple[Any, ...] | None = None, keep: bool = False
    ) -> list[nn.Module] | None:
        """The member modules, when the batch `x` runs through them and nothing is left to
        decide or build: they are built for this storage, the members have no shared trunk
        (`_heads`, known), and `strategy` is "loop" or "auto" whose rule is known to loop on `x`
        without running the model (`_known_to_loop`). `Ensemble.member_logits` then runs them
        without the skeleton's eval-mode walk and `_choose`'s steps (what a plain loop's call
        costs), and a later call with the same `key` reuses the verdict
        (`_ready_again`); None otherwise."""
        modules = self.__dict__.get("_modules_cache")
        heads = self.__dict__.get("_heads_cache")
        if modules is None or modules[0] is not self.stacked or modules[1] is not self.shared:
            return None
        if heads is None or heads[0] is not self.stacked or heads[1] is not self.shared:
            return None
        if modules[2] is None or heads[2] is not None:
            return None
        if strategy == "auto" and not self._known_to_loop(x):
            return None
        if strategy not in ("auto", "loop"):
            return None
        self._loop_batches = self.__dict__.get("_loop_batches", 0) + 1
        if keep and key is not None:  # `x` is the caller's own input (not moved)
            self._ready_memo = (self.stacked, self.shared, key)
        return self._member_modules()  # the cached ones

    def _heads(self, x: Any) -> tuple[nn.Module, MemberStrategies] | None:
        """(the trunk with the shared weights, the heads as an ensemble of their own) when the
        members differ only in a head after a shared trunk (`peg.runtime.heads.find_split`, checked
        on `x`), else None; built once per storage. One member shares its trunk with nobody: None
        (a split would cost a structural copy of the model and a check on `x` for nothing)."""
        if len(self) == 1:
            self._heads_cache = (self.stacked, self.shared, None)  # known: no split
            return None
        cached = self.__dict__.get("_heads_cache")
        if cached is None or cached[0] is not self.stacked or cached[1] is not self.shared:
            ends = [self.member_state(0), self.member_state(len(self) - 1)]
            split = find_split(self.skeleton, set(self.stacked), ends, x)
            parts = None
            if split is not None:
                heads = split.head_entries(self.stacked), split.head_entries(self.shared)
                parts = (split.trunk_module(self.shared), type(self)(split.head, *heads))
            cached = (self.stacked, self.shared, parts)
            if parts is not None or checked(self.skeleton, set(self.stacked)):
                self._heads_cache = cached  # not after inputs that did not run: no verdict
        return cached[2]

    def _batch_logits(self, x: Any, strategy: str, chunk_size: int | None) -> Tensor:
        """Logits `[M, B, C]` of every member on one batch with a concrete strategy.

        `x`: a tensor, or structured inputs (a mapping: `model(**x)`; see `peg.source.batches`),
        which "loop" and "vmap" take and "folded" refuses. The forward passes run under
        `torch.inference_mode` (less per-operation bookkeeping than `no_grad`; the modules are
        built before it), and the logits are gathered after it: an ordinary tensor, fit for
        autograd later (temperature scaling)."""
        if strategy == "folded":
            folded = self._folded_for(x)
            with torch.inference_mode():
                out = self._folded_logits(folded, x)
            return out.clone()  # out of inference mode
        if strategy == "loop":
            looped = self.__dict__.get("_loop_batches", 0)
            self._loop_batches = looped + 1
            transient = self.__dict__.get("_transient", False)
            after = LOOP_MODULES_AFTER if transient else LOOP_MODULES_AFTER_HELD
            modules = self._member_modules() if looped >= after else None
            if modules is None:
                return torch.stack([self._member_output(i, x) for i in range(len(self))])
            return _run_modules(modules, x)

        def one(stacked: dict[str, Tensor], x: Any) -> Tensor:
            out = call_functional(self.skeleton, {**self.shared, **stacked}, x)
            return model_output(out, "member_logits", shaped=True)

        step = len(self) if strategy == "vmap" or chunk_size is None else chunk_size
        outs = []
        with torch.inference_mode():
            for start in range(0, len(self), step):  # "chunked": at most `step` members at once
                part = {k: v[start : start + step] for k, v in self.stacked.items()}
                outs.append(vmap(one, in_dims=(0, None))(part, x))
        out = torch.cat(outs)
        if out.ndim < 2:
            raise ValueError(
                f"member_logits: expected logits [B, *] per member, got {tuple(out.shape[1:])}"
            )
        return out

    def _folded_for(self, x: Any) -> Folded:
        """The folded model (`_folded`), or NotFoldable for inputs it cannot take."""
        if not isinstance(x, Tensor):
            raise NotFoldable(
                f"strategy='folded': takes tensor inputs, got {type(x).__name__}; "
                "use 'vmap' or 'loop'"
            )
        return self._folded()

    def _folded_logits(self, folded: Folded, x: Tensor) -> Tensor:
        """`folded(x)` as `[M, B, C]` (a view; expanded where no layer is per member)."""
        try:
            out = model_output(folded(x), "member_logits", shaped=True)
        except (NotFoldable, TypeError):
            raise
        except Exception as e:  # e.g. a forward reading `self.fc.weight`, a replaced layer's
            raise NotFoldable(
                f"strategy='folded': the folded model failed ({type(e).__name__}: {e}); "
                "use 'vmap' or 'loop'"
            ) from e
        if len(out) == len(x):  # no layer with per-member weights on the output's path
            return out.expand(len(self), *out.shape)
        return out.view(len(self), len(x), *out.shape[1:])

    def _member_output(self, i: int, x: Any) -> Tensor:
        """Member `i`'s logits `[B, C]` on one batch (`functional_call`)."""
        return model_output(
            call_functional(self.skeleton, self.member_state(i), x), "member_logits", shaped=True
        )

    def _predict(self, x: Any, chosen: str, fall_back: bool, chunk_size: int | None) -> Tensor:
        """`_batch_logits` with a clear error for bad inputs; with `fall_back` ("auto"), a
        vectorised strategy that fails on the model is remembered and the next one used
        (folded → vmap → loop). With a shared trunk (`_heads`), the trunk runs once and the
        heads with `chosen` (with `fall_back`, the heads' own "auto" choice)."""
        heads = self._heads(x)
        if heads is not None:
            trunk, head = heads
            try:
                features = logits_of(call_model(trunk, x))
            except Exception:
                self._diagnose(x)  # the inputs at fault: a clear error
                raise
            if fall_back:
                chosen = head._choose(features, chunk_size)
            return head._predict(features, chosen, fall_back, chunk_size)
        try:
            return self._batch_logits(x, chosen, chunk_size)
        except Exception as e:
            self._diagnose(x)  # the inputs or the model's output at fault: a clear error
            vectorising = chosen == "folded" or isinstance(e, (RuntimeError, NotImplementedError))
            if not fall_back and chosen in ("vmap", "chunked") and "CUDNN" in str(e).upper():
                raise ValueError(
                    f"strategy={chosen!r}: cuDNN cannot run this model's layers vectorised over "
                    f"members ({str(e).splitlines()[0][:120]}); use strategy='loop' or 'auto' "
                    "(which falls back to the loop by itself)"
                ) from e
            if not fall_back or chosen == "loop" or not vectorising:
                raise
            return self._predict(x, self._failed(chosen), fall_back, chunk_size)

    def _diagnose(self, x: Any) -> None:
        """Raise a clear error if member 0 cannot run on two rows of `x` or returns no logits."""
        out = diagnose(
            lambda rows: call_functional(self.skeleton, self.member_state(0), rows), x, "X"
        )
        model_output(out, "member_logits", shaped=True)
