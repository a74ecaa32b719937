"""Reading a user's YAML file (a bench spec): plain data only, no aliases, errors on one line.

`yaml.safe_load` builds no objects, but it expands aliases: a 396-byte file of nested aliases
(`a: &a [x, x, ...]`, `b: &b [*a, *a, ...]`, ...) expanded to billions of entries, and a
spec reading `model.hidden` from it ran 50 s and 2 GB before any check. A spec has no use for
aliases, so `*name` (and the `<<: *name` merge key built on it) is refused as it is met, before
anything is built. PyYAML's errors span several lines (the message, then a quoted excerpt with a
caret); `read_yaml` raises one line naming the file, the line and the column.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml


class _NoAliases(yaml.SafeLoader):
    """`yaml.SafeLoader` refusing aliases (`*name`) where they occur."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            event = self.peek_event()
            raise yaml.composer.ComposerError(
                None,
                None,
                f"alias *{event.anchor} refused (aliases can expand a small file into billions "
                "of entries); write the value out",
                event.start_mark,
            )
        return super().compose_node(parent, index)


def read_yaml(path: str | Path, error: type[Exception] = ValueError) -> Any:
    """The plain data of YAML file `path` (mappings, lists, scalars; no aliases); `error`
    (e.g. `SpecError`) with one line "<path>: not valid YAML at line L, column C: ..."."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise error(f"{path}: not UTF-8 text (byte {e.start}: {e.reason})") from None
    loader = _NoAliases(text)
    try:
        return loader.get_single_data()
    except yaml.YAMLError as e:
        raise error(f"{path}: not valid YAML{one_line(e)}") from None
    finally:
        loader.dispose()


def one_line(e: yaml.YAMLError) -> str:
    """The position (1-based) and the problem of a PyYAML error, on one line:
    `" at line L, column C: <problem>"`."""
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
    parts = [getattr(e, "context", None), getattr(e, "problem", None)]
    problem = "; ".join(p for p in parts if p) or str(e)
    return f"{where}: {' '.join(problem.split())}"
