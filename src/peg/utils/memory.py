"""How much memory a device has free, and the one refusal of an argument whose allocation
cannot fit in it (an error naming the argument and the bytes it would need, before any work).

Why: `PEG(n_members=10**9).fit` failed with the allocator's raw "can't allocate 204000000000
bytes", and `HistogramBinning(n_bins=10**9).fit` allocated until the kernel killed the process.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch


def available_memory(device: torch.device) -> int:
    """Bytes free for new tensors on `device`: CUDA's free memory plus what torch's caching
    allocator holds unused (reserved, not allocated: it serves new tensors from it), else the
    system's available RAM (`MemAvailable`, or free pages where /proc/meminfo is missing)."""
    if device.type == "cuda":
        cached = torch.cuda.memory_reserved(device) - torch.cuda.memory_allocated(device)
        return int(torch.cuda.mem_get_info(device)[0]) + max(int(cached), 0)
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def size(n: float) -> str:
    """`n` bytes for a message: '204 GB', '3.1 MB'."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.3g} {unit}"
    return f"{int(n)} bytes"


def require_memory(
    name: str, value: Any, need: float, device: torch.device, what: str, advice: str = ""
) -> None:
    """A ValueError naming argument `name` (= `value`) where `need` bytes (`what` they hold)
    exceed the memory available on `device`; nothing otherwise."""
    free = available_memory(device)
    if need > free:
        raise ValueError(
            f"{name}: {value:,} would need {size(need)} ({what}), more than the {size(free)} "
            f"available on {device}{'; ' + advice if advice else ''}"
        )
