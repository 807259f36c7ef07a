"""The tokenizer of the in-process lexical branch: prose and code alike, with a stemmer.

``tokenize`` splits on punctuation and whitespace, splits identifiers (``getUserName``,
``user_name``, ``HTTPServer``) into their parts while also keeping the whole identifier,
indexes CJK text per character, drops a short list of English stop words, and reduces each
word to its Snowball stem (``executors`` and ``executor``, ``terminated`` and
``termination`` become one term), as Lucene's English analyzer and bm25s's examples do.
Stems come from PyStemmer (the Snowball project's C stemmers). A camelCase identifier is
stemmed like a word (``DiffExecutors`` and ``DiffExecutor`` match); snake_case identifiers
(``user_name``) and CJK characters are kept as they are.

Words repeat, so each word's tokens are computed once per stemmer and then looked up.
"""

from __future__ import annotations

import re
import threading

import Stemmer

__all__ = ["DEFAULT_STEMMER", "check_stemmer", "tokenize"]

DEFAULT_STEMMER = "english"
"""The Snowball stemmer of new indexes (``None``: no stemming, as indexes saved before it)."""

# Words, numbers and runs of CJK ideographs / kana / hangul (split per character below).
_WORD = re.compile(r"[^\W_]+", re.UNICODE)
# camelCase / PascalCase / ACRONYMWord / digits.
_SUBWORD = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_CJK = re.compile(r"[\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff]")

_SNAKE = re.compile(r"\b\w+_\w+\b")
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


_WORD_CACHE_MAX = 500_000
_WORD_TOKENS: dict[str | None, dict[str, tuple[str, ...]]] = {}
"""What each word (a ``_WORD`` match) becomes, per stemmer."""
_LOCAL = threading.local()
"""PyStemmer's stemmer objects are not thread-safe: one per thread and language."""


def check_stemmer(stemmer: str | None) -> str | None:
    """``stemmer`` when it names a Snowball stemmer (or is ``None``); else ``ValueError``."""
    if stemmer is not None and stemmer not in Stemmer.algorithms():
        raise ValueError(
            f"unknown stemmer {stemmer!r}; use None or one of {', '.join(Stemmer.algorithms())}"
        )
    return stemmer


def _stem(stemmer: str, tokens: tuple[str, ...]) -> tuple[str, ...]:
    mine: dict[str, Stemmer.Stemmer] = _LOCAL.__dict__.setdefault("stemmers", {})
    found = mine.get(stemmer)
    if found is None:
        found = mine[stemmer] = Stemmer.Stemmer(stemmer)
    return tuple(found.stemWords(tokens))


def _word_tokens(word: str, stemmer: str | None) -> tuple[str, ...]:
    if _CJK.search(word):
        return tuple(p.lower() for p in _CJK_SPLIT.findall(word))
    lowered = word.lower()
    if lowered in _STOPWORDS:
        return ()
    tokens: tuple[str, ...] = (lowered,)
    if lowered != word and word.isascii() and not word.isupper():  # mixed case
        parts = _SUBWORD.findall(word)
        if len(parts) > 1:
            tokens = (lowered, *(p.lower() for p in parts))
    return tokens if stemmer is None else _stem(stemmer, tokens)


def tokenize(text: str, stemmer: str | None = DEFAULT_STEMMER) -> list[str]:
    """Lowercased, stemmed tokens for BM25 (see the module docstring).

    Args:
        text: Any text.
        stemmer: A Snowball stemmer's name (``Stemmer.algorithms()``), or ``None`` for the
            words as they are.
    """
    tokens: list[str] = []
    cache = _WORD_TOKENS.get(stemmer)
    if cache is None:
        cache = _WORD_TOKENS.setdefault(check_stemmer(stemmer), {})
    for word in _WORD.findall(text):
        found = cache.get(word)
        if found is None:
            found = _word_tokens(word, stemmer)
            if len(cache) < _WORD_CACHE_MAX:
                cache[word] = found
        tokens.extend(found)
    if "_" in text:  # snake_case: `[^\W_]+` split on underscores; keep the identifier too
        tokens.extend(ident.lower() for ident in _SNAKE.findall(text))
    return tokens
