"""Models: the toy MLP, small CNNs, and the CIFAR architectures of the papers.

from peg import models
net = models.build("small-cnn", in_channels=1, num_classes=10)   # logits [B, 10]
net = models.build("preresnet164", num_classes=100)              # PEG paper, CIFAR-100

Every model takes `in_channels` (images) or `in_features` (MLP) and `num_classes`, and maps a
batch to logits `[B, num_classes]`. The CIFAR models expect 32×32 inputs and also run on 28×28
(adaptive pooling); most take a `width` multiplier (`widen_factor` for WideResNet).

MLP, VGG and the ResNets also take `packed=(alpha, num_estimators, gamma)` for their
Packed-Ensembles variant (`_packed.py`): `member_forward(x)` -> `[M, B, C]`, and `forward(x)`
-> `[B, C]`, the log of the averaged member probabilities.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from torch import nn

from peg.models._packed import Packing
from peg.models.cnn import LandscapeCNN, MediumCNN, SmallCNN
from peg.models.gaussian import GaussianHead, RegressionMLP
from peg.models.lenet import LeNet
from peg.models.mlp import MLP
from peg.models.preresnet import PreResNet
from peg.models.resnet import CifarResNet, ResNet
from peg.models.vgg import VGG
from peg.models.wide_resnet import WideResNet
from peg.utils.registry import Registry


class Preset:
    """`cls` with some constructor arguments fixed by the name (e.g. "resnet20": depth=20).

    Calling it with one of the fixed arguments is a ValueError naming the argument, rather
    than silently building a different network than the name says.
    """

    def __init__(self, cls: type[nn.Module], **fixed: Any) -> None:
        self.cls = cls
        self.fixed = fixed

    def __call__(self, **kwargs: Any) -> nn.Module:
        clash = sorted(kwargs.keys() & self.fixed.keys())
        if clash:
            key = clash[0]
            raise ValueError(
                f"{key}: fixed to {self.fixed[key]!r} by this model name; "
                f"call {self.cls.__name__}({key}=...) for other values"
            )
        return self.cls(**self.fixed, **kwargs)

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.fixed.items())
        return f"{self.cls.__name__}({args})"


#: Model name -> constructor; `build(name, **kwargs)` calls `REGISTRY[name](**kwargs)`.
REGISTRY: Registry[Callable[..., nn.Module]] = Registry("model")
for _key, _ctor in (
    ("mlp", MLP),
    ("small-cnn", SmallCNN),
    ("landscape-small-cnn", LandscapeCNN),
    ("medium-cnn", MediumCNN),
    ("lenet", LeNet),
    ("vgg", VGG),
    ("vgg16", Preset(VGG, depth=16, batch_norm=False)),
    ("vgg16-bn", Preset(VGG, depth=16, batch_norm=True)),
    ("preresnet", PreResNet),
    ("preresnet20", Preset(PreResNet, depth=20)),
    ("preresnet56", Preset(PreResNet, depth=56)),
    ("preresnet110", Preset(PreResNet, depth=110)),
    ("preresnet164", Preset(PreResNet, depth=164)),
    ("wide-resnet", WideResNet),
    ("wrn28-10", Preset(WideResNet, depth=28, widen_factor=10)),
    ("cifar-resnet", CifarResNet),
    ("resnet20", Preset(CifarResNet, depth=20)),
    ("resnet", ResNet),
    ("resnet18", Preset(ResNet, depth=18)),
    ("resnet50", Preset(ResNet, depth=50)),
):
    REGISTRY.add(_key, _ctor)
del _key, _ctor


def arguments(name: str) -> list[str] | None:
    """The constructor arguments `build(name, ...)` accepts (None: any, it takes **kwargs)."""
    key = name.strip().lower().replace("_", "-") if isinstance(name, str) else None
    if key not in REGISTRY:
        raise ValueError(f"name: unknown model {name!r}; known: {', '.join(sorted(REGISTRY))}")
    ctor = REGISTRY[key]
    cls = ctor.cls if isinstance(ctor, Preset) else ctor  # a Preset names its fixed ones itself
    params = list(inspect.signature(cls).parameters.values())
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return None
    return [p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]


def check_arguments(name: str, kwargs: dict[str, Any]) -> None:
    """A TypeError naming the unknown constructor arguments of model `name`, if any."""
    known = arguments(name)
    unknown = sorted(set(kwargs) - set(known)) if known is not None else []
    if unknown:
        raise TypeError(f"{name}: unknown argument(s) {unknown}; it takes {known}")


def build(name: str, **kwargs: Any) -> nn.Module:
    """A model by name with constructor arguments `kwargs`.

    Args:
        name: a key of `REGISTRY` (case and "_" vs "-" are ignored):
            "mlp" (`MLP(in_features, num_classes, hidden, activation, dropout)`);
            "small-cnn" (this library's fast `SmallCNN(in_channels, num_classes, width,
            batch_norm, dropout, stem_stride)`);
            "landscape-small-cnn", "medium-cnn" (Fort et al. 2019: `LandscapeCNN`,
            `MediumCNN`); "lenet" (LeNet-5);
            "vgg16", "vgg16-bn" (SWA reference VGG; "vgg" takes `depth`);
            "preresnet20", "preresnet56", "preresnet110", "preresnet164" (SWA reference
            PreResNet; "preresnet" takes `depth`);
            "wrn28-10" ("wide-resnet" takes `depth`, `widen_factor`);
            "resnet20" (He et al. CIFAR; "cifar-resnet" takes `depth`);
            "resnet18", "resnet50" (CIFAR stem; "resnet" takes `depth`).
        **kwargs: passed to the constructor (`in_channels`, `num_classes`, `width`, ...;
            `packed={"alpha": 2, "num_estimators": 4, "gamma": 1}` for "mlp", "vgg*",
            "resnet*", "cifar-resnet").

    Returns:
        The model (in training mode, freshly initialised from torch's global generator).
    """
    check_arguments(name, kwargs)
    return REGISTRY[name.strip().lower().replace("_", "-")](**kwargs)


__all__ = [
    "MLP",
    "REGISTRY",
    "VGG",
    "CifarResNet",
    "GaussianHead",
    "LandscapeCNN",
    "LeNet",
    "MediumCNN",
    "Packing",
    "PreResNet",
    "Preset",
    "RegressionMLP",
    "ResNet",
    "SmallCNN",
    "WideResNet",
    "build",
]
