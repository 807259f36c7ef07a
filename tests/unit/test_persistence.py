"""Save/load: identical results, fresh process, versioning, corruption, no pickle, kill-safety."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from langchain_core.vectorstores import InMemoryVectorStore

from conftest import corpus_documents
from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.persistence import LOCK_FILE, MANIFEST, IndexFormatError

TESTS = Path(__file__).resolve().parents[1] / "support"
QUERIES = ["termination provisions", "royalties and audit rights", "insurance"]


def snapshot(r: RSERetriever) -> list:
    return [[(d.page_content, d.metadata) for d in r.invoke(q)] for q in QUERIES]


@pytest.fixture(params=["faiss", "in_memory"])
def built(request) -> RSERetriever:
    vs = None if request.param == "faiss" else InMemoryVectorStore(HashingEmbeddings())
    r = RSERetriever.from_documents(
        corpus_documents(), embedding=HashingEmbeddings(), vectorstore=vs, k=3
    )
    assert type(r.vectorstore).__name__ == (
        "FaissStore" if request.param == "faiss" else "InMemoryVectorStore"
    )
    return r


def test_round_trip_identical(built, tmp_path) -> None:
    built.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert snapshot(loaded) == snapshot(built)
    assert loaded.k == 3 and loaded.params == built.params
    # the loaded index keeps working: add, replace, delete
    loaded.delete(["gamma.txt"])
    assert all(d.metadata["doc_id"] != "gamma.txt" for d in loaded.invoke("royalties", k=5))


def test_round_trip_in_a_fresh_process(built, tmp_path) -> None:
    built.save(tmp_path / "idx")
    code = (
        "import json, sys;"
        'sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")];'
        "from helpers import HashingEmbeddings; from langchain_rse import RSERetriever;"
        "r = RSERetriever.load(sys.argv[2], embedding=HashingEmbeddings());"
        "print(json.dumps([[(d.page_content, d.metadata) for d in r.invoke(q)] "
        "for q in json.loads(sys.argv[3])]))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, str(TESTS), str(tmp_path / "idx"), json.dumps(QUERIES)],
        capture_output=True,
        text=True,
        check=True,
        timeout=300,
    ).stdout
    expected = json.loads(json.dumps(snapshot(built)))  # tuples become lists
    assert json.loads(out) == expected


def test_saved_files_contain_no_pickle(built, tmp_path) -> None:
    built.save(tmp_path / "idx")
    files = [f for f in (tmp_path / "idx").iterdir() if f.name != LOCK_FILE]  # empty lock file
    assert not any(f.suffix in (".pkl", ".pickle") for f in files)
    for f in files:
        data = f.read_bytes()
        assert not data.startswith(b"\x80"), f"{f.name} looks like a pickle"
        if f.suffix == ".json":
            json.loads(data)
        elif f.suffix == ".jsonl":
            [json.loads(line) for line in data.splitlines() if line]
        elif f.suffix == ".npz":
            with np.load(f, allow_pickle=False) as arrays:  # raises on object arrays
                assert {"doc_indptr", "terms", "tf"} <= set(arrays.files)
                assert all(arrays[n].dtype.kind in "iu" for n in arrays.files)
        else:
            assert f.suffix == ".faiss"


def test_resave_leaves_one_generation(built, tmp_path) -> None:
    built.save(tmp_path / "idx")
    built.save(tmp_path / "idx")
    names = sorted(p.name for p in (tmp_path / "idx").iterdir() if p.name != LOCK_FILE)
    assert len({n.split(".")[1] for n in names if n != MANIFEST}) == 1


def test_version_and_format_errors(built, tmp_path) -> None:
    built.save(tmp_path / "idx")
    manifest_path = tmp_path / "idx" / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["format_version"] = 99
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="format version 99"):
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    manifest_path.write_text("{not json")
    with pytest.raises(IndexFormatError, match="corrupted or truncated"):
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    with pytest.raises(FileNotFoundError, match="no langchain-rse index"):
        RSERetriever.load(tmp_path / "nothing", embedding=HashingEmbeddings())


@pytest.mark.parametrize("role", ["lexical", "lexical_tf", "record_store", "vectors"])
def test_corrupted_or_truncated_file(built, tmp_path, role) -> None:
    built.save(tmp_path / "idx")
    manifest = json.loads((tmp_path / "idx" / MANIFEST).read_text())
    target = tmp_path / "idx" / manifest["files"][role]["name"]
    target.write_bytes(target.read_bytes()[: target.stat().st_size // 2])
    with pytest.raises(IndexFormatError, match="corrupted or truncated"):
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())


def _rewrite(directory: Path, role: str, data: bytes) -> None:
    """Replace a saved file's bytes and its checksum (a well-formed but different save)."""
    import hashlib

    manifest = json.loads((directory / MANIFEST).read_text())
    (directory / manifest["files"][role]["name"]).write_bytes(data)
    manifest["files"][role]["sha256"] = hashlib.sha256(data).hexdigest()
    manifest["files"][role]["size"] = len(data)
    (directory / MANIFEST).write_text(json.dumps(manifest))


