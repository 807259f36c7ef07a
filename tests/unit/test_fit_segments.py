"""What ``fit_segments`` does to the chosen segments, through ``RSERetriever.invoke``: no
answer left in a one-chunk gap, no bare headings
(snapping to sentence ends: ``test_properties_segments.py``)."""

from __future__ import annotations

from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.segments import get_preset

BOILER = "To reset the boiler, hold the reset button and watch the pressure gauge closely. "
OTHER = "The garden shed holds rakes, a wheelbarrow and two spare hoses for the summer. "


def _retriever(text: str, **rse: int) -> RSERetriever:
    return RSERetriever.from_documents(
        [Document(text, id="manual"), Document(OTHER * 6, id="shed")],
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        rse_params=get_preset("default").with_overrides(**rse),
        show_progress=False,
    )


# Three boiler paragraphs, one paragraph about the mail room between, three more: RSE's runs
# stop at 3 chunks, so the two runs of one section leave the middle paragraph out (a steep
# rank decay makes the middle chunk worth less than nothing in so small an index).
STEEP = {"decay_rate": 4, "decay_chars": 0}
GAP_TEXT = (
    "\n\n".join([BOILER * 3] * 3)
    + "\n\nThe answer: the mail room keeps the outbox key on the blue hook by the door.\n\n"
    + "\n\n".join([BOILER * 3] * 3)
)


def test_two_segments_a_chunk_apart_come_back_as_one() -> None:
    query = "reset the boiler pressure gauge"
    apart = _retriever(GAP_TEXT, bridge_chunks=0, **STEEP).invoke(query, max_chars=3000)
    assert len([d for d in apart if d.metadata["doc_id"] == "manual"]) == 2  # the gap
    assert not any("outbox" in d.page_content for d in apart)
    got = _retriever(GAP_TEXT, **STEEP).invoke(query, max_chars=3000)
    manual = [d for d in got if d.metadata["doc_id"] == "manual"]
    assert len(manual) == 1 and "outbox" in manual[0].page_content
    assert sum(len(d.page_content) for d in got) <= 3000


def test_no_gap_is_bridged_beyond_the_budget() -> None:
    """The same two runs under a budget that holds them but not the paragraph between."""
    query = "reset the boiler pressure gauge"
    apart = _retriever(GAP_TEXT, bridge_chunks=0, **STEEP).invoke(query, max_chars=1500)
    used = sum(len(d.page_content) for d in apart)
    got = _retriever(GAP_TEXT, **STEEP).invoke(query, max_chars=used + 20)
    assert sum(len(d.page_content) for d in got) <= used + 20
    assert not any("outbox" in d.page_content for d in got)


HEADED = "".join(  # each paragraph too long to share a chunk with its heading
    f"Sessions {i}\n==========\n\nA session stores data about a visitor on the server side, "
    f"keyed by a cookie; part {i} covers the cache and database backends in turn, then the "
    "signed cookie backend, then how long a session lives, how it expires, and how to clear "
    "the stored sessions of users who have not been back for a month or more.\n\n"
    for i in range(6)
)


def test_a_one_word_query_gets_passages_not_headings() -> None:
    r = _retriever(HEADED)
    for budget in (300, 1000, 4000, None):
        got = [
            d for d in r.invoke("sessions", max_chars=budget) if d.metadata["doc_id"] == "manual"
        ]
        assert got
        for d in got:
            assert len(d.page_content) >= 100, d.page_content
            assert "session stores data" in d.page_content
    # No control here: since headings are sections (SectionSplitter never ends a chunk on a
    # title), a bare heading no longer arises from this document even with the rule off;
    # fit_segments' growing of short results is checked on its own by
    # test_properties_segments.py.


def test_chunks_mode_with_overlapping_chunks_keeps_each_chunk() -> None:
    """With overlapping chunks, each chunk comes back as itself (its own index and span)."""
    from langchain_rse.indexing.chunking import make_splitter

    r = RSERetriever.from_documents(
        [Document(BOILER * 20, id="manual")],
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        splitter=make_splitter(300, 120),
        mode="chunks",
        show_progress=False,
    )
    spans = r.get(["manual"])[0].page_content
    for d in r.invoke("reset the boiler", k=5):
        assert d.metadata["chunk_index"] == d.metadata["chunk_start"]
        assert d.page_content == spans[d.metadata["start_index"] : d.metadata["end_index"]]


def test_a_segment_runs_longer_in_a_document_with_headings() -> None:
    """``headed_segment_chunks``: a document with line headings (here Markdown) may return
    a run of 5 chunks where the same text without headings returns 3."""
    para = "Reset the boiler by holding the reset button until the pressure gauge settles. "
    body = "\n\n".join([para * 3] * 8)
    docs = [
        Document("# Boiler manual\n\n## Resetting\n\n" + body, id="headed"),
        Document("Boiler manual.\n\nResetting.\n\n" + body, id="plain"),
    ]
    params = get_preset("default").with_overrides(merge_touching=False, bridge_chunks=0)
    r = RSERetriever.from_documents(
        docs,
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        rse_params=params,
        show_progress=False,
    )
    assert [p.headed for p in r.index.pointers(["headed", "plain"])] == [True, False]
    for doc_id, longest in (("headed", 5), ("plain", 3)):
        got = r.invoke("reset the boiler pressure gauge", k=10, filter={"doc_id": doc_id})
        assert max(d.metadata["chunk_end"] - d.metadata["chunk_start"] for d in got) == longest
