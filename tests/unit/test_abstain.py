"""Abstaining on off-topic questions: with absolute reranker scores RSE returns nothing.

``EmbeddingReranker`` with the absolute calibration measured on CUAD dev
(``benchmarks/bench_quality.py --offtopic``: sigmoid centre 0.84, temperature 0.02 for the bundled
e5-small) and ``CohereReranker`` (absolute relevance scores, here from the fake server) make
every segment of an off-topic question worth less than ``min_segment_value``, so the retriever
returns ``[]``; an on-topic question still gets its segment. The relative ``"minmax"``
calibration (the default) always gives the best candidate relevance 1 and never abstains.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from fake_cohere_server import overlap_score, running_server
from helpers import HashingEmbeddings, make_contract
from langchain_rse import DocumentRouter, EmbeddingReranker, RSERetriever
from langchain_rse.rerank import CohereReranker
from langchain_rse.routing import query_coverage

OFF_TOPIC = "What is a good recipe for lasagna?"
ON_TOPIC = "termination notice period of the supply agreement"
TOPICS = ["termination", "confidentiality", "payment terms", "governing law", "warranties"]


def corpus() -> list[Document]:
    return [
        Document(page_content=make_contract(name, TOPICS, filler_paragraphs=3), id=name)
        for name in ("supply", "licence")
    ]


@pytest.fixture(scope="module")
def e5_retriever() -> RSERetriever:
    """The bundled offline model (e5-small) indexing two small synthetic contracts."""
    from langchain_rse.embeddings import LocalEmbeddings

    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(LocalEmbeddings()),
        rse_params="reranked",
        show_progress=False,
    )
    retriever.add_documents(corpus())
    return retriever


def abstaining(retriever: RSERetriever) -> EmbeddingReranker:
    return EmbeddingReranker(
        embeddings=retriever.vectorstore.embeddings,
        calibration="sigmoid",
        sigmoid_center=0.84,
        sigmoid_temperature=0.02,
    )


def test_embedding_reranker_with_absolute_calibration_abstains(e5_retriever) -> None:
    retriever = e5_retriever.model_copy(update={"reranker": abstaining(e5_retriever)})
    assert retriever.invoke(OFF_TOPIC) == []
    found = retriever.invoke(ON_TOPIC)
    assert found, "an on-topic question must still return a segment"
    top = found[0]
    assert top.metadata["doc_id"] == "supply"
    assert "termination" in top.page_content.lower()


async def test_abstaining_holds_for_async_invoke(e5_retriever) -> None:
    retriever = e5_retriever.model_copy(update={"reranker": abstaining(e5_retriever)})
    assert await retriever.ainvoke(OFF_TOPIC) == []
    assert await retriever.ainvoke(ON_TOPIC)


def test_relative_minmax_calibration_never_abstains(e5_retriever) -> None:
    reranker = EmbeddingReranker(embeddings=e5_retriever.vectorstore.embeddings)
    assert reranker.calibration_method == "minmax"
    retriever = e5_retriever.model_copy(update={"reranker": reranker})
    assert retriever.invoke(OFF_TOPIC), "min-max gives the least bad chunk relevance 1"


def test_chunks_mode_does_not_abstain(e5_retriever) -> None:
    """Abstaining is RSE's value floor: chunk mode returns the top k whatever their scores."""
    retriever = e5_retriever.model_copy(update={"reranker": abstaining(e5_retriever)})
    assert len(retriever.invoke(OFF_TOPIC, mode="chunks", k=3)) == 3


@pytest.mark.parametrize("low", [0.0, 0.01, 0.05])
def test_cohere_low_scores_return_nothing(low: float) -> None:
    """Cohere's relevance_score is absolute: when every candidate scores low, no segment."""

    def scorer(query: str, document: str) -> float:
        return low if "lasagna" in query else overlap_score(query, document)

    with running_server(scorer) as server:
        reranker = CohereReranker(api_key="co-test", base_url=server.url, timeout=20)
        retriever = RSERetriever(
            vectorstore=InMemoryVectorStore(HashingEmbeddings()),
            reranker=reranker,
            show_progress=False,
        )
        retriever.add_documents(corpus())
        assert retriever.invoke(OFF_TOPIC) == []
        assert server.requests, "the reranker was asked"
        scored = retriever.invoke(OFF_TOPIC, mode="chunks", k=3)
        assert [d.metadata["rerank_score"] for d in scored] == pytest.approx([low] * 3)
        found = retriever.invoke(ON_TOPIC)
        assert found and "termination" in found[0].page_content.lower()


IN_ITS_WORDS = "termination provisions of the supply agreement"
"""On topic in the index's own words (``ON_TOPIC``'s "notice" is in no chunk of these two
small contracts, where it weighs more than all its other words: coverage 0.43)."""


def hashing_retriever(**kwargs: Any) -> RSERetriever:
    retriever = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), show_progress=False, **kwargs
    )
    retriever.add_documents(corpus())
    return retriever


def test_min_coverage_abstains_when_the_index_holds_too_little_of_the_query(tmp_path) -> None:
    """Without a reranker: a query whose rare words no chunk holds returns nothing."""
    assert hashing_retriever().invoke(OFF_TOPIC), "off by default: the least bad passage"
    retriever = hashing_retriever(router=DocumentRouter.leads(min_coverage=0.7))
    assert query_coverage(retriever.index.lexical, OFF_TOPIC) < 0.7
    assert retriever.invoke(OFF_TOPIC) == []
    found = retriever.invoke(IN_ITS_WORDS)
    assert found and "termination" in found[0].page_content.lower()
    retriever.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", HashingEmbeddings())
    assert loaded.router is not None and loaded.router.min_coverage == 0.7
    assert loaded.invoke(OFF_TOPIC) == []


async def test_min_coverage_abstains_for_async_invoke() -> None:
    retriever = hashing_retriever(router=DocumentRouter.leads(min_coverage=0.7))
    assert await retriever.ainvoke(OFF_TOPIC) == []
    assert await retriever.ainvoke(IN_ITS_WORDS)


@pytest.mark.parametrize("bad", [-0.1, 1.5])
def test_a_bad_min_coverage_is_a_clear_error(bad: float) -> None:
    with pytest.raises(ValueError, match="min_coverage"):
        DocumentRouter.leads(min_coverage=bad)


@pytest.fixture(scope="module")
def strict() -> RSERetriever:
    return hashing_retriever(router=DocumentRouter.leads(min_coverage=1.0))


@settings(max_examples=40)
@given(
    words=st.lists(
        st.sampled_from(sorted(set(" ".join(TOPICS).split()) | {"supply"})), min_size=1, max_size=12
    )
)
def test_a_query_of_indexed_words_is_never_abstained(
    strict: RSERetriever, words: list[str]
) -> None:
    """Even at the strictest setting, a query every word of which the index holds (phrased
    in any order, any case) gets results."""
    query = " ".join(w.upper() if i % 2 else w for i, w in enumerate(words))
    assert query_coverage(strict.index.lexical, query) == 1.0
    assert strict.invoke(query)
