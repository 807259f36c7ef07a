"""CUAD dev split loading and indexing shared by ``bench_cuad.py`` and ``tune_cuad.py``."""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from common import CachedEmbeddings, Span, log, require_data
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rse import RSERetriever
from langchain_rse.chunking import Chunk, document_leads
from langchain_rse.enrichment import BaseEnricher, ChunkContext, NoEnricher

DEFAULT_CONTRACTS = 50
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Query:
    text: str
    gold: list[Span]
    category: str


@dataclass(frozen=True)
class CuadSubset:
    contracts: dict[str, str]
    """file name -> text (UTF-8, errors="replace")."""
    queries: list[Query]


def load_cuad(
    n_contracts: int | None = DEFAULT_CONTRACTS, seed: int = DEFAULT_SEED, untuned: bool = False
) -> CuadSubset:
    """A seeded sample of dev contracts with all their dev queries (``None``: all).

    ``untuned``: sample only among the dev contracts outside the default sample (50, seed
    0), the one every default was chosen on, to check the defaults on contracts they never saw.
    """
    root = require_data("cuad")
    dev = json.loads((root / "dev.json").read_text(encoding="utf-8"))
    files = sorted({s["file_path"] for t in dev["tests"] for s in t["snippets"]})
    if untuned:
        tuned = set(random.Random(DEFAULT_SEED).sample(files, DEFAULT_CONTRACTS))
        files = [f for f in files if f not in tuned]
    if n_contracts is not None and n_contracts < len(files):
        files = sorted(random.Random(seed).sample(files, n_contracts))
    chosen = set(files)
    contracts = {
        f: (root / "contracts" / f).read_text(encoding="utf-8", errors="replace") for f in files
    }
    queries = []
    for t in dev["tests"]:
        snippet_files = {s["file_path"] for s in t["snippets"]}
        if snippet_files <= chosen:
            gold = [(s["file_path"], s["span"][0], s["span"][1]) for s in t["snippets"]]
            queries.append(Query(t["query"], gold, t["tags"][-1]))
    return CuadSubset(contracts, queries)


def halves(data: CuadSubset) -> dict[str, list[int]]:
    """Query positions of each half: ``a`` asks about the contracts at even positions in
    name order, ``b`` about the odd ones (all stay indexed). Tune on one, check on the other."""
    names = sorted(data.contracts)
    parts = {"a": set(names[0::2]), "b": set(names[1::2])}
    return {h: [i for i, q in enumerate(data.queries) if q.gold[0][0] in part]
            for h, part in parts.items()}  # fmt: skip


WORDINGS = ("consider", "asked", "question")
"""How ``bench_cuad.py --wording`` phrases the questions: ``consider`` as CUAD does
(``Consider the <name>; <what is asked>``); ``asked`` as one question that names the
contract, then an instruction (``In the <name>, <what is asked>? Quote the contract.``), the
form of benchmarks that ask about a named filing and say how to answer; ``question`` as the
question alone (``In the <name>, <what is asked>?``)."""


def reworded(data: CuadSubset, wording: str) -> CuadSubset:
    """``data`` with its questions in ``wording`` (see :data:`WORDINGS`)."""
    if wording not in WORDINGS:
        raise ValueError(f"wording must be one of {WORDINGS}, got {wording!r}")
    if wording == "consider":
        return data
    queries = []
    for q in data.queries:
        head, sep, ask = q.text.partition("; ")
        if not sep or not head.startswith("Consider the "):
            raise ValueError(f"not a CUAD question: {q.text!r}")
        name, ask = head.removeprefix("Consider the "), ask.strip().rstrip("?.")
        text = f"In the {name}, {ask[:1].lower()}{ask[1:]}?"
        if wording == "asked":
            text += " Quote the contract."
        queries.append(Query(text, q.gold, q.category))
    return CuadSubset(data.contracts, queries)


def build_retriever(
    data: CuadSubset,
    embeddings: CachedEmbeddings,
    chunk_size: int = 600,
    enricher: BaseEnricher | None = None,
    **kwargs: Any,
) -> RSERetriever:
    """One retriever over all chosen contracts (doc id = file name)."""
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(embeddings),
        chunk_size=chunk_size,
        enricher=enricher or NoEnricher(),
        show_progress=False,
        **kwargs,
    )
    docs = contract_documents(data)
    log(f"indexing {len(docs)} contracts (chunk_size={chunk_size}, enricher={enricher!r})")
    retriever.add_documents(docs)
    log(f"indexed: {retriever!r}")
    return retriever


def contract_documents(data: CuadSubset) -> list[Document]:
    """The chosen contracts as documents (doc id = file name)."""
    return [
        Document(page_content=text, id=name, metadata={"source": name})
        for name, text in data.contracts.items()
    ]


def build_router(data: CuadSubset, embeddings: CachedEmbeddings) -> RSERetriever:
    """The library's document router over each contract's lead (``document_leads``)."""
    router = RSERetriever(
        vectorstore=InMemoryVectorStore(embeddings),
        mode="chunks",
        enricher=NoEnricher(),
        show_progress=False,
        router=None,
    )
    router.add_documents(document_leads(contract_documents(data)))
    return router


def lead_title(text: str, max_chars: int = 300) -> str:
    """The opening of a document, whitespace collapsed: for contracts, the agreement's
    name, its parties and date (what CUAD queries name)."""
    return " ".join(text[: max_chars * 4].split())[:max_chars]


class LeadEnricher(BaseEnricher):
    """``HeaderEnricher`` whose title is the document's opening ``max_chars`` characters.

    A benchmark prototype: the same effect is available today by passing
    ``metadata["title"] = lead_title(text)`` and ``HeaderEnricher(max_title_chars=300)``.
    """

    def __init__(self, max_chars: int = 300) -> None:
        from langchain_rse.enrichment import HeaderEnricher

        self.max_chars = max_chars
        self.header = HeaderEnricher(max_title_chars=max_chars)

    def enrich(
        self, doc_id: str, text: str, metadata: dict[str, Any], chunks: Sequence[Chunk]
    ) -> list[ChunkContext]:
        titled = {**metadata, "title": lead_title(text, self.max_chars)}
        return self.header.enrich(doc_id, text, titled, chunks)

    def __repr__(self) -> str:
        return f"LeadEnricher(max_chars={self.max_chars})"


def make_enricher(name: str) -> BaseEnricher:
    """``"header"`` (HeaderEnricher, when importable), ``"lead"`` or ``"none"``."""
    if name == "none":
        return NoEnricher()
    if name == "lead":
        return LeadEnricher()
    if name == "header":
        try:
            from langchain_rse.enrichment import HeaderEnricher
        except ImportError:
            log("HeaderEnricher is not importable; indexing without enrichment")
            return NoEnricher()
        return HeaderEnricher()
    raise ValueError(f"unknown enricher {name!r}; use header, lead or none")