def test_the_stemmer_is_saved_and_a_different_one_is_refused(built, tmp_path) -> None:
    built.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert built.lexical_stemmer == loaded.index.lexical.stemmer == "english"
    with pytest.raises(IndexFormatError, match="saved with stemmer='english'.*'german'"):
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), lexical_stemmer="german")


@pytest.mark.parametrize("damage", ["term out of range", "unknown format", "object array"])
def test_malformed_lexical_arrays_are_a_format_error(built, tmp_path, damage) -> None:
    import io

    idx = tmp_path / "idx"
    built.save(idx)
    header, arrays = built.index.lexical.export_state()
    with np.load(io.BytesIO(arrays)) as data:
        parts = {n: data[n] for n in data.files}
    if damage == "term out of range":
        parts["terms"] = parts["terms"] + len(header["vocab"])
    elif damage == "object array":
        parts["terms"] = np.array([object()] * 2, dtype=object)
    else:
        header = {**header, "format": 99}
    buffer = io.BytesIO()
    np.savez(buffer, **parts)
    _rewrite(idx, "lexical_tf", buffer.getvalue())
    _rewrite(idx, "lexical", json.dumps(header).encode())
    with pytest.raises(IndexFormatError, match="lexical"):
        RSERetriever.load(idx, embedding=HashingEmbeddings())


def test_manifest_cannot_point_outside_the_directory(built, tmp_path) -> None:
    built.save(tmp_path / "idx")
    manifest_path = tmp_path / "idx" / MANIFEST
    manifest = json.loads(manifest_path.read_text())
    manifest["files"]["lexical"]["name"] = "../../etc/passwd"
    manifest_path.write_text(json.dumps(manifest))
    with pytest.raises(IndexFormatError, match="not allowed"):
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())


SAVER = """
import sys, itertools
sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")]
from helpers import HashingEmbeddings, make_contract
from langchain_core.documents import Document
from langchain_rse import RSERetriever
r = RSERetriever.from_documents(
    [Document(make_contract(f"doc{i}", ["payment", "termination"], 30), id=f"d{i}")
     for i in range(20)], embedding=HashingEmbeddings())
r.save(sys.argv[2])
print("ready", flush=True)
for n in itertools.count():
    r.add_documents([Document(make_contract(f"extra{n}", ["escrow"], 30), id=f"x{n}")])
    r.save(sys.argv[2])
"""


def test_killed_during_save_previous_index_still_loads(tmp_path) -> None:
    target = tmp_path / "idx"
    for delay in (0.05, 0.3, 0.9):
        proc = subprocess.Popen(
            [sys.executable, "-c", SAVER, str(TESTS), str(target)],
            stdout=subprocess.PIPE,
            text=True,
        )
        assert proc.stdout is not None
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)
        loaded = RSERetriever.load(target, embedding=HashingEmbeddings())
        assert loaded.invoke("termination", k=1)


# Regression (issue 14, bug 6): `load` dropped the reranker (and router, expander) silently.


