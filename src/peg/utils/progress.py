"""Progress bars for long work: one switch for the whole library.

`enabled=None` (the default everywhere) shows a bar only on a terminal, so logs and CI stay
clean; `PEG_PROGRESS=1` / `PEG_PROGRESS=0` forces bars on or off globally.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable, Iterator
from typing import TypeVar

from tqdm.auto import tqdm

T = TypeVar("T")


def _disable(enabled: bool | None) -> bool | None:
    env = os.environ.get("PEG_PROGRESS")
    if enabled is None and env is not None:
        enabled = env not in ("0", "", "false", "no")
    return None if enabled is None else not enabled


def bar(
    iterable: Iterable[T], desc: str, total: int | None = None, enabled: bool | None = None
) -> Iterator[T]:
    """Wrap `iterable` in a tqdm bar (shown on a TTY unless `enabled` or $PEG_PROGRESS say).

    A single step, or a bar switched off, gets no tqdm at all (its set-up costs ~50 µs, which
    matters to one small prediction).
    """
    if (total is not None and total <= 1) or _disable(enabled):
        return iter(iterable)
    return iter(
        tqdm(
            iterable,
            desc=desc,
            total=total,
            disable=_disable(enabled),
            leave=False,
            dynamic_ncols=True,
        )
    )


def counter(desc: str, enabled: bool | None = None) -> tqdm:
    """A bar without a known length, advanced by hand (`.update(1)`, `.set_postfix_str`)."""
    return tqdm(desc=desc, disable=_disable(enabled), leave=False, dynamic_ncols=True)


def lines(enabled: bool | None = None) -> Callable[[str], None]:
    """Where the steps of long work are said when no bar shows them: one flushed line each on
    stderr when output is not a terminal (a log, a notebook) and progress is left to the
    default; nowhere when a bar shows them or progress is off."""
    if _disable(enabled) is not None or sys.stderr.isatty():
        return lambda line: None
    return lambda line: print(line, file=sys.stderr, flush=True)
