"""Saving and loading an index directory: JSON, NumPy and FAISS files, never pickle.

Layout of an index directory::

    rse_index.json            manifest: format name and version, settings, file list
    lexical.<gen>.json        BM25 chunk keys, vocabulary and group metadata
    lexical_tf.<gen>.npz      BM25 term ids and frequencies per chunk (NumPy, no pickle)
    docstore.<gen>.jsonl      chunk-store records (only when the chunk store is in memory)
    vectors.<gen>.json        vector-store documents (+ vectors for InMemoryVectorStore)
    vectors.<gen>.faiss       FAISS index (when the vector store is FAISS)

Every data file of one save carries the same generation ``<gen>``, and its size and SHA-256
in the manifest: a load opens only regular files (non-blocking, so a named pipe cannot hold
it), refuses one of another size before reading it, and reads no more than that size.
Files are written to temporary names and renamed into place, and the manifest is replaced
last, so a process killed during ``save`` leaves the previous index loadable.
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
import stat
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any, BinaryIO, Protocol, TypeVar, cast, overload

from filelock import FileLock
from langchain_core.embeddings import Embeddings
from langchain_core.stores import BaseStore, InMemoryByteStore
from langchain_core.vectorstores import VectorStore
from langchain_text_splitters import TextSplitter
from pydantic import BaseModel, ValidationError

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
from langchain_rse.index_schema import MANIFEST, IndexFormatError
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
from langchain_rse.indexing.store import (
    default_vectorstore,
    load_vectorstore,
    save_vectorstore,
    vectorstore_kind,
)
from langchain_rse.lexical import BM25Index
from langchain_rse.routing import DocumentRouter
from langchain_rse.segments import RSEParams

logger = logging.getLogger(__name__)

M = TypeVar("M", bound=BaseModel)
R = TypeVar("R")

FORMAT_NAME = "langchain-rse-index"
FORMAT_VERSION = 2
"""Raised whenever the saved layout changes (2: no fields or files of earlier builds)."""
LOCK_FILE = ".rse_index.lock"
"""Held by :func:`save_index` for a whole save (one at a time per directory); not by loads."""
_OWN_FILE = re.compile(
    r"^(\.?(lexical|lexical_tf|docstore|vectors|vectors_index)\.[0-9a-f]{12}\.\w+(\..+\.tmp)?"
    r"|\.rse_index\.json\..+\.tmp)$"
)
"""Data files of a generation, and the temporary files they are written through."""


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


def _json_bytes(obj: object) -> bytes:
    compact = json.dumps(obj, ensure_ascii=False, separators=(",", ":"))
    return compact.encode("utf-8", "surrogatepass")


def _parse_json(data: bytes, what: str) -> object:
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
        self.files: dict[str, dict[str, str | int]] = {}

    def add_bytes(self, role: str, ext: str, data: bytes | memoryview) -> str:
        name = f"{role}.{self.gen}.{ext}"
        atomic_write(self.dir / name, data)
        self.files[role] = {
            "name": name,
            "size": memoryview(data).nbytes,
            "sha256": hashlib.sha256(data).hexdigest(),
        }
        return name

    def add_json(self, role: str, obj: object) -> str:
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


MANIFEST_MAX_BYTES = 16 * 1024 * 1024
"""Far more than a manifest holds (settings and a table of at most five files)."""


def open_regular(path: Path, max_size: int | None = None, size: int | None = None) -> BinaryIO:
    """``path`` opened for reading if it is a regular file (not a link, a named pipe or a
    device): opened non-blocking, so a named pipe cannot make the open wait for a writer,
    then checked with ``fstat``. ``IndexFormatError`` for anything else, and for a file
    larger than ``max_size`` or of another size than ``size`` (nothing is read)."""
    flags = os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOFOLLOW", 0)
    try:
        fd = os.open(path, flags | getattr(os, "O_BINARY", 0))
    except FileNotFoundError:
        raise
    except OSError as exc:  # a link (O_NOFOLLOW: ELOOP), a directory, no permission...
        raise IndexFormatError(f"{str(path)!r} cannot be read as an index file: {exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise IndexFormatError(f"{str(path)!r} is not a regular file")
        if max_size is not None and info.st_size > max_size:
            raise IndexFormatError(f"{str(path)!r} is larger than it can be ({info.st_size} bytes)")
        if size is not None and info.st_size != size:
            raise IndexFormatError(
                f"index file {path.name!r} is corrupted or truncated "
                f"({info.st_size} bytes, the manifest says {size})"
            )
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """An index directory's manifest, checked against ``index_schema.Manifest``."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"no langchain-rse index at {str(directory)!r} ({MANIFEST} missing)"
        )
    with open_regular(path, MANIFEST_MAX_BYTES) as handle:
        raw = handle.read(MANIFEST_MAX_BYTES + 1)
    if len(raw) > MANIFEST_MAX_BYTES:
        raise IndexFormatError(f"{path} is larger than a manifest can be")
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
        self._handles: dict[str, BinaryIO] = {}
        try:
            for role, entry in manifest["files"].items():
                self._handles[role] = self._open(entry["name"], entry["size"])
        except BaseException:
            self.close()
            raise

    def _open(self, name: str, size: int) -> BinaryIO:
        path = self.directory / name
        if path.is_symlink() or path.resolve().parent != self.directory.resolve():
            raise IndexFormatError(
                f"index file {name!r} is a link or lies outside {str(self.directory)!r}"
            )
        try:
            return open_regular(path, size=size)
        except FileNotFoundError:
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
        entry = self.manifest["files"][role]
        data = handle.read(entry["size"] + 1)  # (the size was checked at the open)
        if len(data) != entry["size"] or hashlib.sha256(data).hexdigest() != entry["sha256"]:
            raise IndexFormatError(
                f"index file {self.name(role)!r} is corrupted or truncated (checksum mismatch)"
            )
        return data

    @overload
    def json(self, role: str) -> object: ...

    @overload
    def json(self, role: str, model: type[M]) -> M: ...

    def json(self, role: str, model: type[M] | None = None) -> object:
        """The JSON data file for ``role``, checked against the pydantic ``model`` if given
        (then the model instance is returned)."""
        data = _parse_json(self.read(role), f"index file {self.name(role)!r}")
        return data if model is None else self.json_check(role, data, model)

    def json_check(self, role: str, data: object, model: type[M]) -> M:
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


