"""LLM input tokens spent by ``ContextualEnricher`` per document token, by document length.

For documents of 10k, 100k and 1M characters, each split into the default 600-character
chunks, the enricher runs twice with a fake chat model that counts the characters of
every prompt (no network, no API key):

* ``whole``: every chunk's prompt holds the whole document (``max_document_tokens``
  set very high), as in Anthropic's contextual-retrieval recipe;
* ``windowed``: every prompt holds the title, the document head and a window around the
  chunk (``max_document_tokens=0``; by default only documents over 8,000 estimated tokens
  are windowed).

Tokens are ESTIMATED as characters / 4. "prefix" is the share of input tokens in the
leading, chunk-independent part of the prompts (system message + document / head block),
which providers' prompt caches bill at a discount after the first chunk of a document.

Text: CUAD contracts concatenated (``$RSE_DATA_DIR`` or ``<repo>/../shared/data``) when
present, else synthetic contract-like text.

Usage::

    python benchmarks/bench_enrichment_tokens.py
    python benchmarks/bench_enrichment_tokens.py --sizes 10000 100000
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import threading
from pathlib import Path
from typing import Any

from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from pydantic import PrivateAttr

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_rse.enrichment import CHARS_PER_TOKEN, ContextualEnricher
from langchain_rse.indexing.chunking import Chunk, split_text

REPO_ROOT = Path(__file__).resolve().parent.parent


class CountingChat(BaseChatModel):
    """A fake chat model that counts calls and prompt characters, and answers briefly."""

    model_name: str = "counting-fake"
    _lock: Any = PrivateAttr(default_factory=threading.Lock)
    _calls: int = PrivateAttr(default=0)
    _chars: int = PrivateAttr(default=0)
    _prefix_chars: int = PrivateAttr(default=0)

    @property
    def _llm_type(self) -> str:
        return "counting-fake"

    def reset(self) -> None:
        """Zero the counters."""
        with self._lock:
            self._calls = self._chars = self._prefix_chars = 0

    @property
    def counts(self) -> tuple[int, int, int]:
        """``(calls, prompt characters, leading-prefix characters)``."""
        return self._calls, self._chars, self._prefix_chars

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> ChatResult:
        sizes = []
        for message in messages:
            if isinstance(message.content, str):
                sizes.append(len(message.content))
            else:
                sizes.extend(
                    len(str(block.get("text", "")))
                    for block in message.content
                    if isinstance(block, dict)
                )
        with self._lock:
            self._calls += 1
            self._chars += sum(sizes)
            self._prefix_chars += sum(sizes[:2])  # system message + first document block
        reply = AIMessage(content="This chunk is part of the agreement's payment section.")
        return ChatResult(generations=[ChatGeneration(message=reply)])


def data_dir() -> Path:
    """``$RSE_DATA_DIR`` or ``<repo>/../shared/data``."""
    env = os.environ.get("RSE_DATA_DIR")
    return Path(env).expanduser() if env else REPO_ROOT.parent / "shared" / "data"


def corpus(min_chars: int) -> tuple[str, str]:
    """At least ``min_chars`` of text and a line saying where it came from."""
    folder = data_dir() / "cuad" / "contracts"
    files = sorted(folder.glob("*.txt")) if folder.is_dir() else []
    if files:
        parts: list[str] = []
        total = 0
        for path in files:
            text = path.read_text(encoding="utf-8", errors="replace")
            parts.append(text)
            total += len(text) + 2
            if total >= min_chars:
                break
        return "\n\n".join(parts), f"CUAD contracts ({len(parts)} files) from {folder}"
    rng = random.Random(0)
    words = ["party", "agreement", "shall", "payment", "term", "notice", "goods", "fee"]
    paragraphs = []
    total = 0
    clause = 0
    while total < min_chars:
        clause += 1
        body = " ".join(rng.choice(words) for _ in range(120))
        paragraph = f"{clause}. CLAUSE {clause}\n\n{body.capitalize()}."
        paragraphs.append(paragraph)
        total += len(paragraph) + 2
    return "\n\n".join(paragraphs), "synthetic contract-like text (CUAD not found)"


def measure(
    llm: CountingChat, text: str, chunks: list[Chunk], windowed: bool
) -> tuple[int, int, float]:
    """LLM calls, estimated input tokens and the prefix share for one document."""
    enricher = ContextualEnricher(
        llm,
        max_document_tokens=0 if windowed else 10**12,
        max_concurrency=8,
        show_progress=False,
    )
    llm.reset()
    contexts = enricher.enrich("doc", text, {"title": "Benchmark document"}, chunks)
    assert len(contexts) == len(chunks) and enricher.failures == 0
    calls, chars, prefix = llm.counts
    return calls, chars // CHARS_PER_TOKEN, prefix / max(chars, 1)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10_000, 100_000, 1_000_000])
    args = parser.parse_args(argv)

    text, source = corpus(max(args.sizes))
    print(f"text: {source}")
    print(
        f"tokens are estimated as characters / {CHARS_PER_TOKEN}; chunks of 600 characters; "
        "windowed = head 2,000 chars + 3,000 chars either side of the chunk"
    )
    header = (
        f"{'doc chars':>10} {'doc tok':>8} {'chunks':>6} {'mode':>9} {'LLM calls':>9} "
        f"{'input tok':>12} {'in tok/doc tok':>14} {'prefix':>7}"
    )
    print(header)
    print("-" * len(header))
    llm = CountingChat()
    for size in args.sizes:
        document = text[:size]
        doc_tokens = len(document) // CHARS_PER_TOKEN
        chunks = split_text(document, "doc")
        for windowed in (False, True):
            calls, tokens, prefix = measure(llm, document, chunks, windowed)
            print(
                f"{len(document):>10,} {doc_tokens:>8,} {len(chunks):>6} "
                f"{'windowed' if windowed else 'whole':>9} {calls:>9,} {tokens:>12,} "
                f"{tokens / doc_tokens:>14.1f} {prefix:>7.0%}"
            )
    print(
        "whole-document prompts grow as length x chunks (quadratic); windowed prompts are "
        "bounded per chunk, so the total grows linearly with length. Calls < chunks where "
        "chunks repeat the same text (one call serves them all)."
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
