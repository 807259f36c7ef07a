"""A property test of the write protocol (issue 46): random interleavings of add, replace,
delete and query across two writers and two readers.

After every query: each returned segment is an exact slice of a version of its document
that was current at some point during the query. At the end, after ``vacuum()``: every
store holds exactly the current versions.

* In process (``test_random_interleavings_in_memory``): two retrievers ("workers") over one
  record store and one vector store, each used by a writer thread and a reader thread. A
  seeded scheduler lets one thread run at a time, between two calls to the stores (each
  call is a step; the scheduler picks, at random, which parked thread takes the next
  one), so a writer can be held anywhere in its protocol while the others go on. The
  record store logs every pointer change, which gives each query the versions that were
  current while it ran.
* Over Chroma + Redis (``test_random_interleavings_over_chroma_and_redis``): two writer
  processes and one reader process, with seeded random pauses; writers log in Redis when
  each write begins and ends, which bounds the versions current during a query.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from langchain_core.documents import Document
from langchain_core.stores import BaseStore, InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings, make_contract, stored_metadata
from langchain_rse import RSERetriever
from langchain_rse.indexing.records import DocBody, Pointer

TESTS = Path(__file__).resolve().parents[1] / "support"
DOCS = ("alpha", "beta")
TOPICS = ("payment", "escrow", "termination", "royalties", "insurance", "audit")
SEEDS = range(12)
OPS = 10
"""Operations per writer and queries per reader, in each interleaving."""
PROCESS_OPS = 30
"""Operations per writer process over Chroma + Redis."""


VARIANTS = 2
"""Texts per document: writers flip between them, so a text comes back (an ABA)."""


def version_text(doc: str, variant: int) -> str:
    """Text ``variant`` of ``doc`` (the name of the document is in every chunk)."""
    topics = [TOPICS[variant], TOPICS[(3 * variant + 1) % len(TOPICS)]]
    return "RECITAL " * variant + make_contract(doc, topics, 1)


def random_write(rng: random.Random) -> tuple[str, str, str | None]:
    """``(op, doc, text)``: an add or replace (text), or a delete (None); mostly of the
    first document, so that the writers collide."""
    doc = DOCS[0] if rng.random() < 0.8 else rng.choice(DOCS)
    if rng.random() < 0.2:
        return "delete", doc, None
    return "write", doc, version_text(doc, rng.randrange(VARIANTS))


def random_query(rng: random.Random) -> tuple[str, str, str]:
    """``(doc, query, mode)``: a query naming a document (only its chunks have the name)."""
    doc = DOCS[0] if rng.random() < 0.8 else rng.choice(DOCS)
    return doc, f"{doc} {rng.choice(TOPICS)} provisions", rng.choice(["segments", "chunks"])


def allowed_texts(
    log: Sequence[tuple[str, str | None]], start: int, end: int
) -> dict[str, set[str]]:
    """Each document's texts current at some point while ``log[start:end]`` was written:
    the one current at ``start`` and every one set after (``log``: ``(doc, text or None)``
    pointer changes in order)."""
    current: dict[str, str | None] = {}
    for doc, text in log[:start]:
        current[doc] = text
    out = {doc: {t} for doc, t in current.items() if t is not None}
    for doc, text in log[start:end]:
        if text is not None:
            out.setdefault(doc, set()).add(text)
    return out


def present_throughout(
    log: Sequence[tuple[str, str | None]], start: int, end: int, doc: str
) -> bool:
    """Whether ``doc`` was indexed while ``log[start:end]`` was written, and changed at
    most twice (a query runs its retrieval again after each change, up to three times)."""
    state = None
    for d, text in log[:start]:
        if d == doc:
            state = text
    changes = [text for d, text in log[start:end] if d == doc]
    return state is not None and None not in changes and len(changes) <= 2


def check_segments(found: list[Document], allowed: dict[str, set[str]]) -> list[str]:
    """Problems: segments that are not an exact slice of an allowed version."""
    problems = []
    for d in found:
        m = d.metadata
        texts = allowed.get(m["doc_id"], set())
        if not any(t[m["start_index"] : m["end_index"]] == d.page_content for t in texts):
            problems.append(
                f"{m['doc_id']}[{m['start_index']}:{m['end_index']}] is not a "
                "slice of a version current during the query"
            )
    return problems


# ---------------------------------------------------------------- in process: a scheduler


class Scheduler:
    """Runs threads one at a time, switching at :meth:`step` (called before each store
    call). As in probabilistic concurrency testing (PCT), each thread has a random
    priority and the parked thread of the highest one runs; after each step the running
    thread drops to the lowest priority with probability ``switch``, so a thread is held
    anywhere, for long, while others run (seeded: ``random.Random(seed)``). A thread that
    does not park within ``patience`` seconds (it waits for a lock a parked thread holds)
    is passed over until it parks."""

    def __init__(self, seed: int, switch: float = 0.15, patience: float = 0.1) -> None:
        self.rng = random.Random(seed)
        self.switch = switch
        self.patience = patience
        self.priority: dict[str, float] = {}
        self.cond = threading.Condition()
        self.parked: set[str] = set()
        self.done: set[str] = set()
        self.managed: set[int] = set()
        self.turn: str | None = None
        self.steps = 0

    def step(self) -> None:
        me = threading.current_thread()
        if me.ident not in self.managed:
            return
        with self.cond:
            self.parked.add(me.name)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.turn == me.name)
            self.turn = None

    def run(self, actors: dict[str, Callable[[], None]]) -> None:
        """Run the ``actors`` (name → function) to their end; re-raise the first error."""
        errors: list[BaseException] = []

        def body(fn: Callable[[], None]) -> None:
            with self.cond:
                self.managed.add(threading.get_ident())
            try:
                self.step()
                fn()
            except BaseException as exc:
                errors.append(exc)
            finally:
                with self.cond:
                    self.done.add(threading.current_thread().name)
                    self.cond.notify_all()

        threads = [
            threading.Thread(target=body, args=(fn,), name=name, daemon=True)
            for name, fn in actors.items()
        ]
        self.priority = {t.name: self.rng.random() for t in threads}
        for t in threads:
            t.start()
        with self.cond:
            self.cond.wait_for(lambda: len(self.parked | self.done) == len(threads), timeout=60)
            while len(self.done) < len(threads):
                if self.parked:
                    name = max(self.parked, key=self.priority.__getitem__)
                    if self.rng.random() < self.switch:
                        self.priority[name] = min(self.priority.values()) - 1
                    self.parked.discard(name)
                    self.turn = name
                    self.steps += 1
                    self.cond.notify_all()
                    # until it parks again or ends (or waits on a lock: patience)
                    self.cond.wait_for(
                        lambda n=name: n in self.parked or n in self.done, timeout=self.patience
                    )
                else:
                    self.cond.wait(timeout=self.patience)
        for t in threads:
            t.join(timeout=60)
        if errors:
            raise errors[0]


class LoggedStore(BaseStore[str, bytes]):
    """A shared in-memory record store (another process's view, as Redis would give):
    every call is a scheduler step, and every pointer change is logged as ``(doc_id,
    text)``."""

    def __init__(self, scheduler: Scheduler) -> None:
        self.inner = InMemoryByteStore()
        self.scheduler = scheduler
        self.lock = threading.Lock()
        self.log: list[tuple[str, str | None]] = []
        self.texts: dict[str, str] = {}  # version -> text
        self.docs: dict[str, str] = {}  # pointer key -> doc id

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        self.scheduler.step()
        with self.lock:
            return self.inner.mget(keys)

    def mset(self, pairs: Sequence[tuple[str, bytes]]) -> None:
        self.scheduler.step()
        with self.lock:
            for key, value in pairs:
                if key.startswith("body/"):
                    self.texts[key.split("/")[1]] = DocBody.from_bytes(value).text
                elif key.startswith("doc/"):
                    record = Pointer.from_bytes(value)
                    self.docs[key] = record.doc_id
                    self.log.append((record.doc_id, self.texts[record.version]))
            self.inner.mset(pairs)

    def mdelete(self, keys: Sequence[str]) -> None:
        self.scheduler.step()
        with self.lock:
            held = set(self.inner.yield_keys())
            self.log += [(self.docs[k], None) for k in keys if k.startswith("doc/") and k in held]
            self.inner.mdelete(keys)

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        self.scheduler.step()
        with self.lock:
            return iter(list(self.inner.yield_keys(prefix=prefix)))


class ServerLikeVectorStore(InMemoryVectorStore):
    """An in-memory vector store shared by the workers as a server is: one call at a
    time, each a scheduler step."""

    def __init__(self, scheduler: Scheduler) -> None:
        super().__init__(HashingEmbeddings())
        self.scheduler = scheduler
        self.lock = threading.Lock()

    def add_documents(self, documents: list[Document], **kwargs: Any) -> list[str]:
        self.scheduler.step()
        with self.lock:
            return super().add_documents(documents, **kwargs)

    def delete(self, ids: Sequence[str] | None = None, **kwargs: Any) -> None:
        self.scheduler.step()
        with self.lock:
            super().delete(ids, **kwargs)

    def similarity_search_with_score(self, query: str, k: int = 4, **kwargs: Any) -> Any:
        self.scheduler.step()
        with self.lock:
            return super().similarity_search_with_score(query, k, **kwargs)


def worker(vs: ServerLikeVectorStore, store: LoggedStore) -> RSERetriever:
    return RSERetriever(vectorstore=vs, record_store=store, k=3, chunk_size=300)


def assert_exactly_current(workers: Sequence[RSERetriever], texts: dict[str, str]) -> None:
    """Every store holds exactly the current versions (BM25 and leads of every worker)."""
    r = workers[0]
    current = {p.doc_id: p for p in r.index.records.pointers(list(DOCS)) if p is not None}
    want = sorted((p.doc_id, p.version) for p in current.values() for _ in p.spans)
    stored = sorted((m["doc_id"], m["doc_version"]) for m in stored_metadata(r.vectorstore))
    assert stored == want, "orphan or missing chunks in the vector store"
    keys = list(r.record_store.yield_keys())
    for prefix in ("doc/", "body/", "ver/"):
        assert len([k for k in keys if k.startswith(prefix)]) == len(current), prefix
    for w in workers:
        w.invoke("payment")  # catches up with the other worker's writes
        assert sorted(tuple(k.split("\x1f")[:2]) for k in list(w.index.lexical.keys())) == want
        assert sorted(d.id for d in w.router.retriever.get(list(DOCS))) == sorted(current)
        got = {d.id: d.page_content for d in w.get(list(DOCS))}
        assert got == {d: texts[p.version] for d, p in current.items()}


def interleaving(seed: int) -> dict[str, int]:
    """One random interleaving; returns its counts (steps, queries, empty results)."""
    scheduler = Scheduler(seed)
    store, vs = LoggedStore(scheduler), ServerLikeVectorStore(scheduler)
    workers = [worker(vs, store), worker(vs, store)]
    workers[0].add_documents([Document(version_text(d, 0), id=d) for d in DOCS])
    rng = random.Random(seed)
    plans = [[random_write(rng) for _ in range(OPS)] for _ in range(2)]
    queries = [[random_query(rng) for _ in range(OPS)] for _ in range(2)]
    problems: list[str] = []
    counts = {"queries": 0, "empty": 0}

    def writer(w: int) -> Callable[[], None]:
        def run() -> None:
            for op, doc, text in plans[w]:
                if op == "delete":
                    workers[w].delete([doc])
                else:
                    workers[w].add_documents([Document(text, id=doc)])

        return run

    def reader(w: int) -> Callable[[], None]:
        def run() -> None:
            for doc, query, mode in queries[w]:
                start = len(store.log)
                found = workers[w].invoke(query, mode=mode)
                end = len(store.log)
                problems.extend(check_segments(found, allowed_texts(store.log, start, end)))
                if present_throughout(store.log, start, end, doc) and all(
                    d.metadata["doc_id"] != doc for d in found
                ):
                    problems.append(f"{query!r} missed {doc}, indexed all along")
                counts["queries"] += 1
                counts["empty"] += not found

        return run

    scheduler.run(
        {"writer0": writer(0), "writer1": writer(1), "reader0": reader(0), "reader1": reader(1)}
    )
    assert not problems, f"seed {seed}: {problems[:3]}"
    scheduler.managed.clear()  # the checks below run unscheduled
    workers[0].vacuum()
    assert_exactly_current(workers, store.texts)
    return {"steps": scheduler.steps, **counts}


def test_random_interleavings_in_memory() -> None:
    started = time.perf_counter()
    totals = {"steps": 0, "queries": 0, "empty": 0}
    for seed in SEEDS:
        for key, n in interleaving(seed).items():
            totals[key] += n
    print(f"{len(SEEDS)} interleavings, {totals} in {time.perf_counter() - started:.1f} s")
    assert totals["queries"] == len(SEEDS) * 2 * OPS
    assert totals["empty"] < totals["queries"] // 2  # most queries find something


# ---------------------------------------------------------------- Chroma + Redis: processes

PROCESS = """
import json, random, sys, time
sys.path[:0] = [f"{sys.argv[1]}/../{d}" for d in ("support", "unit", "integration", ".")]
import redis
from langchain_core.documents import Document
from engines import build
from test_interleavings import (PROCESS_OPS, allowed_chroma_texts, check_segments,
                                random_query, random_write)

cfg, role, seed = json.loads(sys.argv[2]), sys.argv[3], int(sys.argv[4])
r = build(cfg, k=3, chunk_size=300)
log = redis.Redis(host="127.0.0.1", port=cfg["redis"])
key = cfg["name"] + ":oplog"
rng = random.Random(seed)
print("ready", flush=True)
sys.stdin.readline()
problems, queries = [], 0
if role.startswith("writer"):
    for n in range(PROCESS_OPS):
        op, doc, text = random_write(rng)
        log.rpush(key, json.dumps(["begin", doc, text, f"{role}/{n}"]))
        if op == "delete":
            r.delete([doc])
        else:
            r.add_documents([Document(text, id=doc)])
        log.rpush(key, json.dumps(["end", doc, text, f"{role}/{n}"]))
        time.sleep(rng.random() * 0.02)
else:
    deadline = time.time() + 90
    while log.llen(key) < int(sys.argv[5]) and time.time() < deadline:  # writers at work
        start = log.llen(key)
        doc, query, mode = random_query(rng)
        try:
            found = r.invoke(query, mode=mode)
        except Exception as exc:
            problems.append(f"{query!r}: {type(exc).__name__}: {exc}")
            found = []
        entries = [json.loads(e) for e in log.lrange(key, 0, -1)]
        problems += check_segments(found, allowed_chroma_texts(entries, start))
        queries += 1
print(json.dumps({"problems": problems[:5], "queries": queries}), flush=True)
"""


def allowed_chroma_texts(entries: list[list[Any]], start: int) -> dict[str, set[str]]:
    """Each document's texts that may have been current during a query that began when
    the log had ``start`` entries and ended after ``entries`` (``["begin"|"end", doc,
    text or None, operation id]``): the text of any write that began before the end,
    unless a later operation on the document began after it ended and itself ended before
    the query began (every write makes a new version, so that one replaced it)."""
    began: dict[str, tuple[int, str, str | None]] = {}
    ended: dict[str, int] = {}
    for i, (what, doc, text, op) in enumerate(entries):
        if what == "begin":
            began[op] = (i, doc, text)
        else:
            ended[op] = i
    out: dict[str, set[str]] = {}
    for op, (_, doc, text) in began.items():
        if text is None:
            continue
        end = ended.get(op)
        superseded = end is not None and any(
            d == doc and b > end and ended.get(o, start) < start for o, (b, d, _) in began.items()
        )
        if not superseded:
            out.setdefault(doc, set()).add(text)
    return out


@pytest.fixture(scope="module")
def chroma_redis(tmp_path_factory) -> Iterator[dict[str, Any]]:
    from engines import servers_for

    with servers_for("chroma_redis", tmp_path_factory.mktemp("interleavings")) as cfg:
        yield cfg


@pytest.mark.integration
def test_random_interleavings_over_chroma_and_redis(chroma_redis) -> None:
    from engines import build, drop, new_index, stored_versions

    started = time.perf_counter()
    cfg = new_index(chroma_redis)
    r = build(cfg, k=3, chunk_size=300)
    r.add_documents([Document(version_text(d, 0), id=d) for d in DOCS])
    texts = {d: version_text(d, 0) for d in DOCS}
    import redis

    oplog = redis.Redis(host="127.0.0.1", port=cfg["redis"])
    for d, text in texts.items():
        oplog.rpush(
            cfg["name"] + ":oplog",
            json.dumps(["begin", d, text, d]),
            json.dumps(["end", d, text, d]),
        )
    entries = 2 * len(texts) + 2 * 2 * PROCESS_OPS  # the log once both writers are done
    roles = [("writer0", 1), ("writer1", 2), ("reader", 3)]
    procs = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                PROCESS,
                str(TESTS),
                json.dumps(cfg),
                role,
                str(seed),
                str(entries),
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for role, seed in roles
    ]
    try:
        for p in procs:
            assert p.stdout is not None and p.stdout.readline().strip() == "ready"
        for p in procs:
            assert p.stdin is not None
            p.stdin.write("go\n")
            p.stdin.flush()
        replies = []
        for p in procs:
            out, _ = p.communicate(timeout=120)
            assert p.returncode == 0
            replies.append(json.loads(out.splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
    for reply in replies:
        assert reply["problems"] == []
    assert replies[-1]["queries"] > 0

    r.vacuum()
    r.invoke("payment")  # the in-process BM25 catches up with the writers
    current = {p.doc_id: p for p in r.index.records.pointers(list(DOCS)) if p is not None}
    want = sorted((p.doc_id, p.version) for p in current.values() for _ in p.spans)
    for where, chunks in stored_versions(r).items():
        assert chunks == want, f"orphan or missing chunks in the {where}"
    keys = list(r.record_store.yield_keys())
    for prefix in ("doc/", "body/", "ver/"):
        assert len([k for k in keys if k.startswith(prefix)]) == len(current), prefix
    for d in r.get(list(DOCS)):
        assert d.page_content in {version_text(d.id, v) for v in range(VARIANTS)}
    print(
        f"Chroma + Redis: {replies[-1]['queries']} queries during "
        f"{2 * PROCESS_OPS} writes in {time.perf_counter() - started:.1f} s"
    )
    oplog.delete(cfg["name"] + ":oplog")
    drop(cfg, r)
