"""Peak memory of temperature scaling fitted through a model at scale: dense and token outputs.

Two cases of issue 58's "model path at scale", each fitted by
`peg.methods.calibration._streamed.fit_temperature_streamed` (one pass over the batches per
evaluation of the NLL's derivatives, float64 sums, `[N, C]` never held):

- dense: 48 frames of 512 × 1024 through a small conv net with 19 classes (1.9 GB of float32
  logits if gathered), 2 frames a batch, a 16-pixel border labelled 255 and left out
  (`ignore_index=255`, as Cityscapes); labels drawn from softmax(logits / 0.7), so T* ≈ 0.7.
- lm: a GPT-2 from a small config (n_layer=2, n_embd=64, V = 50,257) over 64 sequences of
  256 tokens (16,384 tokens, 3.3 GB of float32 logits if gathered), 4 sequences a batch,
  through `NextToken` (next-token logits against labels[:, 1:]); random token ids whose labels
  are drawn from the model's own prediction at temperature 0.8 (so T* ≈ 0.8). Its NLL at the
  streamed T is compared with the exact optimum: every next-token logit gathered in memory
  (float32, 3.3 GB; `fit_temperature`'s float64 copies of them would need ~25 GB, more than
  this machine's 23), T fitted on them with float64 work to a step of 1e-12, its slope printed.

Each fit runs in a fresh process, which reports its peak RSS growth over the fit (VmHWM after
− VmRSS before, the model and the labels already built: everything the fit allocated and held
at once), the time and the passes. `--cache` also runs each fit with the kept rows cached on
disk after the first pass (the forwards run once, the logits read back memory-mapped).

    python benchmarks/shapes_memory.py                       # both cases, ~10 min on 2 cores
    python benchmarks/shapes_memory.py --case lm --tokens 4096
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

HERE = Path(__file__).resolve().parent
RESULTS = HERE.parent / "results" / "benchmarks" / "shapes_memory.txt"


def _status(key: str) -> float:
    """`key` of /proc/self/status in MB (VmRSS, VmHWM)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(key)


# ------------------------------------------------------------------------------ dense
def conv_net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 19, 1)).eval()


def frame(i: int, height: int, width: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(i)
    return torch.randn(1, 3, height, width, generator=g)


def dense_labels(net: nn.Module, frames: int, height: int, width: int) -> torch.Tensor:
    """`[frames, H, W]` uint8: drawn from softmax(logits / 0.7) (Gumbel-max), border = 255."""
    out = torch.empty(frames, height, width, dtype=torch.uint8)
    with torch.no_grad():
        for i in range(frames):
            z = net(frame(i, height, width))[0] / 0.7
            g = torch.Generator().manual_seed(10_000 + i)
            u = torch.rand(z.shape, generator=g).clamp_min(1e-12)
            out[i] = (z - torch.log(-torch.log(u))).argmax(0).to(torch.uint8)
    out[:, :16], out[:, -16:], out[:, :, :16], out[:, :, -16:] = 255, 255, 255, 255
    return out


def dense_case(args: argparse.Namespace) -> tuple:
    net = conv_net()
    labels = dense_labels(net, args.frames, args.height, args.width)
    per = args.frames_per_batch

    def batches():
        with torch.no_grad():
            for start in range(0, args.frames, per):
                x = torch.cat(
                    [frame(i, args.height, args.width) for i in range(start, start + per)]
                )
                yield net(x), labels[start : start + per].long()

    return batches, {"class_dim": 1, "ignore_index": 255}


# ------------------------------------------------------------------------------ lm
def gpt2() -> nn.Module:
    import transformers

    torch.manual_seed(0)
    config = transformers.GPT2Config(
        n_layer=2, n_embd=64, n_head=2, n_positions=256, bos_token_id=0, eos_token_id=0,
        initializer_range=0.1,
    )  # fmt: skip
    return transformers.GPT2LMHeadModel(config).eval()


def lm_tokens(model: nn.Module, sequences: int, length: int, path: Path) -> None:
    """`[sequences, length]` random token ids and their labels: each next token drawn from the
    model's own prediction at temperature 0.8 (one forward; labels[:, 0] = -100), saved."""
    if path.exists():
        return
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.config.vocab_size, (sequences, length), generator=g)
    labels = torch.full_like(ids, -100)
    with torch.no_grad():
        for i in range(0, sequences, 4):
            logits = model(input_ids=ids[i : i + 4]).logits[:, :-1] / 0.8
            probs = logits.softmax(-1).reshape(-1, logits.shape[-1])
            drawn = torch.multinomial(probs, 1, generator=g).reshape(logits.shape[:2])
            labels[i : i + 4, 1:] = drawn
    torch.save({"input_ids": ids, "labels": labels}, path)


def lm_case(args: argparse.Namespace) -> tuple:
    from peg.integrations._next_token import NextToken

    data = torch.load(args.tokens_file)
    lm = NextToken(gpt2())
    return lm.batches(data, batch_size=args.sequences_per_batch), {"class_dim": -1}


# ------------------------------------------------------------------------------ one fit
def run_one(args: argparse.Namespace) -> None:
    """In a fresh process: build the case, then fit; print a JSON line."""
    from peg.methods.calibration._streamed import fit_temperature_streamed, streamed_sums

    torch.set_num_threads(args.threads)
    batches, options = (dense_case if args.case == "dense" else lm_case)(args)
    calls = []

    def counted():
        calls.append(1)
        return batches()

    before = _status("VmRSS")
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=args.cache_dir) as folder:
        cache = Path(folder) if args.mode == "cache" else None
        t = fit_temperature_streamed(counted, cache=cache, dtype=args.dtype, **options)
    seconds = time.perf_counter() - start
    peak = _status("VmHWM") - before
    sums = streamed_sums(batches, t, dtype=torch.float64, **options)
    print(json.dumps({
        "case": args.case, "mode": args.mode, "T": t, "nll": sums["nll"] / sums["n"],
        "n": sums["n"], "peak_mb": peak, "seconds": seconds, "forward_passes": len(calls),
    }))  # fmt: skip


