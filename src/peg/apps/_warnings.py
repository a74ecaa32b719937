"""Warnings said as one line each on stderr, as the `peg` command's errors are."""

from __future__ import annotations

import contextlib
import sys
import warnings
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def one_line_warnings(prefix: str, typed: Callable[[str], str] = str) -> Iterator[None]:
    """Warnings said as one line each, `PREFIX: warning: ...` on stderr (the message through
    `typed`: in the words the user typed), not Python's `file:line: Category: ...` followed by
    the source line that warned (which means nothing to a user of a command). Which warnings
    show (once per place) is unchanged; the previous `showwarning` is restored afterwards."""

    def show(message: Warning | str, *_: object, **__: object) -> None:
        text = " ".join(str(message).split())  # one line, whatever the message's layout
        sys.stderr.write(f"{prefix}: warning: {typed(text)}\n")

    with warnings.catch_warnings():
        warnings.showwarning = show
        yield
