"""The files of an index directory: written atomically, one generation at a time
(:class:`SaveWriter`), the manifest read and checked (:func:`read_manifest`), and the data
files it names opened safely and read once, each checked against its size and SHA-256
(:class:`IndexFiles`)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import stat
from pathlib import Path
from typing import Any, BinaryIO, TypeVar, overload

from pydantic import BaseModel, ValidationError

from langchain_rse.persistence import schema
from langchain_rse.persistence.schema import MANIFEST, IndexFormatError

__all__ = [
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LOCK_FILE",
    "IndexFiles",
    "SaveWriter",
    "atomic_write",
    "open_regular",
    "read_manifest",
]

M = TypeVar("M", bound=BaseModel)

FORMAT_NAME = "langchain-rse-index"
FORMAT_VERSION = 3
"""Raised whenever the saved layout changes (2: no fields or files of earlier builds; 3: the
record store's role and manifest key are ``record_store``, the router saves no ``fetch_k``)."""
LOCK_FILE = ".rse_index.lock"
"""Held by :func:`save_index` for a whole save (one at a time per directory); not by loads."""
_OWN_FILE = re.compile(
    r"^(\.?(lexical|lexical_tf|record_store|vectors|vectors_index)\.[0-9a-f]{12}\.\w+(\..+\.tmp)?"
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


class SaveWriter:
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
    """An index directory's manifest, checked against ``schema.Manifest``."""
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
        schema.Manifest.model_validate_json(raw)
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
