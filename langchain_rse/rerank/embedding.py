"""An offline reranker: cosine similarity of any LangChain ``Embeddings``."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

import numpy as np
from langchain_core.callbacks import Callbacks
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from numpy.typing import NDArray
from pydantic import Field

from langchain_rse.rerank.base import RerankError, RerankResult, _WrappingReranker

__all__ = ["EmbeddingReranker"]


def _cosines(query: Sequence[float], vectors: Sequence[Sequence[float]]) -> NDArray[np.float64]:
    q = np.asarray(query, dtype=np.float64)
    m = np.asarray(vectors, dtype=np.float64).reshape(len(vectors), q.size)
    norms = np.linalg.norm(m, axis=1) * np.linalg.norm(q)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = (m @ q) / norms
    return np.nan_to_num(out, nan=0.0)


class EmbeddingReranker(_WrappingReranker):
    """Rerank by cosine similarity between the query's and each candidate's embedding.

    An offline reranker: no API key, no network, any LangChain ``Embeddings``. It is weaker
    than a cross-encoder such as Cohere's: it re-scores with a bi-encoder, and with the
    retriever's own model it restores the dense order within the fused candidates. It gives
    RSE a relevance from similarity rather than from fused rank alone. The candidate texts are
    embedded at query time (``candidate_pool`` of them per query); wrap the model in
    LangChain's ``CacheBackedEmbeddings`` to embed each chunk once.

    Example:
        .. code-block:: python

            from langchain_rse import EmbeddingReranker, RSERetriever
            from langchain_rse.embeddings import LocalEmbeddings

            retriever = RSERetriever(
                reranker=EmbeddingReranker(embeddings=LocalEmbeddings()), preset="reranked"
            )

    The default calibration is ``"minmax"`` over the candidates times a rank decay of 20
    (``exp(-rank / 20)``): on the CUAD dev split it did as well as the best absolute (sigmoid)
    calibration and, unlike one, it does not depend on where a model's cosines sit (the
    bundled multilingual-e5-small crowds them between 0.75 and 0.92; other models spread them
    elsewhere). For an absolute scale, set ``calibration="sigmoid"`` with ``sigmoid_center``
    near the cosine of a typical relevant chunk (0.84 for e5-small) and
    ``sigmoid_temperature=0.02``. See ``benchmarks/RESULTS.md``; pair it with
    ``preset="reranked"``.

    **Abstaining on off-topic questions.** Min-max is relative: the least bad candidate of any
    question gets relevance 1, so RSE always returns a segment ("a recipe for lasagna" asked of
    contracts gets a contract clause). The absolute sigmoid lets RSE's ``min_segment_value`` reject
    them: with the bundled e5-small, ``calibration="sigmoid", sigmoid_center=0.84,
    sigmoid_temperature=0.02`` and ``preset="reranked"`` returned nothing for 48 of 50 off-topic
    questions on the CUAD dev contracts with the same recall@4k on the real questions (43.2%;
    precision 4.58% vs 4.68%; ``benchmarks/bench_quality.py --offtopic``), with 600-character
    chunks; with the default 300-character chunks, whose cosines run a little higher,
    ``sigmoid_temperature=0.01`` keeps it (46 of 50, recall@4k 0.2 points lower). It is not the
    default because the centre belongs to the model: with a model whose cosines sit lower, the same
    centre would return nothing for every question. Chunk mode (``mode="chunks"``) never abstains:
    it returns the top ``k`` whatever their relevance.
    """

    embeddings: Embeddings
    """The model that embeds the query and the candidates."""
    calibration: Literal["auto", "beta", "identity", "minmax", "sigmoid"] = "minmax"
    rank_decay: float | None = Field(default=20.0, gt=0)

    def _call(self, query: str, documents: Sequence[Document], callbacks: Callbacks) -> Any:
        texts = [d.page_content for d in documents]
        return self.embeddings.embed_query(query), self.embeddings.embed_documents(texts)

    async def _acall(self, query: str, documents: Sequence[Document], callbacks: Callbacks) -> Any:
        texts = [d.page_content for d in documents]
        query_vector = await self.embeddings.aembed_query(query)
        return query_vector, await self.embeddings.aembed_documents(texts)

    def _read(self, output: tuple[list[float], list[list[float]]], n: int) -> RerankResult:
        cos = _cosines(*output)
        order = sorted(range(cos.size), key=lambda i: -cos[i])
        return self._result(order, [float(cos[i]) for i in order])

    def _failure(self, exc: BaseException, n_documents: int) -> RerankError:
        return RerankError(
            f"{type(self.embeddings).__name__} failed to embed the query or {n_documents} "
            f"candidates: {type(exc).__name__}: {exc}"
        )
