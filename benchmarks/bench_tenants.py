"""Tenants: a routed query's latency with and without a tenant filter, on one index.

``N`` synthetic contracts, each named in its opening by a generated two-word name (*Kaloru
Vemisa Holdings*), belong to ``T`` tenants (``metadata["tenant"]``, one in ``T``). Every
query names one contract (``What is the notice period in the Kaloru Vemisa supply
agreement?``), so the router weighs its words: how many documents hold each one, counted
over the documents the filter allows. Each query runs unfiltered and under its contract's
tenant filter, alternated query by query, after one warm-up pass. Printed: p50 / p95 of
``invoke`` in ms, the share of queries whose first result is the named contract, and the
bundled model's ``embed_query`` p50 (the numbers above use a hashing embedder, so they
measure the retriever over FAISS; a user of the default model waits that much longer on
every query).

    python benchmarks/bench_tenants.py [--docs 5000] [--tenants 20] [--queries 60]
"""

from __future__ import annotations

import argparse
import random
import statistics
import time

from bench_load import FastHashingEmbeddings
from common import base_embeddings
from langchain_core.documents import Document

from langchain_rse import NoEnricher, RSERetriever

SYLLABLES = ["ka", "lo", "mi", "ra", "to", "ve", "zu", "ne", "sa", "pi", "do", "fe"]
CLAUSES = [
    "Either party may terminate this agreement with a notice period of {} days.",
    "The supplier shall deliver goods within {} weeks of the order.",
    "Payment is due {} days after the invoice date.",
    "Disputes are settled by arbitration within {} days of a notice.",
    "The licensee shall keep books and records for {} years.",
]


def corpus(n: int, tenants: int, rng: random.Random) -> tuple[list[Document], list[str]]:
    """``n`` contracts and their names; contract ``i`` belongs to tenant ``i % tenants``."""

    def word() -> str:
        return "".join(rng.choice(SYLLABLES) for _ in range(3)).capitalize()

    docs, names = [], []
    for i in range(n):
        name = f"{word()} {word()}"
        body = "\n\n".join(c.format(rng.randint(1, 99)) for c in rng.sample(CLAUSES, 5))
        opening = f"{name.upper()} SUPPLY AGREEMENT\n\nbetween {name} Holdings and the Buyer.\n\n"
        metadata = {"tenant": f"t{i % tenants}"}
        docs.append(Document(opening + body, id=f"c{i}.txt", metadata=metadata))
        names.append(name)
    return docs, names


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--docs", type=int, default=5000)
    p.add_argument("--tenants", type=int, default=20)
    p.add_argument("--queries", type=int, default=60)
    args = p.parse_args()
    rng = random.Random(7)
    docs, names = corpus(args.docs, args.tenants, rng)
    start = time.perf_counter()
    retriever = RSERetriever.from_documents(
        docs, FastHashingEmbeddings(), enricher=NoEnricher()
    )  # (FAISS, exact cosine)
    print(
        f"{args.docs} documents, {args.tenants} tenants: indexed in "
        f"{time.perf_counter() - start:.1f} s"
    )
    asked = rng.sample(range(args.docs), args.queries)
    questions = [f"What is the notice period in the {names[i]} supply agreement?" for i in asked]
    times: dict[str, list[float]] = {"unfiltered": [], "tenant filter": []}
    right = dict.fromkeys(times, 0)
    for timed in (False, True):  # a warm-up pass, then the timed one
        for i, question in zip(asked, questions):
            for mode in times:
                kwargs = (
                    {"filter": {"tenant": f"t{i % args.tenants}"}} if mode != "unfiltered" else {}
                )
                t = time.perf_counter()
                found = retriever.invoke(question, **kwargs)
                if timed:
                    times[mode].append(1000 * (time.perf_counter() - t))
                    right[mode] += bool(found) and found[0].metadata["doc_id"] == f"c{i}.txt"
    for mode, ms in times.items():
        p95 = statistics.quantiles(ms, n=20)[-1]
        print(
            f"{mode:>14}: p50 {statistics.median(ms):6.1f} ms  p95 {p95:6.1f} ms  "
            f"first result the named contract {right[mode]}/{len(ms)}"
        )
    model, name = base_embeddings()
    model.embed_query("warm-up")
    embed = []
    for question in questions[:20]:
        t = time.perf_counter()
        model.embed_query(question)
        embed.append(1000 * (time.perf_counter() - t))
    print(f"{name} embed_query p50 {statistics.median(embed):.1f} ms (add it to both)")


if __name__ == "__main__":
    main()
