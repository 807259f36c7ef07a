"""The default local vector store (FAISS, else in memory), saved in and loaded from an
index directory (:mod:`~langchain_rse.persistence.directory`)."""

from __future__ import annotations

import warnings
from typing import Any, Protocol, TypeVar, cast

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore
from pydantic import BaseModel

from langchain_rse.integrations import vectorstore_kind
from langchain_rse.persistence import schema
from langchain_rse.persistence.schema import IndexFormatError

__all__ = [
    "default_vectorstore",
    "load_vectorstore",
    "save_vectorstore",
]


M = TypeVar("M", bound=BaseModel)


class VectorFiles(Protocol):
    """What loading a vector store reads of :class:`~langchain_rse.persistence.files.IndexFiles`."""

    manifest: dict[str, Any]

    def name(self, role: str) -> str: ...

    def read(self, role: str) -> bytes: ...

    def json(self, role: str, model: type[M]) -> M: ...


class VectorWriter(Protocol):
    """What saving a vector store asks of :class:`~langchain_rse.persistence.files.SaveWriter`."""

    def add_bytes(self, role: str, ext: str, data: bytes | memoryview) -> str: ...

    def add_json(self, role: str, obj: object) -> str: ...


# ---------------------------------------------------------------- the local vector store


def _langchain_faiss() -> tuple[Any, Any, Any]:
    """LangChain's ``FAISS``, its ``InMemoryDocstore`` and ``DistanceStrategy``, quietly
    (``langchain-community``, which warns on import: ``pip install "langchain-rse[compat]"``)."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            from langchain_community.docstore.in_memory import InMemoryDocstore
            from langchain_community.vectorstores import FAISS
            from langchain_community.vectorstores.utils import DistanceStrategy
    except ImportError as exc:
        raise ImportError(
            "this index was saved from LangChain's FAISS store, which needs "
            'langchain-community: pip install "langchain-rse[compat]"'
        ) from exc
    return FAISS, InMemoryDocstore, DistanceStrategy


def default_vectorstore(embedding: Embeddings | None = None) -> VectorStore:
    """The default local store: exact cosine search in FAISS
    (:class:`~langchain_rse.integrations.faiss.FaissStore`), else ``InMemoryVectorStore``, over
    ``embedding`` (the bundled ``LocalEmbeddings`` when None).

    It keeps the chunks' metadata without their text, which the record store holds."""
    if embedding is None:
        from langchain_rse.embeddings import LocalEmbeddings

        embedding = LocalEmbeddings()
    try:
        import faiss  # noqa: F401
    except ImportError:
        return InMemoryVectorStore(embedding)
    from langchain_rse.integrations.faiss import FaissStore

    return FaissStore(embedding, keep_text=False)  # the chunk texts are in the record store


def save_vectorstore(vs: VectorStore, writer: VectorWriter) -> dict[str, Any]:
    """Write a local vector store's files with ``writer``; its manifest entry."""
    from langchain_rse.integrations.faiss import FaissStore

    kind = vectorstore_kind(vs)
    info: dict[str, Any] = {"kind": kind, "class": f"{type(vs).__module__}.{type(vs).__name__}"}
    if kind == "in_memory":
        store = vs.store  # type: ignore[attr-defined]
        writer.add_json(
            "vectors",
            [
                {
                    "id": k,
                    "text": v["text"],
                    "metadata": v["metadata"],
                    "vector": [float(x) for x in v["vector"]],
                }
                for k, v in store.items()
            ],
        )
    elif isinstance(vs, FaissStore):
        if vs.index is None:  # nothing added yet
            import faiss

            vs.index = faiss.IndexFlatIP(len(vs.embedding.embed_query("dimension probe")))
        writer.add_json("vectors", vs.to_json())
        writer.add_bytes("vectors_index", "faiss", vs.index_bytes())
    elif kind == "faiss":  # LangChain's FAISS
        import faiss

        ids = [vs.index_to_docstore_id[i] for i in range(len(vs.index_to_docstore_id))]  # type: ignore[attr-defined]
        docs = vs.docstore._dict  # type: ignore[attr-defined]
        documents = [{"text": docs[i].page_content, "metadata": docs[i].metadata} for i in ids]
        writer.add_json(
            "vectors",
            {
                "ids": ids,
                "docstore": "in_memory",
                "documents": documents,
                "normalize_L2": bool(vs._normalize_L2),  # type: ignore[attr-defined]
                "distance_strategy": str(vs.distance_strategy.value),  # type: ignore[attr-defined]
            },
        )
        raw: Any = faiss.serialize_index(vs.index)  # type: ignore[attr-defined]
        writer.add_bytes("vectors_index", "faiss", memoryview(raw))  # no copy of the vectors
    return info


def load_vectorstore(files: VectorFiles, embedding: Embeddings) -> VectorStore:
    """The local vector store saved in ``files`` (``ValueError`` for an external one)."""

    info = files.manifest["vectorstore"]
    kind = info["kind"]
    if kind == "in_memory":
        vs = InMemoryVectorStore(embedding)
        for rec in files.json("vectors", schema.InMemoryVectors).root:
            vs.store[rec.id] = rec.model_dump()
        return vs
    if kind == "faiss":
        import faiss

        data = files.json("vectors", schema.FaissVectors)
        raw = files.read("vectors_index")
        name = files.name("vectors_index")
        try:
            index = faiss.deserialize_index(np.frombuffer(raw, dtype=np.uint8))
        except RuntimeError as exc:
            raise IndexFormatError(f"the FAISS index file {name!r} cannot be read: {exc}") from None
        if index.ntotal != len(data.ids):
            raise IndexFormatError(
                f"the FAISS index file {name!r} and {files.name('vectors')!r} disagree in size"
            )
        if str(info["class"]).rsplit(".", 1)[-1] == "FaissStore":
            from langchain_rse.integrations.faiss import FaissStore

            try:
                return FaissStore.from_saved(embedding, data.model_dump(), index)
            except ValueError as exc:
                raise IndexFormatError(f"{files.name('vectors')!r}: {exc}") from None
        FAISS, InMemoryDocstore, DistanceStrategy = _langchain_faiss()
        store = InMemoryDocstore(
            {
                # (LangChain's FAISS is saved with its texts; None fails as it did)
                i: Document(page_content=cast(str, d.text), metadata=d.metadata, id=i)
                for i, d in zip(data.ids, data.documents)
            }
        )
        return FAISS(  # type: ignore[no-any-return]
            embedding,
            index,
            store,
            dict(enumerate(data.ids)),
            normalize_L2=data.normalize_L2,
            distance_strategy=DistanceStrategy(data.distance_strategy),
        )
    raise ValueError(
        f"this index uses an external vector store ({info.get('class')}); "
        "pass it with RSERetriever.load(path, vectorstore=...)"
    )
