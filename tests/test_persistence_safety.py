"""Index directories under shared use and hostile input (issue 46 items 3, 7, 15; issue 47
item 9): concurrent saves, endpoints in a tampered manifest, schema validation of every
file, and file permissions that follow the umask."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from conftest import corpus_documents
from fake_cohere_server import FakeCohereServer, running_server
from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.persistence import MANIFEST, IndexFormatError

LOCK_FILE = ".rse_index.lock"  # persistence.LOCK_FILE (not imported: the test runs on older code)


TESTS = Path(__file__).resolve().parent
ROOT = TESTS.parent


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}


# ---------------------------------------------------------------- 47.9: file permissions


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_index_files_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    r = RSERetriever.from_documents(corpus_documents(), embedding=HashingEmbeddings())
    old = os.umask(umask)
    try:
        r.save(tmp_path / "idx")
        r.save(tmp_path / "idx")  # a second save replaces every file
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "idx").iterdir() if p.is_file()]
    assert len(files) >= 5
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: mode for p in files}


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_cli_index_and_html_page_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for doc in corpus_documents():
        (folder / doc.metadata["source"]).write_text(doc.page_content, encoding="utf-8")
    cli = [sys.executable, "-m", "langchain_rse.cli"]
    run = {"env": _env(), "check": True, "capture_output": True, "timeout": 300,
           "preexec_fn": lambda: os.umask(umask)}  # fmt: skip
    subprocess.run([*cli, "index", str(folder), "--index", str(tmp_path / "idx"),
                    "--no-progress"], **run)  # fmt: skip
    page = tmp_path / "why.html"
    subprocess.run([*cli, "query", str(tmp_path / "idx"), "termination", "--html", str(page)],
                   **run)  # fmt: skip
    written = [p for p in (tmp_path / "idx").rglob("*") if p.is_file()] + [page]
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in written}
    index_files = {name: m for name, m in modes.items() if "embedding_cache" not in name}
    assert index_files == {name: mode for name in index_files}, modes


# ---------------------------------------------------------------- 3: concurrent saves

SAVER = """
import sys
from helpers import HashingEmbeddings, make_contract
from langchain_core.documents import Document
from langchain_rse import RSERetriever
worker, target, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
docs = [Document(make_contract(f"w{worker}d{i}", ["payment", "termination"], 6 + worker),
                 id=f"w{worker}-{i}") for i in range(4 + worker)]
r = RSERetriever.from_documents(docs, embedding=HashingEmbeddings(), index_batch_size=8)
print("ready", flush=True)
sys.stdin.readline()  # all workers start saving together
for n in range(rounds):
    r.add_documents([Document(make_contract(f"w{worker}x{n}", ["escrow"], 3), id=f"w{worker}x{n}")])
    r.save(target)
"""


def _concurrent_saves(target: Path, workers: int, rounds: int) -> list[str]:
    """``workers`` processes save to ``target`` ``rounds`` times each, all at once; meanwhile
    this process loads the index again and again. The errors of those loads."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAVER, str(w), str(target), str(rounds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )  # fmt: skip
        for w in range(workers)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    errors: list[str] = []
    while any(proc.poll() is None for proc in procs):
        if (target / MANIFEST).exists():
            try:
                RSERetriever.load(target, embedding=HashingEmbeddings())
            except Exception as exc:  # noqa: BLE001 - every failure is reported
                errors.append(f"{type(exc).__name__}: {exc}")
        time.sleep(0.01)
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    return errors


@pytest.mark.parametrize("start", ["valid index", "empty"])
def test_concurrent_saves_to_one_directory_keep_it_loadable(tmp_path: Path, start: str) -> None:
    target = tmp_path / "idx"
    if start == "valid index":
        RSERetriever.from_documents(corpus_documents(), embedding=HashingEmbeddings()).save(target)
    for trial in range(2):
        errors = _concurrent_saves(target, workers=3, rounds=6)
        assert errors == [], errors
        loaded = RSERetriever.load(target, embedding=HashingEmbeddings())
        assert loaded.invoke("termination", k=1), trial
        # one generation: the last save's, complete (no stray data or temporary files)
        manifest = json.loads((target / MANIFEST).read_text())
        data_files = {p.name for p in target.iterdir() if p.name != LOCK_FILE}
        assert data_files == {MANIFEST} | {f["name"] for f in manifest["files"].values()}


# ---------------------------------------------------------------- 7: endpoints in the index

COHERE_KEY = "co-secret-key-7f3a"


def _set_reranker_url(index: Path, url: str) -> None:
    """What an attacker with write access to the index does: point the saved reranker at
    their host (the manifest is JSON, and the checksums cover the data files only)."""
    manifest = json.loads((index / MANIFEST).read_text())
    manifest["components"]["reranker"] = {
        "class": "CohereReranker",
        "module": "langchain_rse.rerank.cohere",
        "settings": {"model": "rerank-v3.5", "base_url": url, "timeout": 5.0},
        "objects": {},
    }
    (index / MANIFEST).write_text(json.dumps(manifest))


def test_a_tampered_reranker_url_gets_no_key_through_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("COHERE_API_KEY", COHERE_KEY)
    monkeypatch.delenv("CO_API_URL", raising=False)
    RSERetriever.from_documents(corpus_documents(), embedding=HashingEmbeddings()).save(
        tmp_path / "idx"
    )
    with running_server() as evil:
        _set_reranker_url(tmp_path / "idx", evil.url)
        with caplog.at_level("WARNING", logger="langchain_rse"):
            loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
        loaded.invoke("termination provisions")
        assert evil.requests == []
    assert loaded.reranker is None
    assert "reranker=CohereReranker" in caplog.text  # named: pass it again to rerank
    with pytest.raises(ValueError, match="reranker=CohereReranker"):
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), strict=True)


def test_a_saved_reranker_keeps_working_at_the_callers_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint comes from the caller (``CO_API_URL`` here), never from the index."""
    from langchain_rse.rerank import CohereReranker

    monkeypatch.setenv("COHERE_API_KEY", COHERE_KEY)
    with running_server() as server:
        monkeypatch.setenv("CO_API_URL", server.url)
        r = RSERetriever.from_documents(
            corpus_documents(), embedding=HashingEmbeddings(), reranker=CohereReranker()
        )
        r.save(tmp_path / "idx")
        loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), strict=True)
        assert isinstance(loaded.reranker, CohereReranker)
        loaded.invoke("termination provisions")
        assert server.requests  # the caller's endpoint, with the key from the environment
        assert server.requests[-1].headers["authorization"] == f"Bearer {COHERE_KEY}"


def test_a_tampered_reranker_url_gets_no_key_through_the_cli_query(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for doc in corpus_documents():
        (folder / doc.metadata["source"]).write_text(doc.page_content, encoding="utf-8")
    cli = [sys.executable, "-m", "langchain_rse.cli"]
    env = {**_env(), "COHERE_API_KEY": COHERE_KEY}
    env.pop("CO_API_URL", None)
    subprocess.run([*cli, "index", str(folder), "--index", str(tmp_path / "idx"),
                    "--no-progress"], env=env, check=True, capture_output=True, timeout=300)  # fmt: skip
    with running_server() as evil:
        _set_reranker_url(tmp_path / "idx", evil.url)
        for extra in ([], ["--explain"]):
            done = subprocess.run([*cli, "query", str(tmp_path / "idx"), "termination", *extra],
                                  env=env, capture_output=True, text=True, timeout=300)  # fmt: skip
            assert done.returncode == 0, done.stderr
        assert evil.requests == []
