"""CUAD (dev split) character recall / precision at equal budgets of returned text.

All chosen contracts are indexed in ONE retriever, and every method searches all of
them. Every method uses the same chunks and the same chunk vectors (one shared
``InMemoryVectorStore``, filled by ``RSERetriever.add_documents``), so the methods
differ only in how they rank and what they return:

* ``dense``: the vector store alone, top-k chunks;
* ``bm25``: our ``BM25Index`` alone, top-k chunks (same chunk texts);
* ``ensemble(split)`` / ``ensemble(tokenize)``: LangChain's ``EnsembleRetriever`` over
  ``BM25Retriever`` (default ``str.split`` preprocessing / our tokenizer) and
  ``vectorstore.as_retriever()``;
* ``hybrid``: ``RSERetriever(mode="chunks")``;
* ``rse``: ``RSERetriever(mode="segments")``.

Each method's best-first character ranges are cut at budgets of 1k/2k/4k/8k characters
(the last range truncated); per query, recall = |gold ∩ returned| / |gold| and precision =
|gold ∩ returned| / |returned|, averaged over queries.

Usage::

    python benchmarks/bench_cuad.py                      # 50 seeded dev contracts
    python benchmarks/bench_cuad.py --contracts 100 --seed 1
    python benchmarks/bench_cuad.py --untuned             # 50 contracts no default saw
    python benchmarks/bench_cuad.py --all --enricher none
"""

from __future__ import annotations

import argparse
import json
import math
import re
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from common import (
    CACHE_DIR,
    RESULTS_DIR,
    CachedEmbeddings,
    Span,
    base_embeddings,
    bootstrap_se,
    cut_at_budget,
    fmt_table,
    log,
    recall_precision,
)
from cuad_data import (
    DEFAULT_CONTRACTS,
    DEFAULT_SEED,
    WORDINGS,
    CuadSubset,
    build_retriever,
    build_router,
    halves,
    load_cuad,
    make_enricher,
    reworded,
)
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rse import DocumentRouter, RSERetriever
from langchain_rse.chunking import DEFAULT_CHUNK_SIZE, chunk_key
from langchain_rse.lexical import BM25Index, tokenize
from langchain_rse.rerank import EmbeddingReranker
from langchain_rse.segments import RSEParams, get_preset

BUDGETS = (1000, 2000, 4000, 8000)
TARGET_BUDGET = 4000

Method = Callable[[str], list[Span]]


def spans_of(docs: Sequence[Document]) -> list[Span]:
    """``(doc_id, start_index, end_index)`` of returned documents, in order."""
    return [
        (str(d.metadata["doc_id"]), int(d.metadata["start_index"]), int(d.metadata["end_index"]))
        for d in docs
    ]


def chunk_documents(vectorstore: InMemoryVectorStore) -> list[Document]:
    """The chunk documents (indexed text + offsets) the retriever wrote to the store."""
    return [
        Document(page_content=rec["text"], metadata=rec["metadata"], id=rec["id"])
        for rec in vectorstore.store.values()
    ]


