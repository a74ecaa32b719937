"""Runs the docs' pages as a user would, each run in a fresh process of its own, for
tests/test_docs.py: `python docs_run.py` serves one run a request. It also spawns the fault
tests' victims (tests/conftest.py's `fork_server`): a request with "code" forks a child that runs
it as `python -c CODE ARGS` would, in the same fresh state, and is answered with the child's
process id at once (the test kills it with SIGKILL; a "poll" request gives its exit status).
`Server` (at the end) is the tests' side of it.

The server imports torch, numpy, scikit-learn's data sets and peg once (PRELOAD: 8-10 s of CPU,
which a fresh Python per run paid every time), then reads requests from stdin, one JSON object a
line: the steps of a page (its runnable blocks, in order, in a JSON file), where to write the
report, the scratch folder to run in, the environment, and the files that get stdout and
stderr. For each it forks a child: the child starts from the state of a Python that has only
imported those modules (no torch op has run, no thread started: the server checks), reseeds what
a fresh Python seeds from the OS (numpy's and `random`'s global generators, and torch's where a
fresh torch draws its seed, else its fixed default), moves to the scratch folder and runs the
steps; the server answers with the child's exit status, one JSON object a line. Python's hash
seed and memory addresses are the server's: the test starts one server per run of a page, so
the two runs of a page differ in those as two fresh processes do.

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
import select
import shlex
import signal
import subprocess
import sys
import time
import traceback
import types
from pathlib import Path

RECORD_SEPARATOR = "\x1e"
MISSING_DATA = "not found under any data root"  # peg.data's FileNotFoundError says this
# Imported once by the server: what nearly every page and every `peg` command imports. Each of
# torch._dynamo (torch.optim imports it when the first optimizer is built) and sklearn.datasets
# (the toy data: make_moons, digits) costs a fresh Python 2-3 s of CPU.
PRELOAD = ("numpy", "torch", "torch._dynamo", "sklearn.datasets", "peg", "peg.data",
           "peg.models", "peg.train", "peg.apps.cli")  # fmt: skip

SERVER_TORCH_SEED = 0  # the server's torch's seed at its start (serve sets it)
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
    _reseed()
    torch = sys.modules["torch"]
    if env.get("OMP_NUM_THREADS"):
        torch.set_num_threads(int(env["OMP_NUM_THREADS"]))


def _reseed() -> None:
    """The global generators' seeds as a fresh Python's: `random`'s and numpy's from the OS;
    torch's from the OS where a fresh torch draws it (torch 2.13 does), else its fixed default
    (older ones: a new generator's seed)."""
    random.seed()
    sys.modules["numpy"].random.seed()
    torch = sys.modules["torch"]
    if torch.Generator().initial_seed() == SERVER_TORCH_SEED:
        torch.manual_seed(SERVER_TORCH_SEED)
    else:
        torch.seed()


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
    _reseed()
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


def _spawn(request: dict) -> int:
    """`python -c CODE ARGS` in a forked child, not waited for: its process id."""
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid:
        return pid
    out = os.open(os.devnull, os.O_WRONLY)
    err = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    _fresh(request["env"], out, err)
    os.close(out)
    os.close(err)
    os.chdir(request["cwd"])
    module = types.ModuleType("__main__")
    sys.modules["__main__"] = module
    sys.argv, sys.path[0] = ["-c", *request["args"]], ""  # as `python -c` sets them
    status: object = 1
    try:
        exec(compile(request["code"], "<string>", "exec"), module.__dict__)
        status = 0
    except SystemExit as e:
        status = e.code
    except BaseException:
        traceback.print_exc()
    _end(status)
    return 0  # never reached: _end exits


def _answer(request: dict, spawned: set[int]) -> dict:
    """The server's reply to one request: a page's run, a spawn, or a spawned child's status."""
    if "code" in request:
        pid = _spawn(request)
        spawned.add(pid)
        return {"pid": pid}
    if "poll" in request:  # a spawned child's exit status, null while it runs (unless "wait")
        pid, status = os.waitpid(request["poll"], 0 if request.get("wait") else os.WNOHANG)
        if not pid:
            return {"status": None}
        spawned.discard(pid)
        return {"status": os.waitstatus_to_exitcode(status)}
    return {"status": _run(request)}


def serve() -> int:
    """Import once, then one forked run per request line on stdin, its answer on stdout."""
    global SERVER_TORCH_SEED
    for name in PRELOAD:
        importlib.import_module(name)
    SERVER_TORCH_SEED = sys.modules["torch"].initial_seed()  # the seed it started with
    tasks = Path("/proc/self/task")
    if tasks.is_dir():  # a thread would not survive the fork (torch's pools start lazily)
        assert len(list(tasks.iterdir())) == 1, "the docs server started a thread"
    replies, spawned = sys.stdout, set()
    try:
        for line in sys.stdin:
            replies.write(json.dumps(_answer(json.loads(line), spawned)) + "\n")
            replies.flush()
    finally:  # the tests have gone: no spawned child outlives them
        for pid in spawned:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
    return 0


# ------------------------------------------------------------------------------ the client
class Server:
    """A server (this file, run by this Python with the peg the tests import first on its path,
    as if installed) for the tests: a page's runs (tests/test_docs.py) and spawned children
    (the fault tests' victims, tests/conftest.py's `fork_server`)."""

    def __init__(self, log: Path, env: dict | None = None) -> None:
        import peg

        env = dict(os.environ if env is None else env)
        env["PYTHONPATH"] = os.pathsep.join(
            [str(Path(peg.__file__).resolve().parents[1]), *filter(None, [env.get("PYTHONPATH")])]
        )
        env.setdefault("OMP_NUM_THREADS", "1")  # as conftest's torch.set_num_threads(1)
        self.env, self.log = env, log
        with open(log, "w", encoding="utf-8") as errors:  # the server's own, not a run's
            self.process = subprocess.Popen(
                [sys.executable, __file__], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                stderr=errors, env=env, text=True,
            )  # fmt: skip

    def ask(self, request: dict, seconds: float = 60) -> dict:
        """The server's answer to one request, within `seconds`."""
        assert self.process.stdin and self.process.stdout
        self.process.stdin.write(json.dumps(request) + "\n")
        self.process.stdin.flush()
        ready, _, _ = select.select([self.process.stdout], [], [], seconds)
        line = self.process.stdout.readline() if ready else ""
        assert line, f"the fork server did not answer:\n{self.log.read_text()[-3000:]}"
        return json.loads(line)

    def spawn(self, code: str, *args: str, cwd: Path, stderr: Path, env: dict) -> Forked:
        """`python -c CODE ARGS` run from `cwd` with `env`, forked: stdout discarded, stderr
        written to the file `stderr`. The hash seed is the server's (set it in its env)."""
        request = {"code": code, "args": list(args), "cwd": str(cwd), "stderr": str(stderr),
                   "env": {**env, "PYTHONPATH": self.env["PYTHONPATH"]}}  # fmt: skip
        return Forked(self, self.ask(request)["pid"], stderr)

    def close(self) -> None:
        if self.process.stdin:
            self.process.stdin.close()
        try:
            self.process.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


class Forked:
    """A spawned child, as `subprocess.Popen` shows one: `pid`, `poll()`, `wait()`, `kill()`,
    `returncode` (negative: killed by that signal), and its stderr's text."""

    def __init__(self, server: Server, pid: int, stderr: Path) -> None:
        self.server, self.pid, self.stderr, self.returncode = server, pid, stderr, None
        # readable once the child has ended (the server reaps it only when asked, so the pid
        # is not reused meanwhile): a look costs no request to the server
        self.ended = os.pidfd_open(pid) if hasattr(os, "pidfd_open") else None

    def poll(self, wait: bool = False) -> int | None:
        if self.returncode is None and (wait or self._has_ended()):
            self.returncode = self.server.ask({"poll": self.pid, "wait": wait})["status"]
            if self.returncode is not None and self.ended is not None:
                os.close(self.ended)
        return self.returncode

    def _has_ended(self, seconds: float = 0) -> bool:
        return self.ended is None or bool(select.select([self.ended], [], [], seconds)[0])

    def wait(self, timeout: float = 60) -> int:
        """Its exit status once it has ended; an AssertionError after `timeout` seconds."""
        if self.returncode is None:
            assert self._has_ended(timeout), f"the child {self.pid} still runs after {timeout} s"
            self.poll(wait=True)
        assert self.returncode is not None
        return self.returncode

    def kill(self) -> None:
        if self.returncode is None:
            os.kill(self.pid, signal.SIGKILL)

    def error(self, last: int = 2000) -> str:
        """The `last` characters the child wrote on stderr ("" before it opened the file)."""
        try:
            return self.stderr.read_text(errors="replace")[-last:]
        except FileNotFoundError:
            return ""


if __name__ == "__main__":
    sys.exit(serve())
