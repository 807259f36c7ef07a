"""Saving and loading an index directory (:func:`save_index`, :func:`load_index`): the
settings and components in the manifest, the in-process BM25 index, an in-memory record
store and a local vector store in data files (:mod:`~langchain_rse.persistence.files`)."""

from __future__ import annotations

import json
import logging
import os
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar, cast

from filelock import FileLock
from langchain_core.embeddings import Embeddings
from langchain_core.stores import BaseStore, InMemoryByteStore
from langchain_core.vectorstores import VectorStore
from langchain_text_splitters import TextSplitter

from langchain_rse.embeddings import underlying
from langchain_rse.indexing.chunking import make_splitter
from langchain_rse.indexing.records import (
    DocBody,
    Pointer,
    VersionRecord,
    body_key,
    default_splitter_params,
    local_form,
    parse_chunk_key,
    plain_form,
    pointer_key,
)
from langchain_rse.lexical import BM25Index
from langchain_rse.persistence import schema
from langchain_rse.persistence.components import describe_component, restore_components
from langchain_rse.persistence.files import (
    LOCK_FILE,
    IndexFiles,
    SaveWriter,
    read_manifest,
)
from langchain_rse.persistence.schema import IndexFormatError
from langchain_rse.persistence.vectorstores import load_vectorstore, save_vectorstore
from langchain_rse.routing import DocumentRouter
from langchain_rse.segments import RSEParams

__all__ = [
    "COMPONENTS",
    "SAVED_FIELDS",
    "SavedSettings",
    "SavedStores",
    "load_index",
    "save_index",
]

logger = logging.getLogger(__name__)

R = TypeVar("R")


SAVED_FIELDS = (
    "k",
    "mode",
    "chunk_size",
    "lexical_stemmer",
    "fetch_k",
    "weights",
    "max_document_chars",
    "max_chars",
)
COMPONENTS = ("enricher", "reranker", "router", "query_expander")


def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("langchain-rse")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _splitter_config(r: SavedSettings) -> dict[str, Any]:
    """The splitter and RSE parameters as the manifest holds them: a preset by name,
    explicit parameters as a table, and a splitter that ``make_splitter`` makes as its
    ``chunk_size`` and ``chunk_overlap`` (then with the preset in force pinned by name)."""
    from dataclasses import asdict

    params = r.rse_params
    split = default_splitter_params(r.splitter) if r.splitter is not None else None
    if split is not None and params is None:
        params = r.preset_name  # a splitter would choose "default" at load
    size, overlap = split or (r.chunk_size, 0)
    return {
        "chunk_size": size,
        "chunk_overlap": overlap,
        "custom_splitter": r.splitter is not None and split is None,
        "preset": params if isinstance(params, str) else None,
        "rse_params": asdict(params) if isinstance(params, RSEParams) else None,
    }


@dataclass(frozen=True)
class SavedSettings:
    """What a save records of the retriever's settings
    (:class:`~langchain_rse.retriever.RSERetriever` builds it)."""

    fields: dict[str, object]
    """The values of :data:`SAVED_FIELDS`."""
    components: dict[str, object]
    """The :data:`COMPONENTS`, as set."""
    splitter: TextSplitter | None
    chunk_size: int
    rse_params: RSEParams | str | None
    preset_name: str
    router: DocumentRouter | None


@dataclass(frozen=True)
class SavedStores:
    """The stores of an index a save reads (:class:`~langchain_rse.engine.Index`)."""

    vectorstore: VectorStore
    record_store: BaseStore[str, bytes]
    lexical_store: VectorStore | None
    lexical: BM25Index
    """The in-process BM25 index."""


def save_index(settings: SavedSettings, stores: SavedStores, path: str | os.PathLike[str]) -> int:
    """Write an index's own state (its ``settings`` and what ``stores`` hold in process) to
    ``path`` (see :meth:`RSERetriever.save`); returns the number of chunks saved."""
    Path(path).mkdir(parents=True, exist_ok=True)
    with FileLock(Path(path) / LOCK_FILE):  # another process's save finishes first
        return _save_index(settings, stores, SaveWriter(path))


