"""The ``langchain-rse`` command: index files, query an index, describe an index, demo.

Examples::

    langchain-rse demo
    langchain-rse index ./contracts --index ./idx
    langchain-rse query ./idx "Who may terminate for convenience?" -k 3
    langchain-rse query ./idx "governing law" --json
    langchain-rse query ./idx "governing law" --explain --html why.html
    langchain-rse info ./idx
    langchain-rse mcp ./idx                  (an MCP server over stdio)
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import logging
import os
import re
import signal
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from langchain_core.documents import Document

from langchain_rse.cli.loaders import (
    FILES_RECORD,
    SKIPPED_RECORD,
    SUFFIXES,
    CLIError,
    changed_files,
    list_files,
    load_files_record,
    port_number,
    positive_int,
    text_encoding,
)
from langchain_rse.indexing import steps as indexing
from langchain_rse.indexing.chunking import DEFAULT_CHUNK_SIZE
from langchain_rse.segments import PRESETS

__all__ = ["main"]

logger = logging.getLogger("langchain_rse.cli")


class Interrupted(Exception):
    """Ctrl-C: the message says what was kept; exit status 130, no traceback."""


if TYPE_CHECKING:
    from langchain_core.embeddings import Embeddings

    from langchain_rse.embeddings import VectorCache
    from langchain_rse.enrichment import BaseEnricher
    from langchain_rse.rerank import BaseReranker
    from langchain_rse.retriever import RSERetriever

_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and newline (escape sequences start with them)."""


