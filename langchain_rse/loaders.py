"""Reading files into text for the ``langchain-rse`` command: .txt/.md, .pdf, .html, .docx.

:func:`load_documents` gives Python the documents the command indexes (same ids, metadata
and chunk texts), so both can share one embedding cache.

Each reader returns a :class:`LoadedText`: the text, the character offset where each page
starts (PDFs only, so segments can be cited by page) and any notes worth a warning (an
encoding guessed for a file that is not UTF-8). A file that cannot be used raises
``ValueError`` with a reason the command prints.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.documents import Document

from langchain_rse.pages import PAGE_OFFSETS, join_pages

__all__ = [
    "SUFFIXES",
    "LoadedText",
    "decode_text",
    "file_document",
    "folder_files",
    "load_documents",
    "read_file",
]

_LOCAL_HINT = 'pip install "langchain-rse[local]"'


@dataclass
class LoadedText:
    """The text of one file."""

    text: str
    page_offsets: list[int] | None = None
    """Start offset of each page in ``text`` (page 1 starts at 0); ``None`` without pages."""
    notes: list[str] = field(default_factory=list)
    """Things the user should know about how the file was read (e.g. its encoding)."""


def decode_text(data: bytes) -> tuple[str, str | None]:
    """``data`` as text, and the encoding that was guessed when it is not UTF-8.

    UTF-8 (with or without a byte-order mark) is decoded as is; anything else is decoded
    with the encoding ``charset-normalizer`` detects. ``ValueError`` for binary data or
    bytes no encoding explains.
    """
    if b"\x00" in data[:8192]:
        raise ValueError("looks like a binary file (NUL bytes)")
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    best = from_bytes(data).best()
    if best is None:
        raise ValueError("not UTF-8, and no text encoding explains its bytes")
    return str(best), best.encoding


def _read_plain(path: Path) -> LoadedText:
    text, encoding = decode_text(path.read_bytes())
    notes = [f"not UTF-8; decoded as {encoding}"] if encoding else []
    return LoadedText(text, notes=notes)


def _read_pdf(path: Path) -> LoadedText:
    try:
        from pypdf import PdfReader
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise ValueError(f"PDF support needs `{_LOCAL_HINT}`") from exc
    try:
        pages = [page.extract_text() or "" for page in PdfReader(str(path)).pages]
    except Exception as exc:  # pypdf raises many types for damaged files
        raise ValueError(f"unreadable PDF ({type(exc).__name__}: {exc})") from None
    text, offsets = join_pages(pages)
    return LoadedText(text, page_offsets=offsets)


def _read_html(path: Path) -> LoadedText:
    try:
        from bs4 import BeautifulSoup
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise ValueError(f"HTML support needs `{_LOCAL_HINT}`") from exc
    markup, _ = decode_text(path.read_bytes())
    soup = BeautifulSoup(markup, "html.parser")
    for hidden in soup(["script", "style", "noscript", "template"]):
        hidden.decompose()
    lines = (line.strip() for line in soup.get_text("\n").splitlines())
    return LoadedText("\n".join(line for line in lines if line))


def _read_docx(path: Path) -> LoadedText:
    try:
        import docx
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise ValueError(f"Word support needs `{_LOCAL_HINT}`") from exc
    try:
        document = docx.Document(str(path))
    except Exception as exc:  # zipfile, lxml and python-docx errors for damaged files
        raise ValueError(f"unreadable Word file ({type(exc).__name__}: {exc})") from None
    return LoadedText("\n\n".join(p.text for p in document.paragraphs if p.text.strip()))


_READERS: dict[str, Callable[[Path], LoadedText]] = {
    ".txt": _read_plain,
    ".md": _read_plain,
    ".pdf": _read_pdf,
    ".html": _read_html,
    ".htm": _read_html,
    ".docx": _read_docx,
}
SUFFIXES = tuple(_READERS)
"""File types the command reads."""


def read_file(path: Path) -> LoadedText:
    """The text of a supported file; ``ValueError`` with a reason when it cannot be used."""
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"unsupported file type {path.suffix!r} (use {', '.join(SUFFIXES)})")
    loaded = reader(path)
    if not loaded.text.strip():
        raise ValueError("no text to index")
    return loaded


def folder_files(folder: Path) -> list[Path]:
    """Every file under ``folder``, recursively and sorted, less hidden files and files in
    hidden folders (``.git``, ``.DS_Store``...)."""
    return sorted(
        p
        for p in folder.rglob("*")
        if p.is_file() and not any(part.startswith(".") for part in p.relative_to(folder).parts)
    )


def file_document(path: Path, loaded: LoadedText) -> Document:
    """The source document the ``langchain-rse index`` command makes of a file it read.

    Its id and ``metadata["source"]`` are the absolute path, ``title`` the file name without
    its suffix (the offline enricher puts it in every chunk's header, so it is part of the
    text that is embedded), ``file`` the file name, and PDFs keep ``page_offsets``.
    """
    resolved = path.resolve()
    key = str(resolved)
    metadata: dict[str, Any] = {"source": key, "title": resolved.stem, "file": resolved.name}
    if loaded.page_offsets is not None:
        metadata[PAGE_OFFSETS] = loaded.page_offsets
    return Document(loaded.text, id=key, metadata=metadata)


def load_documents(paths: Iterable[str | os.PathLike[str]]) -> list[Document]:
    """Files and folders (recursively, hidden ones left out) as the source documents the
    ``langchain-rse index`` command makes of them: same ids, metadata and text, so an index
    built from them over the command's embedding cache embeds nothing the command embedded::

        emb = cached_embeddings(LocalEmbeddings(), "idx/embedding_cache")
        retriever = RSERetriever(vectorstore=default_vectorstore(emb))
        retriever.add_documents(load_documents(["./contracts"]))

    A file that cannot be read (an unsupported type, no text, damaged) is left out with a
    warning naming the reason; ``FileNotFoundError`` for a path that does not exist.
    """
    docs = []
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise FileNotFoundError(f"no such file or folder: {raw}")
        for file in folder_files(path) if path.is_dir() else [path]:
            try:
                docs.append(file_document(file, read_file(file)))
            except (OSError, ValueError) as exc:
                warnings.warn(f"skipped {file}: {exc}", stacklevel=2)
    return docs