def make_methods(
    retriever: RSERetriever,
    n_chunks: int,
    which: Sequence[str],
    rerank_params: RSEParams | None = None,
    router: RSERetriever | None = None,
    route_params: RSEParams | None = None,
) -> dict[str, Method]:
    """The compared methods, each a function from a query to best-first ranges
    (``rerank_params``: the RSE parameters of ``rse+rerank``; default: preset "reranked";
    ``router``: the document router of the routing rows; ``route_params``: RSE parameters
    of ``rse+route``)."""
    from langchain_community.retrievers import BM25Retriever

    try:
        from langchain_classic.retrievers import EnsembleRetriever
    except ImportError:  # older LangChain
        from langchain.retrievers import EnsembleRetriever  # type: ignore[no-redef]

    vs = retriever.vectorstore
    assert isinstance(vs, InMemoryVectorStore)
    chunks = chunk_documents(vs)
    methods: dict[str, Method] = {}

    if "dense" in which:
        methods["dense"] = lambda q: spans_of(vs.similarity_search(q, k=n_chunks))

    if "bm25" in which:
        index = BM25Index()
        keys = [
            chunk_key(d.metadata["doc_id"], d.metadata["doc_version"], d.metadata["chunk_index"])
            for d in chunks
        ]
        index.add(keys, [d.page_content for d in chunks])
        span_of = {
            k: (d.metadata["doc_id"], d.metadata["start_index"], d.metadata["end_index"])
            for k, d in zip(keys, chunks)
        }
        methods["bm25"] = lambda q: [span_of[k] for k, _ in index.search(q, n_chunks)]

    dense_retriever = vs.as_retriever(search_kwargs={"k": n_chunks})
    for name, preprocess in (("ensemble(split)", None), ("ensemble(tokenize)", tokenize)):
        if name not in which:
            continue
        kwargs: dict[str, Any] = {"k": n_chunks}
        if preprocess is not None:
            kwargs["preprocess_func"] = preprocess
        bm25 = BM25Retriever.from_documents(chunks, **kwargs)
        ensemble = EnsembleRetriever(retrievers=[bm25, dense_retriever], weights=[0.5, 0.5])
        methods[name] = lambda q, e=ensemble: spans_of(e.invoke(q))

    pool = max(retriever.candidate_pool, n_chunks)
    if "default" in which:  # the retriever as configured: the library's default pipeline
        default = retriever.model_copy(update={"mode": "segments"})
        methods["default"] = lambda q: spans_of(default.invoke(q, k=100))
    leads = retriever.router
    no_focus = None if leads is None else leads.model_copy(update={"focus": False})
    if "default(no focus)" in which:  # the default with the router's focus off (issue 16)
        unfocused = retriever.model_copy(update={"mode": "segments", "router": no_focus})
        methods["default(no focus)"] = lambda q: spans_of(unfocused.invoke(q, k=100))
    for name in which:  # the default with the router fetching fewer candidates per branch
        if (m := re.fullmatch(r"default\(router fetch_k=(\d+)\)", name)) and leads is not None:
            fewer = leads.model_copy(update={"fetch_k": int(m[1])})
            variant = retriever.model_copy(update={"mode": "segments", "router": fewer})
            methods[name] = lambda q, v=variant: spans_of(v.invoke(q, k=100))
    if "default(chunks)" in which:
        default_chunks = retriever.model_copy(update={"mode": "chunks", "candidate_pool": pool})
        methods["default(chunks)"] = lambda q: spans_of(default_chunks.invoke(q, k=n_chunks))

    # The rows below are the pipeline before document routing: no router, RRF 1:1, the
    # "unrouted" preset.
    before: dict[str, Any] = {"router": None, "weights": (1.0, 1.0),
                              "rse_params": get_preset("unrouted")}  # fmt: skip
    if "hybrid" in which:
        hybrid = retriever.model_copy(update={"mode": "chunks", "candidate_pool": pool, **before})
        methods["hybrid"] = lambda q: spans_of(hybrid.invoke(q, k=n_chunks))

    if "rse" in which:
        rse = retriever.model_copy(update={"mode": "segments", **before})
        methods["rse"] = lambda q: spans_of(rse.invoke(q, k=100))

    # The offline reranker stand-in: the library's EmbeddingReranker (cosine of the same
    # model's embeddings of the enriched chunk text, sigmoid-calibrated).
    reranker = EmbeddingReranker(embeddings=vs.embeddings)
    if "hybrid+rerank" in which:
        reranked = retriever.model_copy(
            update={"mode": "chunks", "candidate_pool": pool, "reranker": reranker, **before}
        )
        methods["hybrid+rerank"] = lambda q: spans_of(reranked.invoke(q, k=n_chunks))
    # The default pipeline with the reranker and its preset, with and without focus.
    with_reranker = {"mode": "segments", "reranker": reranker,
                     "rse_params": rerank_params or get_preset("reranked")}  # fmt: skip
    if "default+rerank" in which:
        default_rr = retriever.model_copy(update=with_reranker)
        methods["default+rerank"] = lambda q: spans_of(default_rr.invoke(q, k=100))
    if "default+rerank(no focus)" in which:
        unfocused_rr = retriever.model_copy(update={**with_reranker, "router": no_focus})
        methods["default+rerank(no focus)"] = lambda q: spans_of(unfocused_rr.invoke(q, k=100))
    if "rse+rerank" in which:
        rse_rr = retriever.model_copy(update={**before, **with_reranker})
        methods["rse+rerank"] = lambda q: spans_of(rse_rr.invoke(q, k=100))
    if router is not None:
        # The library's document routing: top document only, dense-only fusion inside it.
        routed = {"router": DocumentRouter(retriever=router), "weights": (1.0, 0.0)}
        if "dense+route" in which:
            chunks_routed = retriever.model_copy(update={**routed, "mode": "chunks"})
            methods["dense+route"] = lambda q: spans_of(chunks_routed.invoke(q, k=n_chunks))
        if "rse+route" in which:
            rse_routed = retriever.model_copy(
                update={**routed, "mode": "segments", "rse_params": route_params}
            )
            methods["rse+route"] = lambda q: spans_of(rse_routed.invoke(q, k=100))
    return methods


