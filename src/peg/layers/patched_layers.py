"""The patched layers: BatchNorm, Linear and Conv with K components of their parameters
(`PatchedModule` subclasses), each built from its plain layer and turned back into one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg.layers.patched_module import PatchedModule

BN_TYPES: tuple[type[nn.Module], ...] = (nn.BatchNorm1d, nn.BatchNorm2d, nn.BatchNorm3d)
#: Input ranks each BatchNorm type accepts (as its `_check_input_dim`).
_BN_INPUT_DIMS: dict[type[nn.Module], tuple[int, ...]] = {
    nn.BatchNorm1d: (2, 3),
    nn.BatchNorm2d: (4,),
    nn.BatchNorm3d: (5,),
}
_CONV_FN: dict[type[nn.Module], Callable[..., Tensor]] = {
    nn.Conv1d: F.conv1d,
    nn.Conv2d: F.conv2d,
    nn.Conv3d: F.conv3d,
}


class PatchedBatchNorm(PatchedModule):
    """BatchNorm with K components of γ and β; normalisation as `nn.BatchNorm{1,2,3}d`.

    Built from an affine BatchNorm, whose running statistics (same buffer names) it keeps
    updating in train mode exactly as BatchNorm does. Input `[B, C, ...]` -> output of the
    same shape. Parameters: `weight_components`, `bias_components`, both `[K, C]`.
    """

    def __init__(
        self,
        bn: nn.BatchNorm1d | nn.BatchNorm2d | nn.BatchNorm3d,
        k: int,
        mode: str = "emp",
        noise: float = 0.1,
        sigma: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(k, mode, sigma)
        if type(bn) not in BN_TYPES or not bn.affine:
            raise ValueError(
                f"bn: expected an affine nn.BatchNorm1d/2d/3d, got {type(bn).__name__}"
                f"{'' if getattr(bn, 'affine', True) else ' with affine=False'}"
            )
        self.plain_type = type(bn)
        self.num_features = bn.num_features
        self.eps = bn.eps
        self.momentum = bn.momentum
        self.track_running_stats = bn.track_running_stats
        # The running statistics are taken over as they are (the same tensors).
        self.register_buffer("running_mean", bn.running_mean)
        self.register_buffer("running_var", bn.running_var)
        self.register_buffer("num_batches_tracked", bn.num_batches_tracked)
        std = _noise_std(noise, bn.weight)
        self._init_components("weight", bn.weight, std, generator)
        self._init_components("bias", bn.bias, std, generator)
        self.mix = self.mix.to(bn.weight.device)

    def forward(self, x: Tensor) -> Tensor:
        """`[B, C, ...]` normalised with the batch (train) or running (eval) statistics."""
        dims = _BN_INPUT_DIMS[self.plain_type]
        if x.dim() not in dims:
            raise ValueError(
                f"x: {self.plain_type.__name__} expects {' or '.join(f'{d}D' for d in dims)} "
                f"input, got {x.dim()}D"
            )
        # The factor and flags below follow nn.BatchNorm's own forward, so K = 1 is exact.
        factor = 0.0 if self.momentum is None else self.momentum
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = 1.0 / float(self.num_batches_tracked) if self.momentum is None else factor
        use_batch = self.training or (self.running_mean is None and self.running_var is None)
        track = not self.training or self.track_running_stats
        p = self.effective()
        return F.batch_norm(
            x,
            self.running_mean if track else None,
            self.running_var if track else None,
            p["weight"],
            p["bias"],
            use_batch,
            factor,
            self.eps,
        )

    def to_plain(self, component: int | None = None) -> nn.Module:
        """An `nn.BatchNorm{1,2,3}d` with γ, β from the mixture mean (None) or `component`."""
        values = self._plain_values(component)
        w = values["weight"]
        bn = self.plain_type(
            self.num_features,
            eps=self.eps,
            momentum=self.momentum,
            affine=True,
            track_running_stats=self.track_running_stats,
            device=w.device,
            dtype=w.dtype,
        )
        with torch.no_grad():
            bn.weight.copy_(w)
            bn.bias.copy_(values["bias"])
        bn.running_mean, bn.running_var = self.running_mean, self.running_var
        bn.num_batches_tracked = self.num_batches_tracked
        return bn

    def extra_repr(self) -> str:
        return f"{self.num_features}, {super().extra_repr()}"


class PatchedLinear(PatchedModule):
    """`nn.Linear` with K components of its weight `[K, O, I]` and bias `[K, O]`.

    Input `[B, ..., I]` -> output `[B, ..., O]`.
    """

    def __init__(
        self,
        linear: nn.Linear,
        k: int,
        mode: str = "emp",
        noise: float = 0.1,
        sigma: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(k, mode, sigma)
        if type(linear) is not nn.Linear:
            raise ValueError(f"linear: expected an nn.Linear, got {type(linear).__name__}")
        self.in_features, self.out_features = linear.in_features, linear.out_features
        std = _noise_std(noise, linear.weight)
        self._init_components("weight", linear.weight, std, generator)
        self._init_components("bias", linear.bias, std, generator)
        self.mix = self.mix.to(linear.weight.device)

    def forward(self, x: Tensor) -> Tensor:
        """`x @ Wᵀ + b` with the drawn (or mean) W and b."""
        p = self.effective()
        return F.linear(x, p["weight"], p.get("bias"))

    def to_plain(self, component: int | None = None) -> nn.Module:
        """An `nn.Linear` with the mixture mean (None) or one component."""
        values = self._plain_values(component)
        w = values["weight"]
        layer = nn.Linear(
            self.in_features,
            self.out_features,
            bias="bias" in values,
            device=w.device,
            dtype=w.dtype,
        )
        _copy_into(layer, values)
        return layer

    def extra_repr(self) -> str:
        return f"{self.in_features}, {self.out_features}, {super().extra_repr()}"


class PatchedConv(PatchedModule):
    """`nn.Conv{1,2,3}d` with K components of its weight `[K, O, I/groups, *kernel]` and bias.

    Input `[B, I, *spatial]` -> output `[B, O, *spatial']`, as the plain convolution.
    """

    def __init__(
        self,
        conv: nn.Conv1d | nn.Conv2d | nn.Conv3d,
        k: int,
        mode: str = "emp",
        noise: float = 0.1,
        sigma: float = 0.0,
        generator: torch.Generator | None = None,
    ) -> None:
        super().__init__(k, mode, sigma)
        if type(conv) not in _CONV_FN:
            raise ValueError(f"conv: expected an nn.Conv1d/2d/3d, got {type(conv).__name__}")
        self.plain_type = type(conv)
        self.in_channels, self.out_channels = conv.in_channels, conv.out_channels
        self.kernel_size, self.stride = conv.kernel_size, conv.stride
        self.padding, self.dilation = conv.padding, conv.dilation
        self.groups, self.padding_mode = conv.groups, conv.padding_mode
        self._reversed_padding_repeated_twice = conv._reversed_padding_repeated_twice
        std = _noise_std(noise, conv.weight)
        self._init_components("weight", conv.weight, std, generator)
        self._init_components("bias", conv.bias, std, generator)
        self.mix = self.mix.to(conv.weight.device)

    def forward(self, x: Tensor) -> Tensor:
        """The convolution with the drawn (or mean) kernel, as `nn.Conv*d.forward`."""
        p = self.effective()
        conv = _CONV_FN[self.plain_type]
        if self.padding_mode != "zeros":
            x = F.pad(x, self._reversed_padding_repeated_twice, mode=self.padding_mode)
            padding: Any = 0
        else:
            padding = self.padding
        return conv(x, p["weight"], p.get("bias"), self.stride, padding, self.dilation, self.groups)

    def to_plain(self, component: int | None = None) -> nn.Module:
        """An `nn.Conv{1,2,3}d` with the mixture mean (None) or one component."""
        values = self._plain_values(component)
        w = values["weight"]
        layer = self.plain_type(
            self.in_channels,
            self.out_channels,
            self.kernel_size,
            stride=self.stride,
            padding=self.padding,
            dilation=self.dilation,
            groups=self.groups,
            bias="bias" in values,
            padding_mode=self.padding_mode,
            device=w.device,
            dtype=w.dtype,
        )
        _copy_into(layer, values)
        return layer

    def extra_repr(self) -> str:
        return (
            f"{self.in_channels}, {self.out_channels}, kernel_size={self.kernel_size}, "
            f"stride={self.stride}, {super().extra_repr()}"
        )


def _noise_std(noise: float, weight: Tensor) -> float:
    """`noise` × RMS of the layer's weight (γ for BatchNorm), or `noise` itself if that is 0."""
    rms = float(weight.detach().float().pow(2).mean().sqrt()) if weight.numel() else 0.0
    return noise * (rms if rms > 0 else 1.0)


def _copy_into(layer: nn.Module, values: dict[str, Tensor]) -> None:
    with torch.no_grad():
        for name, value in values.items():
            getattr(layer, name).copy_(value)
