"""How the default router routes each dev corpus's questions, without embeddings.

Routing is decided by the lead index (BM25 over each document's title and opening), so the
router's decisions need no vectors (the vector store gets hash vectors): for CUAD dev in every
phrasing family (``cuad_data.WORDINGS``), COVID-QA dev and the code set, how many questions
are routed to a gold document (``right``), to another (``wrong``), or not at all (``none``).
End to end (recall, misled): ``bench_quality.py --corpus cuad --wording all``.

Usage::

    python benchmarks/bench_routes.py
    python benchmarks/bench_routes.py --set router.min_naming=0.0
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from bench_quality import as_documents, build_default, load_corpus, route_counts
from common import fmt_table, log, parse_settings
from cuad_data import DEFAULT_CONTRACTS, WORDINGS, load_cuad, reworded
from langchain_core.embeddings import DeterministicFakeEmbedding


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contracts", type=int, default=DEFAULT_CONTRACTS)
    ap.add_argument("--set", type=parse_settings, default={}, metavar="KEY=VALUE[,KEY=VALUE]")
    args = ap.parse_args(argv)
    emb = DeterministicFakeEmbedding(size=8)
    rows = []
    cuad = load_corpus("cuad", args.contracts)
    assert cuad is not None
    log(f"cuad: {len(cuad.documents)} contracts")
    retriever = build_default(as_documents(cuad), emb, **args.set)  # type: ignore[arg-type]
    base = load_cuad(args.contracts)
    for wording in WORDINGS:
        c = route_counts(retriever, reworded(base, wording).queries)
        rows.append([f"cuad {wording}", c["right"], c["wrong"], c["none"]])
    for name in ("covidqa", "code"):
        corpus = load_corpus(name)
        if corpus is not None:
            log(f"{name}: {len(corpus.documents)} documents")
            r = build_default(as_documents(corpus), emb, **args.set)  # type: ignore[arg-type]
            c = route_counts(r, corpus.queries)
            rows.append([name, c["right"], c["wrong"], c["none"]])
    print(fmt_table(["questions", "routed right", "routed wrong", "not routed"], rows))


if __name__ == "__main__":
    main()
