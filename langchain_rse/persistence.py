"""Saving and loading an index directory: JSON, NumPy and FAISS files, never pickle.

Layout of an index directory::

    rse_index.json            manifest: format name and version, settings, file list
    lexical.<gen>.json        BM25 tokens per chunk key
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
import os
import re
import secrets
import tempfile
import warnings
from pathlib import Path
from typing import Any

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

FORMAT_NAME = "langchain-rse-index"
FORMAT_VERSION = 1
MANIFEST = "rse_index.json"
_SAFE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,200}$")
_DATA_FILE = re.compile(r"^(lexical|docstore|vectors|vectors_index)\.[0-9a-f]{12}\.\w+$")


class IndexFormatError(ValueError):
    """An index directory that is corrupted, truncated or of an unsupported format."""


def _faiss_classes() -> tuple[Any, Any, Any, Any]:
    """Import FAISS and LangChain's wrapper, quietly (langchain-community warns on import)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import faiss
        from langchain_community.docstore.in_memory import InMemoryDocstore
        from langchain_community.vectorstores import FAISS
        from langchain_community.vectorstores.utils import DistanceStrategy
    return faiss, FAISS, InMemoryDocstore, DistanceStrategy


def default_vectorstore(embedding: Embeddings) -> VectorStore:
    """The default local store: exact cosine search in FAISS, else ``InMemoryVectorStore``."""
    try:
        faiss, FAISS, InMemoryDocstore, DistanceStrategy = _faiss_classes()
    except ImportError:
        return InMemoryVectorStore(embedding)
    dim = len(embedding.embed_query("dimension probe"))
    return FAISS(
        embedding,
        faiss.IndexFlatL2(dim),
        InMemoryDocstore({}),
        {},
        normalize_L2=True,  # L2 distance on unit vectors ranks exactly as cosine
        distance_strategy=DistanceStrategy.EUCLIDEAN_DISTANCE,
    )


# ---------------------------------------------------------------- file primitives


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def atomic_write(path: Path, data: bytes) -> None:
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


def _load_json(path: Path) -> Any:
    return json.loads(path.read_bytes().decode("utf-8", "surrogatepass"))


class IndexWriter:
    """Writes one generation of data files, then the manifest, then removes stale files."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.gen = secrets.token_hex(6)
        self.files: dict[str, dict[str, str]] = {}

    def name(self, role: str, ext: str) -> str:
        return f"{role}.{self.gen}.{ext}"

    def add_bytes(self, role: str, ext: str, data: bytes) -> str:
        name = self.name(role, ext)
        atomic_write(self.dir / name, data)
        self.files[role] = {"name": name, "sha256": hashlib.sha256(data).hexdigest()}
        return name

    def add_file(self, role: str, name: str) -> None:
        """Register a file written by other means (already renamed into place)."""
        self.files[role] = {"name": name, "sha256": _sha256(self.dir / name)}

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
            if (
                path.is_file()
                and path.name not in keep
                and re.match(
                    r"^(lexical|docstore|vectors|vectors_index)\.[0-9a-f]{12}\.\w+$", path.name
                )
            ):
                path.unlink(missing_ok=True)


def read_manifest(directory: str | os.PathLike[str]) -> dict[str, Any]:
    """Read and check an index directory's manifest (format, version, file names)."""
    path = Path(directory) / MANIFEST
    if not path.is_file():
        raise FileNotFoundError(
            f"no langchain-rse index at {str(directory)!r} ({MANIFEST} missing)"
        )
    try:
        manifest = _load_json(path)
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


def checked_path(directory: Path, manifest: dict[str, Any], role: str) -> Path:
    """The path of a data file named in the manifest, after verifying its checksum."""
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
    if _sha256(path) != entry["sha256"]:
        raise IndexFormatError(
            f"index file {entry['name']!r} is corrupted or truncated (checksum mismatch)"
        )
    return path


def load_checked_json(directory: Path, manifest: dict[str, Any], role: str) -> Any:
    path = checked_path(directory, manifest, role)
    try:
        return _load_json(path)
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise IndexFormatError(f"index file {path.name!r} is not valid JSON: {exc}") from None


# ---------------------------------------------------------------- vector stores


def vectorstore_kind(vs: VectorStore) -> str:
    """``"faiss"``, ``"in_memory"`` or ``"external"`` (saved elsewhere by its owner)."""
    if type(vs).__name__ == "FAISS" and type(vs).__module__.startswith("langchain_community"):
        return "faiss"
    if isinstance(vs, InMemoryVectorStore):
        return "in_memory"
    return "external"


def save_vectorstore(vs: VectorStore, writer: IndexWriter) -> dict[str, Any]:
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
    elif kind == "faiss":
        faiss = _faiss_classes()[0]
        ids = [vs.index_to_docstore_id[i] for i in range(len(vs.index_to_docstore_id))]  # type: ignore[attr-defined]
        docs = vs.docstore._dict  # type: ignore[attr-defined]
        writer.add_bytes(
            "vectors",
            "json",
            _json_bytes(
                {
                    "ids": ids,
                    "documents": [
                        {"text": docs[i].page_content, "metadata": docs[i].metadata} for i in ids
                    ],
                    "normalize_L2": bool(vs._normalize_L2),  # type: ignore[attr-defined]
                    "distance_strategy": str(vs.distance_strategy.value),  # type: ignore[attr-defined]
                }
            ),
        )
        name = writer.name("vectors_index", "faiss")
        tmp = writer.dir / f".{name}.tmp"
        faiss.write_index(vs.index, str(tmp))  # type: ignore[attr-defined]
        with tmp.open("rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, writer.dir / name)
        writer.add_file("vectors_index", name)
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
        faiss, FAISS, InMemoryDocstore, DistanceStrategy = _faiss_classes()
        data = load_checked_json(directory, manifest, "vectors")
        index = faiss.read_index(str(checked_path(directory, manifest, "vectors_index")))
        if index.ntotal != len(data["ids"]):
            raise IndexFormatError("FAISS index and its documents disagree in size")
        docs = {
            i: Document(page_content=d["text"], metadata=d["metadata"], id=i)
            for i, d in zip(data["ids"], data["documents"])
        }
        return FAISS(  # type: ignore[no-any-return]
            embedding,
            index,
            InMemoryDocstore(docs),
            dict(enumerate(data["ids"])),
            normalize_L2=data["normalize_L2"],
            distance_strategy=DistanceStrategy(data["distance_strategy"]),
        )
    raise ValueError(
        f"this index uses an external vector store ({info.get('class')}); "
        "pass it with RSERetriever.load(path, vectorstore=...)"
    )
