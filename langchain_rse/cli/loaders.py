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
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from langchain_core.documents import Document

from langchain_rse.indexing.chunking import PAGE_OFFSETS, join_pages, validate_documents

__all__ = [
    "FILES_RECORD",
    "SKIPPED_RECORD",
    "SUFFIXES",
    "CLIError",
    "Changes",
    "Listing",
    "LoadedText",
    "base_folder",
    "changed_files",
    "decode_text",
    "document_id",
    "file_document",
    "folder_files",
    "list_files",
    "load_documents",
    "load_files_record",
    "port_number",
    "positive_int",
    "read_document",
    "read_file",
    "record_id",
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


DETECT_BYTES = 1 << 20
"""Bytes an encoding is detected from (the rest is decoded with it): detection costs
seconds per megabyte, decoding milliseconds."""
MAX_BYTES_PER_CHAR = 4
"""No text encoding uses more bytes per character (UTF-8, UTF-32): a plain-text or HTML
file larger than this many bytes per allowed character is refused from its size alone."""
_BOMS = [
    (codecs.BOM_UTF32_LE, "utf-32"),  # before UTF-16's, which it starts with
    (codecs.BOM_UTF32_BE, "utf-32"),
    (codecs.BOM_UTF16_LE, "utf-16"),
    (codecs.BOM_UTF16_BE, "utf-16"),
]


def decode_text(data: bytes, encoding: str | None = None) -> tuple[str, str | None]:
    """``data`` as text, and the encoding that was guessed when it is not UTF-8.

    With ``encoding``, or the byte-order mark of UTF-16 or UTF-32, the bytes are decoded
    with it (``ValueError`` when they are not valid in it). Otherwise UTF-8 (with or
    without a byte-order mark) is decoded as is; anything else is decoded with the encoding
    ``charset-normalizer`` detects in its first :data:`DETECT_BYTES`, and when its best
    guess is no more likely than Windows-1252 (short text gives the detector little to go
    on: ``Café crème`` is as plausible in Central European cp1250 as ``Café crčme``),
    Windows-1252 wins. ``ValueError`` for binary data (NUL characters) or bytes no
    encoding explains.
    """
    if encoding is None:
        encoding = next((name for bom, name in _BOMS if data.startswith(bom)), None)
    if encoding is not None:
        try:
            text = data.decode(encoding)
        except UnicodeDecodeError as exc:
            raise ValueError(f"not valid {encoding} ({exc.reason} at byte {exc.start})") from None
        if "\x00" in text[:8192]:
            raise ValueError(
                f"looks like a binary file (NUL characters when decoded as {encoding})"
            )
        return text, None
    if b"\x00" in data[:8192]:
        raise ValueError("looks like a binary file (NUL bytes)")
    try:
        return data.decode("utf-8-sig"), None
    except UnicodeDecodeError:
        pass
    from charset_normalizer import from_bytes

    matches = from_bytes(data[:DETECT_BYTES])
    best = matches.best()
    if best is None:
        raise ValueError("not UTF-8, and no text encoding explains its bytes")
    western = next((m for m in matches if WESTERN in m.could_be_from_charset), None)
    if western is not None and (western.chaos, -western.coherence) <= (best.chaos, -best.coherence):
        guessed = WESTERN
    else:
        guessed = best.encoding
    try:
        return data.decode(guessed), guessed
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"not UTF-8; detected {guessed} from its start, but byte {exc.start} is not "
            "valid in it (--encoding sets the encoding)"
        ) from None


def _read_bytes(path: Path, limit: int) -> bytes:
    """At most ``limit`` bytes of ``path``; ``ValueError`` when it holds more (nothing more
    is read)."""
    with path.open("rb") as file:
        data = file.read(limit + 1)
    if len(data) > limit:
        raise ValueError(f"over {limit:,} bytes, more than --max-document-chars allows")
    return data


