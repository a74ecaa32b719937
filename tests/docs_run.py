"""Runs the docs' pages as a user would, each run in a fresh process of its own, for
tests/test_docs.py: `python docs_run.py` serves one run a request.

The server imports torch, numpy and peg once (3-4 s of CPU, which a fresh Python per run paid
every time), then reads requests from stdin, one JSON object a line: the steps of a page (its
runnable blocks, in order, in a JSON file), where to write the report, the scratch folder to run
in, the environment, and the files that get stdout and stderr. For each it forks a child: the
child starts from the state of a Python that has only imported those modules (no torch op has
run, no thread started: the server checks), reseeds what a fresh Python seeds from the OS
(numpy's and `random`'s global generators; torch's starts at its fixed default seed, as a fresh
torch does), moves to the scratch folder and runs the steps; the server answers with the child's
exit status, one JSON object a line. Python's hash seed and memory addresses are the server's:
the test starts one server per run of a page, so the two runs of a page differ in those as two
fresh processes do.

Python blocks are executed in one `__main__` namespace, as a script or a notebook would (a
block's last bare expression is shown with `sys.displayhook`, as the interpreter and Jupyter
show it); a bash block's commands (`peg ...`, `cd DIR`) run as a shell would run them, from the
folder the shell is in (the scratch folder, moved by `cd`), each in a process of its own that
runs the `peg` console script's entry point (`sys.exit(peg.apps.cli.main())`), forked from a
copy of the server taken before the page ran (so nothing a block did leaks into a command).
Before each step a line `RECORD_SEPARATOR + where` is printed on stdout and on stderr, so the
test can split both by block. The report gets, per step, its wall-clock seconds, its CPU seconds
(this process's and the commands': a measure of its size that a busy machine does not inflate)
and its error (a traceback), or the reason the page stopped for a missing data set.
"""

from __future__ import annotations

import ast
import atexit
import contextlib
import importlib
import json
import os
import random
import resource
import shlex
import signal
import sys
import time
import traceback
import types
from pathlib import Path

RECORD_SEPARATOR = "\x1e"
MISSING_DATA = "not found under any data root"  # peg.data's FileNotFoundError says this
# Imported once by the server: what nearly every page and every `peg` command imports.
PRELOAD = ("numpy", "torch", "peg", "peg.data", "peg.models", "peg.train", "peg.apps.cli")

_commands: dict = {"cpu": 0.0}  # the page's channel to its commands' forker, their CPU seconds


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
        sys.stderr.flush()
        request, reply = _commands["channel"]
        request.write(json.dumps({"argv": argv, "cwd": shell["cwd"]}) + "\n")
        request.flush()
        answer = json.loads(reply.readline() or '{"status": "no answer"}')
        _commands["cpu"] += answer.get("cpu", 0.0)
        if answer["status"] != 0:
            raise RuntimeError(f"{shlex.join(argv)} exited {answer['status']}")


def cpu_seconds() -> float:
    """CPU time so far, user and system, of this process and of the commands it ran."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime + _commands["cpu"]


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


# ------------------------------------------------------------------------------ the server
def _fresh(env: dict, out: int, err: int) -> None:
    """In a forked child: the process state a fresh Python would start a run with."""
    os.environ.clear()
    os.environ.update(env)
    null = os.open(os.devnull, os.O_RDONLY)
    for fd, to in ((null, 0), (out, 1), (err, 2)):
        os.dup2(fd, to)
    os.close(null)
    sys.stdin = open(0, encoding="utf-8", closefd=False)  # noqa: SIM115 (the process's stdin)
    random.seed()  # from the OS, as a fresh Python seeds them
    sys.modules["numpy"].random.seed()
    torch = sys.modules["torch"]
    torch.manual_seed(torch.initial_seed())  # a fresh torch's fixed default seed
    if env.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))


def _end(status: object) -> None:
    """A forked child's end, as the interpreter ends: exit functions, flushed streams."""
    if status is None:
        status = 0
    elif not isinstance(status, int):  # sys.exit("message"): printed, status 1
        print(status, file=sys.stderr)
        status = 1
    try:
        atexit._run_exitfuncs()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(status)


def _command(argv: list[str], cwd: str) -> None:
    """In a forked child: `peg ARGV` as the console script runs it (`sys.exit(main())`)."""
    os.chdir(cwd)
    sys.argv = ["peg", *argv[1:]]
    random.seed()
    sys.modules["numpy"].random.seed()
    status: object = 1
    try:
        status = importlib.import_module("peg.apps.cli").main()
    except SystemExit as e:
        status = e.code
    except BaseException:
        traceback.print_exc()
    _end(status)


def _forker(requests: int, replies: int) -> None:
    """In a copy of the server taken before a page runs: one fresh child per `peg` command the
    page asks for, until the page closes its end of the pipe."""
    os.setpgid(0, 0)  # the server ends this group (its commands too) when the page has ended
    with os.fdopen(requests, encoding="utf-8") as inbox, os.fdopen(replies, "w") as outbox:
        for line in inbox:
            asked = json.loads(line)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                _command(asked["argv"], asked["cwd"])
            _, status, usage = os.wait4(pid, 0)
            cpu = usage.ru_utime + usage.ru_stime
            outbox.write(json.dumps({"status": os.waitstatus_to_exitcode(status), "cpu": cpu}))
            outbox.write("\n")
            outbox.flush()
    os._exit(0)


def _run(request: dict) -> int:
    """One run of a page in a forked child; its exit status (negative: killed by that signal)."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND  # commands append after blocks
    out, err = (os.open(request[k], flags, 0o644) for k in ("stdout", "stderr"))
    sys.stdout.flush()
    sys.stderr.flush()
    forker, ends = None, []
    steps = json.loads(Path(request["steps"]).read_text(encoding="utf-8"))
    if any(step["kind"] == "commands" for step in steps):
        (ask, asked), (reply, replied) = os.pipe(), os.pipe()
        forker = os.fork()
        if forker == 0:
            os.close(asked)
            os.close(reply)
            _fresh(request["env"], out, err)
            _forker(ask, replied)
        os.close(ask)
        os.close(replied)
        ends = [asked, reply]
    page = os.fork()
    if page == 0:
        _fresh(request["env"], out, err)
        if ends:
            _commands["channel"] = (os.fdopen(ends[0], "w"), os.fdopen(ends[1], encoding="utf-8"))
        signal.alarm(request["timeout"])  # a page that hangs is killed (SIGALRM)
        os.chdir(request["cwd"])
        sys.argv = [__file__, request["steps"], request["report"]]
        status: object = 1
        try:
            status = main(request["steps"], request["report"])
        except BaseException:
            traceback.print_exc()
        _end(status)
    for fd in (out, err, *ends):
        os.close(fd)
    _, status = os.waitpid(page, 0)
    if forker is not None:
        with contextlib.suppress(ProcessLookupError):  # a command left by a killed page
            os.killpg(forker, signal.SIGKILL)
        os.waitpid(forker, 0)
    return os.waitstatus_to_exitcode(status)


def serve() -> int:
    """Import once, then one forked run per request line on stdin, its status on stdout."""
    for name in PRELOAD:
        importlib.import_module(name)
    tasks = Path("/proc/self/task")
    if tasks.is_dir():  # a thread would not survive the fork (torch's pools start lazily)
        assert len(list(tasks.iterdir())) == 1, "the docs server started a thread"
    replies = sys.stdout
    for line in sys.stdin:
        status = _run(json.loads(line))
        replies.write(json.dumps({"status": status}) + "\n")
        replies.flush()
    return 0


if __name__ == "__main__":
    sys.exit(serve())
