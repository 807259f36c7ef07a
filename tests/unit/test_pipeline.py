"""The whole pipeline in one test: enrich → hybrid search → fuse → rerank → RSE.

Real SDK clients against fakes on 127.0.0.1: ``ChatOpenAI`` writes the chunk contexts,
``cohere.ClientV2`` reranks; the embedding model is the hashing stand-in.
"""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore
from langchain_openai import ChatOpenAI

from conftest import corpus_documents
from fake_cohere_server import running_server
from fake_openai_server import FakeOpenAIServer, chunk_of
from helpers import HashingEmbeddings
from langchain_rse import CohereReranker, ContextualEnricher, RSERetriever


def context_reply(request: dict) -> str:
    chunk = chunk_of(request)
    topic = "termination" if "termination" in chunk.lower() else "other matters"
    return f"This part of the contract is about {topic}."


async def test_full_pipeline_sync_and_async(tmp_path) -> None:
    docs = corpus_documents()
    texts = {d.metadata["source"]: d.page_content for d in docs}
    with FakeOpenAIServer(reply=context_reply) as llm_server, running_server() as rerank_server:
        llm = ChatOpenAI(model="gpt-4o-mini", base_url=llm_server.base_url, api_key="sk-test")
        enricher = ContextualEnricher(llm, cache_dir=tmp_path / "contexts", show_progress=False)
        reranker = CohereReranker(api_key="co-test", base_url=rerank_server.url, timeout=20)
        retriever = RSERetriever(
            vectorstore=InMemoryVectorStore(HashingEmbeddings()),
            enricher=enricher,
            reranker=reranker,
            k=3,
        )
        retriever.add_documents(docs)
        n_chunks = len(retriever.index.lexical)
        assert enricher.usage.llm_calls == len(llm_server.requests) > 0
        # the context is indexed with the chunk (vector store text) and kept in metadata
        stored = list(retriever.vectorstore.store.values())
        assert all(v["metadata"]["enrichment"] == "llm" for v in stored)
        assert all(v["text"].startswith("This part of the contract is about") for v in stored)

        query = "termination provisions of the agreement"
        segments = retriever.invoke(query)
        assert rerank_server.requests, "the reranker was called"
        sent = rerank_server.requests[-1].body
        assert sent["query"] == query and sent["model"] == "rerank-v3.5"
        assert all(d.startswith("This part of the contract") for d in sent["documents"])
        assert segments and all("rerank_fallback" not in s.metadata for s in segments)
        for seg in segments:
            m = seg.metadata
            assert seg.page_content == texts[m["doc_id"]][m["start_index"] : m["end_index"]]
            assert "termination" in seg.page_content.lower()
        assert [(d.page_content, d.metadata) for d in await retriever.ainvoke(query)] == [
            (d.page_content, d.metadata) for d in segments
        ]

        chunks = retriever.invoke(query, mode="chunks", k=5)
        assert all("rerank_score" in c.metadata and c.metadata["context"] for c in chunks)

        # re-indexing the same documents costs no LLM call and no embedding
        calls = len(llm_server.requests)
        retriever.add_documents(docs)
        assert len(llm_server.requests) == calls and len(retriever.index.lexical) == n_chunks
        # a changed document is enriched again, only its chunks
        retriever.add_documents(
            [
                Document(
                    docs[0].page_content + "\n\nA new closing clause.", metadata=docs[0].metadata
                )
            ]
        )
        assert 0 < len(llm_server.requests) - calls <= n_chunks // 2


async def test_offline_pipeline_with_the_embedding_reranker() -> None:
    """The offline stand-in reranker: header contexts, hybrid search, cosine rerank, RSE."""
    import numpy as np

    from langchain_rse import EmbeddingReranker

    docs = corpus_documents()
    texts = {d.metadata["source"]: d.page_content for d in docs}
    embeddings = HashingEmbeddings()
    reranker = EmbeddingReranker(embeddings=embeddings, calibration="identity", rank_decay=None)
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(embeddings), reranker=reranker, k=3, rse_params="unrouted"
    )
    retriever.add_documents(docs)
    query = "termination provisions of the agreement"

    chunks = retriever.invoke(query, mode="chunks", k=5)
    q = np.asarray(embeddings.embed_query(query))
    indexed = {
        (v["metadata"]["doc_id"], v["metadata"]["chunk_index"]): v["text"]
        for v in retriever.vectorstore.store.values()
    }
    assert len(chunks) == 5
    scores = [c.metadata["rerank_score"] for c in chunks]
    assert scores == sorted(scores, reverse=True)
    for chunk in chunks:
        m = chunk.metadata
        text = indexed[(m["doc_id"], m["chunk_index"])]
        assert text.endswith(chunk.page_content)  # the enriched text was reranked
        assert m["rerank_score"] == pytest.approx(float(q @ np.asarray(embeddings._embed(text))))
        assert m["score"] == pytest.approx(max(m["rerank_score"], 0.0))

    segments = retriever.invoke(query)
    assert segments and all("rerank_fallback" not in s.metadata for s in segments)
    for seg in segments:
        m = seg.metadata
        assert seg.page_content == texts[m["doc_id"]][m["start_index"] : m["end_index"]]
    assert [(d.page_content, d.metadata) for d in await retriever.ainvoke(query)] == [
        (d.page_content, d.metadata) for d in segments
    ]