TUNED = {
    "rse tuned, dense only (lib)": {"weights": (1.0, 0.0)},
    "dense + route (proto)": {"mode": "dense", "route": "title"},
    "rse tuned + route (proto)": {"route": "title", "weights": (1.0, 0.0)},
}
"""Extra rows from the sweeps (``tune_cuad.py``), replayed exactly; ``proto`` rows use
document routing, which the library does not have yet."""


def tuned_methods(
    data: CuadSubset, retriever: RSERetriever, embeddings: CachedEmbeddings, params: RSEParams
) -> dict[str, Method]:
    from tune_cuad import Config, corpus_of, precompute, run_query

    corpus = corpus_of(retriever)
    by_text = dict(zip((q.text for q in data.queries), precompute(data, corpus, embeddings)))
    methods: dict[str, Method] = {}
    for name, overrides in TUNED.items():
        cfg = Config(params=params, **overrides)  # type: ignore[arg-type]
        methods[name] = lambda q, c=cfg: run_query(c, corpus, by_text[q])
    return methods


def evaluate(
    data: CuadSubset, methods: dict[str, Method], budgets: Sequence[int] = BUDGETS
) -> dict[str, dict[str, Any]]:
    """Per method: per-budget mean recall / precision / returned chars and per-query values."""
    results: dict[str, dict[str, Any]] = {}
    for name, method in methods.items():
        t0 = time.perf_counter()
        per_budget: dict[int, dict[str, list[float]]] = {
            b: {"recall": [], "precision": [], "chars": [], "wrong_doc": []} for b in budgets
        }
        for q in data.queries:
            ranked = method(q.text)
            for b in budgets:
                cut = cut_at_budget(ranked, b)
                r, p = recall_precision(q.gold, cut)
                per_budget[b]["recall"].append(r)
                per_budget[b]["precision"].append(p)
                chars = sum(e - s for _, s, e in cut)
                per_budget[b]["chars"].append(chars)
                gold_files = {f for f, _, _ in q.gold}
                off = sum(e - s for f, s, e in cut if f not in gold_files)
                per_budget[b]["wrong_doc"].append(off / chars if chars else 0.0)
        seconds = time.perf_counter() - t0
        log(f"{name}: {seconds:.1f}s for {len(data.queries)} queries")
        results[name] = {
            "seconds_per_query": seconds / max(len(data.queries), 1),
            "budgets": {
                str(b): {
                    "recall": _mean(v["recall"]),
                    "precision": _mean(v["precision"]),
                    "chars": _mean(v["chars"]),
                    "wrong_doc": _mean(v["wrong_doc"]),
                    "recall_se": bootstrap_se(v["recall"]),
                    "per_query_recall": v["recall"],
                    "per_query_precision": v["precision"],
                }
                for b, v in per_budget.items()
            },
        }
    return results


def _mean(xs: Sequence[float]) -> float:
    return float(sum(xs) / len(xs)) if xs else math.nan