def _read_plain(path: Path, encoding: str | None, max_chars: int) -> LoadedText:
    data = _read_bytes(path, max_chars * MAX_BYTES_PER_CHAR)
    text, guessed = decode_text(data, encoding)
    notes = [f"not UTF-8; decoded as {guessed} (--encoding sets it)"] if guessed else []
    return LoadedText(text, notes=notes)


def _read_pdf(path: Path, encoding: str | None, max_chars: int) -> LoadedText:
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


def _read_html(path: Path, encoding: str | None, max_chars: int) -> LoadedText:
    try:
        from bs4 import BeautifulSoup
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise ValueError(f"HTML support needs `{_LOCAL_HINT}`") from exc
    markup, _ = decode_text(_read_bytes(path, max_chars * MAX_BYTES_PER_CHAR), encoding)
    soup = BeautifulSoup(markup, "html.parser")
    for hidden in soup(["script", "style", "noscript", "template"]):
        hidden.decompose()
    lines = (line.strip() for line in soup.get_text("\n").splitlines())
    return LoadedText("\n".join(line for line in lines if line))


def _read_docx(path: Path, encoding: str | None, max_chars: int) -> LoadedText:
    try:
        import docx
    except ImportError as exc:  # pragma: no cover - depends on extras
        raise ValueError(f"Word support needs `{_LOCAL_HINT}`") from exc
    try:
        document = docx.Document(str(path))
    except Exception as exc:  # zipfile, lxml and python-docx errors for damaged files
        raise ValueError(f"unreadable Word file ({type(exc).__name__}: {exc})") from None
    return LoadedText("\n\n".join(p.text for p in document.paragraphs if p.text.strip()))