def screen(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (ESC, BEL, CR, C1...) from
    documents and file names are shown as ``\\x1b``-style escapes instead of acting on
    the terminal (window title, clear screen, colours); tabs and newlines stay."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text.replace("\r\n", "\n"))


def _json(obj: object, indent: int | None = 2) -> str:
    """``obj`` as JSON with the exact text; the C1 controls and DEL, which JSON allows raw,
    are written as ``\\u00XX`` escapes so that printing it cannot drive a terminal."""
    text = json.dumps(obj, ensure_ascii=False, indent=indent)
    return re.sub(r"[\x7f-\x9f]", lambda m: f"\\u{ord(m[0]):04x}", text)


def _make_enricher(llm: str | None, index_dir: Path) -> BaseEnricher:
    from langchain_rse.enrichment import HeaderEnricher

    if not llm:
        return HeaderEnricher()
    provider, _, model = llm.partition(":")
    if provider != "openai" or not model:
        raise CLIError(f"--llm must look like openai:MODEL, got {llm!r}")
    if not os.environ.get("OPENAI_API_KEY"):
        raise CLIError("--llm openai:... needs the OPENAI_API_KEY environment variable")
    try:
        from langchain_openai import ChatOpenAI
    except ImportError as exc:
        raise CLIError('--llm openai:... needs `pip install "langchain-rse[openai]"`') from exc
    from langchain_rse.enrichment import ContextualEnricher

    return ContextualEnricher(ChatOpenAI(model=model), cache_dir=index_dir / "context_cache")


def _make_reranker(name: str | None) -> BaseReranker | None:
    """The Cohere reranker for ``--reranker cohere`` (``embedding`` needs the open index)."""
    if not name or name == "embedding":
        return None
    if name != "cohere":
        raise CLIError(f"unknown reranker {name!r}; the CLI knows 'cohere' and 'embedding'")
    if not (os.environ.get("COHERE_API_KEY") or os.environ.get("CO_API_KEY")):
        raise CLIError("--reranker cohere needs the COHERE_API_KEY environment variable")
    from langchain_rse.rerank import CohereReranker

    return CohereReranker()


def _open_index(index_dir: Path, **kwargs: Any) -> RSERetriever:
    from langchain_rse.persistence import MANIFEST
    from langchain_rse.retriever import RSERetriever

    if not (index_dir / MANIFEST).is_file():
        raise CLIError(
            f"no langchain-rse index at {index_dir} "
            f"(create one with: langchain-rse index PATH --index {index_dir})"
        )
    return RSERetriever.load(index_dir, **kwargs)


def _local_embeddings() -> tuple[Embeddings, VectorCache, Callable[[], int]]:
    """The bundled model, its document vectors cached in the user's cache (so a run killed
    half-way resumes without embedding the finished chunks again), that cache, and a
    function counting the model's vectors in it."""
    from langchain_rse.embeddings import LocalEmbeddings, VectorCache, cache_size, cached_embeddings

    model, store = LocalEmbeddings(), VectorCache()
    return cached_embeddings(model, store), store, lambda: cache_size(store, model)


def _open_for_indexing(
    args: argparse.Namespace, index_dir: Path, enricher: BaseEnricher
) -> tuple[RSERetriever, VectorCache, Callable[[], int]]:
    from langchain_rse.persistence import MANIFEST, default_vectorstore, read_manifest
    from langchain_rse.retriever import RSERetriever

    embedding, cache, cached = _local_embeddings()
    if (index_dir / MANIFEST).is_file():
        if read_manifest(index_dir)["embedding"]["class"] != "LocalEmbeddings":
            raise CLIError(
                f"{index_dir} was not built with the bundled embedding model; "
                "update it from Python with its own embedding"
            )
        preset = {"rse_params": args.preset} if getattr(args, "preset", None) else {}
        retriever = RSERetriever.load(
            index_dir,
            embedding=embedding,
            enricher=enricher,
            max_document_chars=args.max_document_chars,
            **preset,
        )
    else:
        retriever = RSERetriever(  # rse_params None: the preset tuned for the chunk size
            vectorstore=default_vectorstore(embedding),
            enricher=enricher,
            chunk_size=args.chunk_size,
            rse_params=getattr(args, "preset", None),
            max_document_chars=args.max_document_chars,
        )
    indexing.INDEX_BATCH_SIZE = 64  # progress (and the embedding cache) move in small steps
    if args.no_progress:
        retriever.show_progress = False
    return retriever, cache, cached


@contextlib.contextmanager
def _finish_before_interrupt() -> Iterator[None]:
    """Within the block, Ctrl-C waits until the block is done (raised at its end), so the
    index and its file record are never saved half-way."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    caught: list[int] = []
    previous = signal.signal(signal.SIGINT, lambda signum, frame: caught.append(signum))
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)
    if caught:
        raise KeyboardInterrupt


def _check_writable(index_dir: Path) -> None:
    """A :class:`CLIError` now, before any reading or embedding, when the index cannot be
    written at ``index_dir`` (a file there, a read-only folder or parent)."""
    if index_dir.exists() and not index_dir.is_dir():
        raise CLIError(f"--index {index_dir} is a file, not a folder")
    folder = index_dir
    while not folder.exists():
        folder = folder.parent
    if not folder.is_dir() or not os.access(folder, os.W_OK | os.X_OK):
        raise CLIError(f"cannot write the index at {index_dir}: {folder} is not writable")
    for name in os.listdir(index_dir) if index_dir.is_dir() else []:
        inner = index_dir / name
        if inner.is_dir() and not os.access(inner, os.W_OK | os.X_OK):
            raise CLIError(f"cannot write the index at {index_dir}: {inner} is not writable")


LIST_SKIPPED_UP_TO = 5
"""Skipped files are listed one per line up to this many (all with -v), then summarised."""


def _skipped_summary(skipped: Sequence[tuple[Path, str]], left_out: Counter[str]) -> str:
    """One line: how many files were skipped or left out, counted by reason."""
    kinds: Counter[str] = Counter()
    for path, reason in skipped:
        if reason.startswith("unsupported file type"):
            kinds[f"{path.suffix.lower() or 'no suffix'} (unsupported)"] += 1
        elif "--max-document-chars" in reason:
            kinds["over --max-document-chars"] += 1
        else:
            kinds[re.sub(r"\s*\(.*", "", reason)] += 1
    parts = [f"{n} {kind}" for kind, n in kinds.most_common()]
    listed = "" if len(skipped) <= LIST_SKIPPED_UP_TO else " (-v lists them)"
    summary = f"skipped {len(skipped)} file(s): {', '.join(parts)}{listed}" if parts else ""
    if left_out:
        more = ", ".join(f"{n} {why}" for why, n in left_out.most_common())
        summary += ("; " if summary else "") + f"left out: {more}"
    return summary


SECONDS_PER_MILLION_CHARS = {"markup": 1140.0, "plain": 1190.0}
"""CPU seconds to index a million characters with the bundled model and the offline
enricher (``benchmarks/bench_cli_indexing.py``, ``benchmarks/RESULTS.md``: reST docs and
plain text, ~215 characters per chunk with the default chunk size): the wall time on one
free core, e.g. a 2-core machine busy with one other job."""
MARKUP_SUFFIXES = (".md", ".rst", ".adoc", ".html", ".htm")
ANNOUNCE_FROM_S = 120.0
"""Indexing expected to take longer than this is announced before it starts."""


def estimate(docs: Sequence[Document]) -> tuple[float, float]:
    """Characters of ``docs`` and the seconds indexing them is expected to take here
    (every chunk embedded: chunks already in the embedding cache make it faster)."""
    chars = seconds = 0.0
    for doc in docs:
        kind = "markup" if Path(str(doc.id)).suffix.lower() in MARKUP_SUFFIXES else "plain"
        chars += len(doc.page_content)
        seconds += len(doc.page_content) / 1e6 * SECONDS_PER_MILLION_CHARS[kind]
    return chars, seconds


def _announce(docs: Sequence[Document]) -> None:
    chars, seconds = estimate(docs)
    if seconds < ANNOUNCE_FROM_S:
        return
    markup, plain = (SECONDS_PER_MILLION_CHARS[k] / 60 for k in ("markup", "plain"))
    print(
        f"note: {len(docs)} file(s), {chars / 1e6:.1f} million characters: indexing takes "
        f"{indexing.about(seconds)} with the bundled model on one free core (measured: "
        f"{markup:.0f} min per million characters of Markdown/reST, {plain:.0f} of plain "
        "text; less with more free cores, chunks already embedded are not redone). To "
        "shorten it, index a subfolder, narrow it with --include/--exclude, or build the "
        "index from Python with a hosted embedding model. Ctrl-C keeps what was embedded.",
        file=sys.stderr,
    )


def cmd_index(args: argparse.Namespace) -> int:
    from langchain_rse.persistence import MANIFEST, atomic_write

    index_dir = Path(args.index)
    _check_writable(index_dir)
    listing = list_files(
        args.paths,
        index_dir,
        getattr(args, "follow_links", False),
        include=getattr(args, "include", None) or (),
        exclude=getattr(args, "exclude", None) or (),
        ignore_files=not getattr(args, "no_ignore_files", False),
        base=Path(args.base) if getattr(args, "base", None) else None,
    )
    for note in listing.notes:
        print(screen(f"note: {note}"), file=sys.stderr)
    skipped = listing.skipped
    if not listing.files and not skipped:
        why = f" ({_skipped_summary([], listing.left_out)})" if listing.left_out else ""
        raise CLIError(f"no files under {' '.join(args.paths)}{why}")
    encoding = getattr(args, "encoding", None)
    enricher = _make_enricher(args.llm, index_dir)  # a bad --llm fails before any reading
    record = load_files_record(index_dir)
    refused = load_files_record(index_dir, SKIPPED_RECORD)
    changes = changed_files(listing, record, args.paths, encoding, args.max_document_chars, refused)
    for note in changes.notes:
        print(screen(note), file=sys.stderr)
    if getattr(args, "verbose", False) or len(skipped) <= LIST_SKIPPED_UP_TO:
        for path, reason in skipped:
            print(screen(f"skipped {path}: {reason}"), file=sys.stderr)
    summary = _skipped_summary(skipped, listing.left_out)
    if summary:
        print(screen(summary), file=sys.stderr)
    if not changes.todo and not changes.unchanged and not changes.delete:
        raise CLIError(f"nothing could be indexed: {len(skipped)} file(s) skipped (see above)")
    _announce(changes.todo)
    retriever, cache, cached = _open_for_indexing(args, index_dir, enricher)
    cached_before = cached()
    saved = False
    try:
        if changes.delete:
            retriever.delete(changes.delete)
            for key in changes.dropped:
                record.pop(key, None)
        if changes.todo:
            retriever.add_documents(changes.todo)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            ids = [str(d.id) for d in changes.todo]
            for doc_id, pointer in zip(ids, retriever.index.pointers(ids)):
                if pointer is not None:  # LLM contexts that fell back are retried next run
                    record[changes.keys[doc_id]].update(
                        fallbacks=pointer.fallbacks, chunks=len(pointer.spans), indexed_at=now
                    )
        with _finish_before_interrupt():
            retriever.save(index_dir)
            atomic_write(index_dir / FILES_RECORD, json.dumps(record, indent=1).encode())
            atomic_write(index_dir / SKIPPED_RECORD, json.dumps(refused, indent=1).encode())
            saved = True
    except KeyboardInterrupt:
        if saved:
            raise Interrupted(f"interrupted after the index at {index_dir} was saved") from None
        state = "was not changed" if (index_dir / MANIFEST).exists() else "was not written"
        raise Interrupted(
            f"interrupted: the index at {index_dir} {state}; {cached()} chunk vector(s) "
            f"embedded so far are cached in {cache.path}, so re-run the "
            "same command to finish without embedding them again"
        ) from None
    except PermissionError as exc:
        raise CLIError(f"cannot write the index at {index_dir}: {exc}") from None
    embedded = cached() - cached_before
    chunks = sum(record[changes.keys[str(d.id)]].get("chunks", 0) for d in changes.todo)
    print(
        screen(
            f"indexed {len(changes.todo)} file(s), {changes.unchanged} unchanged, "
            f"{len(skipped)} skipped, {len(changes.dropped)} removed; {embedded} of their "
            f"{chunks} chunk(s) newly embedded (the others were cached in "
            f"{cache.path}); index at {index_dir}"
        )
    )
    return 0


CHUNK_FIELDS = ("chunk_index", "fused_score", "dense_rank", "lexical_rank", "context")
"""What ``--mode chunks --json`` adds to each result: the chunk, its fused score, its rank
in each search (``null``: not found there) and the situating context it was indexed with."""


def _result_json(d: Document) -> dict[str, Any]:
    m = d.metadata
    out = {
        "source": m.get("source"),
        "doc_id": m["doc_id"],
        "start_index": m["start_index"],
        "end_index": m["end_index"],
        "chunk_start": m["chunk_start"],
        "chunk_end": m["chunk_end"],
        "score": m["score"],
    }
    extra = ("page_start", "page_end", *CHUNK_FIELDS, "rerank_score", "rerank_fallback")
    out.update((key, m[key]) for key in extra if key in m)
    out["text"] = d.page_content
    return out


def _print_results(docs: list[Document], as_json: bool, name_key: str = "source") -> None:
    if as_json:
        print(_json([_result_json(d) for d in docs]))
        return
    if not docs:
        print("no relevant segments found")
    for n, d in enumerate(docs, start=1):
        m = d.metadata
        pages = ""
        if "page_start" in m:
            first, last = m["page_start"], m["page_end"]
            pages = f"  page {first}" if first == last else f"  pages {first}-{last}"
        print(
            screen(
                f"[{n}] {m.get(name_key, m['doc_id'])}{pages}  chars {m['start_index']}-"
                f"{m['end_index']}  score {m['score']:.3f}"
            )
        )
        print(screen(d.page_content.strip()))
        print()


def _check_output(path: Path) -> None:
    """A :class:`CLIError` now, before any work, when ``path`` cannot be written."""
    folder = path.parent
    if path.is_dir():
        raise CLIError(f"--html {path} is a folder")
    if not folder.is_dir():
        raise CLIError(f"cannot write {path}: no folder {folder}")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise CLIError(f"cannot write {path}: {folder} is not writable")


def _questions(args: argparse.Namespace) -> Iterator[str]:
    """The question given, else one per line of standard input, or a prompt on a
    terminal (until an empty line, end of input or Ctrl-C)."""
    if args.question is not None:
        yield args.question
        return
    if not sys.stdin.isatty():
        yield from (line.strip() for line in sys.stdin if line.strip())
        return
    print("ask a question (an empty line or Ctrl-D ends)", file=sys.stderr)
    while True:
        try:
            question = input("? ").strip()
        except EOFError:
            print(file=sys.stderr)
            return
        if not question:
            return
        yield question


def cmd_query(args: argparse.Namespace) -> int:
    html = getattr(args, "html", None)
    if html:
        _check_output(Path(html))
    # Reranked only with --reranker: not by a network service the index names.
    kwargs: dict[str, Any] = {"mode": args.mode, "reranker": _make_reranker(args.reranker)}
    if getattr(args, "preset", None) or args.reranker:
        kwargs["rse_params"] = getattr(args, "preset", None) or "reranked"
    retriever = _open_index(Path(args.index), **kwargs)
    if args.reranker == "embedding":
        from langchain_rse.rerank import EmbeddingReranker

        embeddings = getattr(retriever.vectorstore, "embeddings", None)
        if embeddings is None:
            raise CLIError("--reranker embedding needs a vector store with an embedding model")
        retriever.reranker = EmbeddingReranker(embeddings=embeddings)
    explain = getattr(args, "explain", False) or html
    budget = {"max_chars": args.max_chars} if getattr(args, "max_chars", None) else {}
    asked = 0
    for question in _questions(args):
        if asked and not args.json:
            print(screen(f"=== {question}"))
        asked += 1
        try:
            if explain:
                explanation = retriever.explain(question, k=args.k, **budget)
                docs = explanation.results
            else:
                docs = retriever.invoke(question, k=args.k, **budget)
        except (ValueError, TypeError) as exc:
            raise CLIError(str(exc)) from None
        if html:
            from langchain_rse.persistence import atomic_write

            page = explanation.to_html().encode("utf-8", "surrogatepass")
            atomic_write(Path(html), page)
            print(screen(f"wrote {html}"), file=sys.stderr)
        if getattr(args, "explain", False) and not args.json:
            print(screen(explanation.to_text()), end="\n\n")
        if args.json and args.question is None:  # JSON Lines: one object per question
            line = {"question": question, "results": [_result_json(d) for d in docs]}
            print(_json(line, indent=None))
        else:
            _print_results(docs, args.json, getattr(args, "name_key", "source"))
        sys.stdout.flush()
    if not asked and args.question is None and not sys.stdin.isatty():
        raise CLIError("no question given, and none on standard input")
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from langchain_rse.persistence import read_manifest

    index_dir = Path(args.index)
    try:
        manifest = read_manifest(index_dir)
    except FileNotFoundError as exc:
        raise CLIError(str(exc)) from None
    record = load_files_record(index_dir)
    files = [
        {"file": key, "chunks": entry.get("chunks"), "indexed_at": entry.get("indexed_at")}
        for key, entry in sorted(record.items())
    ]
    info = {
        "index": str(index_dir),
        "format_version": manifest["format_version"],
        "library_version": manifest.get("library_version"),
        "files": len(record) or None,
        "chunks": manifest.get("stats", {}).get("chunks"),
        "embedding": manifest["embedding"],
        **{
            name: _describe_component(spec)
            for name, spec in manifest.get("components", {}).items()
            if spec is not None
        },
        "vectorstore": manifest["vectorstore"]["class"],
        "record_store": manifest["record_store"]["class"],
        "settings": manifest["config"],
    }
    if args.json:
        print(json.dumps({**info, "file_list": files}, indent=2))
        return 0
    for key, value in info.items():
        print(screen(f"{key:16} {value}"))
    if files:
        print("\nchunks  indexed (UTC)         file")
        for f in files:
            chunks = "?" if f["chunks"] is None else f["chunks"]
            print(screen(f"{chunks:>6}  {f['indexed_at'] or '?':20}  {f['file']}"))
    return 0


def cmd_mcp(args: argparse.Namespace) -> int:
    try:
        import mcp.server.mcpserver  # noqa: F401  (the optional SDK, before the index loads)
    except ImportError as exc:
        raise CLIError(f'the MCP server needs `pip install "langchain-rse[mcp]"` ({exc})') from None
    from langchain_rse.agents import serve

    token = None
    if args.token_file is not None:
        if args.http is None:
            raise CLIError("--token-file protects --http; stdio needs no token")
        try:
            token = Path(args.token_file).read_text(encoding="utf-8").strip()
        except (OSError, UnicodeDecodeError) as exc:
            raise CLIError(f"cannot read the token file {args.token_file}: {exc}") from None
        if len(token) < 16 or any(c.isspace() or not c.isprintable() for c in token):
            raise CLIError(
                f"the token in {args.token_file} must be one line of at least 16 printable "
                "characters without spaces"
            )
    serve(_open_index(Path(args.index)), http_port=args.http, token=token)
    return 0


DEMO_QUESTION = "How much notice does the customer need to terminate for convenience?"
DEMO_NEXT = """\
score: the segment's value in RSE: the summed relevance of its chunks (each between 0
and 1) minus a penalty per chunk, so a longer run of relevant chunks scores higher. The
results are listed with the one holding the most relevant chunk first, not by score, so
a later result can score higher. Scores compare results of one query, not across queries.

