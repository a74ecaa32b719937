"""Packed-Ensembles speed on CPU, in the layout of Table 8 of Laurent et al. (2023).

Training (s/epoch) and inference (images/s) of the single model, Packed-Ensembles-(2, 4, 1),
Packed-Ensembles-(2, 4, 2) and Deep Ensembles of 4 (the single model looped 4 times), measured
in one run on random 32×32×3 inputs (CIFAR-sized, 10 classes), float32.

- Inference: eval mode, `torch.inference_mode`, images/s over `--batches` batches.
- Training: one SGD step (forward, loss, backward, update) per batch; the Packed-Ensembles use
  `packed_loss`, the Deep Ensemble steps each member on its own loss. s/epoch is the measured
  time per image × `--epoch-images` (default 50,000, CIFAR-10's training set): a full epoch on
  CPU would take far too long, and the ratio to the single model is what the table is about.
- The models are timed in turns (single, PE-1, PE-2, DE, single, ...) `--repeats` times and the
  median is kept, so load on the machine hits every model alike; ratios are within this run.

    python benchmarks/packed_speed.py             # ResNet-18, batch 64
    python benchmarks/packed_speed.py --quick     # a smoke run: batch 8, one batch, one repeat
    python benchmarks/packed_speed.py --arch resnet20
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from peg import models
from peg.losses import packed_loss
from peg.utils.env import machine

ARCH_NAMES = {"resnet18": "ResNet-18", "resnet20": "ResNet-20", "resnet50": "ResNet-50"}
CLASSES = 10


@dataclass
class Contender:
    """One row of the table: its models (one, or the Deep Ensemble's members) and its loss."""

    name: str
    nets: list[nn.Module]
    loss: Callable[[Tensor, Tensor], Tensor]
    opts: list[torch.optim.Optimizer]

    @property
    def params(self) -> int:
        return sum(p.numel() for net in self.nets for p in net.parameters())


def contenders(arch: str, members: int = 4) -> list[Contender]:
    """Single model, PE-(2, M, 1), PE-(2, M, 2), Deep Ensembles-M."""

    def make(nets: list[nn.Module], name: str, loss: Callable[[Tensor, Tensor], Tensor]):
        opts = [torch.optim.SGD(n.parameters(), lr=0.01, momentum=0.9) for n in nets]
        return Contender(name, nets, loss, opts)

    torch.manual_seed(0)
    single = models.build(arch, num_classes=CLASSES)
    pe1 = models.build(arch, num_classes=CLASSES, packed=(2, members, 1))
    pe2 = models.build(arch, num_classes=CLASSES, packed=(2, members, 2))
    deep = [models.build(arch, num_classes=CLASSES) for _ in range(members)]
    return [
        make([single], "Single Model", F.cross_entropy),
        make([pe1], f"Packed-Ensembles-(2,{members},1)", packed_loss),
        make([pe2], f"Packed-Ensembles-(2,{members},2)", packed_loss),
        make(deep, f"Deep Ensembles ({members}, looped)", F.cross_entropy),
    ]


def time_inference(c: Contender, x: Tensor) -> float:
    """Seconds for one batch through every net of the contender."""
    for net in c.nets:
        net.eval()
    start = time.perf_counter()
    with torch.inference_mode():
        for net in c.nets:
            net(x)
    return time.perf_counter() - start


def time_training(c: Contender, x: Tensor, y: Tensor) -> float:
    """Seconds for one training step of every net of the contender."""
    for net in c.nets:
        net.train()
    start = time.perf_counter()
    for net, opt in zip(c.nets, c.opts, strict=True):
        opt.zero_grad(set_to_none=True)
        c.loss(net(x), y).backward()
        opt.step()
    return time.perf_counter() - start


def run(args: argparse.Namespace) -> None:
    if args.threads:
        torch.set_num_threads(args.threads)
    rows = contenders(args.arch)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(args.batch_size, 3, 32, 32, generator=gen)
    y = torch.randint(0, CLASSES, (args.batch_size,), generator=gen)
    for c in rows:  # warm-up at the timed shape: allocator, oneDNN kernel selection
        time_inference(c, x)
        time_training(c, x, y)
    infer: dict[str, list[float]] = {c.name: [] for c in rows}
    trains: dict[str, list[float]] = {c.name: [] for c in rows}
    for _ in range(args.repeats):
        for c in rows:  # in turns, so load on the machine hits every row alike
            infer[c.name].append(sum(time_inference(c, x) for _ in range(args.batches)))
            trains[c.name].append(sum(time_training(c, x, y) for _ in range(args.batches)))
    images = args.batches * args.batch_size
    im_s = {k: images / statistics.median(v) for k, v in infer.items()}
    s_epoch = {k: statistics.median(v) / images * args.epoch_images for k, v in trains.items()}
    base = rows[0].name

    print(
        "Table 8 layout: training and inference times; all ensembles have 4 subnetworks.\n"
        f"{ARCH_NAMES.get(args.arch, args.arch)}, random 32×32×3 inputs, {CLASSES} classes, "
        f"float32, CPU, batch {args.batch_size}, {args.batches} batch(es) × {args.repeats} "
        "repeat(s), median\n"
        f"machine: {machine()}\n"
        f"s/epoch = measured s/image × {args.epoch_images} images\n"
    )
    head = f"{'models':<32}{'Training ↓':>22}{'Inference ↑':>22}{'params':>12}"
    sub = f"{'':<32}{'s/epoch':>12}{'× single':>10}{'im/s':>12}{'× single':>10}{'(M)':>12}"
    print(head, sub, "-" * len(sub), sep="\n")
    for c in rows:
        print(
            f"{c.name:<32}{s_epoch[c.name]:>12.1f}{s_epoch[c.name] / s_epoch[base]:>10.2f}"
            f"{im_s[c.name]:>12.1f}{im_s[c.name] / im_s[base]:>10.2f}{c.params / 1e6:>12.2f}"
        )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--arch", choices=sorted(ARCH_NAMES), default="resnet18")
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--batches", type=int, default=2, help="timed batches per repeat")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epoch-images", type=int, default=50_000)
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch default)")
    parser.add_argument(
        "--quick", action="store_true", help="smoke run: batch 8, 1 batch, 1 repeat"
    )
    args = parser.parse_args(argv)
    if args.quick:
        args.batch_size, args.batches, args.repeats = 8, 1, 1
    for name in ("batch_size", "batches", "repeats", "epoch_images"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')}: expected an integer >= 1")
    run(args)


if __name__ == "__main__":
    main()
