"""The modules a fresh Python has loaded after each of a few statements, run in order in one
process that every import test reads (a fresh interpreter costs seconds of imports; the tests
of what `import peg` loads shared one each). Each statement's set holds what the statements
before it loaded too: a check that something is absent is as strict as in a process of its own,
or stricter."""

from __future__ import annotations

import functools
import json
import subprocess
import sys

STATEMENTS = (
    "import peg",
    "import peg.data, peg.metrics, peg.plots",
    "import peg.analysis, peg.methods",  # with the above: the library without its applications
    "import peg.apps.cli",  # what `peg --help` loads
    "import peg.integrations",  # the package; each framework's module imports its own
    "peg.metrics.auroc([0.1, 0.2], [0.9, 0.3])",  # a use of what needs scikit-learn
)


@functools.cache
def modules_after() -> dict[str, frozenset[str]]:
    """For each of STATEMENTS, the names in `sys.modules` once it (and those before it) ran."""
    code = (
        "import json, sys\nseen, namespace = [], {}\n"
        f"for statement in {STATEMENTS!r}:\n"
        "    exec(statement, namespace)\n    seen.append(sorted(sys.modules))\n"
        "print(json.dumps(seen))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    seen = json.loads(done.stdout.strip().splitlines()[-1])
    return {s: frozenset(names) for s, names in zip(STATEMENTS, seen, strict=True)}
