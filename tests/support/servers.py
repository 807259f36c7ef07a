"""Start real local servers (Redis, Chroma) for integration tests, on 127.0.0.1."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import pytest


def missing_server(reason: str) -> NoReturn:
    """Skip a test whose server is not installed; in CI (``CI=true``) fail it instead.

    CI installs every server, so there a missing one is a broken setup, not a reason to
    let the integration tests vanish from the run.
    """
    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (required when CI=true)", pytrace=False)
    pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _wait_for_port(port: int, proc: subprocess.Popen, what: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with status {proc.returncode}")
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"{what} did not listen on 127.0.0.1:{port} within {timeout}s")


@contextmanager
def _server(cmd: list[str], port: int, what: str, log: Path) -> Iterator[int]:
    env = {**os.environ, "ANONYMIZED_TELEMETRY": "False"}  # servers stay off the network
    with log.open("wb") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    try:
        _wait_for_port(port, proc, what)
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def redis_server(tmp: Path) -> Iterator[int]:
    exe = shutil.which("redis-server")
    if exe is None:
        missing_server("redis-server is not installed (Debian package redis-server)")
    port = free_port()
    cmd = [
        exe,
        "--port",
        str(port),
        "--bind",
        "127.0.0.1",
        "--save",
        "",
        "--appendonly",
        "no",
        "--dir",
        str(tmp),
    ]
    with _server(cmd, port, "redis-server", tmp / "redis.log") as p:
        yield p


@contextmanager
def chroma_server(tmp: Path) -> Iterator[int]:
    exe = shutil.which("chroma") or str(Path(sys.executable).parent / "chroma")
    if not Path(exe).exists():
        missing_server("the chroma server is not installed (pip install chromadb)")
    port = free_port()
    cmd = [exe, "run", "--path", str(tmp / "chroma"), "--host", "127.0.0.1", "--port", str(port)]
    with _server(cmd, port, "chroma run", tmp / "chroma.log") as p:
        yield p
