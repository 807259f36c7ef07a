"""Query latency and throughput of the bundled model on a machine whose cores are busy.

Issue 47.2: with every core busy, the bundled model's OpenMP threads wait for each other
and one query took ~1.7 s. This starts one bounded burner process per core (a numpy BLAS
matrix-product loop, as other work on a shared server), then measures, for the current
thread setting (``new``: ``LocalEmbeddings()``, one thread per query) and the old one
(``old``: ``LocalEmbeddings(num_threads=<cores>)``, OpenMP's default of every core):

* ``embed_query`` latency, p50 / p95;
* ``invoke`` latency over ~5k chunks (the bundled sample documents repeated), p50 / p95;
* queries per second of 1 and of 4 worker processes querying the saved index at once.

Targets: p50 under 50 ms for one query, and 4 workers serving at least 1.8x the queries
per second of one. The corpus's document vectors come from the bundled model once and are
cached in ``benchmarks/.cache/`` (the copies of a chunk share its vector); query vectors are
always computed, since they are what is measured.

    python benchmarks/bench_busy.py            # ~5k chunks, 40 queries, 10 s per throughput run
    python benchmarks/bench_busy.py --quick    # ~1k chunks, 6 queries, 3 s: a smoke run
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import re
import statistics
import sys
import time
from pathlib import Path

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from langchain_rse import RSERetriever  # noqa: E402
from langchain_rse.embeddings import LocalEmbeddings  # noqa: E402
from langchain_rse.persistence import MANIFEST  # noqa: E402
from langchain_rse.sample_data import load_sample_documents  # noqa: E402

CACHE = Path(__file__).resolve().parent / ".cache"
COPY = re.compile(r" \(copy \d+\)")
QUERIES = [
    "How much notice does the customer need to terminate for convenience?",
    "Which law governs the agreement?",
    "What happens if the service is unavailable?",
    "How many vacation days do employees get?",
    "What was the root cause of the incident?",
    "Who approves expense reports?",
    "What are the payment terms?",
    "How long did the outage last?",
    "Can employees work remotely?",
    "What are the confidentiality obligations?",
]
CORES = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def model(setting: str) -> LocalEmbeddings:
    """``new``: the default thread choice; ``old``: every core, as before the change."""
    return LocalEmbeddings() if setting == "new" else LocalEmbeddings(num_threads=CORES)


# ---------------------------------------------------------------- busy cores


def _burn(deadline: float) -> None:
    a = np.random.default_rng(0).random((400, 400))
    while time.time() < deadline:  # bounded: stops by itself if the benchmark dies
        a = a @ a
        a /= np.abs(a).max()


def start_burners(n: int, seconds: float) -> list[mp.Process]:
    """``n`` single-threaded BLAS matrix-product loops (one per core), for ``seconds``."""
    os.environ["OPENBLAS_NUM_THREADS"] = os.environ["OMP_NUM_THREADS"] = "1"  # for the children
    try:
        procs = [
            mp.get_context("spawn").Process(
                target=_burn, args=(time.time() + seconds,), daemon=True
            )
            for _ in range(n)
        ]
        for p in procs:
            p.start()
    finally:
        del os.environ["OPENBLAS_NUM_THREADS"], os.environ["OMP_NUM_THREADS"]
    time.sleep(1.0)  # let them get going
    return procs


def stop(procs: list[mp.Process]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        p.join()


# ---------------------------------------------------------------- the index


class CopyVectors(Embeddings):
    """Document vectors from the bundled model, one per distinct chunk text with the copy
    number taken out of its header, cached in a file; queries embedded by ``query_model``."""

    def __init__(self, query_model: Embeddings, path: Path) -> None:
        self.query_model, self.path = query_model, path
        self.vectors: dict[str, list[float]] = (
            json.loads(path.read_text()) if path.is_file() else {}
        )

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        keys = [COPY.sub("", t) for t in texts]
        missing = sorted({k for k in keys if k not in self.vectors})
        if missing:
            self.vectors.update(zip(missing, LocalEmbeddings().embed_documents(missing)))
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.write_text(json.dumps(self.vectors))
        return [self.vectors[k] for k in keys]

    def embed_query(self, text: str) -> list[float]:
        return self.query_model.embed_query(text)


def build_index(chunks: int) -> Path:
    """The sample documents repeated to about ``chunks`` chunks, saved (once) to the cache."""
    path = CACHE / f"busy_index_{chunks}"
    if (path / MANIFEST).is_file():
        return path
    base = load_sample_documents()
    per_copy = len(
        RSERetriever.from_documents(
            base,
            embedding=CopyVectors(model("new"), CACHE / "busy_vectors.json"),
            show_progress=False,
        ).index.lexical
    )
    docs = [
        Document(
            d.page_content,
            id=f"{d.metadata['source']}#{i}",
            metadata={**d.metadata, "title": f"{d.metadata['title']} (copy {i})"},
        )
        for i in range(max(1, round(chunks / per_copy)))
        for d in base
    ]
    r = RSERetriever.from_documents(
        docs, embedding=CopyVectors(model("new"), CACHE / "busy_vectors.json"), show_progress=False
    )
    r.save(path)
    print(f"index: {len(r.index.lexical):,} chunks in {len(docs)} documents, saved to {path}")
    return path


# ---------------------------------------------------------------- measurements


def percentiles(ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=20, method="inclusive") if len(ms) > 1 else ms * 19
    return f"p50 {statistics.median(ms):8.1f} ms   p95 {q[18]:8.1f} ms"


def latencies(fn, n: int) -> list[float]:  # type: ignore[no-untyped-def]
    fn(QUERIES[0])  # warm up (model load, caches)
    out = []
    for i in range(n):
        t = time.perf_counter()
        fn(QUERIES[i % len(QUERIES)])
        out.append((time.perf_counter() - t) * 1000)
    return out


def _worker(path: str, setting: str, start: mp.Event, seconds: float, out: mp.Queue) -> None:  # type: ignore[type-arg]
    r = RSERetriever.load(path, embedding=model(setting))
    r.invoke(QUERIES[0])  # warm up
    out.put("ready")
    start.wait()
    done, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        r.invoke(QUERIES[done % len(QUERIES)])
        done += 1
    out.put(done)


def throughput(path: Path, setting: str, workers: int, seconds: float) -> float:
    """Queries per second of ``workers`` processes invoking the saved index at once."""
    ctx = mp.get_context("spawn")
    start, out = ctx.Event(), ctx.Queue()
    procs = [
        ctx.Process(target=_worker, args=(str(path), setting, start, seconds, out))
        for _ in range(workers)
    ]
    for p in procs:
        p.start()
    for _ in procs:  # all loaded and warmed up
        out.get(timeout=600)
    start.set()
    total = sum(out.get(timeout=seconds + 600) for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="~1k chunks, 6 queries, 3 s")
    parser.add_argument("--chunks", type=int, help="index size (default 5000; 1000 with --quick)")
    parser.add_argument("--queries", type=int, help="queries timed per setting (default 40)")
    parser.add_argument("--seconds", type=float, help="per throughput run (default 10)")
    parser.add_argument("--settings", default="new,old", help="thread settings to compare")
    parser.add_argument(
        "--burners", type=int, default=CORES, help="busy processes (default: cores)"
    )
    args = parser.parse_args()
    chunks = args.chunks or (1000 if args.quick else 5000)
    n = args.queries or (6 if args.quick else 40)
    seconds = args.seconds or (3.0 if args.quick else 10.0)
    settings = args.settings.split(",")

    path = build_index(chunks)  # on an idle machine: the burners start after it
    print(
        f"{CORES} core(s), {args.burners} burner process(es); settings: new = "
        f"LocalEmbeddings() (1 thread per query), old = num_threads={CORES}"
    )
    burners = start_burners(args.burners, 3600)  # stopped at the end; an hour at most
    try:
        for setting in settings:
            emb = model(setting)
            r = RSERetriever.load(path, embedding=emb)
            print(f"[{setting}] embed_query       {percentiles(latencies(emb.embed_query, n))}")
            print(
                f"[{setting}] invoke ({len(r.index.lexical):,} chunks) "
                f"{percentiles(latencies(r.invoke, n))}"
            )
            one = throughput(path, setting, 1, seconds)
            four = throughput(path, setting, 4, seconds)
            print(
                f"[{setting}] invoke, queries/s: 1 worker {one:7.1f}   4 workers {four:7.1f}"
                f"   ratio {four / one:4.2f}x"
            )
    finally:
        stop(burners)


if __name__ == "__main__":
    main()