_READERS: dict[str, Callable[[Path, str | None, int], LoadedText]] = {
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


def read_file(path: Path, encoding: str | None = None, max_chars: int = 20_000_000) -> LoadedText:
    """The text of a supported file (plain text and HTML decoded with ``encoding`` when
    given, else detected); ``ValueError`` with a reason when it cannot be used. Plain text
    and HTML files too large to hold ``max_chars`` characters or fewer are refused from
    their size, and no more of them is read than could be."""
    reader = _READERS.get(path.suffix.lower())
    if reader is None:
        raise ValueError(f"unsupported file type {path.suffix!r} (use {', '.join(SUFFIXES)})")
    size = path.stat().st_size
    if reader in (_read_plain, _read_html) and size > max_chars * MAX_BYTES_PER_CHAR:
        raise ValueError(f"{size:,} bytes: over --max-document-chars {max_chars:,} in any encoding")
    loaded = reader(path, encoding, max_chars)
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


def base_folder(paths: Sequence[str | os.PathLike[str]]) -> Path:
    """The folder ids are relative to: the one folder given, or the folder holding every
    given file and folder (resolved)."""
    places = [Path(p).resolve() if Path(p).is_dir() else Path(p).parent.resolve() for p in paths]
    return Path(os.path.commonpath(places)) if places else Path.cwd()


def document_id(place: Path, base: Path) -> str:
    """The id (and ``source``) of the file at ``place`` (its folder resolved, the file
    itself not: a link keeps its own name): its path under ``base``, ``/``-separated."""
    return place.relative_to(base).as_posix()


def file_document(path: Path, loaded: LoadedText, doc_id: str | None = None) -> Document:
    """The source document the ``langchain-rse index`` command makes of a file it read.

    Its id and ``metadata["source"]`` are ``doc_id`` (the command's: the file's path
    relative to the indexed folder, so the index neither shows nor depends on where it was
    built; default: the absolute path), ``title`` the file name without its suffix (the
    offline enricher puts it in every chunk's header, so it is part of the text that is
    embedded), ``file`` the file name, and PDFs keep ``page_offsets``.
    """
    resolved = path.resolve()
    key = doc_id if doc_id is not None else str(resolved)
    metadata: dict[str, Any] = {"source": key, "title": resolved.stem, "file": resolved.name}
    if loaded.page_offsets is not None:
        metadata[PAGE_OFFSETS] = loaded.page_offsets
    return Document(loaded.text, id=key, metadata=metadata)


def load_documents(paths: Sequence[str | os.PathLike[str]]) -> list[Document]:
    """Files and folders (recursively, hidden ones left out) as the source documents the
    ``langchain-rse index`` command makes of them: same ids (paths relative to the one
    folder given, or to the folder holding all the given paths), metadata and text, so an
    index built from them over the command's embedding cache embeds nothing the command
    embedded::

        emb = cached_embeddings(LocalEmbeddings())  # the default cache, the command's
        retriever = RSERetriever(vectorstore=default_vectorstore(emb))
        retriever.add_documents(load_documents(["./contracts"]))

    A file that cannot be read (an unsupported type, no text, damaged) is left out with a
    warning naming the reason; ``FileNotFoundError`` for a path that does not exist.
    """
    for raw in paths:
        if not Path(raw).exists():
            raise FileNotFoundError(f"no such file or folder: {raw}")
    base = base_folder(paths)
    docs = []
    for raw in paths:
        path = Path(raw)
        for file in folder_files(path) if path.is_dir() else [path]:
            if not file.is_file():  # a named pipe, a socket, a device, a broken link
                warnings.warn(f"skipped {file}: not a regular file", stacklevel=2)
                continue
            place = file.parent.resolve() / file.name
            try:
                docs.append(file_document(file, read_file(file), document_id(place, base)))
            except (OSError, ValueError) as exc:
                warnings.warn(f"skipped {file}: {exc}", stacklevel=2)
    return docs


# ---------------------------------------------------------------- the command's files


FILES_RECORD = "cli_files.json"
"""Per-file size and modification time, so re-indexing reads only new or changed files."""


def load_files_record(index_dir: Path, name: str = FILES_RECORD) -> dict[str, dict[str, Any]]:
    """The index's record of the files it holds, or with ``name`` :data:`SKIPPED_RECORD`
    the files it refused (empty when missing or unreadable)."""
    path = index_dir / name
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


IGNORE_FILE = ".gitignore"
"""Files ``index`` honours in the folders it walks (git's rules, via ``pathspec``)."""


@dataclass
class Listing:
    """What ``index`` was given: the files to read and what it left out, and why."""

    files: dict[Path, Path | None] = field(default_factory=dict)
    """Each file to read (resolved: its key in the index's file record), with the link
    inside a given folder it was reached through when it lies outside that folder."""
    ids: dict[Path, str] = field(default_factory=dict)
    """Each file's document id: its path relative to :attr:`base`."""
    base: Path = field(default_factory=Path.cwd)
    """The folder ids are relative to."""
    skipped: list[tuple[Path, str]] = field(default_factory=list)
    left_out: Counter[str] = field(default_factory=Counter)
    """Files not listed, counted by the rule that left them out (``--exclude``...)."""
    notes: list[str] = field(default_factory=list)


class _Rules:
    """``--include`` / ``--exclude`` patterns and the ``.gitignore`` files of one folder
    tree, all with git's pattern rules (``*.md`` at any depth, ``_build/`` a folder)."""

    def __init__(
        self, root: Path, include: Sequence[str], exclude: Sequence[str], ignore_files: bool
    ) -> None:
        import pathspec

        self.root = root
        self.include = pathspec.PathSpec.from_lines("gitwildmatch", include) if include else None
        self.exclude = pathspec.PathSpec.from_lines("gitwildmatch", exclude) if exclude else None
        self.ignore_files = ignore_files
        self._ignores: dict[Path, Any] = {}

    def _ignore_spec(self, folder: Path) -> Any:
        if folder not in self._ignores:
            import pathspec

            file = folder / IGNORE_FILE
            try:
                lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
            except OSError:
                lines = []
            self._ignores[folder] = pathspec.GitIgnoreSpec.from_lines(lines) if lines else None
        return self._ignores[folder]

    def left_out_by(self, path: Path) -> str | None:
        """Why the file at ``path`` (under the root) is left out, or ``None``."""
        relative = path.relative_to(self.root).as_posix()
        if self.include is not None and not self.include.match_file(relative):
            return "not matched by --include"
        if self.exclude is not None and self.exclude.match_file(relative):
            return "matched by --exclude"
        if self.ignore_files:
            folder = path.parent
            while True:
                spec = self._ignore_spec(folder)
                if spec is not None and spec.match_file(path.relative_to(folder).as_posix()):
                    return f"ignored by {IGNORE_FILE}"
                if folder == self.root:
                    break
                folder = folder.parent
        return None


def list_files(
    paths: Sequence[str],
    index_dir: Path,
    follow_links: bool = False,
    include: Sequence[str] = (),
    exclude: Sequence[str] = (),
    ignore_files: bool = True,
    base: Path | None = None,
) -> Listing:
    """Files under ``paths`` (files or folders, recursively; hidden files and folders inside
    a folder and the index's own folder are left out), sorted, unique — supported or not:
    the caller reports the ones it cannot read. Inside folders, ``include`` / ``exclude``
    patterns (git's rules, relative to the given folder) and ``.gitignore`` files (with
    ``ignore_files``) leave files out; files named directly are always listed. Links inside
    a folder to files or folders outside it are followed only with ``follow_links``. Ids
    are relative to ``base`` (default: :func:`base_folder` of ``paths``)."""
    for raw in paths:
        if not Path(raw).exists():
            raise CLIError(f"no such file or folder: {raw}")
    listing = Listing(base=(base or base_folder(paths)).resolve())
    own = index_dir.resolve()

    def add(resolved: Path, place: Path, link: Path | None = None) -> None:
        if not place.is_relative_to(listing.base):
            raise CLIError(f"{place} is not under --base {listing.base}")
        if resolved not in listing.files:
            listing.files[resolved] = link
            listing.ids[resolved] = document_id(place, listing.base)

    for raw in paths:
        path = Path(raw)
        if not path.is_dir():
            add(path.resolve(), path.parent.resolve() / path.name)  # a named file: even a link
            continue
        root = path.resolve()
        rules = _Rules(root, include, exclude, ignore_files)
        if own.is_relative_to(root) and own.is_dir():
            listing.notes.append(f"left out {index_dir}: the index's own folder")
        for p in folder_files(path, follow_links, leave_out=own):
            resolved = p.resolve()
            if resolved.is_relative_to(own) or (p.is_dir() and resolved.is_relative_to(root)):
                continue  # the index itself; a link to a folder inside (its files are listed)
            place = root / p.relative_to(path)
            reason = rules.left_out_by(place)
            if reason is not None:
                listing.left_out[reason] += 1
            elif resolved.is_relative_to(root):
                add(resolved, resolved)
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
                add(resolved, place, place)
    return listing


def read_document(
    path: Path, max_chars: int, encoding: str | None = None, doc_id: str | None = None
) -> tuple[Document, list[str]]:
    """The file as a source document (id ``doc_id``), and notes for the user;
    ``ValueError`` with the reason when it cannot be indexed (unreadable, unsupported, too
    long, binary)."""
    loaded = read_file(path, encoding, max_chars)
    doc = file_document(path, loaded, doc_id)  # as loaders.load_documents makes it for Python
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


def port_number(value: str) -> int:
    """An argparse type: a TCP port, 1 to 65535."""
    number = positive_int(value)
    if number > 65535:
        raise argparse.ArgumentTypeError(f"a port is 1 to 65535, got {number}")
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


SKIPPED_RECORD = "cli_skipped.json"
"""Files read and refused, with their size, modification time and the reason: re-indexing
reports them again without reading them until they change (or the settings do)."""


@dataclass
class Changes:
    """What ``index`` must do, from :func:`changed_files`."""

    todo: list[Document] = field(default_factory=list)
    """Documents of new or changed files (their record entries updated)."""
    keys: dict[str, str] = field(default_factory=dict)
    """Each document id in ``todo`` → its key in the file record."""
    unchanged: int = 0
    delete: list[str] = field(default_factory=list)
    """Document ids to delete: files gone or no longer readable, and former ids of files
    whose id changed."""
    dropped: list[str] = field(default_factory=list)
    """Record keys of files no longer indexed."""
    notes: list[str] = field(default_factory=list)


def record_id(key: str, entry: dict[str, Any]) -> str:
    """The document id of the file record's entry ``key`` (indexes made before ids were
    relative used the absolute path, the key)."""
    return str(entry.get("id", key))


def changed_files(
    listing: Listing,
    record: dict[str, dict[str, Any]],
    paths: Sequence[str],
    encoding: str | None,
    max_chars: int,
    skipped_record: dict[str, dict[str, Any]] | None = None,
) -> Changes:
    """What ``index`` must do with the listed files, given the index's ``record`` (updated
    for the new and changed files); unreadable new files go to ``listing.skipped``, and
    to ``skipped_record`` (which also answers for files it holds unchanged, unread)."""
    skipped_record = {} if skipped_record is None else skipped_record
    changes = Changes()
    settings = {"encoding": encoding, "max_chars": max_chars}
    owners = {record_id(key, entry): key for key, entry in record.items()}
    for path, link in listing.files.items():
        key, doc_id = str(path), listing.ids[path]
        previous = record.get(key, {})
        owner = owners.get(doc_id)
        if (
            owner is not None
            and owner != key
            and Path(owner) not in listing.files
            and (Path(owner).exists())
        ):
            raise CLIError(
                f"{link or path} would be indexed as {doc_id!r}, the id of {owner} "
                "already in the index; index both from their common folder, or set --base"
            )
        stamp: dict[str, int] | None = None
        try:
            status = regular_file(path)
            stamp = {"size": status.st_size, "mtime_ns": status.st_mtime_ns}
            if (
                previous.get("stamp") == stamp
                and not previous.get("fallbacks")
                and previous.get("encoding") == encoding
                and record_id(key, previous) == doc_id
            ):
                changes.unchanged += 1
                continue
            refused = skipped_record.get(key)
            if refused and refused.get("stamp") == stamp and refused.get("settings") == settings:
                raise ValueError(refused["reason"])
            doc, read_notes = read_document(path, max_chars, encoding, doc_id)
        except (OSError, ValueError) as exc:
            if key in record:  # emptied, made binary or unreadable: redacted, not kept
                changes.notes.append(f"removed {link or path} from the index: {exc}")
                changes.delete.append(record_id(key, previous))
                changes.dropped.append(key)
            else:
                listing.skipped.append((link or path, str(exc)))
            if isinstance(exc, ValueError) and stamp is not None:
                skipped_record[key] = {"stamp": stamp, "settings": settings, "reason": str(exc)}
            continue
        skipped_record.pop(key, None)
        changes.notes += [f"note: {path}: {note}" for note in read_notes]
        if previous and record_id(key, previous) != doc_id:
            changes.delete.append(record_id(key, previous))  # indexed under another id
        changes.todo.append(doc)
        changes.keys[doc_id] = key
        record[key] = {"stamp": stamp, "id": doc_id}
        if encoding:
            record[key]["encoding"] = encoding
        if link:
            record[key]["link"] = str(link)
    # Files under the given paths (or reached through a link there) that were not listed
    # now (deleted, a link removed or no longer followed) are removed from the index.
    roots = [Path(p).resolve() for p in paths]
    for key, entry in record.items():
        if (
            Path(key) not in listing.files
            and any(Path(entry.get("link") or key).is_relative_to(r) for r in roots)
            and key not in changes.dropped
        ):
            changes.delete.append(record_id(key, entry))
            changes.dropped.append(key)
    return changes
