"""Milvus as the retriever's external lexical store (``lexical_store=``).

:class:`MilvusLexicalStore` is ``langchain_milvus.Milvus`` over a collection that has no
dense vector, only Milvus's built-in BM25 function (text field -> sparse field), so its
``similarity_search_with_score`` is a BM25 search run by the Milvus server. The stock
class can already be set up that way; this subclass exists because, used as it is:

* the BM25 score's sign depends on the server: Milvus returns the BM25 score (higher is
  better) while Milvus Lite 3.x returns ``-score`` as a distance. Scores are returned as
  ``abs(score)``, higher is better on both (BM25 scores are never negative);
* an instance that opens an existing collection derives search parameters from the
  index type's defaults (``drop_ratio_build=0.2``, metric ``IP``), which BM25 search
  rejects: here the BM25 index and search parameters are always given explicitly, so a
  second process (a reader that never writes) searches the same way as the writer;
* ``delete`` logs a failure and returns ``False``; here it raises, so a failed delete
  is not silently left as orphan chunks;
* a metadata key equal to a schema field name (``pk``, ``text``, ``sparse`` by default)
  would overwrite that field in the inserted row; here it is refused.

Chunk metadata is kept as dynamic fields (``enable_dynamic_field=True``), returned by
searches and usable in filter expressions (``expr='tenant == "acme" and year >= 2020'``).
The dense branch needs no adapter: pass a stock ``Milvus`` (with the same explicit
``index_params`` in every process, so all of them pick the same relevance function).
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from langchain_core.documents import Document
from langchain_milvus import BM25BuiltInFunction, Milvus

__all__ = ["BM25_INDEX_PARAMS", "BM25_SEARCH_PARAMS", "MilvusLexicalStore"]

BM25_INDEX_PARAMS: dict[str, Any] = {
    "index_type": "SPARSE_INVERTED_INDEX",
    "metric_type": "BM25",
    "params": {},
}
BM25_SEARCH_PARAMS: dict[str, Any] = {"metric_type": "BM25", "params": {}}


class MilvusLexicalStore(Milvus):
    """A Milvus collection searched only by the server's BM25 (see the module docstring).

    Args:
        collection_name: the collection (created on the first write).
        connection_args: as for ``Milvus``, e.g. ``{"uri": "http://127.0.0.1:19530"}``.
        analyzer_params: the text field's analyzer (Milvus's default when None).
        consistency_level: ``"Strong"`` by default, so one process's writes are seen by
            the next search of another (``"Session"``, Milvus's default, only promises
            a client its own writes).
        **kwargs: passed to ``Milvus`` (``timeout``, ``drop_old``, ``text_field``, ...).
    """

    def __init__(
        self,
        collection_name: str = "RSELexical",
        connection_args: dict[str, Any] | None = None,
        *,
        analyzer_params: dict[str, Any] | None = None,
        consistency_level: str = "Strong",
        sparse_field: str = "sparse",
        **kwargs: Any,
    ) -> None:
        text_field = kwargs.pop("text_field", "text")
        function = BM25BuiltInFunction(
            input_field_names=text_field,
            output_field_names=sparse_field,
            analyzer_params=analyzer_params,
        )
        super().__init__(
            embedding_function=None,
            collection_name=collection_name,
            connection_args=connection_args,
            consistency_level=consistency_level,
            index_params=dict(BM25_INDEX_PARAMS),
            search_params=dict(BM25_SEARCH_PARAMS),
            auto_id=False,
            enable_dynamic_field=True,
            text_field=text_field,
            vector_field=sparse_field,
            builtin_function=function,
            **kwargs,
        )

    # ------------------------------------------------------------ writes

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        timeout: float | None = None,
        batch_size: int = 1000,
        *,
        ids: list[str] | None = None,
        **kwargs: object,
    ) -> list[str]:
        reserved = {self._primary_field, self._text_field, *self.vector_fields}
        for metadata in metadatas or []:
            clash = reserved.intersection(metadata)
            if clash:
                raise ValueError(
                    f"metadata keys {sorted(clash)} are field names of the Milvus "
                    f"collection {self.collection_name!r}; rename them"
                )
        return super().add_texts(
            texts, metadatas, timeout=timeout, batch_size=batch_size, ids=ids, **kwargs
        )

    def delete(self, ids: list[str] | None = None, expr: str | None = None, **kwargs: Any) -> bool:
        if ids is not None and not ids:
            return True
        if not super().delete(ids=ids, expr=expr, **kwargs):
            raise RuntimeError(
                f"could not delete from the Milvus collection {self.collection_name!r}"
            )
        return True

    # ------------------------------------------------------------ search

    def similarity_search_with_score(
        self,
        query: str,
        k: int = 4,
        param: dict | list[dict] | None = None,
        expr: str | None = None,
        timeout: float | None = None,
        **kwargs: object,
    ) -> list[tuple[Document, float]]:
        """BM25 hits, best first, with their BM25 score (higher is better); ``expr`` is a
        Milvus filter expression over the metadata (``'tenant in ["a", "b"]'``)."""
        hits = super().similarity_search_with_score(
            query, k=k, param=param, expr=expr, timeout=timeout, **kwargs
        )
        return [(doc, abs(float(score))) for doc, score in hits]

    async def asimilarity_search_with_score(
        self,
        query: str,
        k: int = 4,
        param: dict | list[dict] | None = None,
        expr: str | None = None,
        timeout: float | None = None,
        **kwargs: object,
    ) -> list[tuple[Document, float]]:
        hits = await super().asimilarity_search_with_score(
            query, k=k, param=param, expr=expr, timeout=timeout, **kwargs
        )
        return [(doc, abs(float(score))) for doc, score in hits]
