"""The real command in a child process: a run killed with SIGKILL half-way resumes without
embedding again what it had finished; progress reaches a log that is not a terminal; no
bm25s DEBUG line on stderr."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from helpers import cached_vectors, write_corpus

ROOT = Path(__file__).resolve().parents[2]
CACHE_BATCH = 32
"""Vectors the command's cache stores at a time (``cached_embeddings``' batch size)."""


def command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "langchain_rse.cli", *argv]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    return env


def test_killed_index_resumes_with_fewer_embedding_calls(tmp_path: Path) -> None:
    docs, index = tmp_path / "docs", tmp_path / "idx"
    write_corpus(docs)
    argv = command("index", str(docs), "--index", str(index), "--chunk-size", "100")
    child = subprocess.Popen(
        argv, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    try:
        while cached_vectors() < CACHE_BATCH:  # the first batch is in the cache
            assert child.poll() is None, f"finished before it could be killed: {child.stderr}"
            assert time.monotonic() < deadline, "no vector was cached in time"
            time.sleep(0.05)
        child.send_signal(signal.SIGKILL)
    finally:
        child.kill()
        child.communicate()
    assert child.returncode == -signal.SIGKILL
    done_before = cached_vectors()
    assert not (index / "rse_index.json").exists()  # killed before it saved anything

    resumed = subprocess.run(argv, env=environment(), capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    found = re.search(r"(\d+) of their (\d+) chunk\(s\) newly embedded", resumed.stdout)
    assert found, resumed.stdout
    embedded, total = int(found[1]), int(found[2])
    assert total > done_before >= CACHE_BATCH  # it was killed half-way
    assert embedded == total - done_before  # only what the killed run had not finished
    assert cached_vectors() == total
    # progress, when the resumed run took long enough to report any (a line every 10 s),
    # went to its log (stderr is a pipe, not a terminal) and ended with the total
    if "embedding + writing:" in resumed.stderr:
        assert "langchain_rse.progress: embedding + writing:" in resumed.stderr
        assert f"{total}/{total} chunks" in resumed.stderr
    assert "bm25s" not in resumed.stderr

    query = subprocess.run(
        command("query", str(index), "when does the supplier ship order 317?", "--json"),
        env=environment(),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert query.returncode == 0, query.stderr
    assert "DEBUG" not in query.stderr and "bm25s" not in query.stderr
    hits = json.loads(query.stdout)
    assert hits and any("order 317" in h["text"] for h in hits)
