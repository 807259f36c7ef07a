"""Query-path measurements at one corpus size (run in a fresh process per size).

Builds ``RSERetriever`` over a FAISS store (and an ``InMemoryVectorStore`` where
feasible), LangChain's ``EnsembleRetriever(BM25Retriever, FAISS retriever)`` over the
same chunks and the same embedder, and times ``invoke`` on each; at the profile
size it also breaks our query path into stages.
"""

from __future__ import annotations

import contextlib
import cProfile
import ctypes
import functools
import gc
import inspect
import pstats
import resource
import time
import warnings
from collections import defaultdict
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from unittest import mock

import numpy as np
import psutil
from langchain_classic.retrievers import EnsembleRetriever
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore
from speed_corpus import CHUNK_SIZE, DIM, Corpus, load_sentences
from speed_writes import WriteTiming, time_writes

import langchain_rse.bm25
import langchain_rse.lexical
import langchain_rse.pipeline
import langchain_rse.search
from langchain_rse import RSERetriever
from langchain_rse.enrichment import index_text
from langchain_rse.record_store import RecordStore
from langchain_rse.stores.chunk_docstore import ChunkDocstore
from langchain_rse.stores.faiss import LocalFAISS

with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # langchain-community's sunset notice
    from langchain_community.docstore.in_memory import InMemoryDocstore
    from langchain_community.retrievers import BM25Retriever
    from langchain_community.vectorstores import FAISS


@dataclass(frozen=True)
class Settings:
    """What one size's run measures."""

    queries: int = 50
    warmup: int = 3
    budget_s: float = 60.0  # per configuration; at least `min_queries` are always timed
    min_queries: int = 5
    ensemble_max: int = 300_000
    inmemory_max: int = 100_000
    faiss_threads: int = 1
    profile: bool = False
    write_repeats: int = 10


@dataclass
class Latency:
    """Per-query wall-clock and CPU times of one configuration."""

    family: str  # "ours" | "ensemble"
    mode: str  # "segments" | "chunks" | "fused chunks"
    store: str  # "FAISS" | "InMemory"
    wall_ms: list[float]
    cpu_ms: list[float]
    empty: int = 0  # queries that returned nothing

    @property
    def median(self) -> float:
        return float(np.median(self.wall_ms))

    @property
    def p95(self) -> float:
        return float(np.percentile(self.wall_ms, 95))

    @property
    def cpu_median(self) -> float:
        return float(np.median(self.cpu_ms))


@dataclass
class BuildStats:
    """Index build (FAISS-backed ``RSERetriever``) and its resident memory."""

    chunks: int
    documents: int
    add_s: float  # add_documents, wall clock, embedding included
    embed_s: float  # time inside the (lookup) embedder: excluded from throughput
    vectorstore_s: float  # FAISS add_documents calls, embedding excluded
    first_query_s: float  # the first invoke (nothing is built lazily any more)
    rss_add: int  # RSS delta after add_documents
    rss_total: int  # RSS delta after the first query
    faiss_bytes: int
    chunk_store_bytes: int
    embed_misses: int
    rss_base: int  # process RSS before the build
    peak_build: int  # process peak RSS after the build and the lazy BM25 build
    ivf_s: float | None = None  # building the FAISS-IVF copy (train + add)
    bm25_retriever_s: float | None = None  # LangChain BM25Retriever.from_documents
    bm25_retriever_rss: int | None = None
    lexical_bytes: int = 0  # our BM25 index's arrays
    lexical_segments: int = 0
    half_bytes: int = 0  # LocalFAISS's half-precision copy of the vectors

    @property
    def chunks_per_s(self) -> float:
        """Build throughput without embedding, lazy BM25 build included."""
        return self.chunks / (self.add_s - self.embed_s + self.first_query_s)


