"""The retriever's fields in 0.2 (issue 48): ``rse_params`` takes a preset's name
(``preset=`` is a deprecated alias), ``strict`` is the reranker's, an overlap is a splitter's
(``chunk_overlap=`` a deprecated alias), and indexes saved with the old fields still load
with the same behaviour."""

from __future__ import annotations

import json
import warnings
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


def test_preset_is_a_deprecated_alias_of_rse_params() -> None:
    with pytest.warns(DeprecationWarning, match="rse_params"):
        r = _retriever(preset="precision")
    assert r.rse_params == "precision" and r.params == PRESETS["precision"]
    custom = RSEParams(3, 60, 0.05, 0.1, 30.0)
    with pytest.warns(DeprecationWarning):  # explicit parameters win, as they did
        assert _retriever(preset="precision", rse_params=custom).params == custom


@pytest.mark.parametrize("old", [{"preset": "precision"}, {"chunk_size": 600, "chunk_overlap": 50}])
def test_deprecation_warnings_point_at_the_callers_line(old: dict[str, object]) -> None:
    emb = HashingEmbeddings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        RSERetriever(vectorstore=InMemoryVectorStore(emb), **old)  # type: ignore[arg-type]
        RSERetriever.from_documents([], embedding=emb, **old)
    deprecations = [w for w in caught if w.category is DeprecationWarning]
    assert len(deprecations) == 2
    assert all(w.filename == __file__ for w in deprecations), deprecations


def test_strict_rerank_moved_to_the_reranker() -> None:
    with pytest.raises(ValueError, match="strict=True to the reranker"):
        _retriever(strict_rerank=True)
    assert EmbeddingReranker(embeddings=HashingEmbeddings(), strict=True).strict


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


def test_an_index_saved_with_preset_and_strict_rerank_loads_the_same(tmp_path: Path) -> None:
    """A 0.2 manifest: ``preset`` and ``strict_rerank`` in its config, no ``strict`` in the
    reranker's settings."""
    emb = HashingEmbeddings()
    r = RSERetriever.from_documents(
        corpus_documents(),
        embedding=emb,
        reranker=EmbeddingReranker(embeddings=emb),
        show_progress=False,
    )
    r.save(tmp_path / "idx")
    path = tmp_path / "idx" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["config"].update(preset="reranked", strict_rerank=True, rse_params=None)
    del manifest["components"]["reranker"]["settings"]["strict"]
    path.write_text(json.dumps(manifest))
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert loaded.params == PRESETS["reranked"]
    assert loaded.reranker is not None and loaded.reranker.strict is True


def _chunks(r: RSERetriever) -> list[tuple[int, int]]:
    return sorted(tuple(s) for rec in r._records.pointers(["c0", "c1"]) if rec for s in rec.spans)


def _docs() -> list:
    return [d.model_copy(update={"id": f"c{i}"}) for i, d in enumerate(corpus_documents()[:2])]


def test_chunk_overlap_is_a_deprecated_alias_of_a_splitter() -> None:
    with pytest.warns(DeprecationWarning, match="make_splitter"):
        old = _retriever(chunk_size=600, chunk_overlap=50, show_progress=False)
    new = _retriever(splitter=make_splitter(600, 50), rse_params="long_chunks", show_progress=False)
    assert old.params == new.params == PRESETS["long_chunks"]  # as chunk_size=600 chose
    old.add_documents(_docs())
    new.add_documents(_docs())
    assert _chunks(old) == _chunks(new) and _chunks(old)
    with pytest.raises(ValueError, match="chunk_overlap"), pytest.warns(DeprecationWarning):
        _retriever(chunk_size=100, chunk_overlap=100)


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
    assert loaded._records.pointers(["new"])[0].spans == again._records.pointers(["new"])[0].spans
    versions = [p.version for p in loaded._records.pointers(["c0", "c1"])]
    loaded.add_documents(_docs())  # unchanged: the same splitter fingerprint, not re-indexed
    assert [p.version for p in loaded._records.pointers(["c0", "c1"])] == versions


def test_an_index_saved_with_chunk_overlap_loads_the_same(tmp_path: Path) -> None:
    """A 0.2 manifest with ``chunk_overlap`` and no preset: the same chunks for new
    documents, the preset its chunk size chose, unchanged documents not re-indexed."""
    with pytest.warns(DeprecationWarning):
        r = _retriever(chunk_size=600, chunk_overlap=50, show_progress=False)
    r.add_documents(_docs())
    r.save(tmp_path / "idx")
    path = tmp_path / "idx" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["config"].update(preset=None, rse_params=None)  # as 0.2 saved it
    path.write_text(json.dumps(manifest))
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert loaded.params == PRESETS["long_chunks"]
    versions = [p.version for p in loaded._records.pointers(["c0", "c1"])]
    loaded.add_documents(_docs())
    assert [p.version for p in loaded._records.pointers(["c0", "c1"])] == versions
