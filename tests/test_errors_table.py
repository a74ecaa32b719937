"""docs/errors.md is the error cases of the test modules, rendered (tests/errors_table.py)."""

from __future__ import annotations

import errors_table


def test_docs_errors_md_is_up_to_date(tmp_path):
    assert errors_table.DOC.read_text() == errors_table.render(tmp_path), (
        "run: python tests/errors_table.py"
    )


def test_the_scan_finds_the_case_modules():
    names = {m.__name__ for m in errors_table.case_modules()}
    assert {"test_peg_errors", "test_app_errors", "test_archive_errors"} <= names
    assert "test_errors_table" not in names
