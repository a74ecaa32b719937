"""Members folded into the batch dimension: every member of an ensemble in one forward pass.

`fold(skeleton, stacked, shared)` returns a copy of the skeleton whose layers with weights hold
all M members' weights (views of the ensemble's tensors, no copies). Activations are
member-major `[M·B, ...]`: member m's rows are m·B … (m+1)·B − 1. Every operation without
weights (activations, pooling, flatten, residual sums, `x.view(len(x), -1)`) runs on them
unchanged; each layer with weights applies member m's weights to member m's rows in one call:

- Linear: one `baddbmm` over `[M, B·…, in]`;
- Conv1d/2d/3d: one grouped convolution over `[B, M·C, ...]`;
- BatchNorm (eval, running statistics), LayerNorm, GroupNorm: per-member affine maps.

The input is shared by every member and is not repeated: it enters as `[B, ...]`, and a layer
that receives such a shared tensor runs all members as one wide layer (Linear: a single
`[B, in] × [in, M·out]` matmul; conv: one convolution with M·out channels), reading the M
weight matrices as one. That is where small batches gain most: `torch.func.vmap` broadcasts an
unbatched input into M matrix–vector products instead (docs/performance.md, "Inference").
A tensor is recognised as shared by its row count (B, against M·B when folded); a layer
seeing any other count raises `NotFoldable`.

Limits, checked before use: a module with weights of another kind holding per-member values,
a BatchNorm without running statistics, or a non-zero padding mode raise `NotFoldable` when
folding; a forward that mixes rows (e.g. `x.mean(0)`) would silently mix members, so `Ensemble`
compares two members' folded logits with `functional_call` once per architecture before it
relies on folding (and vectorises with vmap otherwise).
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Callable, Mapping
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg.errors import NotFoldable

__all__ = ["NotFoldable", "fold"]

_CONV: dict[type[nn.Module], Callable[..., Tensor]] = {
    nn.Conv1d: F.conv1d,
    nn.Conv2d: F.conv2d,
    nn.Conv3d: F.conv3d,
}


class _Rows:
    """Members M and rows B of the call in progress, shared by a folded model's layers."""

    def __init__(self, members: int) -> None:
        self.members = members
        self.batch = 0

    def is_shared(self, x: Tensor, where: str) -> bool:
        """True for the shared input's B rows, False for M·B folded rows."""
        if x.shape[0] == self.batch:
            return True
        if x.shape[0] == self.members * self.batch:
            return False
        raise NotFoldable(
            f"{where}: received {x.shape[0]} rows, expected {self.batch} (shared input) or "
            f"{self.members * self.batch} (M × B folded); the forward changes the batch size"
        )

    def unfold(self, x: Tensor) -> Tensor:
        """`[M·B, ...]` → `[M, B, ...]` (a view)."""
        return x.view(self.members, self.batch, *x.shape[1:])

    def expand(self, x: Tensor) -> Tensor:
        """A shared `[B, ...]` tensor as every member's rows, `[M·B, ...]`."""
        return x.expand(self.members, *x.shape).reshape(-1, *x.shape[1:])

    def members_last(self, x: Tensor) -> Tensor:
        """`[B, M·K, ...]` (members as channel groups) → folded `[M·B, K, ...]`."""
        B, M = x.shape[0], self.members
        per = x.view(B, M, x.shape[1] // M, *x.shape[2:]).transpose(0, 1)
        return per.reshape(M * B, *per.shape[2:])


class _Layer(nn.Module):
    """A folded layer: its weights are `[M, ...]` (per member) or as in the model (shared)."""

    def __init__(
        self, rows: _Rows, name: str, tensors: Mapping[str, Tensor | None], stacked: set[str]
    ) -> None:
        super().__init__()
        self.rows = rows
        self.where = name or "model"
        self.tensors = dict(tensors)
        self.stacked = stacked - {"num_batches_tracked"}  # names of the per-member tensors

    def per_member(self, key: str, shape: tuple[int, ...]) -> Tensor | None:
        """Tensor `key` as `[M, *shape]` (a shared one expanded, a view), or None."""
        t = self.tensors[key]
        if t is None:
            return None
        if key not in self.stacked:
            t = t.expand(self.rows.members, *t.shape)
        return t.reshape(self.rows.members, *shape)


class _Linear(_Layer):
    def forward(self, x: Tensor) -> Tensor:
        weight, bias = self.tensors["weight"], self.tensors["bias"]
        assert weight is not None
        shared = self.rows.is_shared(x, self.where)
        if not self.stacked:  # the same layer for every member
            return F.linear(x, weight, bias)
        M, (out, inp) = self.rows.members, weight.shape[-2:]
        w = self.per_member("weight", (out, inp))
        b = self.per_member("bias", (out,))
        if shared:  # one wide layer: [B, ..., in] × [in, M·out]
            y = F.linear(x, w.reshape(M * out, inp), None if b is None else b.reshape(-1))
            y = y.unflatten(-1, (M, out)).movedim(-2, 0)  # [M, B, ..., out]
            return y.reshape(M * x.shape[0], *y.shape[2:])
        xs = x.reshape(M, -1, inp)  # [M, B·…, in]
        wt = w.transpose(1, 2)
        y = torch.bmm(xs, wt) if b is None else torch.baddbmm(b.unsqueeze(1), xs, wt)
        return y.view(*x.shape[:-1], out)


class _Conv(_Layer):
    def __init__(self, conv: nn.Module, *args: Any) -> None:
        super().__init__(*args)
        assert isinstance(conv, nn.modules.conv._ConvNd)
        if conv.padding_mode != "zeros":
            raise NotFoldable(f"{self.where}: padding_mode={conv.padding_mode!r} (only 'zeros')")
        self.conv = _CONV[type(conv)]
        self.options = {"stride": conv.stride, "padding": conv.padding, "dilation": conv.dilation}
        self.groups = conv.groups
        self.spatial = len(conv.kernel_size)

    def forward(self, x: Tensor) -> Tensor:
        weight = self.tensors["weight"]
        assert weight is not None
        shared = self.rows.is_shared(x, self.where)
        if not self.stacked:
            return self.conv(x, weight, self.tensors["bias"], groups=self.groups, **self.options)
        M, shape = self.rows.members, tuple(weight.shape[-(2 + self.spatial) :])
        w = self.per_member("weight", shape).reshape(M * shape[0], *shape[1:])
        b = self.per_member("bias", (shape[0],))
        b = None if b is None else b.reshape(-1)
        if shared and self.groups == 1:  # one convolution with M·out channels
            y = self.conv(x, w, b, **self.options)
        else:  # members as channel groups: [B, M·C, ...]
            x = self.rows.expand(x) if shared else x
            per = self.rows.unfold(x).transpose(0, 1)
            xs = per.reshape(per.shape[0], -1, *per.shape[3:])
            y = self.conv(xs, w, b, groups=M * self.groups, **self.options)
        return self.rows.members_last(y)


class _Affine(_Layer):
    """Normalisation layers: a member-independent normalisation, then per-member scale/shift."""

    def __init__(self, norm: nn.Module, *args: Any) -> None:
        super().__init__(*args)
        self.norm = norm
        if isinstance(norm, nn.modules.batchnorm._BatchNorm) and (
            self.tensors.get("running_mean") is None or self.tensors.get("running_var") is None
        ):
            raise NotFoldable(
                f"{self.where}: BatchNorm without running statistics normalises with the "
                "batch's own statistics, which would mix members"
            )
        self.features = (
            tuple(norm.normalized_shape)
            if isinstance(norm, nn.LayerNorm)
            else (norm.num_channels if isinstance(norm, nn.GroupNorm) else norm.num_features,)
        )

    def _scale_shift(self) -> tuple[Tensor | None, Tensor | None]:
        """Per-member (or shared) scale and shift after the plain normalisation, `[M?, *F]`."""
        t = self.tensors
        if not isinstance(self.norm, nn.modules.batchnorm._BatchNorm):
            return t.get("weight"), t.get("bias")
        mean, var = t["running_mean"], t["running_var"]
        assert mean is not None and var is not None
        scale = torch.rsqrt(var + self.norm.eps)
        if t.get("weight") is not None:
            scale = scale * t["weight"]
        shift = -mean * scale
        if t.get("bias") is not None:
            shift = shift + t["bias"]
        return scale, shift

    def forward(self, x: Tensor) -> Tensor:
        shared = self.rows.is_shared(x, self.where)
        norm, t = self.norm, self.tensors
        if not self.stacked:  # exactly the model's own layer
            if isinstance(norm, nn.modules.batchnorm._BatchNorm):
                mean, var = t["running_mean"], t["running_var"]
                w, b = t.get("weight"), t.get("bias")
                return F.batch_norm(x, mean, var, w, b, False, 0.0, norm.eps)
            if isinstance(norm, nn.LayerNorm):
                return F.layer_norm(x, self.features, t.get("weight"), t.get("bias"), norm.eps)
            return F.group_norm(x, norm.num_groups, t.get("weight"), t.get("bias"), norm.eps)
        if isinstance(norm, nn.LayerNorm):
            z = F.layer_norm(x, self.features, None, None, norm.eps)
        elif isinstance(norm, nn.GroupNorm):
            z = F.group_norm(x, norm.num_groups, None, None, norm.eps)
        else:
            z = x
        if shared:
            z = self.rows.expand(z)
        scale, shift = self._scale_shift()
        M = self.rows.members
        if isinstance(norm, nn.LayerNorm):  # features are the trailing dimensions
            per, view = z.reshape(M, -1, *self.features), (M, 1, *self.features)
        else:  # features are the channels, dimension 1
            per, view = z.reshape(M, self.rows.batch, self.features[0], -1), (M, 1, -1, 1)
        fresh = False  # whether `per` is a tensor of our own, to overwrite
        for factor, op in ((scale, torch.mul), (shift, torch.add)):
            if factor is not None:
                if factor.ndim == len(self.features):  # shared
                    factor = factor.expand(M, *factor.shape)
                factor = factor.reshape(view)
                # in place on our own product: one activation-sized buffer fewer to allocate
                per = per.add_(factor) if fresh else op(per, factor)
                fresh = True
        return per.reshape(z.shape)


_NORMS = (nn.modules.batchnorm._BatchNorm, nn.LayerNorm, nn.GroupNorm)


def _folded_layer(module: nn.Module, *args: Any) -> _Layer | None:
    """The folded form of `module` (arguments as `_Layer`), or None for a kind without one."""
    if type(module) is nn.Linear:
        return _Linear(*args)
    if type(module) in _CONV:
        return _Conv(module, *args)
    if isinstance(module, _NORMS):
        return _Affine(module, *args)
    return None


class Folded(nn.Module):
    """The skeleton with folded layers: `forward(x [B, ...])` → outputs `[M·B, ...]`."""

    def __init__(self, model: nn.Module, rows: _Rows, leftover: dict[str, Tensor]) -> None:
        super().__init__()
        self.model = model
        self.rows = rows
        self.leftover = leftover  # shared tensors of the layers kept as they are

    def forward(self, x: Tensor) -> Tensor:
        self.rows.batch = x.shape[0]
        if self.leftover:
            return torch.func.functional_call(self.model, self.leftover, (x,))
        return self.model(x)


def fold(
    skeleton: nn.Module, stacked: Mapping[str, Tensor], shared: Mapping[str, Tensor]
) -> Folded:
    """The members of `(skeleton, stacked, shared)` (an `Ensemble`'s storage) as one module.

    Raises:
        NotFoldable: a module holding per-member tensors has no folded form, a BatchNorm has
            no running statistics, or a convolution pads other than with zeros.
    """
    members = int(next(iter(stacked.values())).shape[0])
    rows = _Rows(members)
    own = itertools.chain(skeleton.parameters(), skeleton.buffers())
    model = copy.deepcopy(skeleton, memo={id(t): t for t in own})  # the structure, not the tensors
    leftover: dict[str, Tensor] = {}
    for name, module in list(model.named_modules()):
        keys = [k for k, _ in module.named_parameters(recurse=False)]
        keys += [k for k, _ in module.named_buffers(recurse=False)]
        if not keys:
            continue
        full = {k: f"{name}.{k}" if name else k for k in keys}
        tensors = {k: stacked.get(f, shared.get(f)) for k, f in full.items()}
        for absent in ("weight", "bias"):  # e.g. Linear(bias=False) registers bias as None
            tensors.setdefault(absent, None)
        per_member = {k for k, f in full.items() if f in stacked}
        layer = _folded_layer(module, rows, name, tensors, per_member)
        if layer is not None:
            if name:
                model.set_submodule(name, layer)
            else:  # the model is a single layer
                model = layer
            continue
        if per_member:
            raise NotFoldable(
                f"{name or 'model'}: a {type(module).__name__} holds per-member tensors "
                f"({sorted(per_member)[:3]}) and has no folded form"
            )
        leftover.update({f: shared[f] for f in full.values() if f in shared})
    return Folded(model, rows, leftover)
