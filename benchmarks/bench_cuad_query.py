"""The query path on CUAD with the default pipeline: where a query's CPU goes when the
document router takes part.

``bench_speed.py``'s synthetic queries seldom name a document, so its stage breakdown
hardly runs the route's later steps. CUAD's questions name their contract: the route
holds, its chunks are boosted, and most questions are also searched inside the routed
contract (the router's focus), so a query fuses four branches. This builds the default
retriever (``RSERetriever.from_documents``: the local FAISS store, the lead index router)
over the seeded dev contracts and times ``invoke`` over their questions with the branches
in turn (``parallel_branches=False``: every stage on the calling thread), CPU ms per query
(means; the median of ``--rounds`` rounds), caches warm after one pass:

- the searches, as ``bench_speed.py`` counts them: FAISS (the unfiltered search and the
  focus's search inside the routed documents, each whole), the query-vector lookup (this
  benchmark's embedding cache), the query's BM25 tokens and BM25 scoring (chunks and
  leads, every call);
- the own work beyond them, and the stages that hold it (each timed whole, searches
  inside included): the route, the route's check against the unrouted ranking, the
  focus text, fusion and candidates, and the pipeline after them (records, RSE, results).

    python benchmarks/bench_cuad_query.py [--contracts 50] [--seed 0] [--queries 300]
        [--rounds 3] [--enricher none|header|lead]

``--enricher none`` (the default here) indexes the chunks as they are: the stages after
the searches do not read the index texts, and the header enricher's texts take another
embedding pass (minutes) the first time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections import Counter
from collections.abc import Callable
from typing import Any
from unittest import mock

from common import CachedEmbeddings, base_embeddings, log
from cuad_data import DEFAULT_CONTRACTS, DEFAULT_SEED, contract_documents, load_cuad, make_enricher
from speed_query import StageTimer

import langchain_rse.lexical as lexical
import langchain_rse.pipeline as pipeline
from langchain_rse import RSERetriever
from langchain_rse.bm25 import IncrementalBM25
from langchain_rse.routing import DocumentRouter
from langchain_rse.search import SearchBranches
from langchain_rse.stores.chunk_docstore import ChunkDocstore
from langchain_rse.stores.faiss import LocalFAISS

SEARCHES = [
    ("FAISS, unfiltered (LocalFAISS.search_vectors)", LocalFAISS, "search_vectors"),
    ("FAISS, inside the routed documents (ChunkDocstore._search_docs)", ChunkDocstore,
     "_search_docs"),
    ("query vector lookup (CachedEmbeddings.embed_query)", CachedEmbeddings, "embed_query"),
    ("query tokens, chunks and leads (lexical.tokenize)", lexical, "tokenize"),
    ("BM25 scoring, chunks and leads (IncrementalBM25.top)", IncrementalBM25, "top"),
]  # fmt: skip
"""The searches, as ``bench_speed.SEARCH_STAGES`` counts them."""
STAGES = [
    ("route (DocumentRouter.route)", DocumentRouter, "route"),
    ("route check (pipeline.confirmed_route)", pipeline, "confirmed_route"),
    ("focus text (DocumentRouter.focus_query)", DocumentRouter, "focus_query"),
    ("focus searches (SearchBranches.focus)", SearchBranches, "focus"),
    ("fusion and candidates (pipeline.candidates)", pipeline, "candidates"),
    ("pipeline after them (pipeline.run_pipeline)", pipeline, "run_pipeline"),
    ("  RSE (pipeline.select)", pipeline, "select"),
]


def paths(retriever: RSERetriever, queries: list[str]) -> Counter[str]:
    """How many queries held a route and how many fused four branches (the focus's too)."""
    seen: Counter[str] = Counter()
    original = pipeline.candidates

    def counted(s: Any, dense: Any, lexical: Any, *args: Any, **kwargs: Any) -> Any:
        found = original(s, dense, lexical, *args, **kwargs)
        seen["route held"] += found[1] is not None
        seen["focus searched (four branches)"] += len(dense) > len(s.queries)
        return found

    with mock.patch.object(pipeline, "candidates", counted):
        for q in queries:
            retriever.invoke(q)
    return seen


def breakdown(retriever: RSERetriever, queries: list[str]) -> dict[str, float]:
    """CPU ms per query of each row of :data:`SEARCHES` and :data:`STAGES`, and in all."""
    timer = StageTimer()
    with timer.patched(SEARCHES + STAGES):
        start = time.process_time()
        for q in queries:
            retriever.invoke(q)
        total = time.process_time() - start
    rows = {name: timer.seconds[name] / len(queries) * 1e3 for name, _, _ in SEARCHES + STAGES}
    rows["total invoke"] = total / len(queries) * 1e3
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--contracts", type=int, default=DEFAULT_CONTRACTS)
    p.add_argument("--seed", type=int, default=DEFAULT_SEED)
    p.add_argument("--queries", type=int, default=300)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--enricher", default="none", help="none | header | lead")
    args = p.parse_args()

    data = load_cuad(args.contracts, args.seed)
    inner, model = base_embeddings()
    embeddings = CachedEmbeddings(inner, model, verbose=False)
    log(f"indexing {len(data.contracts)} contracts")
    retriever = RSERetriever.from_documents(
        contract_documents(data), embeddings, enricher=make_enricher(args.enricher),
        show_progress=False, parallel_branches=False,
    )  # fmt: skip
    log(f"indexed: {retriever!r}")
    queries = [q.text for q in data.queries[: args.queries]]
    seen = paths(retriever, queries)  # also the warm-up pass
    rounds = [breakdown(retriever, queries) for _ in range(args.rounds)]
    ms: Callable[[str], float] = lambda name: statistics.median(r[name] for r in rounds)  # noqa: E731

    print(f"\n{len(queries)} CUAD dev questions over {len(data.contracts)} contracts "
          f"({len(retriever._lexical):,} chunks, enricher {args.enricher}): "
          + ", ".join(f"{n} {k}" for k, n in seen.items()))  # fmt: skip
    print(f"CPU ms per query, branches in turn, median of {args.rounds} rounds\n")
    print("| row | ms |\n|---|---|")
    print(f"| total invoke | {ms('total invoke'):.3f} |")
    for name, _, _ in SEARCHES:
        print(f"| search: {name} | {ms(name):.3f} |")
    own = ms("total invoke") - sum(ms(name) for name, _, _ in SEARCHES)
    print(f"| **own work beyond the searches** | **{own:.3f}** |")
    for name, _, _ in STAGES:
        print(f"| stage (searches inside included): {name} | {ms(name):.3f} |")


if __name__ == "__main__":
    main()
