"""The CI preflight finds the servers the way the fixtures do, and names a missing one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from server_check import missing_servers

TESTS = Path(__file__).resolve().parents[1] / "support"


def test_a_missing_server_is_named(monkeypatch, tmp_path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no redis-server (nor chroma) on PATH
    missing = missing_servers()
    assert any(m.startswith("redis-server") for m in missing)


def test_ci_stops_the_session_before_any_test_when_a_server_is_missing(tmp_path) -> None:
    env = {**os.environ, "CI": "true", "PATH": str(tmp_path)}
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            str(TESTS.parent / "unit" / "test_fusion.py"),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        cwd=TESTS.parents[1],
    )
    assert out.returncode == 3, out.stdout[-2000:] + out.stderr[-2000:]
    assert "redis-server" in out.stdout + out.stderr
    assert " passed" not in out.stdout