try next:
  langchain-rse demo "Which law governs the agreement?"
  langchain-rse index ./your-folder --index ./idx     (.txt .md .rst .adoc .pdf .html .docx)
  langchain-rse query ./idx "your question" --explain   (why each segment was chosen)
  langchain-rse query ./idx "your question" --html why.html
"""


def cmd_demo(args: argparse.Namespace) -> int:
    from langchain_rse.sample_data import load_sample_documents

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "docs"
        folder.mkdir()
        for doc in load_sample_documents():
            (folder / doc.metadata["source"]).write_text(doc.page_content, encoding="utf-8")
        index_dir = Path(tmp) / "index"
        names = sorted(os.listdir(folder))
        print(f"indexing the bundled sample corpus ({len(names)} documents: {', '.join(names)})")
        index_args = argparse.Namespace(
            paths=[str(folder)],
            index=str(index_dir),
            llm=None,
            chunk_size=DEFAULT_CHUNK_SIZE,
            no_progress=True,
            max_document_chars=20_000_000,
            follow_links=False,
            encoding=None,
        )
        out = io.StringIO()
        with contextlib.redirect_stdout(out):  # its summary names the temporary folder
            cmd_index(index_args)
        question = args.question or DEMO_QUESTION
        print(f"\nquestion: {question}\n")
        code = cmd_query(
            argparse.Namespace(
                index=str(index_dir),
                question=question,
                k=args.k,
                json=False,
                mode="segments",
                reranker=None,
                explain=False,
                html=None,
                name_key="file",
            )
        )
    print(DEMO_NEXT, end="")
    return code


def build_parser() -> argparse.ArgumentParser:
    description = "Index documents and retrieve exact relevant segments (offline by default)."
    parser = argparse.ArgumentParser(prog="langchain-rse", description=description)
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    # -v after the subcommand too (SUPPRESS: a subcommand without it keeps the top-level one)
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "-v",
        "--verbose",
        action="store_true",
        default=argparse.SUPPRESS,
        help="log progress details",
    )
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser(
        "index", parents=[common], help=f"index {' '.join(SUFFIXES)} files and folders"
    )
    p.add_argument(
        "paths",
        nargs="+",
        metavar="PATH",
        help="files or folders (recursively; hidden files are left out)",
    )
    p.add_argument("--index", required=True, metavar="DIR", help="index directory")
    p.add_argument("--llm", metavar="openai:MODEL", help="LLM contextual enrichment (needs key)")
    p.add_argument(
        "--chunk-size", type=positive_int, default=DEFAULT_CHUNK_SIZE, help="characters per chunk"
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="RSE parameters, saved in the index (default: 'long_chunks' with "
        "--chunk-size 600 or more, else 'default')",
    )
    p.add_argument(
        "--max-document-chars",
        type=positive_int,
        default=20_000_000,
        metavar="N",
        help="skip and report longer files (default 20,000,000)",
    )
    p.add_argument(
        "--no-progress",
        action="store_true",
        help="no progress bar (or, off a terminal, no progress log lines)",
    )
    p.add_argument(
        "--follow-links",
        action="store_true",
        help="follow links to files and folders outside the given folders",
    )
    p.add_argument(
        "--encoding",
        type=text_encoding,
        metavar="NAME",
        help="decode .txt .md .html files with this encoding (default: UTF-8, else detected)",
    )
    p.add_argument(
        "--include",
        action="append",
        metavar="GLOB",
        help="index only files matching GLOB inside the folders (.gitignore rules: '*.md' "
        "at any depth, 'guide/**'); repeatable",
    )
    p.add_argument(
        "--exclude",
        action="append",
        metavar="GLOB",
        help="leave out files matching GLOB (e.g. '_build/', '*.pdf'); repeatable",
    )
    p.add_argument(
        "--no-ignore-files",
        action="store_true",
        help="index files that .gitignore files in the folders ignore",
    )
    p.add_argument(
        "--base",
        metavar="DIR",
        help="ids and sources are paths relative to DIR (default: the folder given, or "
        "the folder holding all the paths given)",
    )
    p.set_defaults(func=cmd_index)

    p = sub.add_parser(
        "query",
        parents=[common],
        help="print the best segments for a question",
        description="Print the best segments for each question. Without QUESTION: one "
        "question per line from standard input, or a prompt on a terminal (the index and "
        "model are loaded once).",
    )
    p.add_argument("index", metavar="DIR")
    p.add_argument("question", nargs="?", help="the question (default: read questions)")
    p.add_argument(
        "-k", type=positive_int, default=4, help="maximum number of results (default: 4)"
    )
    p.add_argument(
        "--max-chars",
        type=positive_int,
        metavar="N",
        help="at most N characters of results in all (default: no budget)",
    )
    p.add_argument("--json", action="store_true", help="JSON output for scripts")
    p.add_argument(
        "--mode",
        choices=["segments", "chunks"],
        default="segments",
        help="segments of adjacent relevant chunks (default), or the best chunks alone",
    )
    p.add_argument(
        "--reranker",
        choices=["cohere", "embedding"],
        help="cohere: Cohere's hosted reranker (needs COHERE_API_KEY), for better "
        "ranking; embedding: re-scores candidates by the bundled model's similarity - "
        "slower and no better in our tests, for trying the reranked preset offline. "
        "Either uses the 'reranked' RSE preset",
    )
    p.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="RSE parameters for this query (default: the index's)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="show each document's chunk relevance and chosen segments",
    )
    p.add_argument(
        "--html", metavar="FILE", help="write a page with the segments highlighted in context"
    )
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("info", parents=[common], help="describe an index and list its files")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser(
        "mcp", parents=[common], help="serve an index to MCP clients (search, fetch) over stdio"
    )
    p.add_argument("index", metavar="DIR")
    p.add_argument(
        "--http",
        type=port_number,
        metavar="PORT",
        help="serve streamable HTTP on 127.0.0.1:PORT/mcp instead (without --token-file, any "
        "local process can read every document)",
    )
    p.add_argument(
        "--token-file",
        metavar="FILE",
        help="with --http: require `Authorization: Bearer TOKEN`, TOKEN read from FILE",
    )
    p.set_defaults(func=cmd_mcp)

    p = sub.add_parser(
        "demo", parents=[common], help="index the bundled sample corpus and answer a question"
    )
    p.add_argument("question", nargs="?", help=f"default: {DEMO_QUESTION!r}")
    p.add_argument("-k", type=positive_int, default=2)
    p.set_defaults(func=cmd_demo)
    return parser


def _describe_component(spec: dict[str, Any]) -> str:
    settings = ", ".join(f"{k}={v!r}" for k, v in spec.get("settings", {}).items())
    return f"{spec['class']}({settings})"


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=logging.INFO if args.verbose else logging.WARNING,
        format="%(levelname)s %(name)s: %(message)s",
    )
    if not getattr(args, "no_progress", False):  # progress log lines when not on a terminal
        logging.getLogger("langchain_rse.progress").setLevel(logging.INFO)
    try:
        code = int(args.func(args))
        sys.stdout.flush()  # a closed pipe (`| head`) shows here, not at exit
        return code
    except CLIError as exc:
        print(screen(f"langchain-rse: error: {exc}"), file=sys.stderr)
        return 2
    except Interrupted as exc:
        print(screen(f"\nlangchain-rse: {exc}"), file=sys.stderr)
        return 130
    except KeyboardInterrupt:
        print("\nlangchain-rse: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        # The reader left (`| head`): stop quietly; the rest goes nowhere (`signal` docs).
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 1
