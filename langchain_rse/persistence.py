"""Saving and loading an index directory: JSON, NumPy and FAISS files, never pickle.

Layout of an index directory::

    rse_index.json            manifest: format name and version, settings, file list
    lexical.<gen>.json        BM25 chunk keys, vocabulary and group metadata
    lexical_tf.<gen>.npz      BM25 term ids and frequencies per chunk (NumPy, no pickle)
    docstore.<gen>.jsonl      chunk-store records (only when the chunk store is in memory)
    vectors.<gen>.json        vector-store documents (+ vectors for InMemoryVectorStore)
    vectors.<gen>.faiss       FAISS index (when the vector store is FAISS)

Every data file of one save carries the same generation ``<gen>`` and a SHA-256 in the
manifest. Files are written to temporary names and renamed into place, and the manifest
is replaced last, so a process killed during ``save`` leaves the previous index loadable.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import InMemoryVectorStore, VectorStore

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "IndexFormatError",
    "MANIFEST",
    "default_vectorstore",
    "read_manifest",
]

from langchain_rse.bodies import local_form, plain_form
from langchain_rse.components import describe_component, restore_components
from langchain_rse.embedding_cache import underlying
from langchain_rse.lexical import saved_stemmer

logger = logging.getLogger(__name__)

FORMAT_NAME = "langchain-rse-index"
FORMAT_VERSION = 1
MANIFEST = "rse_index.json"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")
_OWN_FILE = re.compile(
    r"^(\.?(lexical|lexical_tf|docstore|vectors|vectors_index)\.[0-9a-f]{12}\.\w+(\..+\.tmp)?"
    r"|\.rse_index\.json\..+\.tmp)$"
)
"""Data files of a generation, and the temporary files they are written through."""


class IndexFormatError(ValueError):
    """An index directory that is corrupted, truncated or of an unsupported format."""


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
    (:class:`~langchain_rse.stores.faiss.FaissStore`), else ``InMemoryVectorStore``, over
    ``embedding`` (the bundled ``LocalEmbeddings`` when None).

    It keeps the chunks' metadata without their text, which the record store holds."""
    if embedding is None:
        from langchain_rse.embeddings import LocalEmbeddings

        embedding = LocalEmbeddings()
    try:
        import faiss  # noqa: F401
    except ImportError:
        return InMemoryVectorStore(embedding)
    from langchain_rse.stores.faiss import FaissStore

    return FaissStore(embedding, keep_text=False)  # the chunk texts are in the record store


# ---------------------------------------------------------------- file primitives


