"""A small file-backed ``BaseStore[str, bytes]`` for LLM-result caches (no pickle)."""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from langchain_core.stores import BaseStore

__all__ = ["FileByteStore", "file_store"]


class FileByteStore(BaseStore[str, bytes]):
    """A small file-backed byte store: one file per key, written atomically.

    Used for ``ContextualEnricher(cache_dir=...)`` and the embedding cache. Keys may
    contain ``[A-Za-z0-9_.-/]``; the files are laid out as ``langchain_classic``'s
    ``LocalFileStore`` lays them out (one file per key, at the key's path), so a cache
    written by either is read by the other.
    """

    _KEY = re.compile(r"^[A-Za-z0-9_.\-/]+$")

    def __init__(self, root_path: str | os.PathLike[str]) -> None:
        """Store files under ``root_path`` (created when missing)."""
        self.root_path = Path(root_path)
        self.root_path.mkdir(parents=True, exist_ok=True)

    def _path(self, key: str) -> Path:
        if not self._KEY.match(key) or ".." in key.split("/") or key.startswith("/"):
            raise ValueError(f"invalid key for FileByteStore: {key!r}")
        return self.root_path / key

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        """Values of ``keys`` (``None`` where missing)."""
        values: list[bytes | None] = []
        for key in keys:
            path = self._path(key)
            try:
                values.append(path.read_bytes())
            except FileNotFoundError:
                values.append(None)
        return values

    def mset(self, key_value_pairs: Sequence[tuple[str, bytes]]) -> None:
        """Write each value to a temporary file, then rename it into place."""
        for key, value in key_value_pairs:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-")
            try:
                with os.fdopen(fd, "wb") as handle:
                    handle.write(value)
                os.replace(tmp, path)
            except BaseException:
                Path(tmp).unlink(missing_ok=True)
                raise

    def mdelete(self, keys: Sequence[str]) -> None:
        """Delete ``keys`` (missing ones are ignored)."""
        for key in keys:
            self._path(key).unlink(missing_ok=True)

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        """All keys, or those starting with ``prefix``."""
        for path in sorted(self.root_path.rglob("*")):
            if path.is_file() and not path.name.startswith(".tmp-"):
                key = path.relative_to(self.root_path).as_posix()
                if prefix is None or key.startswith(prefix):
                    yield key


def file_store(cache_dir: str | os.PathLike[str]) -> BaseStore[str, bytes]:
    """A :class:`FileByteStore` at ``cache_dir``."""
    return FileByteStore(cache_dir)