@dataclass
class SizeResult:
    """Everything measured at one size."""

    size: int
    build: BuildStats
    latencies: list[Latency] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    # store -> [(stage, CPU ms/query)]
    breakdown: dict[str, list[tuple[str, float]]] = field(default_factory=dict)
    profile_rows: list[tuple[float, float, int, str]] = field(default_factory=list)  # FAISS-IVF
    peak_rss: int = 0  # of the whole worker process
    config: str = ""  # the retriever's query-path settings
    writes: WriteTiming | None = None
    read_ms: float = 0.0  # one read of the flat index's vectors (see `read_floor`)
    half_read_ms: float = 0.0  # one read of their half-precision copy
    exact_same: tuple[int, int] | None = None  # (queries with FAISS's exact hits, queries)


def rss() -> int:
    """Resident memory in use: after a garbage collection and glibc's ``malloc_trim``,
    which hands freed heap pages back to the OS (else RSS also counts what the build
    freed but the allocator kept)."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: no trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return psutil.Process().memory_info().rss


def time_queries(
    search: Callable[[str], list[Document]], queries: list[str], settings: Settings
) -> tuple[list[float], list[float], int]:
    """Warm up, then time ``search`` per query until done or over the time budget."""
    for q in queries[: settings.warmup]:
        search(q)
    wall: list[float] = []
    cpu: list[float] = []
    empty = 0
    started = time.perf_counter()
    for q in queries[settings.warmup :]:
        if len(wall) >= settings.min_queries and time.perf_counter() - started > settings.budget_s:
            break
        w, c = time.perf_counter(), time.process_time()
        docs = search(q)
        cpu.append((time.process_time() - c) * 1e3)
        wall.append((time.perf_counter() - w) * 1e3)
        empty += not docs
    return wall, cpu, empty


def new_faiss(corpus: Corpus) -> LocalFAISS:
    """The retriever's store, as the library's default builds it: exact FAISS
    (``LocalFAISS``: LangChain's wrapper with a linear-time delete and a half-precision
    first scan) with a ``ChunkDocstore``
    (each chunk's metadata, no text: the record store holds the texts)."""
    import faiss

    return LocalFAISS(
        embedding_function=corpus.embeddings,
        index=faiss.IndexFlatL2(DIM),
        docstore=ChunkDocstore(),
        index_to_docstore_id={},
    )


def with_texts(store: FAISS, docs: list[Document]) -> FAISS:
    """``store``'s FAISS index (shared, not copied) under LangChain's ``InMemoryDocstore``
    holding each chunk's text: the store a LangChain user builds for the ensemble."""
    return FAISS(
        embedding_function=store.embedding_function,
        index=store.index,
        docstore=InMemoryDocstore({d.id: d for d in docs}),
        index_to_docstore_id=store.index_to_docstore_id,
    )


def ivf_copy(store: FAISS, nprobe: int = 8) -> FAISS:
    """The same vectors in an approximate ``IndexIVFFlat`` (nlist = sqrt(N)), same docstore.

    Trained on 40 vectors per list, taken from the flat index without copying it.
    """
    import faiss

    n = store.index.ntotal
    vectors = faiss.rev_swig_ptr(store.index.get_xb(), n * DIM).reshape(n, DIM)
    nlist = max(1, int(n**0.5))
    index = faiss.IndexIVFFlat(faiss.IndexFlatL2(DIM), DIM, nlist)
    index.cp.niter = 10
    index.train(vectors[:: max(1, n // (40 * nlist))])
    index.add(vectors)
    index.nprobe = nprobe
    return FAISS(
        embedding_function=store.embedding_function,
        index=index,
        docstore=store.docstore,
        index_to_docstore_id=store.index_to_docstore_id,
    )


def build_rse(corpus: Corpus, **settings: Any) -> tuple[RSERetriever, LocalFAISS, BuildStats]:
    """Index the corpus into a FAISS-backed ``RSERetriever`` (its defaults, or
    ``settings``), timing and sizing it.

    Documents arrive in batches of 100 (one ``add_documents`` call each); only the
    calls are timed, not the generation of the synthetic text between them. The BM25
    index's background merges are waited for (untimed) before memory and queries are
    measured (before session 12 they could still run during the first queries at 1M).
    """
    store = new_faiss(corpus)
    retriever = RSERetriever(
        vectorstore=store, chunk_size=CHUNK_SIZE, show_progress=False, **settings
    )
    vs_seconds = 0.0
    add = store.add_documents

    def timed_add(documents: list[Document], **kwargs: Any) -> list[str]:
        nonlocal vs_seconds
        start = time.perf_counter()
        try:
            return add(documents, **kwargs)
        finally:
            vs_seconds += time.perf_counter() - start

    store.add_documents = timed_add  # type: ignore[method-assign]
    emb = corpus.embeddings
    emb.seconds, emb.misses = 0.0, 0
    before = rss()
    add_s = 0.0
    for batch in corpus.batches():
        start = time.perf_counter()
        retriever.add_documents(batch)
        add_s += time.perf_counter() - start
    del batch
    retriever._lexical.refresh()  # background merges settle: none runs beside the timed queries
    emb.chunks = {}
    embed_s = emb.seconds
    rss_add = rss() - before
    del store.add_documents
    start = time.perf_counter()
    retriever.invoke(corpus.queries[0])
    first_query_s = time.perf_counter() - start
    rss_total = rss() - before
    chunk_store_bytes = sum(len(v) for v in retriever.docstore.store.values())  # type: ignore[attr-defined]
    stats = BuildStats(
        chunks=store.index.ntotal,
        documents=corpus.num_documents,
        add_s=add_s,
        embed_s=embed_s,
        vectorstore_s=vs_seconds - embed_s,
        first_query_s=first_query_s,
        rss_add=rss_add,
        rss_total=rss_total,
        faiss_bytes=store.index.ntotal * DIM * 4,
        chunk_store_bytes=chunk_store_bytes,
        embed_misses=emb.misses,
        rss_base=before,
        peak_build=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        lexical_bytes=retriever._lexical.nbytes,
        half_bytes=store._half.nbytes if store._half is not None else 0,
        lexical_segments=retriever._lexical.segments,
    )
    return retriever, store, stats


def describe(retriever: RSERetriever) -> str:
    """The retriever settings that shape the query path."""
    names = ["k", "mode", "fetch_k", "candidate_pool", "fusion", "preset", "relevance",
             "faiss_threads"]  # fmt: skip
    fields = [f"{n}={getattr(retriever, n)!r}" for n in names if hasattr(retriever, n)]
    p = retriever.params
    fields.append(
        f"RSE max segment/total/min value/penalty={p.max_segment_chunks}/{p.max_total_chunks}/"
        f"{p.min_segment_value}/{p.irrelevant_chunk_penalty}"
    )
    fields.append(f"enricher={type(retriever.enricher).__name__}")
    fields.append(f"reranker={type(retriever.reranker).__name__ if retriever.reranker else None}")
    return ", ".join(fields)


def read_floor(index: Any, repeats: int = 20) -> float:
    """Median wall ms of reading a flat index's vectors once (a numpy ``max`` over FAISS's
    own buffer, on one thread), or the codes of ``LocalFAISS``'s half-precision copy. A scan
    reads every vector, so on one thread it takes about this long at least; FAISS's float32
    scan took within 10% of it, either way, in session 16's runs. (FAISS's own two-thread
    search of one query was slower; a scan split in halves over both cores was faster alone,
    but not in the retriever, whose other core runs the BM25 search: ``RESULTS.md``,
    session 14.)"""
    import faiss

    if isinstance(index, faiss.IndexScalarQuantizer):  # two bytes a dimension
        vectors = faiss.rev_swig_ptr(index.codes.data(), index.codes.size()).view(np.uint16)
    else:
        vectors = faiss.rev_swig_ptr(index.get_xb(), index.ntotal * index.d)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        vectors.max()
        times.append((time.perf_counter() - start) * 1e3)
    return float(np.median(times))


def exact_same(store: Any, corpus: Corpus, queries: list[str], k: int) -> tuple[int, int]:
    """(queries for which ``LocalFAISS.search_vectors``, the retriever's scan of a
    half-precision copy, returned FAISS's exact hits, distances and order; queries)."""
    same = 0
    for q in queries:
        vector = np.asarray([corpus.embeddings.embed_query(q)], dtype=np.float32)
        got, want = store.search_vectors(vector, k), store.index.search(vector, k)
        same += all(np.array_equal(a, b) for a, b in zip(got, want))
    return same, len(queries)


def cold_caches(retriever: RSERetriever) -> None:
    """Forget the record store's decoded pointers and bodies, so that each configuration's
    queries pay for reading the documents they return (before 2026-12-02, session 5, the
    stage breakdown ran the latency runs' queries again, with every body cached). From
    session 15 to 16 it also dropped the FAISS docstore's chunk keys, then cached per hit;
    since session 17 the docstore builds every position's key with the writes, and this
    leaves them."""
    records = retriever._records
    records._pointers.clear()
    records._bodies.clear()


@contextlib.contextmanager
def using_store(retriever: RSERetriever, vectorstore: Any) -> Iterator[None]:
    """Point the retriever at another store holding the same chunks (same ids, metadata)."""
    original = retriever.vectorstore
    retriever.__dict__["vectorstore"] = vectorstore  # a frozen field: for this benchmark only
    try:
        yield
    finally:
        retriever.__dict__["vectorstore"] = original


def chunk_documents(retriever: RSERetriever, store: FAISS) -> list[Document]:
    """The chunks our retriever wrote to the store (ids set), each with the text it was
    indexed with (context + chunk, rebuilt from the record store: the store has none)."""
    metas = []
    for chunk_id in store.index_to_docstore_id.values():
        doc = store.docstore.search(chunk_id)
        assert isinstance(doc, Document)
        metas.append((chunk_id, doc.metadata))
    doc_ids = list(dict.fromkeys(m["doc_id"] for _, m in metas))
    pointers = [p for p in retriever._records.pointers(doc_ids) if p is not None]
    bodies = {p.doc_id: b for p, b in zip(pointers, retriever._records.bodies(pointers))}
    docs = []
    for chunk_id, m in metas:
        body, i = bodies[m["doc_id"]], m["chunk_index"]
        text = index_text(body.contexts[i], body.text[m["start_index"] : m["end_index"]])
        docs.append(Document(id=chunk_id, page_content=text, metadata=m))
    return docs


def ensemble(bm25: BM25Retriever, store: Any, k: int) -> EnsembleRetriever:
    """LangChain's hybrid baseline: equal-weight RRF of BM25 and the vector store."""
    return EnsembleRetriever(
        retrievers=[bm25, store.as_retriever(search_kwargs={"k": k})], weights=[0.5, 0.5]
    )


# ---------------------------------------------------------------------- stage breakdown


class StageTimer:
    """Accumulates CPU time per named stage around patched functions.

    CPU time rather than wall time, so that the scheduler preempting this process on a
    shared machine is not charged to whichever stage happened to be running: the CPU time
    of the thread that runs the stage (``time.thread_time``; FAISS runs on one thread),
    since the query path runs the lexical branch in a worker thread beside the dense one
    (before 2026-12-02, session 6, it took the process's, which counts both threads).
    """

    def __init__(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)

    def wrap(self, name: str, fn: Callable[..., Any]) -> Callable[..., Any]:
        if inspect.isgeneratorfunction(fn):  # from its first step to its return

            @functools.wraps(fn)
            def timed_steps(*args: Any, **kwargs: Any) -> Any:
                start = time.thread_time()
                try:
                    return (yield from fn(*args, **kwargs))
                finally:
                    self.seconds[name] += time.thread_time() - start

            return timed_steps

        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.thread_time()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] += time.thread_time() - start

        return timed

    @contextlib.contextmanager
    def patched(self, targets: list[tuple[str, Any, str]]) -> Iterator[None]:
        """Patch ``owner.attr`` with a timed wrapper for each ``(stage, owner, attr)``."""
        with contextlib.ExitStack() as stack:
            for stage, owner, attr in targets:
                original = getattr(owner, attr)
                stack.enter_context(mock.patch.object(owner, attr, self.wrap(stage, original)))
            yield


def stage_targets(store: FAISS) -> list[tuple[str, Any, str]]:
    """(stage, owner, attribute) to time; indented stages are parts of the stage above.

    Patched where the query path looks them up at call time: the vector store's
    search method, the BM25 index class, and the pipeline's module functions.
    """
    return [
        ("dense search (SearchBranches.dense, k=fetch_k)", langchain_rse.search.SearchBranches,
         "dense"),
        ("  faiss index search", *_dense_search(store)),
        ("lexical search (BM25Index.ranked)", langchain_rse.lexical.BM25Index, "ranked"),
        ("  tokenize query", langchain_rse.lexical, "tokenize"),
        ("  BM25 scoring + top-k (IncrementalBM25.top)", langchain_rse.bm25.IncrementalBM25, "top"),
        ("fusion (pipeline.candidates: RRF + chunk keys)", langchain_rse.pipeline, "candidates"),
        ("pipeline (pipeline.run_pipeline: records, RSE, results)", langchain_rse.pipeline,
         "run_pipeline"),
        ("  record reads (pointers + bodies, JSON)", RecordStore, "pointers"),
        ("  record bodies", RecordStore, "bodies"),
        ("  RSE (pipeline.select: chunk_values + best_segments)", langchain_rse.pipeline, "select"),
        ("  results (pipeline.results: segment Documents)", langchain_rse.pipeline, "results"),
    ]  # fmt: skip


def _dense_search(store: FAISS) -> tuple[Any, str]:
    """Where the retriever's dense branch searches ``store``'s index: ``LocalFAISS``'s
    ``search_vectors`` (over a flat index: the half-precision copy, then the candidates'
    vectors), else FAISS's own ``search``."""
    if isinstance(store, LocalFAISS):
        return type(store), "search_vectors"
    return type(store.index), "search"


# What the untimed remainder of a stage is (keyed by the stage's first word).
REST = {
    "dense": "  rest: chunk keys and scores of the hits (ChunkDocstore.search_index), lock",
    "lexical": "  rest: keys of the hits, lock",
    "pipeline": "  rest: the sans-I/O generator, version check, relevance",
}


def stage_breakdown(
    retriever: RSERetriever, store: FAISS, corpus: Corpus, queries: list[str], cold: bool = True
) -> list[tuple[str, float]]:
    """Mean CPU ms per query of each stage of ``invoke`` (segments mode), the record and
    key caches cold at the start (``cold``), else as the previous queries left them."""
    if cold:
        cold_caches(retriever)
    timer = StageTimer()
    targets = stage_targets(store)
    emb = corpus.embeddings
    embed = 0.0
    with timer.patched(targets):
        start = time.process_time()
        for q in queries:
            retriever.invoke(q)
            embed_start = time.thread_time()
            emb.embed_query(q)  # the query lookup, timed again in CPU time
            embed += time.thread_time() - embed_start
        total = time.process_time() - start - embed

    s = timer.seconds
    rows: list[tuple[str, float]] = []
    parent, children, parts = "", 0.0, 0
    for name, _, _ in [*targets, ("", None, "")]:
        if not name.startswith(" ") and parts:  # close the previous top-level stage
            if parent.startswith("dense"):
                rows.append(("  embed_query (precomputed lookup)", embed))
                children += embed
            rows.append((REST[parent.split(" ")[0]], s[parent] - children))
        if not name:
            break
        rows.append((name, s[name]))
        if name.startswith(" "):
            children, parts = children + s[name], parts + 1
        else:
            parent, children, parts = name, 0.0, 0
    top = [name for name, _, _ in targets if not name.startswith(" ")]
    rows.append(
        (
            "other (invoke: callbacks, Runnable child runs, validation)",
            total - sum(s[t] for t in top),
        )
    )
    rows.append(("total invoke", total))
    if any(s[t] == 0 for t in top):
        missing = [t for t in top if s[t] == 0]
        raise RuntimeError(f"stages never called (the query path changed?): {missing}")
    return [(name, seconds / len(queries) * 1e3) for name, seconds in rows]


def profile_top(
    retriever: RSERetriever, queries: list[str], limit: int = 15
) -> list[tuple[float, float, int, str]]:
    """cProfile of ``invoke`` in CPU time: (own ms, cumulative ms, calls, function) per query."""
    cold_caches(retriever)
    profiler = cProfile.Profile(time.process_time)
    profiler.enable()
    for q in queries:
        retriever.invoke(q)
    profiler.disable()
    stats = pstats.Stats(profiler).stats  # type: ignore[attr-defined]
    n = len(queries)
    rows = []
    for (path, line, func), (_, calls, tottime, cumtime, _) in stats.items():
        short = path.split("site-packages/")[-1]
        if "/langchain_rse/" in short:  # the snapshot's temporary directory
            short = "langchain_rse/" + short.split("/langchain_rse/")[-1]
        where = f"{short}:{line}({func})" if line else func
        rows.append((tottime / n * 1e3, cumtime / n * 1e3, round(calls / n), where))
    rows.sort(reverse=True)
    return rows[:limit]


# ---------------------------------------------------------------------- one size

FLAT, IVF, MEMORY = "FAISS-Flat", "FAISS-IVF", "InMemory"
WARM = "again (caches warm)"
"""The breakdown of the same queries run a second time (record and key caches warm)."""
IN_TURN = "branches in turn"
"""The breakdown with ``parallel_branches=False``: no worker thread beside the dense search."""
SCANLESS = f"{FLAT}, hits memoized (no scan)"
"""A diagnostic breakdown: the exact store's dense search answered from a memo of its own
answers, so no scan streams the vectors through the CPU caches before the rest of the query
runs. Its own work against FAISS-Flat's is what that flush costs the code after the scan."""


@contextlib.contextmanager
def memoized_search() -> Iterator[None]:
    """``LocalFAISS.search_vectors`` answering each (vector, k) it answered before from a
    memo (see :data:`SCANLESS`)."""
    original = LocalFAISS.search_vectors
    memo: dict[tuple[bytes, int], Any] = {}

    def search_vectors(self: LocalFAISS, vector: np.ndarray, k: int) -> Any:
        key = (vector.tobytes(), k)
        if key not in memo:
            memo[key] = original(self, vector, k)
        return memo[key]

    with mock.patch.object(LocalFAISS, "search_vectors", search_vectors):
        yield


def run_size(size: int, settings: Settings) -> SizeResult:
    """All query-path measurements at ``size`` chunks (call in a fresh process)."""
    import faiss

    if settings.faiss_threads:  # else FAISS's default
        faiss.omp_set_num_threads(settings.faiss_threads)
    log = functools.partial(_log, size)
    corpus = Corpus(size, settings.queries + settings.warmup, load_sentences())
    queries = corpus.queries
    log(f"{corpus.num_documents:,} documents, {corpus.num_chunks:,} chunks; building")

    retriever, store, build = build_rse(corpus)
    log(f"RSERetriever built in {build.add_s:.1f} s (+{build.first_query_s:.1f} s first query)")
    if build.embed_misses:
        raise RuntimeError(f"{build.embed_misses} chunk texts had no precomputed vector")
    result = SizeResult(size, build, config=describe(retriever))
    import langchain_rse

    log(f"langchain_rse from {Path(langchain_rse.__file__).parent}")

    def measure(family: str, mode: str, store_name: str, search: Callable[[str], Any]) -> None:
        wall, cpu, empty = time_queries(search, queries, settings)
        result.latencies.append(Latency(family, mode, store_name, wall, cpu, empty))
        log(f"{family} {mode} {store_name}: median {np.median(wall):.2f} ms over {len(wall)}")

    def measure_ours(store_name: str, vectorstore: Any) -> None:
        with using_store(retriever, vectorstore):
            cold_caches(retriever)
            measure("ours", "segments", store_name, retriever.invoke)
            cold_caches(retriever)
            measure("ours", "chunks", store_name, lambda q: retriever.invoke(q, mode="chunks"))

    measure_ours(FLAT, store)
    result.read_ms = read_floor(store.index)
    if store._half is not None:
        result.half_read_ms = read_floor(store._half.index)
    result.exact_same = exact_same(store, corpus, queries, retriever.fetch_k)
    log(
        f"one read of the flat index's vectors: {result.read_ms:.2f} ms (of the half-precision "
        f"copy {result.half_read_ms:.2f} ms); FAISS's exact hits from the half-precision scan "
        f"for {result.exact_same[0]} of {result.exact_same[1]} queries"
    )
    start = time.perf_counter()
    ivf = ivf_copy(store)
    build.ivf_s = time.perf_counter() - start
    log(f"FAISS-IVF copy built in {build.ivf_s:.1f} s")
    measure_ours(IVF, ivf)

    if settings.profile:
        timed = queries[settings.warmup :]
        for name, vectorstore in ((FLAT, store), (IVF, ivf)):
            with using_store(retriever, vectorstore):
                result.breakdown[name] = stage_breakdown(retriever, vectorstore, corpus, timed)
                # The same queries again: what a service whose caches hold them pays.
                result.breakdown[f"{name} {WARM}"] = stage_breakdown(
                    retriever, vectorstore, corpus, timed, cold=False
                )
                if "parallel_branches" in type(retriever).model_fields:  # since session 22
                    retriever.parallel_branches = False
                    try:
                        result.breakdown[f"{name}, {IN_TURN}"] = stage_breakdown(
                            retriever, vectorstore, corpus, timed
                        )
                    finally:
                        retriever.parallel_branches = True
        if isinstance(store, LocalFAISS):
            with using_store(retriever, store), memoized_search():
                for q in timed:  # fills the memo
                    retriever.invoke(q)
                result.breakdown[SCANLESS] = stage_breakdown(retriever, store, corpus, timed)
        with using_store(retriever, ivf):  # where the library's own costs show
            result.profile_rows = profile_top(retriever, timed)

    if size <= settings.ensemble_max:
        docs = chunk_documents(retriever, store)
        before = rss()
        start = time.perf_counter()
        bm25 = BM25Retriever.from_documents(docs, k=retriever.fetch_k)
        build.bm25_retriever_s = time.perf_counter() - start
        build.bm25_retriever_rss = rss() - before
        log(f"BM25Retriever built in {build.bm25_retriever_s:.1f} s")
        k = retriever.fetch_k
        flat_texts, ivf_texts = with_texts(store, docs), with_texts(ivf, docs)
        measure("ensemble", "fused chunks", FLAT, ensemble(bm25, flat_texts, k).invoke)
        measure("ensemble", "fused chunks", IVF, ensemble(bm25, ivf_texts, k).invoke)
        del flat_texts, ivf_texts
    else:
        bm25 = None
        result.skipped.append(
            f"N={size:,}: LangChain EnsembleRetriever skipped (N > --ensemble-max "
            f"{settings.ensemble_max:,}: rank_bm25 keeps a Counter per chunk and scores every "
            "chunk in Python per query token)"
        )

    if size <= settings.inmemory_max:
        docs = chunk_documents(retriever, store)
        memory_store = InMemoryVectorStore(corpus.embeddings)
        corpus.load_all_vectors()
        memory_store.add_documents(docs, ids=[d.id for d in docs])
        corpus.embeddings.chunks = {}
        log("InMemoryVectorStore filled")
        measure_ours(MEMORY, memory_store)
        if bm25 is not None:
            k = retriever.fetch_k
            measure("ensemble", "fused chunks", MEMORY, ensemble(bm25, memory_store, k).invoke)
    else:
        result.skipped.append(
            f"N={size:,}: InMemoryVectorStore skipped (N > --inmemory-max "
            f"{settings.inmemory_max:,}; it keeps vectors as Python float lists, ~12 KB/chunk, "
            "and rebuilds a numpy matrix from them on every query)"
        )
    if settings.write_repeats:
        with using_store(retriever, store):
            result.writes = time_writes(retriever, store, corpus, settings.write_repeats)
        w = result.writes
        log(f"add one document + query: median {np.median(w.add_seen_ms):.1f} ms; delete + "
            f"query {np.median(w.delete_gone_ms):.1f} ms")  # fmt: skip
    result.peak_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    return result


def _log(size: int, message: str) -> None:
    import sys

    print(f"[{time.strftime('%H:%M:%S')} N={size:,}] {message}", file=sys.stderr, flush=True)