def _save_index(settings: SavedSettings, stores: SavedStores, writer: SaveWriter) -> int:
    header, arrays = stores.lexical.export_state()
    writer.add_json("lexical", header)
    writer.add_bytes("lexical_tf", "npz", arrays)
    record_store_kind = "external"
    if isinstance(stores.record_store, InMemoryByteStore):
        record_store_kind = "embedded"
        lines = (
            json.dumps(
                [key, plain_form(key, value).decode("utf-8", "surrogatepass")], ensure_ascii=False
            )
            for key, value in stores.record_store.store.items()
        )
        writer.add_bytes("record_store", "jsonl", "\n".join(lines).encode("utf-8", "surrogatepass"))
    # A cache wrapper (cached_embeddings) is described by the model it caches.
    embeddings = underlying(getattr(stores.vectorstore, "embeddings", None))
    components = {name: describe_component(settings.components[name]) for name in COMPONENTS}
    router_spec = components["router"]
    if router_spec is not None and settings.router is not None:
        router_spec["settings"] = settings.router.settings()
    writer.commit(
        {
            "library_version": _library_version(),
            "config": {
                **{name: settings.fields[name] for name in SAVED_FIELDS},
                **_splitter_config(settings),
            },
            "components": components,
            "embedding": {
                "class": type(embeddings).__name__ if embeddings is not None else None,
                "model": getattr(embeddings, "model_name", None)
                or getattr(embeddings, "model", None),
            },
            "record_store": {
                "kind": record_store_kind,
                "class": type(stores.record_store).__name__,
            },
            "lexical": {
                "kind": "in_process" if stores.lexical_store is None else "external",
                "class": type(stores.lexical_store or stores.lexical).__name__,
            },
            "vectorstore": save_vectorstore(stores.vectorstore, writer),
            "stats": {"chunks": len(header["keys"])},
        }
    )
    return len(header["keys"])


def load_index(
    cls: Callable[..., R],
    lexical_of: Callable[[R], BM25Index],
    path: str | os.PathLike[str],
    embedding: Embeddings | None,
    vectorstore: VectorStore | None,
    record_store: BaseStore[str, bytes] | None,
    strict: bool,
    kwargs: dict[str, Any],
) -> R:
    """Rebuild a retriever (built by ``cls``; ``lexical_of``: its in-process BM25 index)
    from a directory written by :func:`save_index`.

    A save that replaces the index while it is read (and removes the files of the
    generation being read) makes it read the new generation instead."""
    directory = Path(path)
    for attempt in range(_LOAD_ATTEMPTS):
        manifest = read_manifest(directory)
        try:
            return _load_index(
                cls,
                lexical_of,
                directory,
                manifest,
                embedding,
                vectorstore,
                record_store,
                strict,
                kwargs,
            )
        except IndexFormatError:
            if attempt + 1 == _LOAD_ATTEMPTS or not _replaced(directory, manifest):
                raise
            logger.info("index at %s was replaced while it was read; reading it again", path)
    raise AssertionError("unreachable")  # pragma: no cover


_LOAD_ATTEMPTS = 5


def _replaced(directory: Path, manifest: dict[str, Any]) -> bool:
    """Whether the manifest now names another generation than ``manifest``."""
    try:
        return bool(read_manifest(directory)["generation"] != manifest["generation"])
    except (OSError, ValueError):
        return False


def _load_index(
    cls: Callable[..., R],
    lexical_of: Callable[[R], BM25Index],
    directory: Path,
    manifest: dict[str, Any],
    embedding: Embeddings | None,
    vectorstore: VectorStore | None,
    record_store: BaseStore[str, bytes] | None,
    strict: bool,
    kwargs: dict[str, Any],
) -> R:
    config = dict(manifest["config"])
    if config.pop("custom_splitter") and "splitter" not in kwargs:
        raise ValueError("this index was built with a custom splitter; pass splitter=...")
    params, preset = config.pop("rse_params"), config.pop("preset")
    config["rse_params"] = RSEParams(**params) if params else preset
    if (overlap := config.pop("chunk_overlap")) and "splitter" not in kwargs:
        config["splitter"] = make_splitter(config["chunk_size"], overlap)  # the one it made
    config["weights"] = tuple(config["weights"])
    restored = restore_components(manifest, kwargs, embedding, strict)
    kwargs = {**kwargs, **restored}
    lexical_info = manifest["lexical"]
    if lexical_info["kind"] == "external" and kwargs.get("lexical_store") is None:
        raise ValueError(
            f"this index searches an external lexical store ({lexical_info['class']}); "
            "pass lexical_store=..."
        )
    with IndexFiles(directory, manifest) as files:
        if vectorstore is None:
            if embedding is None:
                if manifest["embedding"]["class"] != "LocalEmbeddings":
                    raise ValueError(
                        f"pass embedding=... (the index was built with "
                        f"{manifest['embedding']['class']})"
                    )
                from langchain_rse.embeddings import LocalEmbeddings

                embedding = LocalEmbeddings()
            vectorstore = load_vectorstore(files, embedding)
        if record_store is None:
            if manifest["record_store"]["kind"] != "embedded":
                raise ValueError(
                    f"this index keeps its records in an external "
                    f"{manifest['record_store']['class']}; pass record_store=..."
                )
            record_store = _load_record_store(files)
        lexical = files.json("lexical")
        _check_chunk_keys(
            files.json_check("lexical", lexical, schema.Lexical).keys, files.name("lexical")
        )
        retriever = cls(vectorstore=vectorstore, record_store=record_store, **{**config, **kwargs})
        tf = files.read("lexical_tf")
        try:
            lexical_of(retriever).load_state(cast("dict[str, object]", lexical), tf)
        except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
            raise IndexFormatError(
                f"the lexical index cannot be loaded from {files.name('lexical')!r} and "
                f"{files.name('lexical_tf')!r}: {exc}"
            ) from None
        return retriever


