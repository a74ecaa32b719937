"""A second device on a machine without one: tensors on `fakegpu:0` (PyTorch's PrivateUse1
device, registered from Python) that keep their values on the CPU, with GPU's placement rules.

CI has no GPU, yet the bugs a GPU finds first are placement bugs: labels left on the CPU and
indexed by a mask made on the GPU, inputs fed to a model whose weights moved. Those need a
second device, not a fast one. Inside `fake_gpu()`:

- `tensor.to("fakegpu")`, `module.to("fakegpu")` and factories called with
  `device="fakegpu"` give `FakeGpu` tensors: `.device` is `fakegpu:0`, the values are a CPU
  tensor inside; autograd, optimisers, `torch.func` and vmap work on them;
- every operation checks devices as GPU does and raises PyTorch's own words ("Expected all
  tensors to be on the same device ...") where a GPU would: a CPU tensor with dimensions beside
  a GPU one (0-dimensional CPU tensors are allowed, as on GPU); a CPU tensor indexed by GPU
  indices (a GPU tensor may be indexed by CPU ones); `.numpy()` of a GPU tensor. Copies between
  devices (`copy_`, `.to`) are allowed.

What it cannot tell: speed, TF32 or non-deterministic kernels (the numbers are the CPU's
exactly), cuDNN's restrictions, pinned memory (`pin_memory` returns the tensor as it is), and
code that tests `device.type == "cuda"` (the GPU tests run those on a real GPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any
from unittest import mock

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map


class _Backend(torch.utils.backend_registration._DummyBackendModule):
    """`torch.fakegpu`: one device whose random numbers are the CPU's (its operators run there),
    so that `torch.random.fork_rng()`, which forks the accelerator's state too once one is
    registered, keeps working everywhere in the process."""

    def get_rng_state(self, device: Any = None) -> torch.Tensor:
        return torch.get_rng_state()

    def set_rng_state(self, state: torch.Tensor, device: Any = None) -> None:
        torch.set_rng_state(state)

    def manual_seed(self, seed: int) -> None:
        torch.manual_seed(seed)

    def is_available(self) -> bool:
        """Inside `fake_gpu()` only: elsewhere `torch.accelerator.is_available()` is False, as
        on a CPU machine, so libraries that follow the accelerator (accelerate >= 1.16, under
        the HF Trainer) stay on the CPU instead of calling what a Python backend lacks."""
        return _ACTIVE[0] > 0


_ACTIVE = [0]  # open `fake_gpu()` contexts
torch.utils.backend_registration._setup_privateuseone_for_python_backend(
    "fakegpu", backend_module=_Backend()
)
GPU = torch.device("fakegpu", 0)
CPU = torch.device("cpu")
_INDEXING = {
    torch.ops.aten.index.Tensor,
    torch.ops.aten.index_put.default,
    torch.ops.aten.index_put_.default,
    torch.ops.aten._index_put_impl_.default,
}
_CROSS_DEVICE = {torch.ops.aten.copy_.default, torch.ops.aten._to_copy.default}


class FakeGpu(torch.Tensor):
    """A tensor on `fakegpu:0` whose values (`.elem`) are on the CPU."""

    elem: torch.Tensor
    __torch_function__ = torch._C._disabled_torch_function_impl  # results stay as dispatched

    @staticmethod
    def __new__(cls, elem: torch.Tensor, requires_grad: bool = False) -> FakeGpu:
        out = torch.Tensor._make_wrapper_subclass(  # type: ignore[attr-defined]
            cls,
            elem.shape,
            strides=elem.stride(),
            storage_offset=elem.storage_offset(),
            dtype=elem.dtype,
            layout=elem.layout,
            device=GPU,
            requires_grad=requires_grad,
        )
        out.elem = elem
        return out

    def __repr__(self, *, tensor_contents: Any = None) -> str:
        return f"FakeGpu({self.elem!r})"

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        _check_devices(func, args, kwargs)
        target = kwargs.get("device")
        if target is not None:
            kwargs["device"] = CPU
        out = func(*tree_map(_unwrap, args), **tree_map(_unwrap, kwargs))
        off_gpu = target is not None and torch.device(target).type == "cpu"
        if func is torch.ops.aten._to_copy.default and off_gpu:
            return out
        return tree_map(_wrap, out)


def _unwrap(t: Any) -> Any:
    return t.elem if isinstance(t, FakeGpu) else t


def _wrap(t: Any) -> Any:
    return FakeGpu(t) if isinstance(t, torch.Tensor) and not isinstance(t, FakeGpu) else t


def _tensors(tree: Any) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda t: found.append(t) if isinstance(t, torch.Tensor) else None, tree)
    return found


def _check_devices(func: Any, args: Any, kwargs: Any) -> None:
    """Raise where GPU would: tensors with dimensions on two devices in one operation."""
    if func in _CROSS_DEVICE:
        return
    if func in _INDEXING:
        self, indices = args[0], _tensors(args[1:])
        if not isinstance(self, FakeGpu) and any(isinstance(i, FakeGpu) for i in indices):
            raise RuntimeError(
                "indices should be either on cpu or on the same device as the indexed tensor "
                "(cpu)"
            )
        return
    tensors = _tensors((args, kwargs))
    cpu = [t for t in tensors if not isinstance(t, FakeGpu) and t.dim() > 0]
    if cpu and any(isinstance(t, FakeGpu) for t in tensors):
        raise RuntimeError(
            "Expected all tensors to be on the same device, but found at least two devices, "
            f"fakegpu:0 and cpu! (in {func})"
        )


def _is_gpu(device: Any) -> bool:
    return device is not None and not isinstance(device, torch.Tensor) and (
        torch.device(device).type == "fakegpu"
    )


class _Mode(TorchFunctionMode):
    """Moves to `fakegpu` give `FakeGpu` tensors; factories with `device="fakegpu"` too."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if func is torch.Tensor.to:
            return _move(args, kwargs)
        if func is torch.Tensor.pin_memory:
            return args[0]
        if func is torch.Tensor.is_pinned:
            return False
        if func in (torch.Tensor.tolist, torch.Tensor.untyped_storage) and isinstance(
            args[0], FakeGpu
        ):  # the values' own (a wrapper has no storage)
            return func(args[0].elem)
        if func in (torch.Tensor.numpy, torch.Tensor.__array__) and isinstance(args[0], FakeGpu):
            raise TypeError(
                "can't convert fakegpu:0 device type tensor to numpy. Use Tensor.cpu() to copy the "
                "tensor to host memory first."
            )
        if _is_gpu(kwargs.get("device")):
            kwargs["device"] = CPU
            return tree_map(_leaf, func(*args, **kwargs))
        return func(*args, **kwargs)


