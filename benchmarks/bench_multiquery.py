"""Single query vs several queries for one retrieval, on the CUAD dev split.

The deterministic offline "expander": a CUAD query reads ``Consider the <document name>
between <parties>; <category description>``, so besides the query itself we search its
two halves as separate queries — the category description (what clause is asked for) and
the document part (which contract). Nothing is taken from the gold answer.

Each method's best-first ranges are cut at equal character budgets; recall and precision
are as in ``bench_cuad.py``.

    python benchmarks/bench_multiquery.py [--contracts 50] [--enricher header]
"""

from __future__ import annotations

import argparse
import math
import warnings
from collections.abc import Sequence

from bench_cuad import BUDGETS, evaluate, report, spans_of
from common import CachedEmbeddings, base_embeddings, log
from cuad_data import DEFAULT_CONTRACTS, DEFAULT_SEED, build_retriever, load_cuad, make_enricher


def sub_queries(query: str) -> list[str]:
    """The two halves of a CUAD query (document part, category part), when it has both."""
    head, sep, tail = query.partition(";")
    return [part.strip() for part in (head, tail) if sep and part.strip()]


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contracts", type=int, default=DEFAULT_CONTRACTS)
    ap.add_argument("--all", action="store_true")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument("--chunk-size", type=int, default=600)
    ap.add_argument("--enricher", default="header")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    data = load_cuad(None if args.all else args.contracts, args.seed)
    inner, model_name = base_embeddings()
    embeddings = CachedEmbeddings(inner, model_name)
    texts = [q.text for q in data.queries] + [s for q in data.queries for s in sub_queries(q.text)]
    embeddings.embed_array(texts, "query")  # batched, cached
    retriever = build_retriever(
        data, embeddings, chunk_size=args.chunk_size, enricher=make_enricher(args.enricher)
    )
    n_chunks = math.ceil(1.6 * max(BUDGETS) / args.chunk_size) + 4
    chunks = retriever.model_copy(update={"mode": "chunks", "candidate_pool": 2 * n_chunks})
    segments = retriever.model_copy(update={"mode": "segments"})
    methods = {
        "hybrid chunks, 1 query": lambda q: spans_of(chunks.invoke(q, k=n_chunks)),
        "hybrid chunks, 3 queries": lambda q: spans_of(
            chunks.invoke(q, k=n_chunks, queries=sub_queries(q))
        ),
        "rse, 1 query": lambda q: spans_of(segments.invoke(q, k=100)),
        "rse, 3 queries": lambda q: spans_of(segments.invoke(q, k=100, queries=sub_queries(q))),
    }
    results = evaluate(data, methods)
    print(
        f"CUAD dev, {len(data.contracts)} contracts (seed {args.seed}), {len(data.queries)} "
        f"queries, chunk_size={args.chunk_size}, enricher={args.enricher}, "
        f"rse={retriever.params}"
    )
    print(report(results))
    embeddings.close()
    log("done")


if __name__ == "__main__":
    main()
