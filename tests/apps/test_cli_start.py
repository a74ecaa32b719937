"""The `peg` command as a user meets it: `--help` and argument errors without torch, the
commands users come for first, one name for saved logits in every command (the earlier
spellings still work), the answer last and alone on stdout, file names that are not UTF-8."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from peg.apps import arguments, html
from peg.apps.cli import COMMANDS, main, parser
from peg.apps.compare.methods import CATALOGUE
from peg.apps.select.command import NOT_SAVED
from peg.methods.calibration._calibrator import calibrators

SRC = str(Path(__file__).resolve().parents[2] / "src")


def _fresh(*argv: str) -> subprocess.CompletedProcess[str]:
    """`python -X importtime -m peg.apps ARGV` in a fresh process (this checkout's peg)."""
    env = {**os.environ, "PYTHONPATH": SRC + os.pathsep + os.environ.get("PYTHONPATH", "")}
    return subprocess.run(
        [sys.executable, "-X", "importtime", "-m", "peg.apps", *argv],
        capture_output=True,
        text=True,
        env=env,
    )


def _imported(stderr: str) -> set[str]:
    return {line.rsplit("|", 1)[-1].strip() for line in stderr.splitlines() if "|" in line}


@pytest.mark.parametrize(
    "argv, status",
    [
        (["--help"], 0),
        (["select", "--help"], 0),
        (["select", "--bogus"], 2),
        (["monitor", "--chunk-size", "0", "--out", "x"], 2),
        (["select"], 2),  # inputs missing or mixed: argument errors too
        (["compare", "--val-logits", "v.npy", "--model", "m:f"], 2),
        (["monitor", "--logits", "f.npy", "--out", "x"], 2),
    ],
)
def test_help_and_argument_errors_import_no_torch(argv, status):
    done = _fresh(*argv)
    assert done.returncode == status, done.stderr[-2000:]
    assert "peg.apps.cli" in _imported(done.stderr)  # the check can see what was imported
    assert not {"torch", "numpy"} & _imported(done.stderr)


def test_the_help_leads_with_what_users_come_for():
    assert list(COMMANDS)[:4] == ["select", "apply", "compare", "monitor"]
    text = parser().format_help()
    assert text.index("select") < text.index("demo") and "--val-logits" in text


def test_the_light_copies_match_what_they_copy():
    maps = {c.name for c in calibrators()}  # the registry's, named by it alone
    assert tuple(n for n in CATALOGUE if n not in maps) == arguments.METHOD_NAMES
    assert maps <= set(CATALOGUE)
    assert (arguments.FORMATS, arguments.REPORT, arguments.CSV) == (
        html.FORMATS,
        html.REPORT,
        html.CSV,
    )


@pytest.mark.parametrize(
    "command, spellings",
    [
        ("select", ["--val-logits", "--logits"]),
        ("compare", ["--val-logits", "--logits"]),
        ("monitor", ["--val-logits", "--reference-logits"]),
    ],
)
def test_every_spelling_of_the_validation_logits_is_one_option(command, spellings):
    extra = ["--out", "o"] if command == "monitor" else []
    for spelling in spellings:
        label = spelling.replace("logits", "labels")
        args = parser().parse_args([command, spelling, "v.npy", label, "l.npy", *extra])
        assert (args.val_logits, args.val_labels) == ("v.npy", "l.npy")
        assert arguments.typed(args, "val_labels") == label
    help_text = parser()._subparsers._group_actions[0].choices[command].format_help()
    assert "--val-logits" in help_text and spellings[1] not in help_text  # the old one hidden


def _saved(tmp: Path, n: int = 200, classes: int = 3) -> tuple[np.ndarray, np.ndarray]:
    g = np.random.default_rng(0)
    z = (2 * g.normal(size=(n, classes))).astype(np.float32)
    y = (
        z.argmax(1)
        if n < 4
        else np.where(g.random(n) < 0.8, z.argmax(1), g.integers(0, classes, n))
    )
    np.save(tmp / "v.npy", z)
    np.save(tmp / "vl.npy", y)
    return z, y


@pytest.mark.parametrize("flag", ["--reference-labels", "--val-labels"])
def test_an_error_names_the_option_typed(tmp_path, capsys, flag):
    """A label out of range blamed "val labels" where the user typed --reference-labels."""
    _, y = _saved(tmp_path)
    y[7] = 5
    np.save(tmp_path / "bad.npy", y)
    logits = flag.replace("labels", "logits")
    with pytest.raises(SystemExit) as stop:
        main(
            [
                "monitor",
                logits,
                str(tmp_path / "v.npy"),
                flag,
                str(tmp_path / "bad.npy"),
                "--logits",
                str(tmp_path / "v.npy"),
                "--out",
                str(tmp_path / "o"),
            ]
        )
    err = capsys.readouterr().err
    assert stop.value.code == 2
    assert (
        f"error: {flag}: expected labels in [0, 3) (the classes of {logits}), got 5 at row 7" in err
    )


def test_select_prints_the_answer_last_and_says_the_map_is_not_kept(tmp_path, capsys):
    _saved(tmp_path)
    argv = [
        "select",
        "--val-logits",
        str(tmp_path / "v.npy"),
        "--val-labels",
        str(tmp_path / "vl.npy"),
        "--candidates",
        "TS",
        "Vector scaling",
        "--cv",
        "2",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    lines = out.strip().splitlines()
    assert lines[0].startswith("| candidate |") and lines[2].startswith("| Uncalibrated |")
    assert lines[-1].startswith("chosen: ") and " → " in lines[-1]  # the verdict, last
    assert "AutoSelect [fold" not in out and max(len(line) for line in lines[:-1]) < 200
    assert f"peg select: {NOT_SAVED}" in err
    assert main([*argv, "--verbose"]) == 0  # the full report, the budget's rule
    assert "Cost: " in capsys.readouterr().out


def test_compare_json_on_stdout_parses(tmp_path, capsys):
    """`--format json` printed progress lines on stdout too."""
    _saved(tmp_path)
    argv = [
        "compare",
        "--val-logits",
        str(tmp_path / "v.npy"),
        "--val-labels",
        str(tmp_path / "vl.npy"),
        "--test-logits",
        str(tmp_path / "v.npy"),
        "--test-labels",
        str(tmp_path / "vl.npy"),
        "--methods",
        "Model",
        "TS",
        "--out",
        str(tmp_path / "o"),
        "--format",
        "json",
    ]
    assert main(argv) == 0
    out, err = capsys.readouterr()
    assert [r["method"] for r in json.loads(out)][:2] == ["Model", "TS"]
    assert "compare [2/2] TS" in err


def test_a_file_name_with_an_equals_sign_is_data(tmp_path, monkeypatch):
    """`[NAME=]DATA` split `a=b.npz` into the name a and the data b.npz, no such file."""
    from peg.apps.compare import sources

    z, y = _saved(tmp_path)
    np.savez(tmp_path / "a=b.npz", x=z, y=y)
    monkeypatch.chdir(tmp_path)
    assert list(sources.named(["a=b.npz", "c=a=b.npz"], "--shifted", True)) == ["a=b", "c"]


def _non_utf8(tmp: Path) -> tuple[str, str]:
    """Two files whose names are not UTF-8: target logits and a shifted set."""
    z, y = _saved(tmp)
    logits, shifted = os.fsdecode(tmp / os.fsdecode(b"\xff.npy")), os.fsdecode(b"\xfe.npz")
    np.save(logits, z)
    np.savez(tmp / shifted, x=z, y=y)
    return logits, str(tmp / shifted)


def _peg(*argv: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    """`peg ARGV` in a process of its own: stdout as a terminal's, UTF-8, strict."""
    env = {**os.environ, "PYTHONPATH": SRC, "PYTHONIOENCODING": "utf-8"}
    code = "import sys; from peg.apps.cli import main; sys.exit(main())"
    return subprocess.run(
        [sys.executable, "-c", code, *argv], capture_output=True, cwd=cwd, env=env
    )


def test_monitor_takes_a_file_name_that_is_not_utf8(tmp_path):
    """It stopped with exit 2 and a codec message after the work, leaving only results.json."""
    logits, _ = _non_utf8(tmp_path)
    done = _peg(
        "monitor",
        "--val-logits",
        "v.npy",
        "--val-labels",
        "vl.npy",
        "--logits",
        logits,
        "--out",
        "o",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr.decode()[-1500:]
    assert "\\xff.npy" in (tmp_path / "o" / "results.md").read_text()
    assert b"\\xff.npy" in done.stdout


def test_compare_takes_a_file_name_that_is_not_utf8(tmp_path):
    """It gave a raw matplotlib TypeError (then a codec error writing results.md)."""
    _, shifted = _non_utf8(tmp_path)
    done = _peg(
        "compare",
        "--val-logits",
        "v.npy",
        "--val-labels",
        "vl.npy",
        "--test-logits",
        "v.npy",
        "--test-labels",
        "vl.npy",
        "--shifted",
        shifted,
        "--methods",
        "Model",
        "TS",
        "--out",
        "o",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr.decode()[-1500:]
    assert "\\xfe" in (tmp_path / "o" / "results.md").read_text()
