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
Saves hold ``.rse_index.lock`` (one at a time per directory). Loading checks the manifest
and each JSON file against :mod:`langchain_rse.index_schema`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import zipfile
from pathlib import Path
from typing import Any

from filelock import FileLock
from langchain_core.embeddings import Embeddings
from langchain_core.vectorstores import VectorStore
from pydantic import ValidationError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "IndexFormatError",
    "MANIFEST",
    "default_vectorstore",
    "read_manifest",
    "vectorstore_kind",
]

from langchain_rse import index_schema
from langchain_rse.embeddings import underlying
from langchain_rse.indexing.records import default_splitter_params, local_form, plain_form
from langchain_rse.indexing.store import (
    default_vectorstore,
    load_vectorstore,
    save_vectorstore,
    vectorstore_kind,
)
from langchain_rse.lexical import saved_stemmer
from langchain_rse.segments import RSEParams

logger = logging.getLogger(__name__)

FORMAT_NAME = "langchain-rse-index"
FORMAT_VERSION = 1
MANIFEST = "rse_index.json"
LOCK_FILE = ".rse_index.lock"
"""Held by :func:`save_index` for a whole save (one at a time per directory); not by loads."""
_OWN_FILE = re.compile(
    r"^(\.?(lexical|lexical_tf|docstore|vectors|vectors_index)\.[0-9a-f]{12}\.\w+(\..+\.tmp)?"
    r"|\.rse_index\.json\..+\.tmp)$"
)
"""Data files of a generation, and the temporary files they are written through."""


class IndexFormatError(ValueError):
    """An index directory that is corrupted, truncated or of an unsupported format."""


