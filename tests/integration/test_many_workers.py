"""Several OS processes over one shared index, on every engine (issue 15, "Many workers").

One writer process replaces two documents, adds one and deletes an older one per round,
while three reader processes query flat out. After each round every reader checks that
its lexical branch finds the document just added by the writer (rank 1), that the two
replaced documents come back as exactly their new version, and that deleted documents
are gone; between rounds and during writes every result must be an exact slice of a
whole version of its document, and no deleted document may ever come back. At the end
the writer is killed half-way through a write; ``vacuum()`` must then leave every store
(vector store, lexical index, record store) holding exactly the current versions.

Engines (``tests/engines.py``): ``chroma_redis`` (in-process BM25 in each worker,
refreshed through the shared generation token), ``milvus`` (Milvus BM25 collection as
the lexical store, Redis records) and ``postgres`` (one database for all three stores).
"""

from __future__ import annotations

import json
import queue
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from engines import ENGINES, build, drop, new_index, servers_for, stored_versions
from langchain_core.documents import Document

from conftest import corpus_documents
from helpers import make_contract, search_branches
from langchain_rse import RSERetriever
from langchain_rse.indexing.records import doc_of

pytestmark = pytest.mark.integration

TESTS = Path(__file__).resolve().parents[1] / "support"
ROUNDS = 5
READERS = 3
REPLACED = ("alpha", "beta")
CHROMA_RACE = "Error finding id"
"""Chroma's server (chromadb 1.5.9) answered one reader's query with ``InternalError: Error
executing plan: Internal error: Error finding id`` while the writer deleted a version, once
in a CI run (2026-12-07): an error inside the engine, passed through to the caller, not a
wrong or broken result. Counted apart and bounded, not hidden (``docs/decisions.md``)."""


def version_text(name: str, n: int) -> str:
    """Version ``n`` of a replaced document: its own marker word and shifted offsets."""
    return "RECITAL " * (7 * (n % 3)) + make_contract(name, [f"mk{n}q", "payment"], 3)


def added_text(n: int) -> str:
    """The document the writer adds in round ``n`` (and deletes in round ``n + 2``)."""
    return make_contract(f"worker{n}", ["escrow"], 2) + f"\nThe zq{n}vx clause applies.\n"


def all_texts() -> dict[str, list[str]]:
    """Every text each document id ever has in the test."""
    texts = {d.metadata["source"]: [d.page_content] for d in corpus_documents()}
    texts |= {name: [version_text(name, n) for n in range(ROUNDS + 2)] for name in REPLACED}
    return texts | {f"w{n}": [added_text(n)] for n in range(ROUNDS + 1)}


WORKER = """
import json, os, queue, sys, threading, time
sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")]
from langchain_core.documents import Document
from engines import build
from langchain_rse.indexing.records import pointer_key
from test_many_workers import REPLACED, added_text, reader_loop, version_text

cfg, role = json.loads(sys.argv[2]), sys.argv[3]
# Ranked by marker words, a lexical property: RRF 1:1 and no document routing (which can
# favour a document whose lead matches the query over the replaced ones; ranking is not
# what this test checks, and the lead reload is tested in test_routing.py).
r = build(cfg, k=4, weights=(1.0, 1.0), router=None)
print(json.dumps({"ready": role}), flush=True)
if role == "reader":
    commands = queue.Queue()
    threading.Thread(target=lambda: [commands.put(line) for line in sys.stdin],
                     daemon=True).start()
    reader_loop(r, commands)
    raise SystemExit(0)
for line in sys.stdin:
    if line.strip() == "crash":  # die half-way: chunks written, the pointer not swapped
        real_put = r.index.records.put
        def put(pairs):
            if any(key == pointer_key("alpha") for key, _ in pairs):
                os._exit(3)
            real_put(pairs)
        r.index.records.put = put
        r.add_documents([Document(version_text("alpha", 99), id="alpha")])
    n = int(line)
    t0 = time.time()
    r.add_documents([*(Document(version_text(d, n), id=d) for d in REPLACED),
                     Document(added_text(n), id=f"w{n}")])
    if n >= 2:
        r.delete([f"w{n - 2}"])
    print(json.dumps({"round": n, "t0": t0, "t1": time.time()}), flush=True)
"""