def report(
    results: dict[str, dict[str, Any]],
    budgets: Sequence[int] = BUDGETS,
    by_half: dict[str, list[int]] | None = None,
) -> str:
    """The method × budget table and the ratios to dense at the target budget (also per
    half of the contracts, when ``by_half`` gives the halves' query positions)."""
    header = ["method", *[f"{b // 1000}k R / P (%)" for b in budgets], "chars@4k",
              "wrong doc @4k (%)", "s/query"]  # fmt: skip
    rows = []
    for name, res in results.items():
        cells = [
            f"{100 * res['budgets'][str(b)]['recall']:.1f} / "
            f"{100 * res['budgets'][str(b)]['precision']:.2f}"
            for b in budgets
        ]
        at = res["budgets"][str(TARGET_BUDGET)]
        rows.append([name, *cells, f"{at['chars']:.0f}", f"{100 * at['wrong_doc']:.1f}",
                     f"{res['seconds_per_query']:.3f}"])  # fmt: skip
    lines = [fmt_table(header, rows)]
    se = max(r["budgets"][str(TARGET_BUDGET)]["recall_se"] for r in results.values())
    lines.append(f"\nbootstrap s.e. of recall@4k: up to {100 * se:.1f} points")
    if "dense" in results:
        base = results["dense"]["budgets"][str(TARGET_BUDGET)]
        for name, res in results.items():
            if name == "dense":
                continue
            cur = res["budgets"][str(TARGET_BUDGET)]
            line = (
                f"{name} / dense at 4k: recall x{cur['recall'] / base['recall']:.2f}, "
                f"precision x{cur['precision'] / base['precision']:.2f}"
            )
            for h, idx in (by_half or {}).items():
                r, p = (_mean([cur[f"per_query_{m}"][i] for i in idx])
                        / _mean([base[f"per_query_{m}"][i] for i in idx])
                        for m in ("recall", "precision"))  # fmt: skip
                line += f"; half {h} x{r:.2f} / x{p:.2f}"
            lines.append(line)
    return "\n".join(lines)