def atomic_write(path: Path, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` through a temporary file, fsync and rename. The file gets
    a new file's permissions (``0o666`` less the umask), not :func:`tempfile.mkstemp`'s
    ``0o600``: an index written for a service account is readable by it."""
    tmp = path.parent / f".{path.name}.{secrets.token_hex(6)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def _json_bytes(obj: Any) -> bytes:
    compact = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return compact.encode("utf-8", "surrogatepass")


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

    def add_json(self, role: str, obj: Any) -> str:
        return self.add_bytes(role, "json", _json_bytes(obj))

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


def _mismatch(what: str, exc: ValidationError) -> IndexFormatError:
    """The first problem pydantic found in ``what``, as an :class:`IndexFormatError`."""
    errors = exc.errors()
    first = errors[0]
    where = ".".join(str(part) for part in first["loc"]) or "the top level"
    more = f" (and {len(errors) - 1} more problem(s))" if len(errors) > 1 else ""
    return IndexFormatError(f"{what} is malformed at {where}: {first['msg']}{more}")


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """An index directory's manifest, checked against ``index_schema.Manifest``."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"no langchain-rse index at {str(directory)!r} ({MANIFEST} missing)"
        )
    raw = path.read_bytes()
    try:
        manifest = json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFormatError(f"{path} is corrupted or truncated: {exc}") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT_NAME:
        raise IndexFormatError(f"{path} is not a langchain-rse index manifest")
    version = manifest.get("format_version")
    if type(version) is not int or version != FORMAT_VERSION:
        raise IndexFormatError(
            f"{path}: index format version {version!r} is not supported by this version of "
            f"langchain-rse (it reads version {FORMAT_VERSION}); re-create the index"
        )
    try:
        index_schema.Manifest.model_validate_json(raw)
    except ValidationError as exc:
        raise _mismatch(str(path), exc) from None
    return manifest  # type: ignore[no-any-return]


class IndexFiles:
    """The data files a manifest names, opened at once (a save that replaces them later
    does not take them away) and each read once, checked against its SHA-256."""

    def __init__(self, directory: Path, manifest: dict[str, Any]) -> None:
        self.directory, self.manifest = directory, manifest
        self._handles: dict[str, Any] = {}
        try:
            for role, entry in manifest["files"].items():
                self._handles[role] = self._open(entry["name"])
        except BaseException:
            self.close()
            raise

    def _open(self, name: str) -> Any:
        path = self.directory / name
        if path.is_symlink() or path.resolve().parent != self.directory.resolve():
            raise IndexFormatError(
                f"index file {name!r} is a link or lies outside {str(self.directory)!r}"
            )
        try:
            return path.open("rb")
        except (FileNotFoundError, IsADirectoryError):
            raise IndexFormatError(
                f"index file {name!r} is missing from {str(self.directory)!r}"
            ) from None

    def close(self) -> None:
        for handle in self._handles.values():
            handle.close()

    def __enter__(self) -> IndexFiles:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def name(self, role: str) -> str:
        return str(self.manifest["files"][role]["name"])

    def read(self, role: str) -> bytes:
        """The bytes of the data file for ``role``, checked."""
        handle = self._handles.get(role)
        if handle is None:
            raise IndexFormatError(
                f"index at {str(self.directory)!r} has no {role!r} file ({MANIFEST} lacks it)"
            )
        data = handle.read()
        if hashlib.sha256(data).hexdigest() != self.manifest["files"][role]["sha256"]:
            raise IndexFormatError(
                f"index file {self.name(role)!r} is corrupted or truncated (checksum mismatch)"
            )
        return data  # type: ignore[no-any-return]

    def json(self, role: str, model: Any = None) -> Any:
        """The JSON data file for ``role``, checked against the pydantic ``model`` if given
        (then the model instance is returned)."""
        data = _parse_json(self.read(role), f"index file {self.name(role)!r}")
        return data if model is None else self.json_check(role, data, model)

    def json_check(self, role: str, data: Any, model: Any) -> Any:
        """``data`` read from the file for ``role`` as the pydantic ``model``."""
        try:
            return model.model_validate(data)
        except ValidationError as exc:
            raise _mismatch(f"index file {self.name(role)!r}", exc) from None


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
REMOVED_FIELDS = (
    "lexical_engine",
    "candidate_pool",
    "fusion",
    "rrf_k",
    "relevance",
    "code_weights",
    "code_corpus_weights",
    "max_queries",
    "max_query_chars",
    "index_batch_size",
)
"""Settings an index saved by 0.2 or before may hold, ignored since (see
``docs/decisions.md``)."""


def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("langchain-rse")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _splitter_config(r: Any) -> dict[str, Any]:
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


def save_index(retriever: Any, path: str | os.PathLike[str]) -> int:
    """Write ``retriever``'s own state to ``path`` (see :meth:`RSERetriever.save`);
    returns the number of chunks saved."""
    Path(path).mkdir(parents=True, exist_ok=True)
    with FileLock(Path(path) / LOCK_FILE):  # another process's save finishes first
        return _save_index(retriever, IndexWriter(path))


def _save_index(retriever: Any, writer: IndexWriter) -> int:

    from langchain_core.stores import InMemoryByteStore

    header, arrays = retriever._lexical.export_state()
    writer.add_json("lexical", header)
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
    components = {
        name: index_schema.describe_component(getattr(retriever, name)) for name in COMPONENTS
    }
    router_spec = components["router"]
    if router_spec is not None:
        router_spec["settings"] = retriever.router.settings()
    writer.commit(
        {
            "library_version": _library_version(),
            "config": {
                **{name: getattr(retriever, name) for name in SAVED_FIELDS},
                **_splitter_config(retriever),
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
    """Rebuild a retriever from a directory written by :func:`save_index`.

    A save that replaces the index while it is read (and removes the files of the
    generation being read) makes it read the new generation instead."""
    directory = Path(path)
    for attempt in range(_LOAD_ATTEMPTS):
        manifest = read_manifest(directory)
        try:
            return _load_index(
                cls, directory, manifest, embedding, vectorstore, docstore, strict, kwargs
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
    cls: Any,
    directory: Path,
    manifest: dict[str, Any],
    embedding: Embeddings | None,
    vectorstore: VectorStore | None,
    docstore: Any,
    strict: bool,
    kwargs: dict[str, Any],
) -> Any:
    config = dict(manifest["config"])
    for legacy in ("route_documents", "route_fetch_k", "route_check_k"):
        config.pop(legacy, None)  # saved by 0.1 (routing is one `router` object now)
    if config.get("lexical_engine") not in (None, "bm25s"):
        logger.warning(
            "this index was saved with lexical_engine=%r; BM25 is now always scored as bm25s does",
            config["lexical_engine"],
        )
    for removed in REMOVED_FIELDS:
        config.pop(removed, None)  # saved by 0.2 and before: internal constants now
    if config.pop("custom_splitter", False) and "splitter" not in kwargs:
        raise ValueError("this index was built with a custom splitter; pass splitter=...")
    params, preset = config.pop("rse_params"), config.pop("preset", None)
    config["rse_params"] = RSEParams(**params) if params else preset
    if (overlap := config.pop("chunk_overlap", 0)) and "splitter" not in kwargs:
        config = index_schema.overlap_settings(config, overlap)  # the splitter it made
    strict_rerank = config.pop("strict_rerank", False)  # older saves: the reranker's now
    config["weights"] = tuple(config["weights"])
    components = manifest.get("components")
    if components is None:  # saved by 0.1: only the enricher's class was recorded
        name = manifest["enricher"]["class"]
        module = "langchain_rse.enrichment" if name in ("NoEnricher", "HeaderEnricher") else ""
        spec = {"class": name, "module": module, "settings": {}}
        manifest["components"] = {"enricher": spec}
    restored = index_schema.restore_components(manifest, kwargs, embedding, strict)
    if strict_rerank and restored.get("reranker") is not None:
        restored["reranker"].strict = True
    kwargs = {**kwargs, **restored}
    lexical_info = manifest.get("lexical") or {"kind": "in_process"}
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
        if docstore is None:
            if manifest["docstore"]["kind"] != "embedded":
                raise ValueError(
                    f"this index keeps its chunks in an external "
                    f"{manifest['docstore']['class']}; pass docstore=..."
                )
            docstore = _load_docstore(files)
        lexical = files.json("lexical")
        arrays = isinstance(lexical, dict) and "format" in lexical
        files.json_check(
            "lexical", lexical, index_schema.Lexical if arrays else index_schema.LegacyLexical
        )
        config.setdefault("lexical_stemmer", saved_stemmer(lexical))  # saved before stemming
        retriever = cls(vectorstore=vectorstore, docstore=docstore, **{**config, **kwargs})
        if arrays:  # token ids and frequencies in an .npz
            tf = files.read("lexical_tf")
            try:
                retriever._lexical.load_state(lexical, tf)
            except (ValueError, OSError, EOFError, zipfile.BadZipFile) as exc:
                raise IndexFormatError(
                    f"the lexical index cannot be loaded from {files.name('lexical')!r} and "
                    f"{files.name('lexical_tf')!r}: {exc}"
                ) from None
            return retriever
    # Saved by earlier versions: token lists in JSON (tokenized again here).
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


def _load_docstore(files: IndexFiles) -> Any:
    """The in-memory record store from ``docstore.<gen>.jsonl``: one ``[key, JSON record]``
    pair per line."""
    from langchain_core.stores import InMemoryByteStore

    name = files.name("docstore")
    try:
        raw = files.read("docstore").decode("utf-8", "surrogatepass")
    except UnicodeDecodeError as exc:
        raise IndexFormatError(f"index file {name!r} is not UTF-8 text: {exc}") from None
    items = []
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line:
            continue
        try:
            key, value = json.loads(line)
            if not isinstance(key, str) or not isinstance(json.loads(value), dict):
                raise TypeError("not a [key, JSON object] pair")
            items.append((key, local_form(key, value.encode("utf-8", "surrogatepass"))))
        except (ValueError, TypeError, KeyError) as exc:
            raise IndexFormatError(
                f"index file {name!r} is malformed at line {number}: {exc}"
            ) from None
    if len({key for key, _ in items}) != len(items):
        raise IndexFormatError(f"index file {name!r} holds a key twice")
    docstore = InMemoryByteStore()
    docstore.mset(items)
    return docstore
