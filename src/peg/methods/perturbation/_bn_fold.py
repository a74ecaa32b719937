"""Eval-mode BatchNorm folded into the convolution before it, for the scale search's members.

In eval mode a BatchNorm after a convolution is an affine map per output channel, so the pair
is one convolution: W' = W·s, b' = β + (b − μ)·s with s = γ/√(var + ε) per channel (per member:
PEG and PEP perturb W, γ and β; the running statistics are shared or, with bn="refresh", per
member). The scale search runs S members on its scoring points twice; on the CPU a
channels-last BatchNorm over a CNN's first feature map cost as much as a fifth of each member's
forward, and the folded pair skips it. Logits change at rounding level only.

A pair is folded only where the model's structure proves that the convolution's output feeds
the BatchNorm alone: consecutive children of an `nn.Sequential` whose `forward` is
`nn.Sequential`'s own (child k's output is child k+1's input and nothing else's), each module
held once, no hooks. A forward on two rows of the scoring inputs then checks that every call
of each convolution went straight into its BatchNorm, and that the folded skeleton gives the
original's logits (the base weights, within a rounding tolerance): anything else, no folding.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor, nn

from peg.output import logits_of
from peg.source.batches import call_model

_CONVS = (nn.Conv1d, nn.Conv2d, nn.Conv3d)
_NORMS = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)


@dataclass(frozen=True)
class Pair:
    """A convolution (`conv`, its state-dict prefix) and the BatchNorm (`norm`) after it."""

    conv: str
    norm: str
    eps: float


@dataclass(frozen=True)
class FoldedBatchNorm:
    """A skeleton with each folded BatchNorm an `nn.Identity` and its convolution given a bias,
    and how members' entries become its entries (`entries`)."""

    skeleton: nn.Module
    pairs: tuple[Pair, ...]

    def entries(
        self, stacked: Mapping[str, Tensor], shared: Mapping[str, Tensor]
    ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
        """(stacked `[M, ...]`, shared) entries of the folded skeleton from the original's:
        an entry is stacked when any entry it is computed from is."""
        stacked, shared = dict(stacked), dict(shared)
        for pair in self.pairs:
            _fold_pair(pair, stacked, shared)
        return stacked, shared


def _take(
    name: str, stacked: dict[str, Tensor], shared: dict[str, Tensor]
) -> tuple[Tensor | None, bool]:
    """Entry `name` removed from either dict, `[M or 1, ...]` in float64, and whether stacked."""
    if name in stacked:
        return stacked.pop(name).double(), True
    if name in shared:
        return shared.pop(name).double().unsqueeze(0), False
    return None, False


def _fold_pair(pair: Pair, stacked: dict[str, Tensor], shared: dict[str, Tensor]) -> None:
    """Replace `pair`'s entries by the folded convolution's weight and bias, in place."""
    weight_name = f"{pair.conv}.weight"
    dtype = (stacked.get(weight_name, shared.get(weight_name))).dtype
    W, w_s = _take(weight_name, stacked, shared)
    b, b_s = _take(f"{pair.conv}.bias", stacked, shared)
    gamma, g_s = _take(f"{pair.norm}.weight", stacked, shared)
    beta, beta_s = _take(f"{pair.norm}.bias", stacked, shared)
    mean, m_s = _take(f"{pair.norm}.running_mean", stacked, shared)
    var, v_s = _take(f"{pair.norm}.running_var", stacked, shared)
    _take(f"{pair.norm}.num_batches_tracked", stacked, shared)
    assert W is not None and mean is not None and var is not None  # checked by `_pairs`
    s = torch.rsqrt(var + pair.eps)  # [M or 1, C]
    if gamma is not None:
        s = s * gamma
    shift = -mean if b is None else b - mean
    bias = shift * s if beta is None else beta + shift * s
    weight = W * s.reshape(*s.shape, *([1] * (W.ndim - 2)))
    for name, value, member in (
        (weight_name, weight, w_s or g_s or v_s),
        (f"{pair.conv}.bias", bias, b_s or g_s or beta_s or m_s or v_s),
    ):
        value = value.to(dtype)
        if member:
            stacked[name] = value
        else:
            shared[name] = value.squeeze(0)


def _plain(module: nn.Module, kinds: tuple[type, ...]) -> bool:
    """A module of one of `kinds` running that kind's own forward, with no hooks."""
    if not isinstance(module, kinds) or module._forward_hooks or module._forward_pre_hooks:
        return False
    base = next(k for k in kinds if isinstance(module, k))
    return type(module).forward is base.forward


def _candidates(model: nn.Module) -> list[tuple[nn.Module, str, str]]:
    """(parent Sequential, conv child name, BatchNorm child name) for consecutive children
    where the structure proves the convolution feeds the BatchNorm alone."""
    counts: dict[int, int] = {}
    for _, m in model.named_modules(remove_duplicate=False):
        counts[id(m)] = counts.get(id(m), 0) + 1
    found = []
    for _, seq in model.named_modules():
        if not isinstance(seq, nn.Sequential) or type(seq).forward is not nn.Sequential.forward:
            continue
        if seq._forward_hooks or seq._forward_pre_hooks:
            continue
        names = list(seq._modules)
        for a, b in itertools.pairwise(names):
            conv, norm = seq._modules[a], seq._modules[b]
            if not (_plain(conv, _CONVS) and _plain(norm, _NORMS)):
                continue
            if counts[id(conv)] != 1 or counts[id(norm)] != 1 or norm.training:
                continue
            if norm.running_mean is None or norm.num_features != conv.out_channels:
                continue
            found.append((seq, a, b))
    return found


def _fed_straight(model: nn.Module, pairs: list[tuple[nn.Module, nn.Module]], x: Any) -> bool:
    """Whether, on inputs `x`, every call of each convolution went straight into its
    BatchNorm and every call of the BatchNorm came from it (forward hooks on a probe)."""
    calls: list[tuple[int, int, int]] = []  # (module id, input id, output id)

    def record(module: nn.Module, args: tuple[Any, ...], out: Any) -> None:
        calls.append((id(module), id(args[0]) if args else -1, id(out)))

    handles = [m.register_forward_hook(record) for pair in pairs for m in pair]
    try:
        call_model(model, x)
    finally:
        for h in handles:
            h.remove()
    following = {id(conv): id(norm) for conv, norm in pairs}
    norms = set(following.values())
    for k, (module, _, _) in enumerate(calls):
        if module in following:
            nxt = calls[k + 1] if k + 1 < len(calls) else None
            if nxt is None or nxt[0] != following[module] or nxt[1] != calls[k][2]:
                return False
        elif module in norms and (k == 0 or following.get(calls[k - 1][0]) != module):
            return False
    return bool(calls)


@torch.no_grad()
def fold_batch_norm(
    skeleton: nn.Module, state: Mapping[str, Tensor], x: Any
) -> FoldedBatchNorm | None:
    """Fold every provable convolution-BatchNorm pair of `skeleton` (a private copy in eval
    mode, changed in place only when the folding is kept), checked on inputs `x` (two rows)
    with the base entries `state`; None where no pair is folded or the check fails."""
    found = _candidates(skeleton)
    if not found:
        return None
    modules = [(seq._modules[a], seq._modules[b]) for seq, a, b in found]
    try:
        if not _fed_straight(skeleton, modules, x):
            return None
        before = logits_of(torch.func.functional_call(skeleton, dict(state), (x,)))
    except Exception:  # a forward the probe cannot run: nothing to prove with
        return None
    prefix = {id(m): n for n, m in skeleton.named_modules()}
    pairs = tuple(Pair(prefix[id(c)], prefix[id(n)], float(n.eps)) for c, n in modules)
    undo = []
    for (seq, _, b), (conv, norm) in zip(found, modules, strict=True):
        undo.append((seq, b, norm, conv, conv.bias))
        if conv.bias is None:
            conv.bias = nn.Parameter(conv.weight.new_zeros(conv.out_channels))
        seq._modules[b] = nn.Identity()
    folded = FoldedBatchNorm(skeleton, pairs)
    _, shared = folded.entries({}, state)
    try:
        after = logits_of(torch.func.functional_call(skeleton, shared, (x,)))
        scale = before.abs().max().item() if before.numel() else 0.0
        same = after.shape == before.shape and torch.allclose(
            after, before, rtol=1e-4, atol=1e-4 * max(scale, 1.0)
        )
    except Exception:
        same = False
    if same and math.isfinite(scale):
        return folded
    for seq, b, norm, conv, bias in undo:  # put the skeleton back as it was
        seq._modules[b] = norm
        conv.bias = bias
    return None
