"""Properties of a query's route (:class:`langchain_rse.query.Route`), the policy a
document router gives the pipeline, and of its application to a pure fused ranking
(:func:`langchain_rse.routing.apply_route`):

* a route holds only for the routed documents with a chunk among the first ``check_k`` of
  the unrouted ranking, and not at all when none has one;
* a soft route never adds or drops a candidate: it multiplies the routed chunks' fused
  scores by its factor and sorts again, keeping each side's order;
* a keep-only route that holds leaves only the routed documents' chunks, fused as if the
  branches had returned nothing else; one whose documents no branch found does not hold;
* the first branch's first hit is always a candidate, however far a route pushed it down;
* through ``invoke``: under a keep-only route no other document's chunk comes back.

Branches are generated over doc ids with spaces, unicode and the chunk-key separator, with
repeated hits, empty branches and varied weights, ``check_k`` and pools.
"""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.fusion import Fused, candidates, fused
from langchain_rse.indexing.records import _SEP, chunk_key, doc_of
from langchain_rse.query import Route
from langchain_rse.routing import DocumentRouter, LeadIndex, apply_route, confirm

DOC_IDS = ["a", "b", "c d", "é✓", f"x{_SEP}y", "z"]

keys = st.builds(chunk_key, st.sampled_from(DOC_IDS), st.just("v"), st.integers(0, 6))
branch = st.lists(st.tuples(keys, st.none() | st.floats(0, 1)), max_size=25)
branches = st.lists(branch, min_size=1, max_size=4)
routed_docs = st.frozensets(st.sampled_from(DOC_IDS), min_size=1, max_size=3)
check_ks = st.none() | st.integers(1, 12)


def ranking_and_weights(
    bs: list[list[tuple[str, float | None]]], w: list[float]
) -> tuple[Fused, list[float]]:
    """The fusion of ``bs`` with the weights ``w`` repeated over them, and those weights."""
    weights = (w * len(bs))[: len(bs)]
    return fused(bs, weights), weights


@settings(max_examples=150)
@given(branches, routed_docs, check_ks, st.sampled_from([1.5, 3.0, math.inf]))
def test_a_route_holds_only_for_documents_the_unrouted_ranking_agrees_with(
    bs: list[list[tuple[str, float | None]]],
    docs: frozenset[str],
    check_k: int | None,
    factor: float,
) -> None:
    ranking, _ = ranking_and_weights(bs, [1.0])
    route = Route(docs, factor, check_k, focus=True)
    held = confirm(route, ranking)
    near = {doc_of(k) for k in ranking.ranked_ids(check_k)}
    if check_k is None:
        assert held is route
    elif docs & near:
        assert held == Route(docs & near, factor, None, focus=True)
        assert confirm(held, ranking) is held  # confirmed once: holds as it is
    else:
        assert held is None


@settings(max_examples=150)
@given(branches, routed_docs, st.sampled_from([1.5, 3.0, 9.0]), st.sampled_from([1.0, 4.0]))
def test_a_soft_route_only_reorders(
    bs: list[list[tuple[str, float | None]]], docs: frozenset[str], factor: float, w: float
) -> None:
    ranking, weights = ranking_and_weights(bs, [w, 1.0])
    applied, held = apply_route(Route(docs, factor), ranking, bs, weights)
    if not ranking.ids:
        return
    assert held == Route(docs, factor)
    before = {h.id: h for h in ranking.top()}
    after = applied.top()
    assert {h.id for h in after} == set(before)
    for h in after:
        inside = doc_of(h.id) in docs
        assert h.fused_score == before[h.id].fused_score * (factor if inside else 1.0)
        assert h.ranks == before[h.id].ranks
    assert [h.fused_score for h in after] == sorted((h.fused_score for h in after), reverse=True)
    for side in (True, False):  # each side keeps its order
        order = [h.id for h in ranking.top() if (doc_of(h.id) in docs) is side]
        assert [h.id for h in after if (doc_of(h.id) in docs) is side] == order


@settings(max_examples=150)
@given(branches, routed_docs, st.sampled_from([1.0, 4.0]))
def test_a_keep_only_route_never_lets_another_document_through(
    bs: list[list[tuple[str, float | None]]], docs: frozenset[str], w: float
) -> None:
    ranking, weights = ranking_and_weights(bs, [w, 1.0])
    applied, held = apply_route(Route(docs, math.inf), ranking, bs, weights)
    kept = [[h for h in b if doc_of(h[0]) in docs] for b in bs]
    if not any(kept):  # no branch found them: no route, nothing filtered
        assert held is None and applied is ranking
        return
    assert held is not None and held.keeps_only and held.segment_factor is None
    assert applied.ids and all(doc_of(i) in docs for i in applied.ids)
    assert applied.top() == fused(kept, weights).top()


