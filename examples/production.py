"""Production configuration (needs OPENAI_API_KEY and COHERE_API_KEY; not run by tests).

OpenAI embeddings in FAISS, LLM-written chunk context with a persistent cache, Cohere
reranking with a deadline, and the index saved to disk without pickle.

    pip install "langchain-rse[all]"
    OPENAI_API_KEY=... COHERE_API_KEY=... python examples/production.py ./docs ./index
"""

from __future__ import annotations

import sys
from pathlib import Path

from langchain_core.documents import Document
from langchain_openai import ChatOpenAI, OpenAIEmbeddings

from langchain_rse import CohereReranker, ContextualEnricher, RSERetriever
from langchain_rse.persistence import MANIFEST, default_vectorstore


def main(docs_dir: str, index_dir: str) -> None:
    embeddings = OpenAIEmbeddings(model="text-embedding-3-small")
    enricher = ContextualEnricher(
        ChatOpenAI(model="gpt-4o-mini", temperature=0),
        cache_dir=Path(index_dir) / "context_cache",  # re-indexing unchanged text is free
        max_concurrency=8,
    )
    reranker = CohereReranker(model="rerank-v3.5", timeout=10)  # per-query deadline

    if (Path(index_dir) / MANIFEST).exists():
        retriever = RSERetriever.load(
            index_dir, embedding=embeddings, enricher=enricher, reranker=reranker
        )
    else:
        retriever = RSERetriever(
            vectorstore=default_vectorstore(embeddings),  # FAISS, exact cosine
            enricher=enricher,
            reranker=reranker,
            k=4,
        )
    docs = [
        Document(p.read_text(encoding="utf-8", errors="replace"), metadata={"source": str(p)})
        for p in sorted(Path(docs_dir).rglob("*"))
        if p.suffix in (".txt", ".md")
    ]
    retriever.add_documents(docs)  # unchanged documents are skipped
    print("enrichment usage:", enricher.usage, "failures:", enricher.failures)
    retriever.save(index_dir)

    for seg in retriever.invoke("What are the termination rights?"):
        m = seg.metadata
        print(
            m["source"],
            m["start_index"],
            m["end_index"],
            round(m["score"], 3),
            "(fallback: fused ranking)" if m.get("rerank_fallback") else "",
        )


USAGE = """usage: python examples/production.py DOCS_DIR INDEX_DIR
indexes the .txt/.md files of DOCS_DIR into INDEX_DIR (needs OPENAI_API_KEY and COHERE_API_KEY)"""

if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(USAGE, file=sys.stderr)
        sys.exit(2)
    main(sys.argv[1], sys.argv[2])