def plot(results: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    """Recall vs budget per method (PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(11, 4.2))
    for name, res in results.items():
        budgets = sorted(int(b) for b in res["budgets"])
        recall = [100 * res["budgets"][str(b)]["recall"] for b in budgets]
        precision = [100 * res["budgets"][str(b)]["precision"] for b in budgets]
        style = "-" if name.startswith("rse") else "--"
        axes[0].plot(budgets, recall, style, marker="o", label=name)
        axes[1].plot(budgets, precision, style, marker="o", label=name)
    for ax, metric in zip(axes, ("character recall (%)", "character precision (%)")):
        ax.set_xscale("log", base=2)
        ax.set_xticks(list(BUDGETS), [f"{b // 1000}k" for b in BUDGETS])
        ax.set_xlabel("budget of returned characters")
        ax.set_ylabel(metric)
        ax.grid(alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=120)
    log(f"wrote {path}")


def parse_rse(text: str | None, preset: str, decay: float | None) -> RSEParams:
    """Preset, then ``--decay``, then ``--rse key=value,...`` overrides."""
    params = get_preset(preset)
    overrides: dict[str, float | int] = {}
    if decay is not None:
        overrides["decay_rate"] = decay
    for item in filter(None, (text or "").split(",")):
        key, value = item.split("=")
        key = key.strip()
        overrides[key] = int(value) if key.startswith("max_") else float(value)
    return params.with_overrides(**overrides)


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--contracts", type=int, default=DEFAULT_CONTRACTS)
    ap.add_argument("--all", action="store_true", help="all dev contracts")
    ap.add_argument("--seed", type=int, default=DEFAULT_SEED)
    ap.add_argument(
        "--untuned",
        action="store_true",
        help="sample among the dev contracts outside the default sample (never tuned on)",
    )
    ap.add_argument("--chunk-size", type=int, default=DEFAULT_CHUNK_SIZE)
    ap.add_argument("--enricher", default="header", help="header | lead | none")
    ap.add_argument("--preset", default="default")
    ap.add_argument("--decay", type=float, default=None, help="rank->relevance decay rate")
    ap.add_argument("--rse", default=None, help="RSEParams overrides, e.g. max_segment_chunks=4")
    ap.add_argument("--fusion", default="rrf")
    ap.add_argument("--weights", default="2,1", help="dense,lexical fusion weights")
    ap.add_argument("--fetch-k", type=int, default=50)
    ap.add_argument("--candidate-pool", type=int, default=50)
    ap.add_argument(
        "--methods",
        default="dense,bm25,ensemble(split),ensemble(tokenize),hybrid,rse,default",
        help="comma-separated subset of the methods (also: default(chunks), default(no focus), "
        "default+rerank, default+rerank(no focus); hybrid+rerank, "
        "rse+rerank, with the offline EmbeddingReranker; dense+route, rse+route, with "
        "document routing)",
    )
    ap.add_argument(
        "--rerank-rse",
        default=None,
        help="RSEParams for rse+rerank, as --rse (default: the 'reranked' preset)",
    )
    ap.add_argument(
        "--route-rse",
        default="max_segment_chunks=2,min_segment_value=0.3",
        help="RSEParams overrides (on --preset) for rse+route",
    )
    ap.add_argument(
        "--tuned",
        default=None,
        help="RSEParams for extra tuned rows (replayed; 'proto' rows route to the top "
        "document), e.g. max_segment_chunks=2,min_segment_value=0.3",
    )
    ap.add_argument(
        "--wording",
        default="consider",
        choices=WORDINGS,
        help="consider: CUAD's questions; asked: one question naming the contract, then an "
        "instruction; question: that question alone",
    )
    ap.add_argument("--tag", default=None, help="name of the JSON/PNG outputs")
    ap.add_argument("--no-plot", action="store_true")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)

    data = reworded(
        load_cuad(None if args.all else args.contracts, args.seed, args.untuned), args.wording
    )
    n_chars = sum(len(t) for t in data.contracts.values())
    n_queries = len(data.queries)
    log(f"{len(data.contracts)} contracts ({n_chars / 1e6:.2f}M chars), {n_queries} queries")
    inner, model_name = base_embeddings()
    embeddings = CachedEmbeddings(inner, model_name)
    embeddings.embed_array([q.text for q in data.queries], "query")  # batched, cached
    params = parse_rse(args.rse, args.preset, args.decay)
    dense_w, lexical_w = (float(x) for x in args.weights.split(","))
    retriever = build_retriever(
        data,
        embeddings,
        chunk_size=args.chunk_size,
        enricher=make_enricher(args.enricher),
        rse_params=params,
        fusion=args.fusion,
        weights=(dense_w, lexical_w),
        fetch_k=args.fetch_k,
        candidate_pool=args.candidate_pool,
    )
    n_chunks = math.ceil(1.6 * max(BUDGETS) / args.chunk_size) + 4
    rerank_params = (
        None if args.rerank_rse is None else parse_rse(args.rerank_rse, args.preset, args.decay)
    )
    route_params = parse_rse(args.route_rse, args.preset, args.decay)
    which = args.methods.split(",")
    router = build_router(data, embeddings) if any("+route" in m for m in which) else None
    methods = make_methods(retriever, n_chunks, which, rerank_params, router, route_params)
    if args.tuned is not None:
        tuned = parse_rse(args.tuned, args.preset, args.decay)
        methods.update(tuned_methods(data, retriever, embeddings, tuned))
    results = evaluate(data, methods)

    subset = "all" if args.all else f"{len(data.contracts)} (seed {args.seed})"
    if args.untuned:
        subset += ", outside the default sample"
    config = (
        f"CUAD dev, contracts: {subset}, queries: {len(data.queries)} ({args.wording}), "
        f"chunk_size={args.chunk_size}, enricher={args.enricher}, fusion={args.fusion}, "
        f"weights={args.weights}, fetch_k={args.fetch_k}, candidate_pool={args.candidate_pool}, "
        f"rse={params}"
    )
    if args.tuned is not None:
        config += f"; tuned rows: {tuned}"
    if any("+rerank" in m for m in methods):
        rr = rerank_params or get_preset("reranked")
        config += f"; rerank: EmbeddingReranker defaults, rse+rerank={rr}"
    if any("+route" in m for m in methods):
        config += f"; route: top document, weights 1,0, rse+route={route_params}"
    print(config)
    print(report(results, by_half=halves(data)))
    tag = args.tag or f"cuad_{len(data.contracts)}_{args.chunk_size}_{args.enricher}"
    (CACHE_DIR / "results").mkdir(parents=True, exist_ok=True)
    out = {"config": config, "args": vars(args), "results": results}
    (CACHE_DIR / "results" / f"{tag}.json").write_text(json.dumps(out), encoding="utf-8")
    if not args.no_plot:
        plot(results, RESULTS_DIR / f"{tag}.png", config[:120] + "…")
    embeddings.close()


if __name__ == "__main__":
    main()