def _leaf(t: Any) -> Any:
    """A factory's result on the fake device, a leaf that requires grad if it did."""
    if not isinstance(t, torch.Tensor) or isinstance(t, FakeGpu):
        return t
    return FakeGpu(t.detach(), requires_grad=t.requires_grad)


def _move(args: Any, kwargs: Any) -> Any:
    """`tensor.to(...)`: onto the fake device here, anything else dispatched as usual."""
    self, options = args[0], dict(kwargs)
    copy = options.pop("copy", False)
    options.pop("non_blocking", None)
    device, dtype, _, _ = torch._C._nn._parse_to(*args[1:], **options)
    if not _is_gpu(device):
        return torch.Tensor.to(*args, **kwargs)
    if isinstance(self, FakeGpu):
        return self.to(dtype=dtype, copy=copy) if dtype is not None or copy else self
    moved = self.detach().to(dtype=dtype or self.dtype).clone()  # a move copies
    return FakeGpu(moved, requires_grad=self.requires_grad and moved.is_floating_point())


class _Factories(TorchDispatchMode):
    """Operators called with `device="fakegpu"` and no tensor to dispatch on (factories, also
    those PyTorch's own composite operators call) run on the CPU, their results on `fakegpu`."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = dict(kwargs or {})
        if _is_gpu(kwargs.get("device")):
            kwargs["device"] = CPU
            return tree_map(_wrap, func(*args, **kwargs))
        return func(*args, **kwargs)


def _no_grad(mode: bool = True) -> Any:
    return torch.no_grad() if mode else contextlib.nullcontext()


@contextlib.contextmanager
def fake_gpu() -> Iterator[torch.device]:
    """A context in which `fakegpu:0` works as a second device; yields it."""
    _ACTIVE[0] += 1
    try:
        with _Mode(), _Factories(), mock.patch("torch.inference_mode", _no_grad):
            yield GPU
    finally:
        _ACTIVE[0] -= 1
