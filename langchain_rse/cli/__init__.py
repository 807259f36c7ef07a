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
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.documents import Document

from langchain_rse.cli.loaders import (
    FILES_RECORD,
    SUFFIXES,
    CLIError,
    changed_files,
    list_files,
    load_files_record,
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


_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]")
"""Control characters other than tab and newline (escape sequences start with them)."""


def screen(text: str) -> str:
    """``text`` safe to print on a terminal: control characters (ESC, BEL, CR, C1...) from
    documents and file names are shown as ``\\x1b``-style escapes instead of acting on
    the terminal (window title, clear screen, colours); tabs and newlines stay."""
    return _CONTROL.sub(lambda m: f"\\x{ord(m[0]):02x}", text.replace("\r\n", "\n"))


def _json(obj: Any) -> str:
    """``obj`` as JSON with the exact text; the C1 controls and DEL, which JSON allows raw,
    are written as ``\\u00XX`` escapes so that printing it cannot drive a terminal."""
    text = json.dumps(obj, ensure_ascii=False, indent=2)
    return re.sub(r"[\x7f-\x9f]", lambda m: f"\\u{ord(m[0]):04x}", text)


def _make_enricher(llm: str | None, index_dir: Path) -> Any:
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


def _make_reranker(name: str | None) -> Any:
    """The Cohere reranker for ``--reranker cohere`` (``embedding`` needs the open index)."""
    if not name or name == "embedding":
        return None
    if name != "cohere":
        raise CLIError(f"unknown reranker {name!r}; the CLI knows 'cohere' and 'embedding'")
    if not (os.environ.get("COHERE_API_KEY") or os.environ.get("CO_API_KEY")):
        raise CLIError("--reranker cohere needs the COHERE_API_KEY environment variable")
    from langchain_rse.rerank import CohereReranker

    return CohereReranker()


def _open_index(index_dir: Path, **kwargs: Any) -> Any:
    from langchain_rse.persistence import MANIFEST
    from langchain_rse.retriever import RSERetriever

    if not (index_dir / MANIFEST).is_file():
        raise CLIError(
            f"no langchain-rse index at {index_dir} "
            f"(create one with: langchain-rse index PATH --index {index_dir})"
        )
    return RSERetriever.load(index_dir, **kwargs)


def _local_embeddings(index_dir: Path) -> tuple[Any, Callable[[], int]]:
    """The bundled model, its document vectors cached in the user's cache (so a run killed
    half-way resumes without embedding the finished chunks again), and a function counting
    the vectors in that cache."""
    from langchain_rse.embeddings import LocalEmbeddings, VectorCache, cache_size, cached_embeddings

    model, store = LocalEmbeddings(), VectorCache()
    return cached_embeddings(model, store), lambda: cache_size(store, model)


def _open_for_indexing(args: argparse.Namespace, index_dir: Path, enricher: Any) -> Any:
    from langchain_rse.persistence import MANIFEST, default_vectorstore, read_manifest
    from langchain_rse.retriever import RSERetriever

    embedding, cached = _local_embeddings(index_dir)
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
    return retriever, cached


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


