"""The ``langchain-rse`` command: index files, query an index, describe an index, demo.

Examples::

    langchain-rse demo
    langchain-rse index ./contracts --index ./idx
    langchain-rse query ./idx "Who may terminate for convenience?" -k 3
    langchain-rse query ./idx "governing law" --json
    langchain-rse info ./idx
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from langchain_core.documents import Document

__all__ = ["main"]

SUFFIXES = (".txt", ".md", ".pdf")
FILES_RECORD = "cli_files.json"
"""Per-file size and modification time, so re-indexing reads only new or changed files."""

logger = logging.getLogger("langchain_rse.cli")


class CLIError(Exception):
    """A user-facing error: printed without a traceback, exit status 2."""


# ---------------------------------------------------------------- reading files


def iter_files(paths: Sequence[str]) -> Iterator[Path]:
    """Supported files under ``paths`` (files or folders, recursively), sorted, unique."""
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        if not path.exists():
            raise CLIError(f"no such file or folder: {raw}")
        found = (
            sorted(p for p in path.rglob("*") if p.is_file() and p.suffix.lower() in SUFFIXES)
            if path.is_dir()
            else [path]
        )
        for p in found:
            resolved = p.resolve()
            if resolved not in seen:
                seen.add(resolved)
                yield resolved


def read_file(path: Path) -> str:
    """Text of a .txt/.md/.pdf file; ``ValueError`` with a reason when it cannot be used."""
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        try:
            from pypdf import PdfReader
        except ImportError as exc:  # pragma: no cover - depends on extras
            raise ValueError('PDF support needs `pip install "langchain-rse[local]"`') from exc
        try:
            reader = PdfReader(str(path))
            text = "\n\n".join(page.extract_text() or "" for page in reader.pages)
        except Exception as exc:  # pypdf raises many types for damaged files
            raise ValueError(f"unreadable PDF ({type(exc).__name__}: {exc})") from None
    elif suffix in (".txt", ".md"):
        data = path.read_bytes()
        if b"\x00" in data[:8192]:
            raise ValueError("looks like a binary file (NUL bytes)")
        text = data.decode("utf-8", errors="replace")
    else:
        raise ValueError(f"unsupported file type {suffix!r} (use {', '.join(SUFFIXES)})")
    if not text.strip():
        raise ValueError("no text to index")
    return text


# ---------------------------------------------------------------- building pieces


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


def _load_files_record(index_dir: Path) -> dict[str, dict[str, Any]]:
    path = index_dir / FILES_RECORD
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        logger.warning("%s is unreadable; every file will be re-read", path)
        return {}
    return data if isinstance(data, dict) else {}


# ---------------------------------------------------------------- commands


def cmd_index(args: argparse.Namespace) -> int:
    from langchain_rse.persistence import MANIFEST, atomic_write
    from langchain_rse.retriever import RSERetriever

    index_dir = Path(args.index)
    files = list(iter_files(args.paths))
    if not files:
        raise CLIError(f"no {'/'.join(SUFFIXES)} files under {' '.join(args.paths)}")
    enricher = _make_enricher(args.llm, index_dir)
    if (index_dir / MANIFEST).is_file():
        retriever = RSERetriever.load(index_dir, enricher=enricher)
    else:
        from langchain_rse.embeddings import LocalEmbeddings
        from langchain_rse.persistence import default_vectorstore

        retriever = RSERetriever(
            vectorstore=default_vectorstore(LocalEmbeddings()),
            enricher=enricher,
            chunk_size=args.chunk_size,
        )
    if args.no_progress:
        retriever.show_progress = False

    record = _load_files_record(index_dir)
    todo: list[Document] = []
    unchanged = skipped = 0
    for path in files:
        stat = path.stat()
        key = str(path)
        stamp = {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns}
        previous = record.get(key, {})
        if previous.get("stamp") == stamp and not previous.get("fallbacks"):
            unchanged += 1
            continue
        try:
            text = read_file(path)
        except (OSError, ValueError) as exc:
            print(f"skipped {path}: {exc}", file=sys.stderr)
            skipped += 1
            continue
        todo.append(
            Document(text, id=key, metadata={"source": key, "title": path.stem, "file": path.name})
        )
        record[key] = {"stamp": stamp}
    # Files under the given folders that have disappeared are removed from the index.
    roots = [Path(p).resolve() for p in args.paths]
    gone = [
        key
        for key in record
        if not Path(key).exists() and any(Path(key).is_relative_to(r) for r in roots)
    ]
    if gone:
        retriever.delete(gone)
        for key in gone:
            record.pop(key)
    if todo:
        retriever.add_documents(todo)
        for doc, meta in zip(todo, retriever._records.pointers([str(d.id) for d in todo])):
            if meta is not None:  # LLM contexts that fell back are retried next run
                record[str(doc.id)]["fallbacks"] = meta.fallbacks
    retriever.save(index_dir)
    atomic_write(index_dir / FILES_RECORD, json.dumps(record, indent=1).encode())
    print(
        f"indexed {len(todo)} file(s), {unchanged} unchanged, {skipped} skipped, "
        f"{len(gone)} removed; index at {index_dir}"
    )
    return 0


def _print_results(docs: list[Document], as_json: bool) -> None:
    if as_json:
        out = [
            {
                "source": d.metadata.get("source"),
                "doc_id": d.metadata["doc_id"],
                "start_index": d.metadata["start_index"],
                "end_index": d.metadata["end_index"],
                "chunk_start": d.metadata["chunk_start"],
                "chunk_end": d.metadata["chunk_end"],
                "score": d.metadata["score"],
                "text": d.page_content,
            }
            for d in docs
        ]
        print(json.dumps(out, ensure_ascii=False, indent=2))
        return
    if not docs:
        print("no relevant segments found")
    for n, d in enumerate(docs, start=1):
        m = d.metadata
        print(
            f"[{n}] {m.get('source', m['doc_id'])}  chars {m['start_index']}-{m['end_index']}"
            f"  score {m['score']:.3f}"
        )
        print(d.page_content.strip())
        print()


def cmd_query(args: argparse.Namespace) -> int:
    kwargs: dict[str, Any] = {"mode": args.mode}
    reranker = _make_reranker(args.reranker)
    if reranker is not None:
        kwargs["reranker"] = reranker
    if args.reranker:
        kwargs["preset"] = "reranked"
    retriever = _open_index(Path(args.index), **kwargs)
    if args.reranker == "embedding":
        from langchain_rse.rerank import EmbeddingReranker

        embeddings = getattr(retriever.vectorstore, "embeddings", None)
        if embeddings is None:
            raise CLIError("--reranker embedding needs a vector store with an embedding model")
        retriever.reranker = EmbeddingReranker(embeddings=embeddings)
    try:
        docs = retriever.invoke(args.question, k=args.k)
    except (ValueError, TypeError) as exc:
        raise CLIError(str(exc)) from None
    _print_results(docs, args.json)
    return 0


def cmd_info(args: argparse.Namespace) -> int:
    from langchain_rse.persistence import read_manifest

    index_dir = Path(args.index)
    try:
        manifest = read_manifest(index_dir)
    except FileNotFoundError as exc:
        raise CLIError(str(exc)) from None
    record = _load_files_record(index_dir)
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
        print(json.dumps(info, indent=2))
    else:
        for key, value in info.items():
            print(f"{key:16} {value}")
    return 0


DEMO_QUESTION = "How much notice does the customer need to terminate for convenience?"


def cmd_demo(args: argparse.Namespace) -> int:
    from langchain_rse.sample_data import load_sample_documents

    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "docs"
        folder.mkdir()
        for doc in load_sample_documents():
            (folder / doc.metadata["source"]).write_text(doc.page_content, encoding="utf-8")
        index_dir = Path(tmp) / "index"
        print(f"indexing the bundled sample corpus ({len(os.listdir(folder))} documents)...")
        cmd_index(
            argparse.Namespace(
                paths=[str(folder)], index=str(index_dir), llm=None, chunk_size=600,
                no_progress=True,
            )
        )  # fmt: skip
        question = args.question or DEMO_QUESTION
        print(f"\nquestion: {question}\n")
        return cmd_query(
            argparse.Namespace(
                index=str(index_dir), question=question, k=args.k, json=False,
                mode="segments", reranker=None,
            )
        )  # fmt: skip


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="langchain-rse",
        description="Index documents and retrieve exact relevant segments (offline by default).",
    )
    parser.add_argument("-v", "--verbose", action="store_true", help="log progress details")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("index", help="index .txt, .md and .pdf files and folders")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--index", required=True, metavar="DIR", help="index directory")
    p.add_argument("--llm", metavar="openai:MODEL", help="LLM contextual enrichment (needs key)")
    p.add_argument("--chunk-size", type=int, default=600, help="characters per chunk")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_index)

    p = sub.add_parser("query", help="print the best segments for a question")
    p.add_argument("index", metavar="DIR")
    p.add_argument("question")
    p.add_argument("-k", type=int, default=4, help="maximum number of results")
    p.add_argument("--json", action="store_true", help="JSON output for scripts")
    p.add_argument("--mode", choices=["segments", "chunks"], default="segments")
    p.add_argument(
        "--reranker",
        choices=["cohere", "embedding"],
        help="rerank with Cohere (needs COHERE_API_KEY) or offline by embedding similarity; "
        "either uses the 'reranked' RSE preset",
    )
    p.set_defaults(func=cmd_query)

    p = sub.add_parser("info", help="describe an index")
    p.add_argument("index", metavar="DIR")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_info)

    p = sub.add_parser("demo", help="index the bundled sample corpus and answer a question")
    p.add_argument("question", nargs="?", help=f"default: {DEMO_QUESTION!r}")
    p.add_argument("-k", type=int, default=2)
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
    if not args.verbose:
        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it sets DEBUG on itself
    try:
        return int(args.func(args))
    except CLIError as exc:
        print(f"langchain-rse: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
