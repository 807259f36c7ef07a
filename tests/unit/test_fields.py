"""The retriever's fields in 0.2 (issue 48): ``rse_params`` takes a preset's name,
``strict`` is the reranker's, an overlap is a splitter's; ``preset=`` and ``chunk_overlap=``
are not fields (nothing was released, so there are no aliases)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore

from conftest import corpus_documents
from helpers import HashingEmbeddings
from langchain_rse import EmbeddingReranker, RSERetriever
from langchain_rse.indexing.chunking import make_splitter
from langchain_rse.persistence import MANIFEST
from langchain_rse.segments import PRESETS, RSEParams


def _retriever(**kwargs: object) -> RSERetriever:
    return RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), **kwargs)


def test_at_most_twenty_fields() -> None:
    own = set(RSERetriever.model_fields) - set(BaseRetriever.model_fields)  # name, tags, ...
    assert len(own) <= 20, sorted(own)


def test_rse_params_takes_a_preset_name_or_parameters() -> None:
    assert _retriever(rse_params="reranked").params == PRESETS["reranked"]
    custom = RSEParams(3, 60, 0.05, 0.1, 30.0)
    assert _retriever(rse_params=custom).params == custom
    with pytest.raises(ValueError, match="unknown RSE preset") as raised:
        _retriever(rse_params="fastest")
    assert "reranked" in str(raised.value)  # the known names are listed


@pytest.mark.parametrize("old", [{"preset": "precision"}, {"chunk_overlap": 50}])
def test_the_former_fields_are_not_accepted(old: dict[str, object]) -> None:
    with pytest.raises(ValueError, match=next(iter(old))):
        _retriever(**old)


def test_preset_name_and_strict_reranker_survive_save_and_load(tmp_path: Path) -> None:
    emb = HashingEmbeddings()
    reranker = EmbeddingReranker(embeddings=emb, strict=True)
    r = RSERetriever.from_documents(
        corpus_documents(),
        embedding=emb,
        rse_params="reranked",
        reranker=reranker,
        show_progress=False,
    )
    r.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert loaded.rse_params == "reranked" and loaded.reranker is not None
    assert loaded.reranker.strict is True


def _chunks(r: RSERetriever) -> list[tuple[int, int]]:
    return sorted(
        tuple(s) for rec in r.index.records.pointers(["c0", "c1"]) if rec for s in rec.spans
    )


def _docs() -> list:
    return [d.model_copy(update={"id": f"c{i}"}) for i, d in enumerate(corpus_documents()[:2])]


def test_an_overlapping_default_splitter_saves_as_size_and_overlap(tmp_path: Path) -> None:
    r = _retriever(splitter=make_splitter(600, 50), show_progress=False)
    r.add_documents(_docs())
    r.save(tmp_path / "idx")
    config = json.loads((tmp_path / "idx" / MANIFEST).read_text())["config"]
    assert (config["chunk_size"], config["chunk_overlap"], config["custom_splitter"]) == (
        600,
        50,
        False,
    )
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())  # no splitter=
    assert loaded.params == r.params == PRESETS["default"]  # the preset a splitter chose
    loaded.add_documents([Document("A new clause. " * 80, id="new")])
    again = _retriever(splitter=make_splitter(600, 50), show_progress=False)
    again.add_documents([Document("A new clause. " * 80, id="new")])
    assert (
        loaded.index.records.pointers(["new"])[0].spans
        == again.index.records.pointers(["new"])[0].spans
    )
    versions = [p.version for p in loaded.index.records.pointers(["c0", "c1"])]
    loaded.add_documents(_docs())  # unchanged: the same splitter fingerprint, not re-indexed
    assert [p.version for p in loaded.index.records.pointers(["c0", "c1"])] == versions
