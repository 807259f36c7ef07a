"""Reading files into text for the ``langchain-rse`` command: .txt/.md, .pdf, .html, .docx;
listing the files it is given, and its record of the files an index holds.

:func:`load_documents` gives Python the documents the command indexes (same ids, metadata
and chunk texts), so both can share one embedding cache.

Each reader returns a :class:`LoadedText`: the text, the character offset where each page
starts (PDFs only, so segments can be cited by page) and any notes worth a warning (an
encoding guessed for a file that is not UTF-8). A file that cannot be used raises
``ValueError`` with a reason the command prints.
"""

from __future__ import annotations

import argparse
import codecs
import json
import logging
import os
import stat
import warnings
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.documents import Document

from langchain_rse.indexing.chunking import PAGE_OFFSETS, join_pages, validate_documents

__all__ = [
    "FILES_RECORD",
    "SUFFIXES",
    "CLIError",
    "Listing",
    "LoadedText",
    "changed_files",
    "decode_text",
    "file_document",
    "folder_files",
    "list_files",
    "load_documents",
    "load_files_record",
    "positive_int",
    "read_document",
    "read_file",
    "regular_file",
    "text_encoding",
]

logger = logging.getLogger("langchain_rse.cli")

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
    ".rst": _read_plain,
    ".adoc": _read_plain,
    ".asciidoc": _read_plain,
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


# ---------------------------------------------------------------- the command's files


FILES_RECORD = "cli_files.json"
"""Per-file size and modification time, so re-indexing reads only new or changed files."""


def load_files_record(index_dir: Path) -> dict[str, dict[str, Any]]:
    """The index's record of the files it holds (empty when missing or unreadable)."""
    path = index_dir / FILES_RECORD
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        logger.warning("%s is unreadable; every file will be re-read", path)
        return {}
    return data if isinstance(data, dict) else {}


class CLIError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


_FILE_TYPES = {
    stat.S_IFIFO: "a named pipe",
    stat.S_IFSOCK: "a socket",
    stat.S_IFCHR: "a character device",
    stat.S_IFBLK: "a block device",
}


@dataclass
class Listing:
    """What ``index`` was given: the files to read and what it left out, and why."""

    files: dict[Path, Path | None] = field(default_factory=dict)
    """Each file to read (resolved: its key in the index), with the link inside a given
    folder it was reached through when it lies outside that folder."""
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


def list_files(paths: Sequence[str], index_dir: Path, follow_links: bool = False) -> Listing:
    """Files under ``paths`` (files or folders, recursively; hidden files and folders inside
    a folder and the index's own folder are left out), sorted, unique — supported or not:
    the caller reports the ones it cannot read. Links inside a folder to files or folders
    outside it are followed only with ``follow_links``."""
    listing = Listing()
    own = index_dir.resolve()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise CLIError(f"no such file or folder: {raw}")
        if not path.is_dir():
            listing.files.setdefault(path.resolve(), None)  # a named file: even a link
            continue
        root = path.resolve()
        if own.is_relative_to(root) and own.is_dir():
            listing.notes.append(f"left out {index_dir}: the index's own folder")
        for p in folder_files(path, follow_links, leave_out=own):
            resolved = p.resolve()
            if resolved.is_relative_to(own) or (p.is_dir() and resolved.is_relative_to(root)):
                continue  # the index itself; a link to a folder inside (its files are listed)
            if resolved.is_relative_to(root):
                listing.files.setdefault(resolved, None)
            elif not follow_links:
                kind = "folder" if p.is_dir() else "file"
                listing.skipped.append(
                    (
                        p,
                        f"a link to a {kind} outside {raw} (not followed; "
                        "--follow-links indexes it)",
                    )
                )
            else:
                listing.files.setdefault(resolved, root / p.relative_to(path))
    return listing


def read_document(
    path: Path, max_chars: int, encoding: str | None = None
) -> tuple[Document, list[str]]:
    """The file as a source document, and notes for the user; ``ValueError`` with the
    reason when it cannot be indexed (unreadable, unsupported, too long, binary)."""
    loaded = read_file(path, encoding)
    doc = file_document(path, loaded)  # as loaders.load_documents makes it for Python
    if len(doc.page_content) > max_chars:
        raise ValueError(
            f"{len(doc.page_content):,} characters, over --max-document-chars {max_chars:,}"
        )
    try:
        validate_documents([doc], None, max_chars)
    except TypeError as exc:
        raise ValueError(str(exc)) from None
    return doc, loaded.notes


def regular_file(path: Path) -> os.stat_result:
    """``path``'s status; ``ValueError`` for what is not a regular file (a named pipe
    would block the read for ever), without opening it."""
    status = path.stat()
    if not stat.S_ISREG(status.st_mode):
        kind = _FILE_TYPES.get(stat.S_IFMT(status.st_mode), "a special file")
        raise ValueError(f"not a regular file ({kind})")
    return status


def positive_int(value: str) -> int:
    """An argparse type: an integer of at least 1."""
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected an integer, got {value!r}") from None
    if number < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {number}")
    return number


def text_encoding(value: str) -> str:
    """An argparse type: a text encoding Python knows (its canonical name)."""
    try:
        info = codecs.lookup(value)
    except LookupError:
        raise argparse.ArgumentTypeError(f"unknown encoding {value!r}") from None
    if not getattr(info, "_is_text_encoding", True):
        raise argparse.ArgumentTypeError(f"{value!r} is not a text encoding")
    return info.name


def changed_files(
    listing: Listing,
    record: dict[str, dict[str, Any]],
    paths: Sequence[str],
    encoding: str | None,
    max_chars: int,
) -> tuple[list[Document], int, list[str], list[str]]:
    """What ``index`` must do: the documents of new or changed files (their ``record``
    entries updated), how many are unchanged, the keys of indexed files that are gone or
    can no longer be read, and notes for the user; unreadable new files go to
    ``listing.skipped``."""
    todo: list[Document] = []
    unchanged = 0
    gone: list[str] = []
    notes: list[str] = []
    for path, link in listing.files.items():
        key = str(path)
        previous = record.get(key, {})
        try:
            status = regular_file(path)
            stamp = {"size": status.st_size, "mtime_ns": status.st_mtime_ns}
            if (
                previous.get("stamp") == stamp
                and not previous.get("fallbacks")
                and previous.get("encoding") == encoding
            ):
                unchanged += 1
                continue
            doc, read_notes = read_document(path, max_chars, encoding)
        except (OSError, ValueError) as exc:
            if key in record:  # emptied, made binary or unreadable: redacted, not kept
                notes.append(f"removed {link or path} from the index: {exc}")
                gone.append(key)
            else:
                listing.skipped.append((link or path, str(exc)))
            continue
        notes += [f"note: {path}: {note}" for note in read_notes]
        todo.append(doc)
        record[key] = {"stamp": stamp}
        if encoding:
            record[key]["encoding"] = encoding
        if link:
            record[key]["link"] = str(link)
    # Files under the given paths (or reached through a link there) that were not listed
    # now (deleted, a link removed or no longer followed) are removed from the index.
    roots = [Path(p).resolve() for p in paths]
    gone += [
        key
        for key, entry in record.items()
        if Path(key) not in listing.files
        and any(Path(entry.get("link") or key).is_relative_to(r) for r in roots)
    ]
    return todo, unchanged, gone, notes