def reader_loop(r: RSERetriever, commands: queue.Queue[str]) -> None:
    """A reader process: query flat out; answer ``check N`` after the writer's round N;
    print a summary on ``stop``. Runs in the worker processes."""
    import time

    texts = all_texts()
    problems: list[str] = []
    engine_errors: list[str] = []  # CHROMA_RACE
    starts: list[float] = []
    deleted: set[str] = set()
    latest = 0

    def check(found: list[Document]) -> None:
        for d in found:
            m = d.metadata
            if m["doc_id"] in deleted:
                problems.append(f"deleted {m['doc_id']} came back")
            elif not any(
                t[m["start_index"] : m["end_index"]] == d.page_content for t in texts[m["doc_id"]]
            ):
                problems.append(
                    f"{m['doc_id']} [{m['start_index']}:{m['end_index']}] is not "
                    "a slice of a whole version"
                )

    def after_round(n: int) -> dict[str, Any]:
        """What must hold once round ``n`` is written (the writer waits meanwhile)."""
        deleted.update(f"w{m}" for m in range(n - 1))
        found = r.invoke(f"the zq{n}vx clause", mode="chunks")
        check(found)
        # The lexical branch (the in-process BM25 index refreshed through the generation
        # token, or the lexical store) ranks the new document's chunk first, and the record
        # store returns the document. Its rank in the fused top k also depends on the dense
        # branch, which is not what is checked here: a CI run on Chroma + Redis once
        # returned a fused top 4 without the chunk of lexical rank 1 (ranks 2, 7, 9, 41).
        lexical = search_branches(r).lexical_search(
            {"query": f"the zq{n}vx clause", "filter": None}
        )
        lexical_sees_it = (
            bool(lexical)
            and doc_of(lexical[0][0]) == f"w{n}"
            and [d.id for d in r.get([f"w{n}"])] == [f"w{n}"]
        )
        top = [
            (d.metadata["doc_id"], d.metadata["dense_rank"], d.metadata["lexical_rank"])
            for d in found
        ]
        current = r.invoke(f"mk{n}q payment", mode="chunks", k=8)
        check(current)
        replaced = [d for d in current if d.metadata["doc_id"] in REPLACED]
        whole_current = bool(replaced) and all(
            version_text(d.metadata["doc_id"], n)[
                d.metadata["start_index"] : d.metadata["end_index"]
            ]
            == d.page_content
            for d in replaced
        )
        gone = [] if n < 2 else r.invoke(f"the zq{n - 2}vx clause", mode="chunks")
        check(gone)
        return {
            "checked": n,
            "lexical_sees_it": lexical_sees_it,
            "whole_current": whole_current,
            "deleted_gone": all(d.metadata["doc_id"] != f"w{n - 2}" for d in gone)
            and (n < 2 or r.get([f"w{n - 2}"]) == []),
            "top": top,
        }

    i = 0
    while True:
        try:
            command = commands.get_nowait().split()
        except queue.Empty:
            command = []
        if command and command[0] == "stop":
            break
        if command and command[0] == "check":
            latest = int(command[1])
            print(json.dumps(after_round(latest)), flush=True)
            continue
        queries = [
            "termination provisions",
            "payment obligations",
            "escrow clause",
            f"mk{latest}q payment",
            f"the zq{latest}vx clause",
            f"the zq{max(latest - 2, 0)}vx clause",
        ]
        starts.append(time.time())
        try:
            check(r.invoke(queries[i % len(queries)], mode="chunks" if i % 2 else "segments"))
        except Exception as exc:  # reported to the test
            if CHROMA_RACE in str(exc):
                engine_errors.append(f"{type(exc).__name__}: {exc}")
            else:
                problems.append(f"{type(exc).__name__}: {exc}")
        i += 1
    print(
        json.dumps(
            {
                "queries": len(starts),
                "starts": starts,
                "problems": problems[:5],
                "n_problems": len(problems),
                "n_engine_errors": len(engine_errors),
            }
        ),
        flush=True,
    )