def cmd_index(args: argparse.Namespace) -> int:
    from langchain_rse.embeddings import VectorCache
    from langchain_rse.persistence import MANIFEST, atomic_write

    index_dir = Path(args.index)
    listing = list_files(args.paths, index_dir, getattr(args, "follow_links", False))
    for note in listing.notes:
        print(screen(f"note: {note}"), file=sys.stderr)
    skipped = listing.skipped
    if not listing.files and not skipped:
        raise CLIError(f"no files under {' '.join(args.paths)}")
    encoding = getattr(args, "encoding", None)
    enricher = _make_enricher(args.llm, index_dir)  # a bad --llm fails before any reading
    record = load_files_record(index_dir)
    todo, unchanged, gone, notes = changed_files(
        listing, record, args.paths, encoding, args.max_document_chars
    )
    for note in notes:
        print(screen(note), file=sys.stderr)
    for path, reason in skipped:
        print(screen(f"skipped {path}: {reason}"), file=sys.stderr)
    if not todo and not unchanged and not gone:
        raise CLIError(f"nothing could be indexed: {len(skipped)} file(s) skipped (see above)")
    retriever, cached = _open_for_indexing(args, index_dir, enricher)
    cached_before = cached()
    saved = False
    try:
        if gone:
            retriever.delete(gone)
            for key in gone:
                record.pop(key)
        if todo:
            retriever.add_documents(todo)
            now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
            for doc, meta in zip(todo, retriever._records.pointers([str(d.id) for d in todo])):
                if meta is not None:  # LLM contexts that fell back are retried next run
                    record[str(doc.id)].update(
                        fallbacks=meta.fallbacks, chunks=len(meta.spans), indexed_at=now
                    )
        with _finish_before_interrupt():
            retriever.save(index_dir)
            atomic_write(index_dir / FILES_RECORD, json.dumps(record, indent=1).encode())
            saved = True
    except KeyboardInterrupt:
        if saved:
            raise Interrupted(f"interrupted after the index at {index_dir} was saved") from None
        state = "was not changed" if (index_dir / MANIFEST).exists() else "was not written"
        raise Interrupted(
            f"interrupted: the index at {index_dir} {state}; {cached()} chunk vector(s) "
            f"embedded so far are cached in {VectorCache().path}, so re-run the "
            "same command to finish without embedding them again"
        ) from None
    embedded = cached() - cached_before
    chunks = sum(record[str(d.id)].get("chunks", 0) for d in todo)
    print(
        screen(
            f"indexed {len(todo)} file(s), {unchanged} unchanged, {len(skipped)} skipped, "
            f"{len(gone)} removed; {embedded} of their {chunks} chunk(s) newly embedded "
            f"(the others were cached in {VectorCache().path}); index at {index_dir}"
        )
    )
    return 0


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
    for key in ("page_start", "page_end"):
        if key in m:
            out[key] = m[key]
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


def cmd_query(args: argparse.Namespace) -> int:
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
    explain = getattr(args, "explain", False) or getattr(args, "html", None)
    try:
        if explain:
            explanation = retriever.explain(args.question, k=args.k)
            docs = explanation.results
        else:
            docs = retriever.invoke(args.question, k=args.k)
    except (ValueError, TypeError) as exc:
        raise CLIError(str(exc)) from None
    if getattr(args, "html", None):
        from langchain_rse.persistence import atomic_write

        atomic_write(Path(args.html), explanation.to_html().encode("utf-8", "surrogatepass"))
        print(screen(f"wrote {args.html}"), file=sys.stderr)
    if getattr(args, "explain", False) and not args.json:
        print(screen(explanation.to_text()), end="\n\n")
    _print_results(docs, args.json, getattr(args, "name_key", "source"))
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
        "chunk_store": manifest["docstore"]["class"],
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
        from langchain_rse.agents import serve
    except ImportError as exc:
        raise CLIError(f'the MCP server needs `pip install "langchain-rse[mcp]"` ({exc})') from None
    serve(_open_index(Path(args.index)), http_port=args.http)
    return 0


DEMO_QUESTION = "How much notice does the customer need to terminate for convenience?"
DEMO_NEXT = """\
score: the segment's value in RSE: the summed relevance of its chunks (each between 0
and 1) minus a penalty per chunk, so a longer run of relevant chunks scores higher. The
results are listed with the one holding the most relevant chunk first, not by score, so
a later result can score higher. Scores compare results of one query, not across queries.

try next:
  langchain-rse demo "Which law governs the agreement?"
  langchain-rse index ./your-folder --index ./idx     (.txt .md .pdf .html .docx)
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
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("query", parents=[common], help="print the best segments for a question")
    p.add_argument("index", metavar="DIR")
    p.add_argument("question")
    p.add_argument("-k", type=positive_int, default=4, help="maximum number of results (>= 1)")
    p.add_argument("--json", action="store_true", help="JSON output for scripts")
    p.add_argument("--mode", choices=["segments", "chunks"], default="segments")
    p.add_argument(
        "--reranker",
        choices=["cohere", "embedding"],
        help="rerank with Cohere (needs COHERE_API_KEY) or offline by embedding "
        "similarity; either uses the 'reranked' RSE preset",
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
        "mcp", parents=[common], help="serve an index to MCP clients (search, read) over stdio"
    )
    p.add_argument("index", metavar="DIR")
    p.add_argument(
        "--http",
        type=positive_int,
        metavar="PORT",
        help="serve streamable HTTP on 127.0.0.1:PORT/mcp instead",
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