def _library_version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("langchain-rse")
    except PackageNotFoundError:  # pragma: no cover - running from a source tree
        return "unknown"


def _splitter_config(r: SavedRetriever) -> dict[str, Any]:
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


class SavedRetriever(Protocol):
    """What a save reads of the retriever (:class:`~langchain_rse.retriever.RSERetriever`)
    besides :data:`SAVED_FIELDS` and :data:`COMPONENTS`."""

    @property
    def vectorstore(self) -> VectorStore: ...

    @property
    def docstore(self) -> BaseStore[str, bytes]: ...

    @property
    def lexical_store(self) -> VectorStore | None: ...

    @property
    def splitter(self) -> TextSplitter | None: ...

    @property
    def chunk_size(self) -> int: ...

    @property
    def rse_params(self) -> RSEParams | str | None: ...

    @property
    def preset_name(self) -> str: ...

    @property
    def router(self) -> DocumentRouter | None: ...


def save_index(retriever: SavedRetriever, lexical: BM25Index, path: str | os.PathLike[str]) -> int:
    """Write ``retriever``'s own state (``lexical``: its in-process BM25 index) to ``path``
    (see :meth:`RSERetriever.save`); returns the number of chunks saved."""
    Path(path).mkdir(parents=True, exist_ok=True)
    with FileLock(Path(path) / LOCK_FILE):  # another process's save finishes first
        return _save_index(retriever, lexical, IndexWriter(path))


def _save_index(retriever: SavedRetriever, lexical: BM25Index, writer: IndexWriter) -> int:
    header, arrays = lexical.export_state()
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
    if router_spec is not None and retriever.router is not None:
        router_spec["settings"] = retriever.router.settings()
    writer.commit(
        {
            "library_version": _library_version(),
            "config": {
                **{name: getattr(retriever, name) for name in SAVED_FIELDS},
                **_splitter_config(retriever),
            },
            "components": components,
            "embedding": {
                "class": type(embeddings).__name__ if embeddings is not None else None,
                "model": getattr(embeddings, "model_name", None)
                or getattr(embeddings, "model", None),
            },
            "docstore": {"kind": docstore_kind, "class": type(retriever.docstore).__name__},
            "lexical": {
                "kind": "in_process" if retriever.lexical_store is None else "external",
                "class": type(retriever.lexical_store or lexical).__name__,
            },
            "vectorstore": save_vectorstore(retriever.vectorstore, writer),
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
    docstore: BaseStore[str, bytes] | None,
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
                docstore,
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
    docstore: BaseStore[str, bytes] | None,
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
    restored = index_schema.restore_components(manifest, kwargs, embedding, strict)
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
        if docstore is None:
            if manifest["docstore"]["kind"] != "embedded":
                raise ValueError(
                    f"this index keeps its chunks in an external "
                    f"{manifest['docstore']['class']}; pass docstore=..."
                )
            docstore = _load_docstore(files)
        lexical = files.json("lexical")
        _check_chunk_keys(
            files.json_check("lexical", lexical, index_schema.Lexical).keys, files.name("lexical")
        )
        retriever = cls(vectorstore=vectorstore, docstore=docstore, **{**config, **kwargs})
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


def _load_docstore(files: IndexFiles) -> InMemoryByteStore:
    """The in-memory record store from ``docstore.<gen>.jsonl``: one ``[key, JSON record]``
    pair per line, each record checked (:func:`_check_records`)."""
    name = files.name("docstore")
    try:
        raw = files.read("docstore").decode("utf-8", "surrogatepass")
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
    docstore = InMemoryByteStore()
    docstore.mset([(key, local_form(key, value)) for key, value in items.items()])
    return docstore


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
