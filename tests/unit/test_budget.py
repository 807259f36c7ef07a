"""The context budget (``max_chars``): never exceeded, filled when relevant text exists."""

from __future__ import annotations

import numpy as np
import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from langchain_rse import RSERetriever
from langchain_rse.indexing.chunking import make_splitter
from langchain_rse.segments import best_segments


def brute_force(values, offsets, sizes, max_len, min_value, room):
    """The greedy picks with a size budget, straightforwardly: every run, every pick."""
    chosen, blocked = [], set()
    while True:
        best = None
        for d in range(len(offsets) - 1):
            for s in range(offsets[d], offsets[d + 1]):
                for length in range(1, max_len + 1):
                    e = s + length
                    if e > offsets[d + 1] or sum(sizes[s:e]) > room or blocked & set(range(s, e)):
                        break
                    v = sum(values[s:e])
                    if best is None or v > best[2]:
                        best = (s, e, v)
        if best is None or best[2] < min_value:
            return chosen
        chosen.append(best)
        blocked |= set(range(best[0], best[1]))
        room -= sum(sizes[best[0] : best[1]])


@pytest.mark.parametrize("seed", range(200))
def test_size_budget_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 12, size=rng.integers(1, 4))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    values = rng.normal(-0.1, 0.5, size=offsets[-1])
    sizes = rng.integers(50, 400, size=offsets[-1])
    max_len, room = int(rng.integers(1, 7)), int(rng.integers(100, 3000))
    min_value = float(rng.uniform(0, 1))
    got = best_segments(values, offsets, max_len, len(values), min_value, sizes, room)
    want = brute_force(list(values), list(offsets), list(sizes), max_len, min_value, room)
    assert [(offsets[s.doc] + s.start, offsets[s.doc] + s.end) for s in got] == [
        (a, b) for a, b, _ in want
    ]
    used = sum(int(sizes[offsets[s.doc] + s.start : offsets[s.doc] + s.end].sum()) for s in got)
    assert used <= room


def _manual(section: int) -> str:
    paragraphs = [f"Section {section}: the heating manual for model {section}.\n"]
    for p in range(12):
        paragraphs.append(
            f"To reset the boiler of model {section}, hold the reset button for {p + 3} "
            f"seconds, then check the pressure gauge reads between 1 and 2 bar (step {p}).\n"
        )
    return "\n".join(paragraphs)


@pytest.fixture(scope="module")
def retriever():
    from helpers import HashingEmbeddings

    docs = [Document(_manual(i), metadata={"source": f"m{i}.txt"}) for i in range(6)]
    return RSERetriever.from_documents(
        docs, vectorstore=InMemoryVectorStore(HashingEmbeddings()), k=50
    )


@pytest.mark.parametrize("mode", ["segments", "chunks"])
@pytest.mark.parametrize("budget", [100, 250, 700, 1500, 3000, 6000])
def test_budget_is_never_exceeded(retriever, mode: str, budget: int) -> None:
    for query in ("how to reset the boiler", "pressure gauge bar", "model 3 heating"):
        got = retriever.invoke(query, max_chars=budget, mode=mode)
        assert sum(len(d.page_content) for d in got) <= budget
        for d in got:  # still exact slices
            source = retriever.get([d.metadata["doc_id"]])[0].page_content
            assert d.page_content == source[d.metadata["start_index"] : d.metadata["end_index"]]


@pytest.mark.parametrize("budget", [1000, 2000, 4000])
def test_budget_is_filled_when_relevant_text_exists(retriever, budget: int) -> None:
    """Every chunk of every manual answers the query: the segments fill the budget up to
    less than one segment's length (at most 3 chunks of at most 300 characters)."""
    got = retriever.invoke("how to reset the boiler and check the pressure", max_chars=budget)
    used = sum(len(d.page_content) for d in got)
    assert budget - 3 * 300 <= used <= budget


def test_a_larger_budget_returns_more_text(retriever) -> None:
    """The preset's chunk budget no longer caps the text when the caller gives a budget."""
    query = "how to reset the boiler and check the pressure"
    default = sum(len(d.page_content) for d in retriever.invoke(query))
    large = sum(len(d.page_content) for d in retriever.invoke(query, max_chars=12_000))
    assert large > default


def test_k_still_bounds_the_number_of_segments(retriever) -> None:
    assert len(retriever.invoke("reset the boiler", k=2, max_chars=10_000)) <= 2


def test_the_field_and_the_argument(retriever) -> None:
    bound = retriever.model_copy(update={"max_chars": 500})
    assert sum(len(d.page_content) for d in bound.invoke("reset the boiler")) <= 500
    # the call's argument overrides the field
    assert sum(len(d.page_content) for d in bound.invoke("reset the boiler", max_chars=3000)) > 500


@pytest.mark.parametrize("bad", [0, 50, -1, 1.5, True, "1000"])
def test_a_bad_budget_is_a_clear_error(retriever, bad) -> None:
    with pytest.raises(ValueError, match="max_chars"):
        retriever.invoke("reset the boiler", max_chars=bad)


async def test_async_honours_the_budget(retriever) -> None:
    got = await retriever.ainvoke("how to reset the boiler", max_chars=800)
    assert 0 < sum(len(d.page_content) for d in got) <= 800


def test_budget_holds_with_overlapping_chunks() -> None:
    from helpers import HashingEmbeddings

    docs = [Document(_manual(i), metadata={"source": f"m{i}.txt"}) for i in range(3)]
    r = RSERetriever.from_documents(
        docs,
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        k=50,
        splitter=make_splitter(300, 80),
    )
    for budget in (300, 900, 2500):
        got = r.invoke("reset the boiler pressure", max_chars=budget)
        assert 0 < sum(len(d.page_content) for d in got) <= budget
