"""Without a reranker, the chunk the dense search ranks first always comes back
(``RSEParams.keep_dense_first``): BM25, fusion and segment packing never crowd it out."""

from __future__ import annotations

import pytest
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rse import RSERetriever
from langchain_rse.segments import get_preset


class TwoWordEmbeddings(Embeddings):
    """Texts are near the query as far as they mention its two words: a chunk about
    kittens that sleep is the dense search's first hit, chunks about sleep come next."""

    def _embed(self, text: str) -> list[float]:
        low = text.lower()
        return [float("kitten" in low), float("sleep" in low), 0.05]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self._embed(text)


QUERY = "where do the kittens sleep at night"
# Many touching chunks that BM25 and fusion like (they repeat the query's words), in one
# document: their long runs outweigh one exact chunk in another document.
SLEEP = "".join(
    f"Where do the animals sleep at night? Cows sleep standing, field {i}; the night is "
    f"long and where they sleep matters for the farm and for the night watch.\n"
    for i in range(14)
)
HOUSE = (
    "Household notes.\n"
    + "".join(f"Paint the fence, board {i}, with two coats of white paint.\n" for i in range(20))
    + "The kittens sleep in the basket by the stove.\n"
    + "".join(f"Sweep the yard, corner {i}, before the market opens.\n" for i in range(20))
)


def _retriever(**rse: bool) -> RSERetriever:
    docs = [
        Document(SLEEP, id="farm", metadata={"source": "farm.txt"}),
        Document(HOUSE, id="house", metadata={"source": "house.txt"}),
    ]
    return RSERetriever.from_documents(
        docs,
        vectorstore=InMemoryVectorStore(TwoWordEmbeddings()),
        k=50,
        rse_params=get_preset("default").with_overrides(**rse),
    )


def _holds_kittens(docs: list[Document]) -> bool:
    return any("kittens sleep" in d.page_content for d in docs)


@pytest.mark.parametrize("budget", [400, 700, 1000, 2000, None])
def test_the_dense_first_chunk_always_comes_back(budget: int | None) -> None:
    r = _retriever()
    first = r.vectorstore.similarity_search(QUERY, k=1)[0]
    assert "kittens sleep" in first.page_content  # the dense search's first hit
    got = r.invoke(QUERY, max_chars=budget)
    assert _holds_kittens(got)
    if budget is not None:
        assert sum(len(d.page_content) for d in got) <= budget
    for d in got:  # exact slices still
        source = r.get([d.metadata["doc_id"]])[0].page_content
        assert d.page_content == source[d.metadata["start_index"] : d.metadata["end_index"]]


def test_without_the_rule_the_runs_crowd_it_out() -> None:
    """The case above needs the rule: segment packing alone fills a small budget with
    the other document's runs."""
    off = _retriever(keep_dense_first=False)
    assert not _holds_kittens(off.invoke(QUERY, max_chars=700))
    assert _holds_kittens(_retriever().invoke(QUERY, max_chars=700))


def test_a_single_result_is_rses_best() -> None:
    """With ``k=1`` there is no room beside RSE's best segment: the rule stands aside."""
    on, off = _retriever(), _retriever(keep_dense_first=False)
    assert on.invoke(QUERY, k=1, max_chars=700) == off.invoke(QUERY, k=1, max_chars=700)
    assert not _holds_kittens(on.invoke(QUERY, k=1, max_chars=700))