class Worker:
    """A worker process, its JSON replies collected by a thread (never blocks forever)."""

    def __init__(self, cfg: dict[str, Any], role: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", WORKER, str(TESTS), json.dumps(cfg), role],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        self.replies: queue.Queue[dict[str, Any] | None] = queue.Queue()
        threading.Thread(target=self._follow, daemon=True).start()

    def _follow(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.replies.put(json.loads(line))
        self.replies.put(None)  # exited

    def send(self, line: str) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def reply(self, timeout: float = 180) -> dict[str, Any]:
        msg = self.replies.get(timeout=timeout)
        assert msg is not None, f"the worker exited with status {self.proc.wait()}"
        return msg

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


@pytest.fixture(scope="module", params=ENGINES)
def engine(request, tmp_path_factory) -> Iterator[dict[str, Any]]:
    with servers_for(request.param, tmp_path_factory.mktemp(request.param)) as cfg:
        yield cfg


def test_one_writer_and_three_reader_processes(engine) -> None:
    cfg = new_index(engine)
    r = build(cfg, k=4, weights=(1.0, 1.0), router=None)
    r.add_documents(
        [
            *corpus_documents(),
            *(Document(version_text(d, 0), id=d) for d in REPLACED),
            Document(added_text(0), id="w0"),
        ]
    )
    workers = [Worker(cfg, "reader") for _ in range(READERS)]
    writer = Worker(cfg, "writer")
    try:
        for w in [*workers, writer]:
            assert "ready" in w.reply()
        windows = []
        for n in range(1, ROUNDS + 1):
            writer.send(str(n))
            done = writer.reply()
            assert done["round"] == n
            windows.append((done["t0"], done["t1"]))
            for w in workers:
                w.send(f"check {n}")
            for w in workers:
                got = w.reply()
                top = got.pop("top")  # (doc_id, dense rank, lexical rank) of what was found
                assert got == {
                    "checked": n,
                    "lexical_sees_it": True,
                    "whole_current": True,
                    "deleted_gone": True,
                }, top
        for w in workers:
            w.send("stop")
        summaries = [w.reply() for w in workers]
        for s in summaries:
            assert s["n_problems"] == 0, s["problems"]
            # Chroma's own server error, rare: see CHROMA_RACE
            assert s["n_engine_errors"] <= max(1, s["queries"] // 100), s
            assert s["queries"] > 0
        during = sum(t0 <= t <= t1 for s in summaries for t in s["starts"] for t0, t1 in windows)
        assert during > 0, "no query ran while the writer wrote"
        writer.send("crash")  # killed before its pointer swap: a whole version left over
        assert writer.proc.wait(timeout=180) == 3
    finally:
        for w in [*workers, writer]:
            w.kill()

    docs = [*all_texts()]
    current = [p for p in r.index.records.pointers(docs) if p is not None]
    assert sorted(p.doc_id for p in current) == sorted(
        [d.metadata["source"] for d in corpus_documents()]
        + [*REPLACED, f"w{ROUNDS - 1}", f"w{ROUNDS}"]
    )
    want = sorted((p.doc_id, p.version) for p in current for _ in p.spans)
    r.invoke("payment")  # an in-process BM25 catches up with the other workers' writes
    assert any(chunks != want for chunks in stored_versions(r).values())  # the dead writer's
    assert r.vacuum() == 1
    r.invoke("payment")
    for store, chunks in stored_versions(r).items():
        assert chunks == want, f"orphan or missing chunks in the {store}"
    keys = list(r.record_store.yield_keys())
    for prefix in ("doc/", "body/", "ver/"):  # pointer, body, version record per document
        assert len([k for k in keys if k.startswith(prefix)]) == len(current), prefix
    assert sorted(v.version for v in r.index.records.versions()) == sorted(
        p.version for p in current
    )
    assert r.get(["alpha"])[0].page_content == version_text("alpha", ROUNDS)
    drop(cfg, r)