def exact_lm(args: argparse.Namespace) -> None:
    """In a fresh process: every next-token logit gathered in memory (float32 `[N, V]`), T
    fitted on them with float64 work, the slope at it reported."""
    from peg.integrations._next_token import NextToken
    from peg.methods.calibration._streamed import fit_temperature_streamed, streamed_sums

    torch.set_num_threads(args.threads)
    data = torch.load(args.tokens_file)
    lm = NextToken(gpt2())
    before = _status("VmRSS")
    pairs = [(z[y != -100], y[y != -100]) for z, y in lm.pairs(data, args.sequences_per_batch)]
    z = torch.cat([z for z, _ in pairs])
    y = torch.cat([y for _, y in pairs])
    del pairs

    def gathered():
        return ((z[i : i + 4096], y[i : i + 4096]) for i in range(0, len(y), 4096))

    t = fit_temperature_streamed(gathered, class_dim=-1, tol=1e-12)
    sums = streamed_sums(gathered, t, class_dim=-1)
    print(json.dumps({
        "case": "lm", "mode": "exact (gathered, float64)", "T": t,
        "nll": sums["nll"] / sums["n"], "n": sums["n"], "peak_mb": _status("VmHWM") - before,
        "slope": sums["g"] / sums["n"],
    }))  # fmt: skip


def _child(args: argparse.Namespace, *extra: str) -> dict:
    cmd = [sys.executable, __file__, "--child", "--case", args.case, *extra]
    cmd += ["--frames", str(args.frames), "--tokens", str(args.tokens)]
    cmd += ["--tokens-file", str(args.tokens_file), "--threads", str(args.threads)]
    cmd += ["--dtype", str(args.dtype).removeprefix("torch.")]
    env = {**os.environ, "PYTHONPATH": str(HERE.parent / "src")}
    out = subprocess.run(cmd, capture_output=True, text=True, env=env, check=False)
    if out.returncode:
        raise RuntimeError(out.stderr[-3000:])
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", choices=["dense", "lm", "all"], default="all")
    parser.add_argument("--frames", type=int, default=48)
    parser.add_argument("--height", type=int, default=512)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--frames-per-batch", type=int, default=2)
    parser.add_argument("--tokens", type=int, default=16384)
    parser.add_argument("--sequences-per-batch", type=int, default=4)
    parser.add_argument("--cache", action="store_true", help="also fit with the disk cache")
    parser.add_argument("--no-exact", action="store_true", help="skip the LM's exact optimum")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32")
    parser.add_argument("--cache-dir", default=None)
    parser.add_argument("--tokens-file", type=Path, default=None)
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--mode", default="stream", help=argparse.SUPPRESS)
    parser.add_argument("--exact", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    args.dtype = getattr(torch, args.dtype)
    if args.child:
        return exact_lm(args) if args.exact else run_one(args)
    command = "python benchmarks/shapes_memory.py " + " ".join(sys.argv[1:])
    cases = ["lm", "dense"] if args.case == "all" else [args.case]
    modes = ["stream", "cache"] if args.cache else ["stream"]
    for case in cases:
        rows = []
        args.case = case
        if case == "lm":
            length = 256
            args.tokens_file = Path(tempfile.gettempdir()) / f"peg-gpt2-{args.tokens}.pt"
            lm_tokens(gpt2(), args.tokens // length, length, args.tokens_file)
        else:
            args.tokens_file = Path("-")
        for mode in modes:
            rows.append(_child(args, "--mode", mode))
            print(rows[-1], flush=True)
        if case == "lm" and not args.no_exact:
            rows.append(_child(args, "--exact"))
            print(rows[-1], flush=True)
        _write(command, args, rows)


def _write(command: str, args: argparse.Namespace, rows: list[dict]) -> None:
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    lines = [
        f"$ {command}",
        f"commit: {commit.strip()}",
        f"machine: {platform.system()} {platform.machine()}, {os.cpu_count()} cores (AMD EPYC, "
        f"shared with other jobs), CPU only, torch {torch.__version__} ({args.threads} threads)",
        "peak = RSS growth over the fit (VmHWM after - VmRSS before, model and labels built), "
        f"fresh process per row; streamed fits' work in {args.dtype} (float64 sums)",
        f"{'case':6} {'mode':26} {'T':>10} {'NLL':>12} {'positions':>10} {'peak (MB)':>10} "
        f"{'fit (s)':>8} {'passes':>7}",
    ]
    for r in rows:
        lines.append(
            f"{r['case']:6} {r['mode']:26} {r['T']:10.6f} {r['nll']:12.8f} {int(r['n']):10d} "
            f"{r['peak_mb']:10.0f} {r.get('seconds', float('nan')):8.1f} "
            f"{r.get('forward_passes', r.get('evaluations', 0)):7d}"
        )
    exact = [r for r in rows if r["mode"].startswith("exact")]
    for r in rows:
        if exact and r["case"] == "lm" and r is not exact[0]:
            gap = r["nll"] - exact[0]["nll"]
            lines.append(f"lm {r['mode']}: NLL - exact optimum's = {gap:.2e} nats (bar <= 1e-3)")
    lines += [f"exact optimum's slope dNLL/dβ: {r['slope']:.1e}" for r in exact]
    RESULTS.parent.mkdir(parents=True, exist_ok=True)
    with RESULTS.open("a") as f:
        f.write("\n".join(lines) + "\n\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
