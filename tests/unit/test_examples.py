"""Every offline example runs to completion and prints what it promises."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
OFFLINE = {
    "quickstart.py": ["chars", "chain answer"],
    "agent_tool.py": ["segments:\n  employee_handbook.md", "agent answer"],
}
NEEDS_KEYS = {"production.py"}


def test_every_example_is_listed() -> None:
    assert {p.name for p in EXAMPLES.glob("*.py")} == set(OFFLINE) | NEEDS_KEYS


@pytest.mark.parametrize("name", sorted(OFFLINE))
def test_example_runs(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    out = capsys.readouterr().out
    for words in OFFLINE[name]:
        assert words in out