def atomic_write(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def _json_bytes(obj: Any) -> bytes:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode(
        "utf-8", "surrogatepass"
    )


def _parse_json(data: bytes, what: str) -> Any:
    try:
        return json.loads(data.decode("utf-8", "surrogatepass"))
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFormatError(f"{what} is not valid JSON: {exc}") from None


class IndexWriter:
    """Writes one generation of data files, then the manifest, then removes stale files
    (older generations, and temporary files a killed save left behind)."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.gen = secrets.token_hex(6)
        self.files: dict[str, dict[str, str]] = {}

    def add_bytes(self, role: str, ext: str, data: bytes | memoryview) -> str:
        name = f"{role}.{self.gen}.{ext}"
        atomic_write(self.dir / name, data)
        self.files[role] = {"name": name, "sha256": hashlib.sha256(data).hexdigest()}
        return name

    def commit(self, manifest: dict[str, Any]) -> None:
        manifest = {
            "format": FORMAT_NAME,
            "format_version": FORMAT_VERSION,
            "generation": self.gen,
            **manifest,
            "files": self.files,
        }
        atomic_write(self.dir / MANIFEST, json.dumps(manifest, indent=2).encode())
        keep = {f["name"] for f in self.files.values()} | {MANIFEST}
        for path in self.dir.iterdir():
            if path.is_file() and path.name not in keep and _OWN_FILE.match(path.name):
                path.unlink(missing_ok=True)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check an index directory's manifest (format, version, file names)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"no langchain-rse index at {str(directory)!r} ({MANIFEST} missing)"
        )
    try:
        manifest = json.loads(path.read_bytes())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFormatError(f"{path} is corrupted or truncated: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{path} is not a langchain-rse index manifest")
    version = manifest.get("format_version")
    if version != FORMAT_VERSION:
        raise IndexFormatError(
            f"index format version {version!r} is not supported by this version of "
            f"langchain-rse (it reads version {FORMAT_VERSION}); re-create the index"
        )
    files = manifest.get("files")
    if not isinstance(files, dict):
        raise IndexFormatError(f"{path}: the 'files' table is missing or malformed")
    for role, entry in files.items():
        name = entry.get("name") if isinstance(entry, dict) else None
        digest = entry.get("sha256") if isinstance(entry, dict) else None
        if not isinstance(name, str) or not isinstance(digest, str):
            raise IndexFormatError(f"{path}: the entry for {role!r} is malformed")
        if not _SAFE_NAME.match(name) or ".." in name:
            raise IndexFormatError(f"{path}: file name {name!r} for {role!r} is not allowed")
    return manifest


def read_checked(directory: Path, manifest: dict[str, Any], role: str) -> bytes:
    """The bytes of a data file named in the manifest, read once and checked."""
    entry = manifest["files"].get(role)
    if entry is None:
        raise IndexFormatError(f"index at {str(directory)!r} has no {role!r} file")
    path = directory / entry["name"]
    if path.is_symlink() or path.resolve().parent != directory.resolve():
        raise IndexFormatError(
            f"index file {entry['name']!r} is a link or lies outside {str(directory)!r}"
        )
    if not path.is_file():
        raise IndexFormatError(f"index file {entry['name']!r} is missing from {str(directory)!r}")
    data = path.read_bytes()
    if hashlib.sha256(data).hexdigest() != entry["sha256"]:
        raise IndexFormatError(
            f"index file {entry['name']!r} is corrupted or truncated (checksum mismatch)"
        )
    return data


def load_checked_json(directory: Path, manifest: dict[str, Any], role: str) -> Any:
    data = read_checked(directory, manifest, role)
    return _parse_json(data, f"index file {manifest['files'][role]['name']!r}")


# ---------------------------------------------------------------- vector stores


_OUR_FAISS = {"FaissStore", "LocalFAISS"}
"""The default store's class names, now and before 0.2 (LangChain's FAISS subclassed)."""


def vectorstore_kind(vs: VectorStore) -> str:
    """``"faiss"``, ``"in_memory"`` or ``"external"`` (saved elsewhere by its owner)."""
    from langchain_rse.stores.faiss import FaissStore, is_langchain_faiss

    # ours, or LangChain's FAISS itself (not a user's subclass of it)
    if isinstance(vs, FaissStore) or (is_langchain_faiss(vs) and type(vs).__name__ == "FAISS"):
        return "faiss"
    if isinstance(vs, InMemoryVectorStore):
        return "in_memory"
    return "external"


def save_vectorstore(vs: VectorStore, writer: IndexWriter) -> dict[str, Any]:
    from langchain_rse.stores.faiss import FaissStore

    kind = vectorstore_kind(vs)
    info: dict[str, Any] = {"kind": kind, "class": f"{type(vs).__module__}.{type(vs).__name__}"}
    if kind == "in_memory":
        store = vs.store  # type: ignore[attr-defined]
        writer.add_bytes(
            "vectors",
            "json",
            _json_bytes(
                [
                    {
                        "id": k,
                        "text": v["text"],
                        "metadata": v["metadata"],
                        "vector": [float(x) for x in v["vector"]],
                    }
                    for k, v in store.items()
                ]
            ),
        )
    elif isinstance(vs, FaissStore):
        if vs.index is None:  # nothing added yet
            import faiss

            vs.index = faiss.IndexFlatIP(len(vs.embedding.embed_query("dimension probe")))
        writer.add_bytes("vectors", "json", _json_bytes(vs.to_json()))
        writer.add_bytes("vectors_index", "faiss", vs.index_bytes())
    elif kind == "faiss":  # LangChain's FAISS
        import faiss

        ids = [vs.index_to_docstore_id[i] for i in range(len(vs.index_to_docstore_id))]  # type: ignore[attr-defined]
        docs = vs.docstore._dict  # type: ignore[attr-defined]
        documents = [{"text": docs[i].page_content, "metadata": docs[i].metadata} for i in ids]
        writer.add_bytes(
            "vectors",
            "json",
            _json_bytes(
                {
                    "ids": ids,
                    "docstore": "in_memory",
                    "documents": documents,
                    "normalize_L2": bool(vs._normalize_L2),  # type: ignore[attr-defined]
                    "distance_strategy": str(vs.distance_strategy.value),  # type: ignore[attr-defined]
                }
            ),
        )
        raw: Any = faiss.serialize_index(vs.index)  # type: ignore[attr-defined]
        writer.add_bytes("vectors_index", "faiss", memoryview(raw))  # no copy of the vectors
    return info


def load_vectorstore(
    directory: Path, manifest: dict[str, Any], embedding: Embeddings
) -> VectorStore:
    info = manifest["vectorstore"]
    kind = info["kind"]
    if kind == "in_memory":
        vs = InMemoryVectorStore(embedding)
        for rec in load_checked_json(directory, manifest, "vectors"):
            vs.store[rec["id"]] = {
                "id": rec["id"],
                "vector": rec["vector"],
                "text": rec["text"],
                "metadata": rec["metadata"],
            }
        return vs
    if kind == "faiss":
        import faiss

        data = load_checked_json(directory, manifest, "vectors")
        raw = read_checked(directory, manifest, "vectors_index")
        try:
            index = faiss.deserialize_index(np.frombuffer(raw, dtype=np.uint8))
        except RuntimeError as exc:
            raise IndexFormatError(f"the FAISS index file cannot be read: {exc}") from None
        if index.ntotal != len(data["ids"]):
            raise IndexFormatError("FAISS index and its documents disagree in size")
        ours = str(info.get("class", "")).rsplit(".", 1)[-1] in _OUR_FAISS
        if ours and data.get("normalize_L2"):  # (before 0.2: LocalFAISS, LangChain's format)
            from langchain_rse.stores.faiss import FaissStore

            return FaissStore.from_saved(embedding, data, index)
        FAISS, InMemoryDocstore, DistanceStrategy = _langchain_faiss()
        store = InMemoryDocstore({
            i: Document(page_content=d.get("text", ""), metadata=d["metadata"], id=i)
            for i, d in zip(data["ids"], data["documents"])
        })  # fmt: skip
        return FAISS(  # type: ignore[no-any-return]
            embedding,
            index,
            store,
            dict(enumerate(data["ids"])),
            normalize_L2=data["normalize_L2"],
            distance_strategy=DistanceStrategy(data["distance_strategy"]),
        )
    raise ValueError(
        f"this index uses an external vector store ({info.get('class')}); "
        "pass it with RSERetriever.load(path, vectorstore=...)"
    )


# ---------------------------------------------------------------- the retriever

SAVED_FIELDS = (
    "k", "mode", "chunk_size", "chunk_overlap", "strict_rerank", "lexical_engine",
    "lexical_stemmer", "fetch_k", "candidate_pool", "fusion", "weights", "code_weights",
    "code_corpus_weights", "rrf_k", "relevance", "preset", "max_queries", "max_query_chars",
    "max_document_chars", "index_batch_size", "max_chars",
)  # fmt: skip
COMPONENTS = ("enricher", "reranker", "router", "query_expander")


def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("langchain-rse")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def save_index(retriever: Any, path: str | os.PathLike[str]) -> int:
    """Write ``retriever``'s own state to ``path`` (see :meth:`RSERetriever.save`);
    returns the number of chunks saved."""
    from dataclasses import asdict

    from langchain_core.stores import InMemoryByteStore

    writer = IndexWriter(path)
    header, arrays = retriever._lexical.export_state()
    writer.add_bytes("lexical", "json", _json_bytes(header))
    writer.add_bytes("lexical_tf", "npz", arrays)
    docstore_kind = "external"
    if isinstance(retriever.docstore, InMemoryByteStore):
        docstore_kind = "embedded"
        lines = (
            json.dumps(
                [key, plain_form(key, value).decode("utf-8", "surrogatepass")], ensure_ascii=False
            )
            for key, value in retriever.docstore.store.items()
        )
        writer.add_bytes("docstore", "jsonl", "\n".join(lines).encode("utf-8", "surrogatepass"))
    # A cache wrapper (cached_embeddings) is described by the model it caches.
    embeddings = underlying(getattr(retriever.vectorstore, "embeddings", None))
    components = {name: describe_component(getattr(retriever, name)) for name in COMPONENTS}
    router_spec = components["router"]
    if router_spec is not None:
        router_spec["settings"] = retriever.router.settings()
    writer.commit(
        {
            "library_version": _library_version(),
            "config": {
                **{name: getattr(retriever, name) for name in SAVED_FIELDS},
                "rse_params": asdict(retriever.rse_params) if retriever.rse_params else None,
                "custom_splitter": retriever.splitter is not None,
            },
            "components": components,
            "enricher": {"class": type(retriever.enricher).__name__},
            "embedding": {
                "class": type(embeddings).__name__ if embeddings is not None else None,
                "model": getattr(embeddings, "model_name", None)
                or getattr(embeddings, "model", None),
            },
            "docstore": {"kind": docstore_kind, "class": type(retriever.docstore).__name__},
            "lexical": {
                "kind": "in_process" if retriever.lexical_store is None else "external",
                "class": type(retriever.lexical_store or retriever._lexical).__name__,
            },
            "vectorstore": save_vectorstore(retriever.vectorstore, writer),
            "stats": {"chunks": len(header["keys"])},
        }
    )
    return len(header["keys"])


def load_index(
    cls: Any,
    path: str | os.PathLike[str],
    embedding: Embeddings | None,
    vectorstore: VectorStore | None,
    docstore: Any,
    strict: bool,
    kwargs: dict[str, Any],
) -> Any:
    """Rebuild a retriever from a directory written by :func:`save_index`."""
    from langchain_core.stores import InMemoryByteStore

    from langchain_rse.segments import RSEParams

    directory = Path(path)
    manifest = read_manifest(directory)
    config = dict(manifest["config"])
    for legacy in ("route_documents", "route_fetch_k", "route_check_k"):
        config.pop(legacy, None)  # saved by 0.1 (routing is one `router` object now)
    if config.pop("custom_splitter", False) and "splitter" not in kwargs:
        raise ValueError("this index was built with a custom splitter; pass splitter=...")
    params = config.pop("rse_params")
    config["rse_params"] = RSEParams(**params) if params else None
    config["weights"] = tuple(config["weights"])
    for name in ("code_weights", "code_corpus_weights"):
        if config.get(name) is not None:
            config[name] = tuple(config[name])
    components = manifest.get("components")
    if components is None:  # saved by 0.1: only the enricher's class was recorded
        name = manifest["enricher"]["class"]
        module = "langchain_rse.enrichment" if name in ("NoEnricher", "HeaderEnricher") else ""
        spec = {"class": name, "module": module, "settings": {}}
        manifest["components"] = {"enricher": spec}
    kwargs = {**kwargs, **restore_components(manifest, kwargs, embedding, strict)}
    if vectorstore is None:
        if embedding is None:
            if manifest["embedding"]["class"] != "LocalEmbeddings":
                raise ValueError(
                    f"pass embedding=... (the index was built with "
                    f"{manifest['embedding']['class']})"
                )
            from langchain_rse.embeddings import LocalEmbeddings

            embedding = LocalEmbeddings()
        vectorstore = load_vectorstore(directory, manifest, embedding)
    if docstore is None:
        if manifest["docstore"]["kind"] != "embedded":
            raise ValueError(
                f"this index keeps its chunks in an external {manifest['docstore']['class']}; "
                "pass docstore=..."
            )
        docstore = InMemoryByteStore()
        raw = read_checked(directory, manifest, "docstore").decode("utf-8", "surrogatepass")
        try:
            pairs = [json.loads(line) for line in raw.splitlines() if line]
        except json.JSONDecodeError as exc:
            raise IndexFormatError(f"chunk store file is not valid JSON: {exc}") from None
        docstore.mset([(k, local_form(k, v.encode("utf-8", "surrogatepass"))) for k, v in pairs])
    lexical_info = manifest.get("lexical", {"kind": "in_process"})
    if lexical_info["kind"] == "external" and kwargs.get("lexical_store") is None:
        raise ValueError(
            f"this index searches an external lexical store ({lexical_info['class']}); "
            "pass lexical_store=..."
        )
    lexical = load_checked_json(directory, manifest, "lexical")
    if not isinstance(lexical, dict):
        raise IndexFormatError("the lexical index file is malformed")
    config.setdefault("lexical_stemmer", saved_stemmer(lexical))  # saved before stemming
    retriever = cls(vectorstore=vectorstore, docstore=docstore, **{**config, **kwargs})
    if lexical.get("format") is not None:  # token ids and frequencies in an .npz
        try:
            retriever._lexical.load_state(lexical, read_checked(directory, manifest, "lexical_tf"))
        except ValueError as exc:
            raise IndexFormatError(f"the lexical index cannot be loaded: {exc}") from None
        return retriever
    # Saved by earlier versions: token lists in JSON (tokenized again here).
    if not isinstance(lexical.get("keys"), list) or not isinstance(lexical.get("tokens"), list):
        raise IndexFormatError("the lexical index file has neither arrays nor token lists")
    groups = lexical.get("groups")
    if groups is None:  # saved by 0.1: the metadata filters check comes from the records
        from langchain_rse.lexical import group_of

        ids = sorted({group_of(key).split("\x1f")[0] for key in lexical["keys"]})
        groups = {
            group_of(record.chunk_keys()[0]): record.metadata
            for record in retriever._records.pointers(ids)
            if record is not None and record.spans
        }
    retriever._lexical.set_tokens(dict(zip(lexical["keys"], lexical["tokens"])), groups)
    return retriever
