"""Every offline example runs to completion."""

from __future__ import annotations

import runpy
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
OFFLINE = ["quickstart.py"]


@pytest.mark.parametrize("name", OFFLINE)
def test_example_runs(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    runpy.run_path(str(EXAMPLES / name), run_name="__main__")
    out = capsys.readouterr().out
    assert "chars" in out and "chain answer" in out