@settings(max_examples=150)
@given(branches, routed_docs, st.sampled_from([1.5, 9.0]), st.integers(1, 30))
def test_the_first_branchs_first_hit_is_always_a_candidate(
    bs: list[list[tuple[str, float | None]]], docs: frozenset[str], factor: float, pool: int
) -> None:
    ranking, weights = ranking_and_weights(bs, [4.0, 1.0])
    applied, _ = apply_route(Route(docs, factor), ranking, bs, weights)
    found = candidates(applied, pool, {}, keep_first=bool(bs[0]))
    top = applied.top()
    assert [c.key for c in found[:pool]] == [h.id for h in top[:pool]]
    assert [c.fused_score for c in found[:pool]] == [h.fused_score for h in top[:pool]]
    if bs[0]:
        assert bs[0][0][0] in [c.key for c in found]
        assert len(found) <= pool + 1
    else:
        assert len(found) == min(pool, len(top))


def test_the_router_gives_its_settings_as_the_route() -> None:
    router = DocumentRouter(retriever=LeadIndex(), boost=2.0, check_k=7, focus_weight=1.5)
    assert router.policy("q", None) is None
    named = "In the Orion Supply Agreement, which law governs?"
    assert router.policy(named, {"orion"}) == Route(frozenset({"orion"}), 3.0, 7, 1.5)
    # whether a text is left once the name is cut out is decided when focusing
    assert router.policy("which law governs", {"orion"}) == Route(frozenset({"orion"}), 3.0, 7, 1.5)
    unfocused = router.model_copy(update={"focus": False})
    assert unfocused.policy(named, {"orion"}) == Route(frozenset({"orion"}), 3.0, 7)
    hard = router.model_copy(update={"boost": math.inf, "check_k": None, "focus": False})
    route = hard.policy(named, {"orion"})
    assert route == Route(frozenset({"orion"}), math.inf) and route.keeps_only


class FixedRouter(BaseRetriever):
    """A router retriever that always names one document."""

    doc_id: str

    def _get_relevant_documents(self, query, *, run_manager):  # type: ignore[no-untyped-def,override]
        return [Document("lead", id=self.doc_id)]


TOPICS = ["royalty audit", "termination notice", "warranty claims", "governing law", "insurance"]


@settings(max_examples=12)
@given(
    st.lists(st.sampled_from(TOPICS), min_size=1, max_size=4),
    st.sampled_from(["a", "é✓ doc", "c"]),
    st.sampled_from(TOPICS),
    st.integers(1, 8),
    st.sampled_from(["chunks", "segments"]),
)
def test_a_keep_only_route_returns_only_the_routed_document(
    topics: list[str], routed: str, query: str, k: int, mode: str
) -> None:
    docs = [
        Document(
            "\n\n".join(
                f"{t} clause {i} of {d}: the {t} terms apply." for i, t in enumerate(topics)
            )
            + "\n\n   \t whitespace runs and ünïcödé.",
            id=d,
        )
        for d in ("a", "é✓ doc", "c")
    ]
    router = DocumentRouter(retriever=FixedRouter(doc_id=routed), boost=math.inf, check_k=None)
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=100,
        fetch_k=100,  # every chunk is a dense hit: the routed document is always found
        router=router,
        show_progress=False,
    )
    r.add_documents(docs)
    found = r.invoke(query, k=k, mode=mode)
    assert found and {d.metadata["doc_id"] for d in found} == {routed}


@settings(max_examples=60)
@given(
    weight=st.sampled_from([0.5, 1.0, 2.0, 4.0]),
    weights=st.tuples(st.floats(0.25, 4.0), st.floats(0.25, 4.0)),
)
def test_the_focus_searches_are_fused_at_the_routes_focus_weight(
    weight: float, weights: tuple[float, float]
) -> None:
    """The query's own searches rank chunk 1 of the routed document first, the focus
    searches chunk 2: with the focus searches at ``weight`` times the query's weights,
    chunk 2 comes first exactly when ``weight`` > 1, and the fused scores are the
    reciprocal-rank sums at those weights (brute force)."""
    from langchain_rse.pipeline import Focus, QuerySettings, Search, _search_and_fuse
    from langchain_rse.query import DenseResult
    from langchain_rse.segments import get_preset

    one, two = chunk_key("a", "v", 1), chunk_key("a", "v", 2)
    s = QuerySettings(
        k=3,
        mode="chunks",
        queries=["the Orion agreement: which law"],
        weights=weights,
        candidate_pool=10,
        params=get_preset("default"),
        rerank=False,
        strict_rerank=False,
    )
    steps = _search_and_fuse(s)
    assert isinstance(next(steps), Search)
    route = Route(frozenset({"a"}), math.inf, None, weight)
    own = [(one, 0.9), (two, 0.8)]
    request = steps.send(([DenseResult(own)], [own], route))
    assert isinstance(request, Focus) and request.routed == {"a"}
    focus = [(two, 0.9), (one, 0.8)]
    try:
        steps.send(("which law", DenseResult(focus), focus))
    except StopIteration as done:
        settings_, (found, held) = done.value
    assert held == route and settings_.rerank_queries == [*s.queries, "which law"]
    rrf = lambda first, second: first / (60 + 1) + second / (60 + 2)  # noqa: E731
    w = sum(weights)
    want = {one: rrf(w, weight * w), two: rrf(weight * w, w)}
    assert {c.key: c.fused_score for c in found} == pytest.approx(want)
    if weight != 1.0:
        assert found[0].key == (two if weight > 1 else one)
