"""`peg apply`'s record, `<out>.peg.json`: the mark that peg wrote `--out` (issue 46, item 2).

It was written before the work: a failed run left it behind, and it then licensed overwriting
a file of the user's of the same name; any file of that name (`not even json`) was trusted. Now
it is written only after the work, and names the file, its size and SHA-256: an existing
`--out` is replaced only where its record matches it byte for byte.
"""

from __future__ import annotations

import json
import os

import numpy as np
import pytest
import torch
from torch import nn

import peg
from peg.apps.cli import main
from peg.utils import io as _io

C = 4


def saved(n: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    y = torch.randint(0, C, (n,), generator=g)
    return torch.randn(n, C, generator=g) * 3 + 3 * nn.functional.one_hot(y, C), y


@pytest.fixture
def argv(tmp_path) -> list[str]:
    """`peg apply` of an ETS map (it refuses other class counts) on 40 rows, to p.npy."""
    peg.EnsembleTemperatureScaling().fit(nn.Identity(), saved(300, 0)).save(tmp_path / "map.peg")
    np.save(tmp_path / "new.npy", saved(40, 1)[0].numpy())
    np.save(tmp_path / "wide.npy", saved(40, 1)[0].numpy()[:, [0, 1, 2, 3, 0]])
    return ["apply", str(tmp_path / "map.peg"), "--logits", str(tmp_path / "new.npy"),
            "--out", str(tmp_path / "p.npy")]  # fmt: skip


def _refused(argv: list[str], capsys: pytest.CaptureFixture[str]) -> str:
    with pytest.raises(SystemExit) as stop:
        main(argv)
    assert stop.value.code == 2
    return capsys.readouterr().err


def test_a_failed_run_leaves_no_record_to_license_overwriting(tmp_path, argv, capsys):
    wide = [*argv[:3], str(tmp_path / "wide.npy"), *argv[4:]]
    assert "fitted on 4 classes" in _refused(wide, capsys)
    assert not (tmp_path / "p.npy.peg.json").exists() and not (tmp_path / "p.npy").exists()
    (tmp_path / "p.npy").write_bytes(b"the user's own")  # later, a file of the same name
    assert "peg apply did not write it (no p.npy.peg.json" in _refused(argv, capsys)
    assert (tmp_path / "p.npy").read_bytes() == b"the user's own"


@pytest.mark.parametrize(
    ("record", "why"),
    [
        (b"not even json", "is not a record of peg apply"),
        (b'{"shape": [40, 4]}', "is not a record of peg apply"),  # an earlier version's
        (b'{"made_by": "peg apply"}', "does not name this file"),
        (b"[" * 100_000, "is not a record of peg apply"),  # nested too deeply for json
    ],
    ids=["not json", "an earlier version's", "no file named", "nested too deeply"],
)
def test_a_record_is_trusted_for_its_content_not_its_name(tmp_path, argv, capsys, record, why):
    (tmp_path / "p.npy").write_bytes(b"the user's own")
    (tmp_path / "p.npy.peg.json").write_bytes(record)
    err = _refused(argv, capsys)
    assert f"p.npy exists and peg apply did not write it (p.npy.peg.json beside it {why})" in err
    assert (tmp_path / "p.npy").read_bytes() == b"the user's own"


def test_a_record_vouches_only_for_the_bytes_it_names(tmp_path, argv, capsys):
    assert main(argv) == 0
    record = json.loads((tmp_path / "p.npy.peg.json").read_text())
    assert record["made_by"] == "peg apply" and record["output"] == "p.npy"
    assert record["bytes"] == os.path.getsize(tmp_path / "p.npy") and len(record["sha256"]) == 64
    assert main(argv) == 0  # its own output, unchanged: replaced
    np.save(tmp_path / "p.npy", np.zeros((40, C), np.float32))  # the user's, since
    assert "(it changed since" in _refused(argv, capsys)
    assert not np.load(tmp_path / "p.npy").any()
    # a genuine record copied beside another file: it names p.npy, not q.npy
    (tmp_path / "q.npy").write_bytes(b"mine")
    (tmp_path / "q.npy.peg.json").write_bytes((tmp_path / "p.npy.peg.json").read_bytes())
    out = [*argv[:-1], str(tmp_path / "q.npy")]
    assert "q.npy.peg.json beside it does not name this file" in _refused(out, capsys)
    assert (tmp_path / "q.npy").read_bytes() == b"mine"


def test_a_failed_rename_leaves_no_record(tmp_path, argv, monkeypatch):
    replace = os.replace

    def fails_for_out(src: str, dst: object) -> None:
        if str(dst).endswith("p.npy"):
            raise OSError(28, "No space left on device")
        replace(src, dst)

    monkeypatch.setattr(_io.os, "replace", fails_for_out)
    with pytest.raises(OSError, match="No space left"):
        main([*argv])
    assert sorted(p.name for p in tmp_path.iterdir()) == ["map.peg", "new.npy", "wide.npy"]
