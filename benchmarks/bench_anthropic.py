"""Pass@k on Anthropic's contextual-retrieval codebase set, chunks as given.

Each of the 737 given chunks is indexed as its own document (id
``"{doc_uuid}:{original_index}"``) with a chunk size larger than any chunk, so the
retriever keeps it whole; all methods share one ``InMemoryVectorStore`` (same chunks,
same vectors). Pass@k = per query, the fraction of golden chunks in the top k, averaged.

``reference`` is issue 16's reference row, the hybrid retriever of before the code rules
and stems (RRF 1:1, words as written), built in the same run; with ``hybrid`` beside it the
script prints a paired randomization test of the two per Pass@k.

Usage::

    python benchmarks/bench_anthropic.py
    python benchmarks/bench_anthropic.py --methods hybrid,reference
    python benchmarks/bench_anthropic.py --fusion relative_score --weights 1,0.5
"""

from __future__ import annotations

import argparse
import json
import time
import warnings
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from common import (
    CACHE_DIR,
    CachedEmbeddings,
    base_embeddings,
    fmt_table,
    log,
    paired_test,
    require_data,
)
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rse import RSERetriever
from langchain_rse.lexical import BM25Index, tokenize

KS = (5, 10, 20)
PUBLISHED = {
    "published: voyage-2 base": (80.92, 87.15, 90.06),
    "published: contextual embeddings": (86.37, 92.81, 93.78),
    "published: + contextual BM25": (86.43, 93.21, 94.99),
    "published: + Cohere rerank": (91.24, 94.79, 96.30),
}
CHUNK_SIZE = 8000
"""Larger than the longest given chunk (3,898 characters): every chunk stays whole."""

Method = Callable[[str], list[str]]

REFERENCE: dict[str, Any] = {
    "weights": (1.0, 1.0),
    "code_weights": None,
    "code_corpus_weights": None,
    "lexical_stemmer": None,
}
"""Issue 16's reference row: the hybrid default before the code rules and stems."""


def load() -> tuple[list[Document], list[dict[str, Any]]]:
    root = require_data("anthropic_codebase")
    corpus = json.loads((root / "codebase_chunks.json").read_text(encoding="utf-8"))
    docs = [
        Document(
            page_content=chunk["content"],
            id=f"{doc['original_uuid']}:{chunk['original_index']}",
            metadata={"source": doc["doc_id"]},
        )
        for doc in corpus
        for chunk in doc["chunks"]
    ]
    with (root / "evaluation_set.jsonl").open(encoding="utf-8") as f:
        queries = [json.loads(line) for line in f if line.strip()]
    return docs, queries


def make_methods(
    retriever: RSERetriever, which: Sequence[str], reference: RSERetriever | None = None
) -> dict[str, Method]:
    from langchain_community.retrievers import BM25Retriever

    try:
        from langchain_classic.retrievers import EnsembleRetriever
    except ImportError:  # older LangChain
        from langchain.retrievers import EnsembleRetriever  # type: ignore[no-redef]

    k = max(KS)
    vs = retriever.vectorstore
    assert isinstance(vs, InMemoryVectorStore)
    chunks = [Document(page_content=r["text"], metadata=r["metadata"]) for r in vs.store.values()]

    def ids(docs: Sequence[Document]) -> list[str]:
        return [str(d.metadata["doc_id"]) for d in docs]

    methods: dict[str, Method] = {}
    if "dense" in which:
        methods["dense"] = lambda q: ids(vs.similarity_search(q, k=k))
    if "bm25" in which:
        index = BM25Index()
        index.add([str(d.metadata["doc_id"]) for d in chunks], [d.page_content for d in chunks])
        methods["bm25"] = lambda q: [i for i, _ in index.search(q, k)]
    dense_retriever = vs.as_retriever(search_kwargs={"k": k})
    for name, preprocess in (("ensemble(split)", None), ("ensemble(tokenize)", tokenize)):
        if name not in which:
            continue
        kwargs: dict[str, Any] = {"k": k}
        if preprocess is not None:
            kwargs["preprocess_func"] = preprocess
        bm25 = BM25Retriever.from_documents(chunks, **kwargs)
        ensemble = EnsembleRetriever(retrievers=[bm25, dense_retriever], weights=[0.5, 0.5])
        methods[name] = lambda q, e=ensemble: ids(e.invoke(q))
    if "hybrid" in which:
        methods["hybrid"] = lambda q: ids(retriever.invoke(q, k=k))
    if reference is not None:
        methods["reference"] = lambda q: ids(reference.invoke(q, k=k))
    return methods


