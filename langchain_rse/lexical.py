"""The in-process lexical branch: a code- and prose-aware tokenizer and a BM25 index.

The index keeps each chunk's tokens and builds the sparse BM25 matrix lazily, on the
first query after a change, so a batch of additions or deletions costs one rebuild.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any, Literal

import numpy as np

__all__ = ["BM25Index", "LexicalHit", "tokenize"]

LexicalEngine = Literal["bm25s", "rank_bm25"]

# Words, numbers and runs of CJK ideographs / kana / hangul (split per character below).
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# camelCase / PascalCase / ACRONYMWord / digits.
_SUBWORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")

_CJK_SPLIT = re.compile(_CJK.pattern + "|" + _CJK.pattern.replace("[", "[^", 1) + "+")

_STOPWORDS = frozenset(
    [
        "a",
        "an",
        "and",
        "are",
        "as",
        "at",
        "be",
        "but",
        "by",
        "for",
        "from",
        "has",
        "have",
        "if",
        "in",
        "into",
        "is",
        "it",
        "its",
        "of",
        "on",
        "or",
        "such",
        "that",
        "the",
        "their",
        "then",
        "there",
        "these",
        "they",
        "this",
        "to",
        "was",
        "were",
        "will",
        "with",
    ]
)


def tokenize(text: str) -> list[str]:
    """Lowercased tokens for BM25.

    Splits on punctuation and whitespace, splits identifiers (``getUserName``,
    ``user_name``, ``HTTPServer``) into their parts while also keeping the whole
    identifier, indexes CJK text per character, and drops a short list of English
    stop words.
    """
    tokens: list[str] = []
    for match in _WORD.finditer(text):
        word = match.group()
        if _CJK.search(word):
            tokens.extend(p.lower() for p in _CJK_SPLIT.findall(word))
            continue
        lowered = word.lower()
        if lowered in _STOPWORDS:
            continue
        tokens.append(lowered)
        if word.isascii() and not word.islower() and not word.isupper():
            parts = _SUBWORD.findall(word)
            if len(parts) > 1:
                tokens.extend(p.lower() for p in parts)
    # snake_case: `[^\W_]+` already split on underscores; keep the joined identifier too.
    for ident in re.finditer(r"\b\w+_\w+\b", text):
        tokens.append(ident.group().lower())
    return tokens


LexicalHit = tuple[str, float]
"""``(chunk_id, bm25_score)``."""


def group_of(chunk_id: str) -> str:
    """A chunk id's group: everything before its last ``\x1f`` (the chunk keys of
    :func:`langchain_rse.chunking.chunk_key` group by document version)."""
    return chunk_id.rsplit("\x1f", 1)[0]


class BM25Index:
    """BM25 over chunk texts, keyed by chunk id.

    ``engine="bm25s"`` (default) scores with a sparse matrix; ``engine="rank_bm25"``
    uses the reference ``rank_bm25.BM25Okapi`` (much slower, for comparison).

    The scoring model is rebuilt after changes, on the next search. Up to
    ``sync_rebuild_max`` chunks that rebuild happens in the searching call, so a search
    always sees the latest writes; above it, searches keep using the previous model
    while one background thread rebuilds, so a stream of writes never stalls queries
    (new chunks become searchable when the rebuild lands; :meth:`refresh` waits for it).
    """

    def __init__(
        self,
        engine: LexicalEngine = "bm25s",
        k1: float = 1.5,
        b: float = 0.75,
        sync_rebuild_max: int = 2_000,
    ) -> None:
        if engine not in ("bm25s", "rank_bm25"):
            raise ValueError(f"unknown lexical engine {engine!r}; use 'bm25s' or 'rank_bm25'")
        self.engine: LexicalEngine = engine
        self.k1 = k1
        self.b = b
        self.sync_rebuild_max = sync_rebuild_max
        self._tokens: dict[str, list[str]] = {}
        self._groups: dict[str, dict[str, Any]] = {}
        """Metadata per group (a document version): what filters are checked against."""
        self._lock = threading.RLock()
        self._generation = 0  # bumped by every change
        self._built: tuple[int, list[str], Any] | None = None  # (generation, ids, model)
        self._rebuilding: threading.Thread | None = None
        self._rebuild_lock = threading.Lock()  # one rebuild at a time

    def __len__(self) -> int:
        return len(self._tokens)

    def __repr__(self) -> str:
        return f"BM25Index(engine={self.engine!r}, chunks={len(self)})"

    def add(
        self,
        ids: Sequence[str],
        texts: Sequence[str],
        groups: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        """Add (or replace) chunks; ``groups``: metadata per group (see :func:`group_of`)
        that :meth:`search`'s ``allowed`` is asked about."""
        if len(ids) != len(texts):
            raise ValueError("ids and texts must have the same length")
        tokens = [tokenize(t) for t in texts]
        with self._lock:
            self._tokens.update(zip(ids, tokens))
            self._groups.update(groups or {})
            self._generation += 1

    def delete(self, ids: Iterable[str]) -> None:
        """Remove chunks (and the metadata of their groups); unknown ids are ignored."""
        with self._lock:
            for chunk_id in ids:
                self._tokens.pop(chunk_id, None)
                self._groups.pop(group_of(chunk_id), None)
            self._generation += 1

    def groups(self) -> dict[str, dict[str, Any]]:
        """A copy of the metadata per group (for saving)."""
        with self._lock:
            return dict(self._groups)

    def tokens(self) -> dict[str, list[str]]:
        """A copy of the stored tokens per chunk id (for saving)."""
        with self._lock:
            return dict(self._tokens)

    def set_texts(
        self, texts: Mapping[str, str], groups: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """Replace the whole index with these chunk texts (a reload)."""
        self.set_tokens({key: tokenize(text) for key, text in texts.items()}, groups)

    def set_tokens(
        self, tokens: dict[str, list[str]], groups: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """Replace the whole index with pre-tokenized chunks (for loading)."""
        with self._lock:
            self._tokens = dict(tokens)
            self._groups = dict(groups or {})
            self._generation += 1

    def _fit(self, ids: list[str], corpus: list[list[str]]) -> Any:
        if not ids:
            return None
        if self.engine == "bm25s":
            import bm25s

            # bm25s sets its own logger to DEBUG on import, so every fit printed
            # "Building index from tokens" through the application's handlers.
            bm25s_logger = logging.getLogger("bm25s")
            if bm25s_logger.level == logging.DEBUG:
                bm25s_logger.setLevel(logging.WARNING)
            model = bm25s.BM25(k1=self.k1, b=self.b)
            model.index(corpus, show_progress=False)
            return model
        try:
            from rank_bm25 import BM25Okapi
        except ImportError as exc:  # pragma: no cover - depends on extras
            raise ImportError(
                "engine='rank_bm25' needs `pip install \"langchain-rse[rank-bm25]\"`"
            ) from exc
        return BM25Okapi([c or [""] for c in corpus], k1=self.k1, b=self.b)

    def _rebuild(self) -> None:
        """Fit a model on a snapshot of the tokens; install it unless it is already older."""
        with self._lock:
            generation = self._generation
            ids = list(self._tokens)
            corpus = [self._tokens[i] for i in ids]
        model = self._fit(ids, corpus)  # outside the lock: writers and readers go on
        with self._lock:
            if self._built is None or self._built[0] < generation:
                self._built = (generation, ids, model)

    def refresh(self) -> None:
        """Make every write so far searchable now (waits for or runs the rebuild)."""
        with self._rebuild_lock:
            if self._built is None or self._built[0] != self._generation:
                self._rebuild()

    def _mask(self, ids: list[str], allowed: Callable[[dict[str, Any]], bool]) -> Any:
        """1 for chunks whose group ``allowed`` accepts, else 0 (one call per group)."""
        verdict: dict[str, float] = {}
        groups = self._groups
        out = np.empty(len(ids))
        for i, chunk_id in enumerate(ids):
            g = group_of(chunk_id)
            v = verdict.get(g)
            if v is None:
                v = verdict[g] = float(allowed(groups.get(g, {})))
            out[i] = v
        return out

    def _model(self) -> tuple[list[str], Any]:
        built = self._built
        if built is not None and built[0] == self._generation:
            return built[1], built[2]
        if built is None or len(self._tokens) <= self.sync_rebuild_max:
            self.refresh()
        else:
            with self._lock:
                if self._rebuilding is None or not self._rebuilding.is_alive():
                    self._rebuilding = threading.Thread(
                        target=self.refresh, name="bm25-rebuild", daemon=True
                    )
                    self._rebuilding.start()
        built = self._built
        assert built is not None
        return built[1], built[2]

    def search(
        self, query: str, k: int, allowed: Callable[[dict[str, Any]], bool] | None = None
    ) -> list[LexicalHit]:
        """The ``k`` best chunks with a positive BM25 score, best first; with ``allowed``,
        only chunks whose group metadata it accepts (scored before the top ``k`` is cut,
        so a selective filter still gets ``k`` results)."""
        ids, model = self._model()
        q = tokenize(query)
        if model is None or not q or k <= 0:
            return []
        if self.engine == "bm25s":
            vocab = model.vocab_dict
            q = [t for t in q if t in vocab]
            if not q:
                return []
        scores = np.asarray(model.get_scores(q), dtype=np.float64)
        if allowed is not None:
            scores = scores * self._mask(ids, allowed)
        k = min(k, len(ids))
        top = np.argpartition(-scores, k - 1)[:k]
        top = top[np.argsort(-scores[top], kind="stable")]
        return [(ids[i], float(scores[i])) for i in top if scores[i] > 0]
