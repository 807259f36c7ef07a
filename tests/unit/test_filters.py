"""The metadata-filter language: parsing, evaluation, translation, and the defence in depth
that keeps a store's mistakes from leaking results."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings, make_contract
from langchain_rse import DocumentRouter, RSERetriever
from langchain_rse.filters import (
    FilterError,
    doc_ids,
    matches,
    parse,
    search_kwargs,
    to_dict,
    to_milvus_expr,
    to_pgvector,
)

META = {"tenant": "acme", "year": 2021, "score": 0.5, "public": True}


@pytest.mark.parametrize(
    ("spec", "expected"),
    [
        ({"tenant": "acme"}, True),
        ({"tenant": "globex"}, False),
        ({"tenant": {"$eq": "acme"}}, True),
        ({"tenant": {"$ne": "acme"}}, False),
        ({"missing": {"$ne": "x"}}, True),
        ({"missing": "x"}, False),
        ({"tenant": {"$in": ["globex", "acme"]}}, True),
        ({"tenant": {"$nin": ["globex", "acme"]}}, False),
        ({"year": {"$gt": 2020, "$lte": 2021}}, True),
        ({"year": {"$lt": 2021}}, False),
        ({"score": {"$gte": 0.5}}, True),
        ({"tenant": {"$gt": 1}}, False),  # not a number: no order
        ({"public": True}, True),
        ({"public": 1}, False),  # True is not 1
        ({"year": 2021.0}, True),
        ({"$or": [{"tenant": "globex"}, {"year": 2021}]}, True),
        ({"$and": [{"tenant": "acme"}, {"year": 1999}]}, False),
        ({"tenant": "acme", "year": 1999}, False),  # several keys: and
    ],
)
def test_matches(spec, expected) -> None:
    assert matches(parse(spec), META) is expected


DOC_IDS = ("a", "b", "c")
conditions = st.one_of(
    st.builds(lambda v: {"doc_id": v}, st.sampled_from(DOC_IDS)),
    st.builds(lambda v: {"doc_id": {"$in": v}}, st.lists(st.sampled_from(DOC_IDS), min_size=1)),
    st.builds(lambda v: {"doc_id": {"$ne": v}}, st.sampled_from(DOC_IDS)),
    st.builds(lambda v: {"tenant": v}, st.sampled_from(("acme", "globex"))),
)
filters = st.recursive(
    conditions,
    lambda inner: st.builds(
        lambda op, items: {op: items},
        st.sampled_from(("$and", "$or")),
        st.lists(inner, min_size=1, max_size=3),
    ),
    max_leaves=6,
)


@given(
    spec=filters,
    doc_id=st.sampled_from((*DOC_IDS, "d")),
    tenant=st.sampled_from(("acme", "globex")),
)
def test_a_filter_keeps_no_document_outside_its_doc_ids(spec, doc_id, tenant) -> None:
    """What a store may read first (only the documents :func:`doc_ids` names) loses
    nothing the filter keeps."""
    f = parse(spec)
    bound = doc_ids(f)
    if bound is not None and matches(f, {"doc_id": doc_id, "tenant": tenant}):
        assert doc_id in bound


@pytest.mark.parametrize(
    "spec",
    [
        {},
        {"$not": {"a": 1}},
        {"a": {"$like": "x"}},
        {"a": {"$in": []}},
        {"a": {"$in": "x"}},
        {"a": {"$gt": "2020"}},
        {"a": {"$gt": True}},
        {"a": [1, 2]},
        {"a": {"b": 1}},
        {"$or": []},
        {"a": None},
        {"a": {}},
    ],
)
def test_invalid_filters_are_rejected_with_the_reason(spec) -> None:
    with pytest.raises(FilterError):
        parse(spec)


def test_translations() -> None:
    f = parse({"tenant": {"$in": ["a", "b"]}, "year": {"$gte": 2020}})
    assert to_dict(f) == {"$and": [{"tenant": {"$in": ["a", "b"]}}, {"year": {"$gte": 2020}}]}
    assert to_milvus_expr(f) == '((tenant in ["a", "b"]) and (year >= 2020))'
    vs = InMemoryVectorStore(HashingEmbeddings())
    assert search_kwargs(vs, None) == {}
    keep = search_kwargs(vs, f)["filter"]
    assert keep(Document("x", metadata={"tenant": "a", "year": 2021}))
    assert not keep(Document("x", metadata={"tenant": "c", "year": 2021}))


def test_pgvector_translation_keeps_missing_keys_and_compares_as_json() -> None:
    """(Its semantics against a real PostgreSQL: tests/test_postgres.py.)"""
    missing = {"t": {"$exists": False}}
    assert to_pgvector(parse({"t": {"$ne": "a"}})) == {"$or": [{"t": {"$ne": "a"}}, missing]}
    assert to_pgvector(parse({"t": {"$nin": ["a", "b"]}})) == {
        "$or": [{"$and": [{"t": {"$ne": "a"}}, {"t": {"$ne": "b"}}]}, missing]
    }
    assert to_pgvector(parse({"t": {"$in": ["a", 1]}})) == {
        "$or": [{"t": {"$eq": "a"}}, {"t": {"$eq": 1}}]
    }
    assert to_pgvector(parse({"t": {"$in": ["a"]}, "y": {"$gt": 2}})) == {
        "$and": [{"t": {"$eq": "a"}}, {"y": {"$gt": 2}}]
    }
    with pytest.raises(FilterError, match="identifier"):
        to_pgvector(parse({"weird key": "v"}))


DOCS = [
    Document(
        make_contract("Acme", ["termination", "payment"], 3), id="acme", metadata={"tenant": "acme"}
    ),
    Document(
        make_contract("Globex", ["termination", "payment"], 3),
        id="globex",
        metadata={"tenant": "globex"},
    ),
]


def test_a_store_that_ignores_the_filter_costs_results_never_leaks() -> None:
    ignoring = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        filter_translator=lambda f: {},
        k=6,
        mode="chunks",
    )
    ignoring.add_documents(DOCS)
    found = ignoring.invoke("Globex termination", filter={"tenant": "acme"})
    assert found and {d.metadata["doc_id"] for d in found} == {"acme"}


def test_a_filter_that_cannot_be_translated_is_an_error_not_dropped() -> None:
    r = RSERetriever(vectorstore=_opaque_store(), k=2)
    r.add_documents(DOCS)
    assert r.invoke("termination")  # no filter: fine
    with pytest.raises(FilterError, match="filter_translator"):
        r.invoke("termination", filter={"tenant": "acme"})
    with pytest.raises(ValueError, match="unknown operator"):
        RSERetriever(vectorstore=_opaque_store(), filter={"tenant": {"$like": "a%"}})


def _opaque_store():
    from langchain_core.vectorstores import VectorStore

    class OpaqueStore(VectorStore):
        """A minimal external store (not a subclass of one the retriever knows)."""

        def __init__(self) -> None:
            self.inner = InMemoryVectorStore(HashingEmbeddings())

        def add_documents(self, documents, **kwargs):  # type: ignore[override]
            return self.inner.add_documents(documents, **kwargs)

        def add_texts(self, texts, metadatas=None, **kwargs):  # type: ignore[override]
            return self.inner.add_texts(texts, metadatas, **kwargs)

        def delete(self, ids=None, **kwargs):  # type: ignore[override]
            return self.inner.delete(ids)

        def similarity_search(self, query, k=4, **kwargs):  # type: ignore[override]
            return self.inner.similarity_search(query, k, **kwargs)

        @classmethod
        def from_texts(cls, texts, embedding, metadatas=None, **kwargs):  # type: ignore[override]
            raise NotImplementedError

    return OpaqueStore()


class FixedRouter(BaseRetriever):
    doc_id: str

    def _get_relevant_documents(self, query, *, run_manager):  # type: ignore[override]
        return [Document("lead", id=self.doc_id)]


def test_routing_respects_the_filter() -> None:
    router = DocumentRouter(retriever=FixedRouter(doc_id="globex"), check_k=None)
    vs = InMemoryVectorStore(HashingEmbeddings())
    r = RSERetriever(vectorstore=vs, k=4, mode="chunks", router=router)
    r.add_documents(DOCS)
    assert {d.metadata["doc_id"] for d in r.invoke("termination")} == {"globex"}
    found = r.invoke("termination", filter={"tenant": "acme"})
    assert found and {d.metadata["doc_id"] for d in found} == {"acme"}