def test_load_restores_or_names_every_component(tmp_path, caplog) -> None:
    from langchain_core.documents import BaseDocumentCompressor

    from langchain_rse import DocumentRouter, EmbeddingReranker

    class KeepAll(BaseDocumentCompressor):
        def compress_documents(self, documents, query, callbacks=None):  # type: ignore[override]
            return list(documents)

    emb = HashingEmbeddings()
    r = RSERetriever.from_documents(
        corpus_documents(),
        embedding=emb,
        rse_params="reranked",
        reranker=EmbeddingReranker(embeddings=emb, rank_decay=7.0),
    )
    r.save(tmp_path / "rerank")
    loaded = RSERetriever.load(tmp_path / "rerank", embedding=HashingEmbeddings())
    assert isinstance(loaded.reranker, EmbeddingReranker) and loaded.reranker.rank_decay == 7.0
    assert snapshot(loaded) == snapshot(r)

    r.reranker = KeepAll()  # a compressor, a router: cannot be rebuilt from settings
    r.router = DocumentRouter(retriever=r.model_copy(), documents=2)
    r.save(tmp_path / "custom")
    with caplog.at_level("WARNING", logger="langchain_rse"):
        loaded = RSERetriever.load(tmp_path / "custom", embedding=HashingEmbeddings())
    assert loaded.reranker is None and loaded.router is None
    assert "reranker=CompressorReranker" in caplog.text and "router=DocumentRouter" in caplog.text
    with pytest.raises(ValueError, match="reranker=CompressorReranker"):
        RSERetriever.load(tmp_path / "custom", embedding=HashingEmbeddings(), strict=True)
    # passed again: no warning, the router keeps its saved settings
    caplog.clear()
    with caplog.at_level("WARNING", logger="langchain_rse"):
        loaded = RSERetriever.load(
            tmp_path / "custom",
            embedding=HashingEmbeddings(),
            reranker=KeepAll(),
            router=r.router.retriever,
            strict=True,
        )
    assert "cannot be rebuilt" not in caplog.text
    assert loaded.router is not None and loaded.router.documents == 2


# Regression (issue 14, bug 10): killed saves left temporary files, and load read each
# data file twice (once to hash it, once to parse it).


def test_save_removes_temporary_files_of_a_killed_save(built, tmp_path) -> None:
    target = tmp_path / "idx"
    built.save(target)
    leftovers = [
        ".record_store.0123456789ab.jsonl.x1y2z3.tmp",
        ".vectors.0123456789ab.json.q.tmp",
        ".vectors_index.0123456789ab.faiss.r.tmp",
        ".rse_index.json.abc.tmp",
    ]
    for name in leftovers:
        (target / name).write_bytes(b"partial")
    (target / "notes.txt").write_text("a user's file is left alone")
    built.save(target)
    names = {p.name for p in target.iterdir()}
    assert not names & set(leftovers)
    assert "notes.txt" in names


_OPENED: list[str] | None = None
"""The paths opened while a test watches (:func:`_watch_opens`), else None."""
_HOOKED: list[bool] = []


def _watch_opens(event: str, args: tuple) -> None:
    if event == "open" and _OPENED is not None and isinstance(args[0], (str, Path)):
        _OPENED.append(str(args[0]))


def test_load_opens_each_file_once(built, tmp_path) -> None:
    """Seen through Python's ``open`` audit events (no code of the package replaced)."""
    global _OPENED
    import sys

    built.save(tmp_path / "idx")
    if not _HOOKED:
        sys.addaudithook(_watch_opens)  # (a hook stays for the process: it only records)
        _HOOKED.append(True)
    _OPENED = []
    try:
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
        opened = [Path(p).name for p in _OPENED if Path(p).parent == tmp_path / "idx"]
    finally:
        _OPENED = None
    manifest = json.loads((tmp_path / "idx" / MANIFEST).read_text())
    expected = {MANIFEST, *(f["name"] for f in manifest["files"].values())}
    assert sorted(opened) == sorted(expected), opened
