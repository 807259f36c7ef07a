"""The retriever's fields after 0.3.0 (issue 48): ``rse_params`` takes a preset's name
(``preset=`` is a deprecated alias), ``strict`` is the reranker's, and indexes saved with the
old fields still load with the same behaviour."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from langchain_core.retrievers import BaseRetriever
from langchain_core.vectorstores import InMemoryVectorStore

from conftest import corpus_documents
from helpers import HashingEmbeddings
from langchain_rse import EmbeddingReranker, RSERetriever
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


def test_strict_rerank_moved_to_the_reranker() -> None:
    with pytest.raises(ValueError, match="strict=True to the reranker"):
        _retriever(strict_rerank=True)
    assert EmbeddingReranker(embeddings=HashingEmbeddings(), strict=True).strict


def test_preset_name_and_strict_reranker_survive_save_and_load(tmp_path: Path) -> None:
    emb = HashingEmbeddings()
    reranker = EmbeddingReranker(embeddings=emb, strict=True)
    r = RSERetriever.from_documents(corpus_documents(), embedding=emb, rse_params="reranked",
                                    reranker=reranker, show_progress=False)  # fmt: skip
    r.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert loaded.rse_params == "reranked" and loaded.reranker is not None
    assert loaded.reranker.strict is True


def test_an_index_saved_with_preset_and_strict_rerank_loads_the_same(tmp_path: Path) -> None:
    """A 0.2 manifest: ``preset`` and ``strict_rerank`` in its config, no ``strict`` in the
    reranker's settings."""
    emb = HashingEmbeddings()
    r = RSERetriever.from_documents(corpus_documents(), embedding=emb,
                                    reranker=EmbeddingReranker(embeddings=emb),
                                    show_progress=False)  # fmt: skip
    r.save(tmp_path / "idx")
    path = tmp_path / "idx" / MANIFEST
    manifest = json.loads(path.read_text())
    manifest["config"].update(preset="reranked", strict_rerank=True, rse_params=None)
    del manifest["components"]["reranker"]["settings"]["strict"]
    path.write_text(json.dumps(manifest))
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert loaded.params == PRESETS["reranked"]
    assert loaded.reranker is not None and loaded.reranker.strict is True
