"""docs/guarantees.md: every row names tests, and every test it names exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
NAMED = re.compile(r"`(?:(test_\w+\.py)::|::)?(test_\w+)`|`(test_\w+\.py)`")


def guarantee_rows() -> list[str]:
    table = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    return [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_every_guarantee_names_a_test_that_exists() -> None:
    rows = guarantee_rows()
    assert len(rows) >= 30
    for row in rows:
        test_cell = row.rstrip(" |").rsplit(" | ", 1)[1]
        named = NAMED.findall(test_cell)
        assert named, f"no test named in: {row}"
        current = None
        for file, name, whole_file in named:
            current = file or whole_file or current
            assert current, f"a test without its file in: {row}"
            found = sorted((ROOT / "tests").rglob(current))
            assert len(found) == 1, f"{current}: {len(found)} files of that name under tests/"
            source = found[0].read_text(encoding="utf-8")
            if name:
                assert re.search(rf"^(async )?def {name}\b", source, re.M), f"{current}::{name}"
