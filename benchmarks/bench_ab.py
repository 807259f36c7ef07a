"""Own work beyond the searches: this checkout against another commit, alternated.

A machine whose speed drifts within minutes (a shared VM) moves a full ``bench_speed`` run
by more than one change to the query path gains; alternating the two libraries in short
rounds shows the change. Two worker processes, one per library (this checkout, and ``REV``
checked out in a temporary git worktree), each build the same corpus, retriever and
FAISS-IVF copy with its own benchmark code, then take turns: each round, each library runs
``speed_query.stage_breakdown`` over the same queries on the exact and the IVF store,
record caches cold and then warm, and reports its own work (CPU ms per query beyond the
searches, as ``bench_speed`` counts it) and the BM25 scoring (the chunk search and the
document router's lead search). The tables give the medians.

    python benchmarks/bench_ab.py REV [--size 100000] [--rounds 10] [--queries 50]

Both processes stay in memory together (about 1.6 GB at 100k chunks).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import subprocess
import sys
import tempfile
from multiprocessing.connection import Connection
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COLUMNS = ("exact, cold", "exact, warm", "IVF, cold", "IVF, warm")
BM25 = "  BM25 scoring + top-k (IncrementalBM25.top)"
"""The stage-breakdown row of the BM25 searches (chunks and document leads)."""


def worker(root: str, size: int, queries: int, conn: Connection) -> None:
    """Build at ``size`` chunks with the library and benchmark code under ``root``, then
    answer each round request with the own work and the BM25 scoring of each of
    :data:`COLUMNS`."""
    sys.path[:0] = [root, os.path.join(root, "benchmarks")]
    import faiss
    from bench_speed import SEARCH_STAGES
    from speed_corpus import Corpus, load_sentences
    from speed_query import build_rse, ivf_copy, stage_breakdown, using_store

    import langchain_rse

    assert langchain_rse.__file__.startswith(root), langchain_rse.__file__
    faiss.omp_set_num_threads(1)  # as bench_speed runs it
    corpus = Corpus(size, queries, load_sentences())
    retriever, store, _ = build_rse(corpus)
    ivf = ivf_copy(store)
    timed = corpus.queries[:queries]
    for q in timed:  # warm up the code paths
        retriever.invoke(q)
    conn.send("ready")
    while conn.recv() == "round":
        own, bm25 = [], []
        for vectorstore in (store, ivf):
            with using_store(retriever, vectorstore):
                for cold in (True, False):
                    rows = dict(stage_breakdown(retriever, vectorstore, corpus, timed, cold=cold))
                    own.append(rows["total invoke"] - sum(rows[s] for s in SEARCH_STAGES))
                    bm25.append(rows[BM25])
        conn.send(own + bm25)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("rev", help="the commit to compare this checkout against")
    p.add_argument("--size", type=int, default=100_000, help="chunks (default 100,000)")
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--queries", type=int, default=50, help="queries per breakdown")
    args = p.parse_args()

    from common import data_dir

    os.environ.setdefault("RSE_DATA_DIR", str(data_dir()))  # the worktree has no ../shared
    sha = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short", args.rev],
                         check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    spawn = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="rse-ab-") as tmp:
        other = os.path.join(tmp, "lib")
        subprocess.run(["git", "-C", str(REPO), "worktree", "add", "--detach", "-q", other, sha],
                       check=True)  # fmt: skip
        try:
            labels = {sha: other, "this checkout": str(REPO)}
            links = {}
            for label, root in labels.items():
                mine, theirs = spawn.Pipe()
                proc = spawn.Process(target=worker, args=(root, args.size, args.queries, theirs))
                proc.start()
                links[label] = (proc, mine)
            for label, (_, conn) in links.items():
                print(f"{label}: {conn.recv()}", flush=True)
            rows: dict[str, list[list[float]]] = {label: [] for label in links}
            for n in range(args.rounds):
                for label, (_, conn) in links.items():
                    conn.send("round")
                    rows[label].append(conn.recv())
                    cells = " / ".join(f"{x:.3f}" for x in rows[label][-1])
                    print(f"round {n + 1} {label}: {cells}", flush=True)
            for _, conn in links.values():
                conn.send("stop")
            for proc, _ in links.values():
                proc.join()
        finally:
            subprocess.run(["git", "-C", str(REPO), "worktree", "remove", "--force", other],
                           check=False)  # fmt: skip
    n = len(COLUMNS)
    for title, at in (("own work beyond the searches", slice(0, n)),
                      ("BM25 scoring (chunks and document leads)", slice(n, 2 * n))):  # fmt: skip
        print(
            f"\n{title}, ms of CPU per query, medians of {args.rounds} alternated rounds at "
            f"N={args.size:,} ({args.queries} queries a breakdown)\n"
        )
        print("| library | " + " | ".join(COLUMNS) + " |")
        print("|---" * (n + 1) + "|")
        for label, found in rows.items():
            medians = [statistics.median(c) for c in zip(*found)][at]
            print(f"| {label} | " + " | ".join(f"{x:.3f}" for x in medians) + " |")


if __name__ == "__main__":
    main()