def evaluate(methods: dict[str, Method], queries: Sequence[dict[str, Any]]) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for name, method in methods.items():
        t0 = time.perf_counter()
        per_query = []
        for q in queries:
            got = method(q["query"])
            golden = {f"{u}:{i}" for u, i in q["golden_chunk_uuids"]}
            per_query.append([len(golden & set(got[:k])) / len(golden) for k in KS])
        seconds = time.perf_counter() - t0
        log(f"{name}: {seconds:.1f}s")
        scores = np.asarray(per_query)
        results[name] = {
            "pass": dict(zip(KS, (100 * scores.mean(axis=0)).tolist())),
            # halves for a tune / check split: even and odd question numbers
            "pass_a": dict(zip(KS, (100 * scores[0::2].mean(axis=0)).tolist())),
            "pass_b": dict(zip(KS, (100 * scores[1::2].mean(axis=0)).tolist())),
            "seconds_per_query": seconds / len(queries),
            "per_query": scores.tolist(),
        }
    return results


def paired_rows(results: dict[str, Any], a: str, b: str) -> list[list[str]]:
    """``a`` against ``b`` per Pass@k: mean difference, randomization p, wins / losses."""
    sa, sb = np.asarray(results[a]["per_query"]), np.asarray(results[b]["per_query"])
    rows = []
    for j, k in enumerate(KS):
        t = paired_test(100 * sa[:, j], 100 * sb[:, j])
        rows.append([f"Pass@{k}", f"{t.diff:+.2f}", f"{t.p:.2f}", f"{t.wins} / {t.losses}"])
    return rows


def pair(value: str) -> tuple[float, float] | None:
    """``"a,b"`` as two fusion weights; ``"none"`` as None."""
    if value == "none":
        return None
    dense, lexical = (float(x) for x in value.split(","))
    return dense, lexical


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fusion", default="rrf")
    ap.add_argument(
        "--weights", default="2,1", help="dense,lexical fusion weights (the library's default)"
    )
    ap.add_argument("--fetch-k", type=int, default=50)
    ap.add_argument("--rrf-k", type=float, default=60.0, help="RRF's rank constant")
    ap.add_argument(
        "--code-weights", default="1,1", help="weights for queries that quote code, or 'none'"
    )
    ap.add_argument(
        "--code-corpus-weights",
        default="2,1",
        help="weights for the other queries when the corpus is code (as it is here), or 'none'",
    )
    ap.add_argument(
        "--methods", default="dense,bm25,ensemble(split),ensemble(tokenize),hybrid,reference"
    )
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    docs, queries = load()
    inner, model_name = base_embeddings()
    embeddings = CachedEmbeddings(inner, model_name)
    embeddings.embed_array([q["query"] for q in queries], "query")  # batched, cached
    which = args.methods.split(",")

    def build(**settings: Any) -> RSERetriever:
        retriever = RSERetriever(
            vectorstore=InMemoryVectorStore(embeddings),
            mode="chunks",
            chunk_size=CHUNK_SIZE,
            fusion=args.fusion,
            rrf_k=args.rrf_k,
            fetch_k=args.fetch_k,
            candidate_pool=max(args.fetch_k, max(KS)),
            show_progress=False,
            **settings,
        )
        log(f"indexing {len(docs)} chunks")
        retriever.add_documents(docs)
        return retriever

    retriever = build(
        weights=pair(args.weights),
        code_weights=pair(args.code_weights),
        code_corpus_weights=pair(args.code_corpus_weights),
    )
    reference = build(**REFERENCE) if "reference" in which else None
    results = evaluate(make_methods(retriever, which, reference), queries)

    rows = [
        [label, *(f"{res[key][k]:.2f}" for k in KS), f"{res['seconds_per_query']:.3f}"]
        for name, res in results.items()
        for label, key in ((name, "pass"), (f"  {name}, half a", "pass_a"),
                           (f"  {name}, half b", "pass_b"))
    ]  # fmt: skip
    rows += [[name, *(f"{v:.2f}" for v in vals), ""] for name, vals in PUBLISHED.items()]
    print(
        f"Anthropic codebase set: {len(docs)} chunks, {len(queries)} queries; "
        f"embeddings {model_name}; hybrid fusion={args.fusion} weights={args.weights} "
        f"code_weights={args.code_weights} code_corpus_weights={args.code_corpus_weights} "
        f"fetch_k={args.fetch_k} rrf_k={args.rrf_k:g}; BM25 index: "
        f"{retriever._lexical.identifier_density():.2f} snake_case identifiers per chunk"
    )
    print(fmt_table(["method", *(f"Pass@{k}" for k in KS), "s/query"], rows))
    if "hybrid" in results and "reference" in results:
        print(f"\nhybrid - reference over the same {len(queries)} questions (paired, sign flips):")
        print(fmt_table(["", "difference", "p", "wins / losses"],
                        paired_rows(results, "hybrid", "reference")))  # fmt: skip
    tag = (
        f"{args.fusion}_{args.weights}_{args.code_weights}_{args.code_corpus_weights}_"
        f"{args.rrf_k:g}"
    )
    out = CACHE_DIR / "results" / f"anthropic_{tag}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"args": vars(args), "results": results}), encoding="utf-8")
    embeddings.close()


if __name__ == "__main__":
    main()
