"""Peak memory of ensemble prediction: PEG-30 chunked, and a 10⁵-sample stream.

Targets: (issue 7) predicting with PEG-30 and the "chunked" strategy adds at most chunk size ×
member size + activations to what the process already holds, and a lazy PEG-30
(`PEG(lazy=True, lazy_store="regenerate")`, which keeps no members and regenerates them a
chunk at a time) grows the process by at most base + chunk size × member size + activations +
output from before `fit` (model and validation data already held) through predicting; (issue 8)
a 10⁵-sample stream through a 30-member ensemble runs in bounded memory (the same peak for 10⁴
and 10⁵ samples) when metrics are accumulated batch by batch (`peg.metrics.StreamingMetrics`)
instead of materialising the member logits `[M, N, C]`.

Each case runs in a fresh child process, which resets its peak resident set size (Linux:
/proc/self/clear_refs) right before the measured call and reads VmHWM after it, so the figure
is the growth of the peak during that call alone. Printed in MiB, measured in this run, on
this machine (printed).

    python benchmarks/memory.py [--hidden 2048] [--members 30] [--chunks 5 15 30] [--quick]
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import subprocess
import sys
from pathlib import Path

MiB = 2**20
# The lazy case runs twice: with glibc's default allocator, whose adaptive mmap threshold keeps
# freed blocks (e.g. each gradient's) in the heap, so the peak RSS also counts memory freed but
# not given back; and with the threshold fixed, so that large blocks go back to the system when
# freed and the peak follows the tensors alive at once.
LAZY_ALLOCATORS = [
    ("(glibc default)", None),
    ("(MALLOC_MMAP_THRESHOLD_=128 KiB)", {"MALLOC_MMAP_THRESHOLD_": "131072"}),
]


def _status(field: str) -> int:
    """A /proc/self/status field in bytes (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def _reset_peak() -> None:
    """Give freed heap memory back to the system, then VmHWM := VmRSS.

    Without the trim, memory freed earlier (e.g. by building the ensemble) stays resident and
    later allocations reuse it without raising the peak, hiding what the measured call needs.
    """
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")


def child(case: str, args: argparse.Namespace) -> dict[str, float]:
    """Run one case in this (fresh) process; return its figures in bytes."""
    import torch

    import peg
    from peg.metrics.streaming import StreamingMetrics
    from peg.models import build

    torch.manual_seed(0)
    torch.set_grad_enabled(False)
    hidden = args.hidden if case in ("chunked", "lazy") else args.stream_hidden
    model = build("mlp", in_features=784, num_classes=10, hidden=(hidden,) * 2)
    model.eval()
    member = sum(p.numel() * p.element_size() for p in model.parameters())
    val = (torch.randn(512, 784), torch.randint(0, 10, (512,)))
    if case == "lazy":  # from before fit to after predicting: nothing but model, val and X held
        X = torch.randn(args.rows, 784)
        tiny = build("mlp", in_features=784, num_classes=10, hidden=(8, 8)).eval()
        with torch.enable_grad():  # warm-up on a tiny model: one-time allocations excluded
            warm = peg.PEG(
                n_members=2, eta=0.01, lazy=True, lazy_store="regenerate", progress=False
            ).fit(tiny, val)
        warm.member_logits(X[: args.batch], args.batch, strategy="chunked", chunk_size=2)
        del warm, tiny
        _reset_peak()
        before = _status("VmRSS")
        with torch.enable_grad():
            lazy = peg.PEG(
                n_members=args.members, eta=0.01, lazy=True, lazy_store="regenerate", progress=False
            ).fit(model, val)
        after_fit = _status("VmHWM") - before
        logits = lazy.member_logits(X, args.batch, strategy="chunked", chunk_size=args.chunk)
        extra_peak = _status("VmHWM") - before
        _reset_peak()  # (frees what is not alive)
        return {
            "member": member,
            "extra_peak": extra_peak,
            "fit_peak": after_fit,
            "held": _status("VmRSS") - before,  # after predicting: the lazy object + the output
            "output": logits.numel() * logits.element_size(),
            "activations": args.chunk * args.batch * hidden * 4 * 2,
        }
    with torch.enable_grad():
        ens = peg.PEG(n_members=args.members, eta=0.01, progress=False).fit(model, val).ensemble_
    stored = sum(v.numel() * v.element_size() for v in ens.stacked.values())
    figures: dict[str, float] = {"member": member, "stored": stored}

    if case == "chunked":
        X = torch.randn(args.rows, 784)
        ens.member_logits(X[: args.batch], args.batch, strategy="chunked", chunk_size=args.chunk)
        _reset_peak()  # after a warm-up call: one-time allocations (kernels, pools) excluded
        before = _status("VmRSS")
        logits = ens.member_logits(X, args.batch, strategy="chunked", chunk_size=args.chunk)
        figures["extra_peak"] = _status("VmHWM") - before
        figures["output"] = logits.numel() * logits.element_size()
        # activations of one vectorised call: chunk members × batch × widest layer, fp32
        figures["activations"] = args.chunk * args.batch * hidden * 4 * 2
        return figures

    def batches(n: int):  # the stream: inputs made batch by batch, never held whole
        g = torch.Generator().manual_seed(1)
        for start in range(0, n, args.batch):
            b = min(args.batch, n - start)
            yield torch.randn(b, 784, generator=g), torch.randint(0, 10, (b,), generator=g)

    n = int(case.split("-")[1])
    x, _ = next(batches(args.batch))
    ens.member_logits(x, args.batch, strategy="chunked", chunk_size=args.chunk)  # warm-up
    _reset_peak()
    before = _status("VmRSS")
    stream = StreamingMetrics()
    for x, y in batches(n):
        stream.update(
            ens.member_logits(x, args.batch, strategy="chunked", chunk_size=args.chunk), y
        )
    stream.compute()
    figures["extra_peak"] = _status("VmHWM") - before
    figures["materialised"] = args.members * n * 10 * 4  # what [M, N, C] fp32 would take
    return figures


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=2048, help="MLP width (member size)")
    parser.add_argument("--members", type=int, default=30)
    parser.add_argument("--chunks", type=int, nargs="+", default=[5, 15, 30])
    parser.add_argument("--chunk", type=int, default=5, help=argparse.SUPPRESS)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--rows", type=int, default=1024, help="rows for the chunked case")
    parser.add_argument("--stream-hidden", type=int, default=256, help="MLP width, streams")
    parser.add_argument("--quick", action="store_true", help="width 256, chunks of 5, 10⁴ rows")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.quick:
        args.hidden, args.chunks, args.rows = 256, [5], 256
    if args.child:
        print(json.dumps(child(args.child, args)))
        return
    from peg.utils.env import machine

    def run(case: str, chunk: int, env: dict[str, str] | None = None) -> dict[str, float]:
        argv = [*sys.argv[1:], "--child", case, "--chunk", str(chunk)]
        out = subprocess.run(
            [sys.executable, __file__, *argv],
            check=True,
            capture_output=True,
            text=True,
            env={**os.environ, **(env or {})},
        )
        return {k: v / MiB for k, v in json.loads(out.stdout.splitlines()[-1]).items()}

    print(f"machine: {machine()}")
    print(f"MLP 784-{args.hidden}-{args.hidden}-10, PEG-{args.members}, batches of {args.batch}; "
          f"MiB; peaks measured after a warm-up call")  # fmt: skip
    for chunk in args.chunks:
        c = run("chunked", chunk)
        bound = chunk * c["member"] + c["activations"] + c["output"]
        if chunk == args.chunks[0]:
            print(f"member {c['member']:.1f}; all {args.members} members, held by the ensemble: "
                  f"{c['stored']:.1f}")  # fmt: skip
        print(f"predict {args.rows} rows, chunks of {chunk:2d}: peak grew {c['extra_peak']:6.1f}; "
              f"chunk × member + activations + output = {bound:6.1f}")  # fmt: skip
        # the lazy bound, with activations + output estimated as above, and as measured: what
        # predicting with the stacked ensemble (which allocates no members) grew by, under the
        # same allocator settings
        for label, env in LAZY_ALLOCATORS:
            eager = run("chunked", chunk, env) if env else c
            z = run("lazy", chunk, env)
            stored = (1 + chunk) * z["member"]
            print(f"  lazy PEG-{args.members} {label}, fit + predict, chunks of {chunk:2d}: peak "
                  f"grew {z['extra_peak']:6.1f} (fit alone {z['fit_peak']:6.1f}; held after "
                  f"{z['held']:5.1f}); base + chunk × member + activations + output = "
                  f"{stored + z['activations'] + z['output']:6.1f} estimated, "
                  f"{stored + eager['extra_peak']:6.1f} measured")  # fmt: skip
    for n in (10_000,) if args.quick else (10_000, 100_000):
        s = run(f"stream-{n}", args.chunks[0])
        print(f"stream {n:>6} samples (MLP 784-{args.stream_hidden}-{args.stream_hidden}-10, "
              f"chunks of {args.chunks[0]}) into StreamingMetrics: peak grew {s['extra_peak']:.1f} "
              f"(materialising [M, N, C] alone: {s['materialised']:.1f})")  # fmt: skip


if __name__ == "__main__":
    main()
