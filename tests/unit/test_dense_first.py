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


class MarkerEmbeddings(Embeddings):
    """The dense search ranks chunks by marker words: ``zebra`` first, then ``apple``, then
    ``banana``; BM25 ranks by the query's words (``apple banana``), which ``zebra`` lacks."""

    def _embed(self, text: str) -> list[float]:
        low = text.lower()
        return [float("zebra" in low), float("apple" in low), float("banana" in low), 0.05]

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return [self._embed(t) for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return [1.0, 0.6, 0.3, 0.05]


def _marker_retriever(docs: list[Document]) -> RSERetriever:
    return RSERetriever.from_documents(
        docs, vectorstore=InMemoryVectorStore(MarkerEmbeddings()), show_progress=False
    )


def test_the_dense_first_chunk_comes_back_when_its_segment_ranks_below_k() -> None:
    """Issue 54.4: RSE picks the dense search's first chunk as a segment of its own, but two
    segments that both branches like rank above it; with ``k=2`` it was cut off."""
    r = _marker_retriever(
        [
            Document("Zebra crossings stripe the old town's roads in black and white.", id="z"),
            Document("An apple and a banana make a quick snack for the road.", id="ab"),
            Document("A banana bread recipe: flour, sugar and ripe fruit.", id="b"),
        ]
    )
    got = r.invoke("apple banana", k=2)
    assert "z" in {d.metadata["doc_id"] for d in got}
    assert len(got) == 2


def test_joining_the_dense_first_chunk_to_its_neighbour_charges_the_gap() -> None:
    """Issue 54.3: the dense search's first chunk, joined to the segment that touches it,
    brought the whitespace between them into a 400-character budget uncharged (497 back)."""
    title = "Field notes, kept by the warden of the northern reserve through the dry season.\n\n"
    zebra, apples = "zebra " * 25, "apple banana " * 11
    text = title + zebra.strip() + "\n\n" + " " * 200 + "\n\n" + apples.strip()
    r = _marker_retriever([Document(text, id="t"), Document("banana split, no apple.", id="u")])
    got = r.invoke("apple banana", k=3, max_chars=400)
    assert sum(len(d.page_content) for d in got) <= 400
    assert any("zebra" in d.page_content for d in got)
    for d in got:
        assert d.page_content == text[d.metadata["start_index"] : d.metadata["end_index"]] or (
            d.metadata["doc_id"] == "u"
        )
