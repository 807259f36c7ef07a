"""Load test: N concurrent clients querying one ``RSERetriever``, with and without a writer.

Clients are threads (``ThreadPoolExecutor``, ``retriever.invoke``) or asyncio tasks
(``retriever.ainvoke``); each runs queries back to back for a fixed time. A second pass runs
the same while a writer thread keeps replacing documents (``add_documents`` with a changed
text under the same id). Reported per run: throughput, p50/p99 latency and errors (a raised
exception, or a result whose segment text is not its source's ``[start_index:end_index]``);
errors must be 0.

The corpus is CUAD contracts from ``<repo>/../shared/data/cuad/contracts`` (or
``$RSE_DATA_DIR/cuad/contracts``) when present, else synthetic contracts from
``tests/helpers.make_contract``. Embeddings are a fast offline feature-hashing model defined
here, so the numbers measure the retriever (FAISS + BM25 + fusion + RSE + locking), not a
neural model. The vector store is the default one (``FAISS`` via ``from_documents``).

    python benchmarks/bench_load.py [--seconds 10] [--clients 1,4,8,16] [--docs 100]

Prints a table; a run with the default clients also writes ``benchmarks/results/load.md``.
Exits with status 1 when any error happened.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import re
import sys
import threading
import time
import zlib
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from langchain_rse import RSERetriever

REPO_ROOT = Path(__file__).resolve().parent.parent
RESULTS = Path(__file__).resolve().parent / "results"
DEFAULT_CLIENTS = "1,4,8,16"

QUERIES = [
    "Can either party terminate the agreement for convenience?",
    "Which state's law governs the agreement?",
    "Is there a non-compete restriction?",
    "What is the term and renewal of the contract?",
    "Is there a limitation of liability or cap on damages?",
    "Does the licensee have to pay royalties?",
    "Is there an exclusivity obligation?",
    "Can the agreement be assigned without consent?",
    "What are the audit rights?",
    "What insurance must be maintained?",
    "Who owns the intellectual property developed under the agreement?",
    "Is there a most favored nation clause?",
    "What notice period applies to termination?",
    "Are there minimum purchase commitments?",
    "What warranty is given and for how long?",
    "Is there a change of control provision?",
    "confidentiality obligations after termination",
    "indemnification for third party claims",
    "liquidated damages",
    "revenue sharing and profit split",
]


# ---------------------------------------------------------------------------- embeddings

_TOKEN = re.compile(r"\w+")


class FastHashingEmbeddings(Embeddings):
    """Bag-of-words feature hashing (CRC-32, signed), L2-normalised; offline and fast."""

    def __init__(self, dim: int = 256) -> None:
        self.dim = dim

    def _embed(self, text: str) -> list[float]:
        hashes = np.fromiter(
            (zlib.crc32(t.encode()) for t in _TOKEN.findall(text.lower())), dtype=np.uint32
        )
        vec = np.zeros(self.dim)
        if hashes.size:
            signs = np.where(hashes >> 31, 1.0, -1.0)
            np.add.at(vec, hashes % self.dim, signs)
        norm = float(np.linalg.norm(vec))
        return (vec / norm if norm else np.full(self.dim, self.dim**-0.5)).tolist()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._embed(text)


# ---------------------------------------------------------------------------- corpus


def data_dir() -> Path:
    env = os.environ.get("RSE_DATA_DIR")
    return Path(env).expanduser().resolve() if env else REPO_ROOT.parent / "shared" / "data"


def load_corpus(n_docs: int, synthetic: bool) -> tuple[list[Document], str]:
    """``n_docs`` documents and a description of where they came from."""
    folder = data_dir() / "cuad" / "contracts"
    if not synthetic and folder.is_dir():
        paths = sorted(folder.glob("*.txt"))[:n_docs]
        docs = [
            Document(
                p.read_text("utf-8", errors="replace"),
                metadata={"source": p.name, "title": p.stem[:80]},
            )
            for p in paths
        ]
        shown = (
            os.path.relpath(folder, REPO_ROOT)
            if folder.is_relative_to(REPO_ROOT.parent)
            else folder
        )
        return docs, f"CUAD contracts (first {len(docs)} of {shown})"
    sys.path.insert(0, str(REPO_ROOT / "tests" / "support"))
    from helpers import make_contract

    topics = [
        "payment terms",
        "termination",
        "confidentiality",
        "indemnity",
        "warranty",
        "governing law",
        "insurance",
        "licence grant",
        "royalties",
        "audit rights",
        "exclusivity",
        "non-compete",
        "assignment",
        "notices",
        "force majeure",
    ]
    docs = [
        Document(
            make_contract(f"contract {i}", [topics[(i + j) % len(topics)] for j in range(6)], 12),
            metadata={"source": f"contract-{i}.txt", "title": f"contract {i}"},
        )
        for i in range(n_docs)
    ]
    return docs, f"synthetic contracts (tests/helpers.make_contract, {len(docs)} documents)"


# ---------------------------------------------------------------------------- measuring


@dataclass
class Run:
    """The outcome of one timed run."""

    mode: str
    clients: int
    writer: bool
    seconds: float = 0.0
    latencies: list[float] = field(default_factory=list)
    errors: int = 0
    writes: int = 0
    first_error: str = ""

    @property
    def qps(self) -> float:
        return len(self.latencies) / self.seconds if self.seconds else 0.0

    def pct(self, q: float) -> float:
        return float(np.percentile(self.latencies, q)) * 1000 if self.latencies else float("nan")


class Checker:
    """Checks that each segment is an exact slice of its source (any revision of it)."""

    def __init__(self, docs: Sequence[Document]) -> None:
        self.base = {d.metadata["source"]: d.page_content for d in docs}

    def problem(self, segments: list[Document]) -> str | None:
        if not isinstance(segments, list) or not segments:
            return f"no segments: {segments!r}"[:200]
        for seg in segments:
            m = seg.metadata
            base = self.base.get(m.get("doc_id"))
            if base is None:
                return f"unknown doc_id {m.get('doc_id')!r}"
            start, end = m["start_index"], m["end_index"]
            # Revisions only append to the text, so the part within the base text is fixed.
            cut = max(0, min(end, len(base)) - start)
            if not seg.page_content or seg.page_content[:cut] != base[start : start + cut]:
                return f"segment of {m['doc_id']} [{start}:{end}] is not its source text"
        return None


class Writer:
    """A thread that keeps replacing documents (same id, text with a new revision line)."""

    def __init__(self, retriever: RSERetriever, docs: Sequence[Document]) -> None:
        self.retriever = retriever
        self.docs = list(docs)
        self.writes = 0
        self.errors = 0
        self.first_error = ""
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="bench-writer", daemon=True)
        self._revision = 0

    def _loop(self) -> None:
        while not self._stop.is_set():
            doc = self.docs[self._revision % len(self.docs)]
            self._revision += 1
            text = f"{doc.page_content}\n\nRevision {self._revision}: amended by the load test."
            try:
                self.retriever.add_documents([Document(text, metadata=doc.metadata)])
                self.writes += 1
            except Exception as exc:  # counted and reported
                self.errors += 1
                self.first_error = self.first_error or f"writer: {type(exc).__name__}: {exc}"

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def _client_loop(
    call: Callable[[str], list[Document]], checker: Checker, start: int, step: int, until: float
) -> tuple[list[float], int, str]:
    latencies: list[float] = []
    errors, first, i = 0, "", start
    while time.monotonic() < until:
        query = QUERIES[i % len(QUERIES)]
        i += step
        t0 = time.perf_counter()
        try:
            problem = checker.problem(call(query))
        except Exception as exc:  # counted and reported
            problem = f"{type(exc).__name__}: {exc}"
        latencies.append(time.perf_counter() - t0)
        if problem:
            errors += 1
            first = first or problem
    return latencies, errors, first


def run_threads(retriever: RSERetriever, checker: Checker, n: int, seconds: float) -> Run:
    run = Run("threads", n, False)
    start = time.monotonic()
    until = start + seconds
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="bench-client") as pool:
        futures = [
            pool.submit(_client_loop, retriever.invoke, checker, i, n, until) for i in range(n)
        ]
        results = [f.result() for f in futures]
    run.seconds = time.monotonic() - start
    for latencies, errors, first in results:
        run.latencies += latencies
        run.errors += errors
        run.first_error = run.first_error or first
    return run


async def _arun(retriever: RSERetriever, checker: Checker, n: int, seconds: float) -> Run:
    run = Run("asyncio", n, False)
    start = time.monotonic()
    until = start + seconds

    async def client(i: int) -> None:
        while time.monotonic() < until:
            query = QUERIES[i % len(QUERIES)]
            i += n
            t0 = time.perf_counter()
            try:
                problem = checker.problem(await retriever.ainvoke(query))
            except Exception as exc:  # counted and reported
                problem = f"{type(exc).__name__}: {exc}"
            run.latencies.append(time.perf_counter() - t0)
            if problem:
                run.errors += 1
                run.first_error = run.first_error or problem

    await asyncio.gather(*(client(i) for i in range(n)))
    run.seconds = time.monotonic() - start
    return run


def run_asyncio(retriever: RSERetriever, checker: Checker, n: int, seconds: float) -> Run:
    return asyncio.run(_arun(retriever, checker, n, seconds))


# ---------------------------------------------------------------------------- reporting


def table(runs: Sequence[Run]) -> str:
    headers = ["clients", "mode", "writer", "queries", "qps", "p50 ms", "p99 ms", "errors"]
    headers.append("writes")
    rows = [
        [
            str(r.clients),
            r.mode,
            "yes" if r.writer else "no",
            str(len(r.latencies)),
            f"{r.qps:.1f}",
            f"{r.pct(50):.1f}",
            f"{r.pct(99):.1f}",
            str(r.errors),
            str(r.writes) if r.writer else "",
        ]
        for r in runs
    ]
    widths = [max(len(h), *(len(row[i]) for row in rows)) for i, h in enumerate(headers)]

    def line(cells: list[str]) -> str:
        return "| " + " | ".join(c.ljust(w) for c, w in zip(cells, widths)) + " |"

    rule = "|" + "|".join("-" * (w + 2) for w in widths) + "|"
    return "\n".join([line(headers), rule, *map(line, rows)])


def versions() -> str:
    names = ["langchain-rse", "langchain-core", "langchain-community", "faiss-cpu", "bm25s"]
    names.append("numpy")
    found = []
    for name in names:
        try:
            found.append(f"{name} {version(name)}")
        except PackageNotFoundError:
            found.append(f"{name} (not installed)")
    return ", ".join(found)


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as f:
            model = next((ln.split(":", 1)[1].strip() for ln in f if "model name" in ln), "")
        cpu = model or cpu
    except OSError:
        pass
    load = ", ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (
        f"{platform.platform()}; {cpu}; {os.cpu_count()} logical CPUs; "
        f"Python {platform.python_version()}; load average at start {load}"
    )


def write_report(path: Path, command: str, setup: dict[str, str], runs: Sequence[Run]) -> None:
    lines = [
        "# Load test: concurrent queries against one RSERetriever",
        "",
        f"Command (from the repository root): `{command}`",
        "",
        f"Date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}",
        "",
        *[f"- {k}: {v}" for k, v in setup.items()],
        "",
        "Each row: N clients run queries back to back for the stated time (threads call",
        "`invoke`; asyncio tasks call `ainvoke`). `writer = yes`: a thread keeps replacing",
        "documents (`add_documents` of a changed text under the same id) meanwhile;",
        "`writes` is how many replacements finished. Latency is per query, end to end.",
        "An error is a raised exception or a segment whose text is not its source's",
        "`[start_index:end_index]`.",
        "",
        table(runs),
        "",
    ]
    errors = [r.first_error for r in runs if r.first_error]
    lines.append("First errors: " + ("; ".join(errors) if errors else "none.") + "")
    lines.append("")
    path.parent.mkdir(parents=True, exist_ok=True)
    notes = ""
    if path.exists():
        old = path.read_text()
        if "<!-- notes -->" in old:
            notes = old[old.index("<!-- notes -->") :]
    path.write_text("\n".join(lines) + ("\n" + notes if notes else ""))


# ---------------------------------------------------------------------------- main


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0, help="duration of each run")
    parser.add_argument("--clients", default=DEFAULT_CLIENTS, help="comma-separated N values")
    parser.add_argument("--docs", type=int, default=100, help="documents in the corpus")
    parser.add_argument("--synthetic", action="store_true", help="ignore CUAD, use synthetic")
    parser.add_argument("--no-writer", action="store_true", help="skip the runs with a writer")
    parser.add_argument("--out", type=Path, default=RESULTS / "load.md", help="report path")
    parser.add_argument("--no-report", action="store_true", help="do not write the report")
    args = parser.parse_args(argv)
    clients = [int(x) for x in args.clients.split(",") if x.strip()]

    docs, source = load_corpus(args.docs, args.synthetic)
    t0 = time.perf_counter()
    retriever = RSERetriever.from_documents(docs, embedding=FastHashingEmbeddings(), k=4)
    build_s = time.perf_counter() - t0
    chunks = len(retriever.index.lexical)
    print(
        f"{source}: {len(docs)} documents, {sum(len(d.page_content) for d in docs):,} "
        f"characters, {chunks:,} chunks; indexed in {build_s:.1f}s "
        f"({type(retriever.vectorstore).__name__})",
        file=sys.stderr,
    )
    checker = Checker(docs)
    for query in QUERIES[:3]:  # warm up both paths
        retriever.invoke(query)
        asyncio.run(retriever.ainvoke(query))

    runs: list[Run] = []
    for writer in [False] if args.no_writer else [False, True]:
        for mode, runner in (("threads", run_threads), ("asyncio", run_asyncio)):
            for n in clients:
                if writer:
                    with Writer(retriever, docs[: max(1, len(docs) // 4)]) as w:
                        run = runner(retriever, checker, n, args.seconds)
                    run.writer, run.writes = True, w.writes
                    run.errors += w.errors
                    run.first_error = run.first_error or w.first_error
                    retriever.invoke(QUERIES[0])  # settle the BM25 rebuild outside the timing
                else:
                    run = runner(retriever, checker, n, args.seconds)
                runs.append(run)
                print(
                    f"{mode:8s} clients={n:<3d} writer={'yes' if writer else 'no ':3s} "
                    f"qps={run.qps:7.1f} p50={run.pct(50):7.1f}ms p99={run.pct(99):7.1f}ms "
                    f"errors={run.errors} writes={run.writes}",
                    file=sys.stderr,
                    flush=True,
                )

    print(table(runs))
    command = "python benchmarks/bench_load.py " + " ".join(sys.argv[1:] if argv is None else argv)
    setup = {
        "Machine": machine(),
        "Versions": versions(),
        "Corpus": f"{source}: {len(docs)} documents, "
        f"{sum(len(d.page_content) for d in docs):,} characters, {chunks:,} chunks "
        f"(chunk_size {retriever.chunk_size}); built in {build_s:.1f}s",
        "Retriever": f"`RSERetriever.from_documents(docs, embedding=FastHashingEmbeddings(), "
        f"k=4)`: {type(retriever.vectorstore).__name__} vector store, "
        f"BM25 (bm25s scoring), RRF fusion, RSE preset {retriever.preset_name!r}, "
        "HeaderEnricher, no reranker",
        "Embeddings": "feature hashing defined in the benchmark (256 dimensions, no model)",
        "Run length": f"{args.seconds:g}s per row; queries cycle through {len(QUERIES)} questions",
    }
    if not args.no_report and args.clients == DEFAULT_CLIENTS:
        write_report(args.out, command.strip(), setup, runs)
        print(f"wrote {args.out}", file=sys.stderr)
    failed = sum(r.errors for r in runs)
    if failed:
        print(f"{failed} errors", file=sys.stderr)
        for r in runs:
            if r.first_error:
                print(f"  {r.mode} {r.clients}: {r.first_error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
