"""Runs one page's examples as a user would: `python docs_run.py STEPS.json REPORT.json`.

tests/test_docs.py writes the page's runnable blocks, in order, to STEPS.json and starts this
script in a fresh Python process whose working directory is a scratch folder. Python blocks are
executed in one `__main__` namespace, as a script or a notebook would (a block's last bare
expression is shown with `sys.displayhook`, as the interpreter and Jupyter show it); a bash
block's commands (`peg ...`, `cd DIR`) run as a shell would run them, from the folder the shell
is in (the scratch folder, moved by `cd`), through the `peg` command installed beside this
Python. Before each step a line `RECORD_SEPARATOR + where` is printed on stdout and on
stderr, so the test can split both by block. REPORT.json gets, per step, its wall-clock seconds,
its CPU seconds (this process's and the commands': a measure of its size that a busy machine
does not inflate) and its error (a traceback), or the reason the page stopped for a missing
data set.
"""

from __future__ import annotations

import ast
import json
import os
import resource
import shlex
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

RECORD_SEPARATOR = "\x1e"
MISSING_DATA = "not found under any data root"  # peg.data's FileNotFoundError says this


def peg_command() -> list[str]:
    """The `peg` console script beside this Python, or the same entry point through it."""
    script = Path(sys.executable).parent / "peg"
    if script.exists():
        return [str(script)]
    return [sys.executable, "-c", "import sys; from peg.apps.cli import main; sys.exit(main())"]


def run_python(step: dict, namespace: dict) -> None:
    """A block as a notebook cell: statements executed, the last bare expression displayed."""
    tree = ast.parse("\n" * (step["line"] - 1) + step["code"], step["path"])
    last = tree.body.pop() if tree.body and isinstance(tree.body[-1], ast.Expr) else None
    exec(compile(tree, step["path"], "exec"), namespace)
    if last is not None:
        value = eval(compile(ast.Expression(last.value), step["path"], "eval"), namespace)
        sys.displayhook(value)


def run_commands(step: dict, shell: dict) -> None:
    """A bash block's lines, one command each: `cd DIR` moves the shell, `peg ...` runs."""
    for argv in step["commands"]:
        if argv[0] == "cd":
            shell["cwd"] = os.path.normpath(os.path.join(shell["cwd"], *argv[1:2]))
            continue
        sys.stdout.flush()
        status = subprocess.run([*peg_command(), *argv[1:]], cwd=shell["cwd"]).returncode
        if status != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited {status}")


def cpu_seconds() -> float:
    """CPU time so far, user and system, of this process and of the commands it ran."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def main(steps_file: str, report_file: str) -> int:
    steps = json.loads(Path(steps_file).read_text(encoding="utf-8"))
    module = types.ModuleType("__main__")  # what a script's blocks see as their module
    sys.modules["__main__"] = module
    shell = {"cwd": os.getcwd()}
    report: list[dict] = []
    for step in steps:
        print(RECORD_SEPARATOR + step["where"], flush=True)
        print(RECORD_SEPARATOR + step["where"], file=sys.stderr, flush=True)
        start, cpu, entry = time.perf_counter(), cpu_seconds(), {"where": step["where"]}
        report.append(entry)
        try:
            if step["kind"] == "python":
                run_python(step, module.__dict__)
            else:
                run_commands(step, shell)
        except FileNotFoundError as e:
            if MISSING_DATA not in str(e):
                entry["error"] = traceback.format_exc()
            else:
                entry["missing_data"] = str(e)
        except BaseException:  # SystemExit too: the test reports every stop
            entry["error"] = traceback.format_exc()
        entry["seconds"], entry["cpu"] = time.perf_counter() - start, cpu_seconds() - cpu
        sys.stdout.flush()
        sys.stderr.flush()
        if "error" in entry or "missing_data" in entry:
            break
    Path(report_file).write_text(json.dumps(report), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
