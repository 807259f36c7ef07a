"""Abstention's trade-off: off-topic questions emptied vs answerable questions emptied.

The signal is :func:`langchain_rse.routing.query_coverage` (how much of the query's IDF
weight the index's words hold), computed on the default retriever's BM25 index of each dev
corpus. It needs no embeddings (the vector store gets hash vectors), so every corpus runs
in seconds. For each threshold: the share of the off-topic questions
(``offtopic_questions.txt``) whose coverage is below it (``DocumentRouter.min_coverage``
empties them), beside the share of the corpus's own (answerable) dev questions it empties.

Usage::

    python benchmarks/bench_abstain.py                 # cuad, code, covidqa
    python benchmarks/bench_abstain.py --corpus cuad --wording noname
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

import numpy as np
from bench_quality import CORPORA, OFFTOPIC, as_documents, load_corpus
from common import fmt_table, log
from cuad_data import DEFAULT_CONTRACTS, WORDINGS
from langchain_core.embeddings import DeterministicFakeEmbedding
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rse import RSERetriever
from langchain_rse.routing import query_coverage

THRESHOLDS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.75, 0.8, 0.85, 0.9)


def offtopic_questions() -> list[str]:
    lines = OFFTOPIC.read_text(encoding="utf-8").splitlines()
    return [q.strip() for q in lines if q.strip() and not q.startswith("#")]


def curve(name: str, contracts: int, wording: str) -> str:
    corpus = load_corpus(name, contracts, wording)
    if corpus is None:
        return ""
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(DeterministicFakeEmbedding(size=8)),
        show_progress=False,
        router=None,
    )
    retriever.add_documents(as_documents(corpus))
    index = retriever.index.lexical
    off = np.array([query_coverage(index, q) for q in offtopic_questions()])
    dev = np.array([query_coverage(index, q.text) for q in corpus.queries])
    rows = [
        [
            f"{t:.2f}",
            f"{100 * np.mean(off < t):.1f}",
            f"{100 * np.mean(dev < t):.1f} ({int(np.sum(dev < t))})",
        ]
        for t in THRESHOLDS
    ]
    head = (
        f"## {name}: {len(corpus.documents)} documents, {len(corpus.queries)} dev questions"
        f"{'' if wording == 'consider' or name != 'cuad' else ', wording ' + wording}, "
        f"{len(off)} off-topic\n\n"
    )
    table = fmt_table(["min_coverage", "off-topic emptied %", "answerable emptied % (n)"], rows)
    lowest = sorted(zip(dev, (q.text for q in corpus.queries)))[:3]
    tail = "\n\nlowest-covered dev questions: " + "; ".join(
        f"{c:.2f} {t[:70]!r}" for c, t in lowest
    )
    return head + table + tail


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--corpus", default=",".join(CORPORA))
    ap.add_argument("--contracts", type=int, default=DEFAULT_CONTRACTS)
    ap.add_argument("--wording", default="consider", choices=WORDINGS)
    args = ap.parse_args(argv)
    for name in (c.strip() for c in args.corpus.split(",") if c.strip()):
        log(f"{name}: indexing (BM25 only)")
        print(curve(name, args.contracts, args.wording) + "\n", flush=True)


if __name__ == "__main__":
    main()