def _check_chunk_keys(keys: list[str], name: str) -> None:
    """``IndexFormatError`` unless each key is a chunk key (doc id, version, index)."""
    for key in keys:
        try:
            if parse_chunk_key(key)[2] < 0:
                raise ValueError
        except ValueError:
            raise IndexFormatError(f"index file {name!r} holds {key!r}, not a chunk key") from None


def _load_record_store(files: IndexFiles) -> InMemoryByteStore:
    """The in-memory record store from ``record_store.<gen>.jsonl``: one ``[key, JSON record]``
    pair per line, each record checked (:func:`_check_records`)."""
    name = files.name("record_store")
    try:
        raw = files.read("record_store").decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise IndexFormatError(f"index file {name!r} is not UTF-8 text: {exc}") from None
    items: dict[str, bytes] = {}
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line:
            continue
        try:
            key, value = json.loads(line)
            if not isinstance(key, str) or not isinstance(value, str):
                raise TypeError("not a [key, JSON record] pair")
        except (ValueError, TypeError) as exc:
            raise IndexFormatError(
                f"index file {name!r} is malformed at line {number}: {exc}"
            ) from None
        if key in items:
            raise IndexFormatError(f"index file {name!r} holds the key {key!r} twice")
        items[key] = value.encode("utf-8", "surrogatepass")
    _check_records(items, name)
    store = InMemoryByteStore()
    store.mset([(key, local_form(key, value)) for key, value in items.items()])
    return store


def _check_records(items: dict[str, bytes], name: str) -> None:
    """``IndexFormatError`` unless every record decodes as the one its key names, each
    pointer is at its doc id's key, and its body is there with a context per chunk and
    every chunk span inside the text: what a query relies on."""
    pointers = []
    for key, raw in items.items():
        kind = key.split("/", 1)[0]
        try:
            if kind == "doc":
                pointer = Pointer.from_bytes(raw)
                if key != pointer_key(pointer.doc_id):
                    raise ValueError(f"it holds the pointer of {pointer.doc_id!r}")
                pointers.append(pointer)
            elif kind == "ver":
                if VersionRecord.from_bytes(raw).chunks < 0:
                    raise ValueError("a negative chunk count")
            elif kind != "body":  # (bodies: checked with their pointers, below)
                raise ValueError("not a record key")
        except ValueError as exc:
            raise IndexFormatError(
                f"index file {name!r}: the record {key!r} is bad: {exc}"
            ) from None
    for pointer in pointers:
        key = body_key(pointer.doc_id, pointer.version)
        try:
            if key not in items:
                raise ValueError("it is missing")
            body = DocBody.from_bytes(items[key])
            if len(body.contexts) != len(pointer.spans):
                raise ValueError(
                    f"{len(body.contexts)} chunk contexts for {len(pointer.spans)} chunks"
                )
            chars = body.chars
            if not all(0 <= start <= end <= chars for start, end in pointer.spans):
                raise ValueError(f"a chunk span lies outside its {chars} characters")
        except ValueError as exc:
            raise IndexFormatError(
                f"index file {name!r}: the body {key!r} of {pointer.doc_id!r} is bad: {exc}"
            ) from None
