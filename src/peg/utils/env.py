"""What machine and code a result came from, for results files."""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path

import torch


def machine() -> str:
    """E.g. 'Linux x86_64, Intel Xeon ... , 2 cores, 23.4 GiB, torch 2.13.0+cpu (2 threads)'."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    mem = ""
    try:
        kb = int(Path("/proc/meminfo").read_text().split()[1])
        mem = f", {kb / 2**20:.1f} GiB"
    except (OSError, ValueError, IndexError):
        pass
    gpu = f", GPU {torch.cuda.get_device_name(0)}" if torch.cuda.is_available() else ""
    return (
        f"{platform.system()} {platform.machine()}, {cpu}, {os.cpu_count()} cores{mem}{gpu}, "
        f"torch {torch.__version__} ({torch.get_num_threads()} threads)"
    )


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The git commit of peg's own source tree (or of `cwd`), if it is a checkout."""
    cwd = Path(__file__).resolve().parent if cwd is None else cwd
    try:
        out = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=cwd, capture_output=True, text=True, timeout=5
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() or None if out.returncode == 0 else None
