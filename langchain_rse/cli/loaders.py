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

from langchain_rse.indexing.chunking import PAGE_OFFSETS, join_pages

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


WESTERN = "cp1252"
"""The encoding preferred when detection cannot tell it from another (short Western text)."""


def decode_text(data: bytes, encoding: str | None = None) -> tuple[str, str | None]:
    """``data`` as text, and the encoding that was guessed when it is not UTF-8.

    With ``encoding``, the bytes are decoded with it (``ValueError`` when they are not
    valid in it). Otherwise UTF-8 (with or without a byte-order mark) is decoded as is;
    anything else is decoded with the encoding ``charset-normalizer`` detects, and when
    its best guess is no more likely than Windows-1252 (short text gives the detector
    little to go on: ``Café crème`` is as plausible in Central European cp1250 as
    ``Café crčme``), Windows-1252 wins. ``ValueError`` for binary data or bytes no
    encoding explains.
    """
    if b"\x00" in data[:8192]:
        raise ValueError("looks like a binary file (NUL bytes)")
    if encoding is not None:
        try:
            return data.decode(encoding), None
        except UnicodeDecodeError as exc:
            raise ValueError(f"not valid {encoding} ({exc.reason} at byte {exc.start})") from None
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    matches = from_bytes(data)
    best = matches.best()
    if best is None:
        raise ValueError("not UTF-8, and no text encoding explains its bytes")
    western = next((m for m in matches if WESTERN in m.could_be_from_charset), None)
    if western is not None and (western.chaos, -western.coherence) <= (best.chaos, -best.coherence):
        return str(western), WESTERN
    return str(best), best.encoding


def _read_plain(path: Path, encoding: str | None) -> LoadedText:
    text, guessed = decode_text(path.read_bytes(), encoding)
    notes = [f"not UTF-8; decoded as {guessed} (--encoding sets it)"] if guessed else []
    return LoadedText(text, notes=notes)


def _read_pdf(path: Path, encoding: str | None) -> LoadedText:
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


def _read_html(path: Path, encoding: str | None) -> LoadedText:
    try:
        from bs4 import BeautifulSoup
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise ValueError(f"HTML support needs `{_LOCAL_HINT}`") from exc
    markup, _ = decode_text(path.read_bytes(), encoding)
    soup = BeautifulSoup(markup, "html.parser")
    for hidden in soup(["script", "style", "noscript", "template"]):
        hidden.decompose()
    lines = (line.strip() for line in soup.get_text("\n").splitlines())
    return LoadedText("\n".join(line for line in lines if line))


def _read_docx(path: Path, encoding: str | None) -> LoadedText:
    try:
        import docx
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise ValueError(f"Word support needs `{_LOCAL_HINT}`") from exc
    try:
        document = docx.Document(str(path))
    except Exception as exc:  # zipfile, lxml and python-docx errors for damaged files
        raise ValueError(f"unreadable Word file ({type(exc).__name__}: {exc})") from None
    return LoadedText("\n\n".join(p.text for p in document.paragraphs if p.text.strip()))


_READERS: dict[str, Callable[[Path, str | None], LoadedText]] = {
    ".txt": _read_plain,
    ".md": _read_plain,
    ".pdf": _read_pdf,
    ".html": _read_html,
    ".htm": _read_html,
    ".docx": _read_docx,
}
SUFFIXES = tuple(_READERS)
"""File types the command reads."""


def read_file(path: Path, encoding: str | None = None) -> LoadedText:
    """The text of a supported file (plain text and HTML decoded with ``encoding`` when
    given, else detected); ``ValueError`` with a reason when it cannot be used."""
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"unsupported file type {path.suffix!r} (use {', '.join(SUFFIXES)})")
    loaded = reader(path, encoding)
    if not loaded.text.strip():
        raise ValueError("no text to index")
    return loaded


def folder_files(
    folder: Path, follow_links: bool = False, leave_out: Path | None = None
) -> list[Path]:
    """Everything under ``folder`` that is not a folder (files, links, named pipes...),
    recursively and sorted, less hidden entries and hidden folders (``.git``,
    ``.DS_Store``...) and the folder ``leave_out`` (resolved). Links to folders are listed
    as entries, and entered only with ``follow_links`` (each real folder once)."""
    found: list[Path] = []
    entered: set[Path] = set()
    for top, dirs, files in os.walk(folder, followlinks=follow_links):
        real = Path(top).resolve()
        if real in entered or real == leave_out:  # a loop through links, or the index
            dirs.clear()
            continue
        entered.add(real)
        here = Path(top)
        for name in list(dirs):
            if name.startswith(".") or (here / name).resolve() == leave_out:
                dirs.remove(name)
            elif not follow_links and (here / name).is_symlink():
                found.append(here / name)
        found.extend(here / name for name in files if not name.startswith("."))
    return sorted(found)


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
            if not file.is_file():  # a named pipe, a socket, a device, a broken link
                warnings.warn(f"skipped {file}: not a regular file", stacklevel=2)
                continue
            try:
                docs.append(file_document(file, read_file(file)))
            except (OSError, ValueError) as exc:
                warnings.warn(f"skipped {file}: {exc}", stacklevel=2)
    return docs
