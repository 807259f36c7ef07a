"""Incremental BM25: exact global statistics after every change, at a cost proportional to it.

The index is a list of immutable *postings blocks* (Lucene's segments), each a term-major
``scipy.sparse.csr_array`` of term frequencies over a contiguous range of chunk numbers.
An addition writes one new block; a deletion clears the chunk's ``alive`` flag and
takes its terms out of the global statistics (live chunks, total length, document
frequencies), which stay exact: scores equal those of an index built from scratch, and a
write is visible to the very next query.

What BM25 calls documents are chunks here, each under its chunk key; a term's document
frequency keeps its name (the live chunks that hold the term).

Blocks are merged like a counter (the newest ``merge_factor`` adjacent blocks whose size
classes differ by at most one become one, dropping deleted chunks); large merges run on a
background thread. When deleted chunk numbers outnumber live ones the index is
renumbered (:meth:`IncrementalBM25.compact`). Not thread-safe:
:class:`langchain_rse.lexical.BM25Index` wraps it in a readers-writer lock.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from itertools import chain
from typing import Literal

import numpy as np
from scipy import sparse

__all__ = ["IncrementalBM25", "PostingsBlock", "Variant"]

Variant = Literal["lucene", "okapi"]
"""``"lucene"``: bm25s's default scoring; ``"okapi"``: ``rank_bm25.BM25Okapi``'s."""

_LEVEL_BASE = 1 << 14
"""Postings of the smallest size class of the merge policy."""


def _grow(array: np.ndarray, size: int, fill: float = 0) -> np.ndarray:
    """``array`` with room for at least ``size`` entries (capacity grows by a quarter:
    amortised O(1) per entry, at most 25% of the forward index unused)."""
    if size <= len(array):
        return array
    out = np.full(max(size, len(array) + len(array) // 4, 16), fill, dtype=array.dtype)
    out[: len(array)] = array
    return out


def _postings(
    tf: np.ndarray, terms: np.ndarray, chunks: np.ndarray, shape: tuple[int, int]
) -> sparse.csr_array:
    """The term-major matrix of these ``(term, chunk, frequency)`` triples. Chunk
    numbers and offsets are 32-bit while they fit (scipy keeps the index width of the
    coordinates it is given: 64-bit ones make a posting 10 bytes instead of 6), and term
    frequencies 16-bit (32-bit if one exceeds 65,535); scores convert them exactly."""
    index = np.int32 if max(*shape, len(chunks)) < 2**31 else np.int64
    counts = tf.astype(np.uint16 if tf.max(initial=0) <= 0xFFFF else np.uint32)
    return sparse.csr_array((counts, (terms.astype(index), chunks.astype(index))), shape=shape)


@dataclass(frozen=True)
class PostingsBlock:
    """Postings of chunks ``lo <= d < hi`` (term-major: ``matrix[t]`` lists term ``t``)."""

    lo: int
    hi: int
    matrix: sparse.csr_array

    @property
    def postings(self) -> int:
        return int(self.matrix.nnz)

    @property
    def level(self) -> int:
        """The merge policy's size class."""
        # Level L holds [base * 4**(L-1), base * 4**L) postings (level 0: under base), so
        # four blocks of one level merge into one of the next level (or stay at 0); with a
        # block one level below among them, into one of the same level or the next.
        return (
            0 if self.postings < _LEVEL_BASE else int(math.log(self.postings / _LEVEL_BASE, 4)) + 1
        )


class IncrementalBM25:
    """BM25 over chunks given as token-id bags; see the module docstring.

    Chunks are addressed by an opaque ``int`` *group id* (metadata lives with the caller)
    and a string key. Token strings are mapped to ids here (``vocab``).
    """

    def __init__(
        self,
        k1: float = 1.5,
        b: float = 0.75,
        variant: Variant = "lucene",
        epsilon: float = 0.25,
        merge_factor: int = 4,
        sync_merge_postings: int = 2_000_000,
        max_block_postings: int = 8_000_000,
    ) -> None:
        if variant not in ("lucene", "okapi"):
            raise ValueError(f"unknown BM25 variant {variant!r}")
        if merge_factor < 2:
            raise ValueError("merge_factor must be at least 2")
        self.k1, self.b, self.variant, self.epsilon = k1, b, variant, epsilon
        self.merge_factor = merge_factor
        self.sync_merge_postings = sync_merge_postings
        """Merges up to this many postings run in the writing call; larger ones are
        handed to the ``background`` callable given to :meth:`add`."""
        self.max_block_postings = max_block_postings
        """No merge makes a block larger (bounds a merge's time and memory)."""
        self.epoch = 0
        self.vocab: dict[str, int] = {}
        self.terms: list[str] = []
        self.df = np.zeros(0, dtype=np.int64)
        self.reset()

    # ------------------------------------------------------------------ state

    def reset(self) -> None:
        """Forget every chunk (the vocabulary's statistics too)."""
        self.vocab, self.terms = {}, []
        self.df = np.zeros(0, dtype=np.int64)
        self.n_chunks = 0  # chunk numbers handed out (live and dead)
        self.n_live = 0
        self.total_len = 0
        self.dl = np.zeros(0, dtype=np.float32)
        """Chunk lengths; +inf for deleted chunks, so they score 0 without a check."""
        self.alive = np.zeros(0, dtype=bool)
        self.gid = np.zeros(0, dtype=np.int32)
        self.fptr = np.zeros(1, dtype=np.int64)  # forward index: terms of d at fptr[d]:fptr[d+1]
        self.fterms = np.zeros(0, dtype=np.int32)
        self.keys: list[str | None] = []
        """Each chunk's key; a deleted one keeps it (a search's hits read their keys after
        its lock: ``chunk_of`` and ``alive`` say which are live)."""
        self.chunk_of: dict[str, int] = {}
        self.blocks: list[PostingsBlock] = []
        self.busy: set[int] = set()  # ids of blocks a background merge is reading
        self.epoch += 1  # merges started before a reset are discarded
        self._idf_cache: tuple[int, np.ndarray] | None = None
        self.changes = 0

    def __len__(self) -> int:
        return self.n_live

    @property
    def nbytes(self) -> int:
        """Bytes held in NumPy/SciPy arrays (postings, per-chunk and per-term arrays;
        capacity included). The keys, their dict and the vocabulary are Python objects."""
        arrays: list[np.ndarray] = [self.df, self.dl, self.alive, self.gid, self.fptr]
        arrays.append(self.fterms)
        total = sum(a.nbytes for a in arrays)
        for block in self.blocks:
            m = block.matrix
            total += m.data.nbytes + m.indices.nbytes + m.indptr.nbytes
        return total

    def term_ids(self, tokens: Sequence[str], grow: bool) -> list[int]:
        """Token ids (new terms get one when ``grow``, else unknown tokens are dropped)."""
        vocab = self.vocab
        ids = list(map(vocab.get, tokens))
        if not grow:
            return [i for i in ids if i is not None] if None in ids else ids  # type: ignore[return-value]
        if None in ids:  # new terms (rare once the vocabulary has settled)
            for at, i in enumerate(ids):
                if i is None:
                    token = tokens[at]
                    i = vocab.get(token)
                    if i is None:
                        i = vocab[token] = len(self.terms)
                        self.terms.append(token)
                    ids[at] = i
        return ids  # type: ignore[return-value]

    # ------------------------------------------------------------------ writes

    def add(
        self, keys: Sequence[str], token_ids: Sequence[Sequence[int]], gids: Sequence[int]
    ) -> None:
        """Add chunks (keys already present are replaced) as one new block (call
        :meth:`merge` next)."""
        self.df = _grow(self.df, len(self.terms))  # terms given ids since the last add
        self.delete([k for k in keys if k in self.chunk_of])
        n = len(keys)
        if n == 0:
            return
        lengths = np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=n)
        flat = np.fromiter(chain.from_iterable(token_ids), dtype=np.int64, count=int(lengths.sum()))
        v = max(len(self.terms), 1)
        local = np.repeat(np.arange(n, dtype=np.int64), lengths)
        pairs, tf = np.unique(local * v + flat, return_counts=True)  # one entry per (chunk, term)
        chunks, terms = np.divmod(pairs, v)
        lo = self.n_chunks
        hi = lo + n
        self._reserve(hi, len(self.terms))
        counts = np.bincount(chunks, minlength=n)
        self.fterms = _grow(self.fterms, int(self.fptr[lo]) + len(terms))
        self.fterms[self.fptr[lo] : self.fptr[lo] + len(terms)] = terms
        self.fptr[lo + 1 : hi + 1] = self.fptr[lo] + np.cumsum(counts)
        self.dl[lo:hi] = lengths
        self.alive[lo:hi] = True
        self.gid[lo:hi] = gids
        self.df[: len(self.terms)] += np.bincount(terms, minlength=len(self.terms))
        for d, key in enumerate(keys, lo):
            self.chunk_of[key] = d
        self.keys.extend(keys)
        self.n_chunks, self.n_live = hi, self.n_live + n
        self.total_len += int(lengths.sum())
        matrix = _postings(tf, terms, chunks + lo, (len(self.terms), hi))
        self.blocks.append(PostingsBlock(lo, hi, matrix))
        self.changes += 1

    def _reserve(self, chunks: int, terms: int) -> None:
        self.dl = _grow(self.dl, chunks, fill=np.inf)
        self.alive = _grow(self.alive, chunks)
        self.gid = _grow(self.gid, chunks)
        self.fptr = _grow(self.fptr, chunks + 1)
        self.df = _grow(self.df, terms)

    def delete(self, keys: Sequence[str]) -> list[int]:
        """Tombstone these chunks (unknown keys are ignored); returns their group ids."""
        chunks = [d for d in map(self.chunk_of.pop, keys, [None] * len(keys)) if d is not None]
        if not chunks:
            return []
        arr = np.asarray(chunks, dtype=np.int64)
        self.alive[arr] = False
        fptr, fterms = self.fptr, self.fterms
        terms = np.concatenate([fterms[fptr[d] : fptr[d + 1]] for d in chunks])
        self.df[: len(self.terms)] -= np.bincount(terms, minlength=len(self.terms))
        self.total_len -= int(self.dl[arr].sum(dtype=np.float64))
        self.dl[arr] = np.inf
        self.n_live -= len(chunks)
        self.changes += 1
        return [int(g) for g in self.gid[arr]]

    def needs_compaction(self, minimum: int = 50_000) -> bool:
        """Dead chunk numbers outnumber live ones (and at least ``minimum`` of them)."""
        dead = self.n_chunks - self.n_live
        return dead >= minimum and dead > self.n_live

    # ------------------------------------------------------------------ merges

    def merge_candidate(self) -> list[PostingsBlock] | None:
        """The newest run of ``merge_factor`` adjacent blocks whose size classes differ
        by at most one, none of them busy, that stays within ``max_block_postings``; None if
        there is none. One class of slack: writes of a few full batches and a remainder
        (``add_documents`` in groups) leave a smaller block after each few, and with
        classes that must be equal those runs never merged (84-501 blocks at 1M chunks)."""
        f = self.merge_factor
        blocks = self.blocks
        for i in range(len(blocks) - f, -1, -1):
            run = blocks[i : i + f]
            levels = [s.level for s in run]
            if (
                max(levels) - min(levels) <= 1
                and not any(id(s) in self.busy for s in run)
                and sum(s.postings for s in run) <= self.max_block_postings
            ):
                return run
        return None

    def merge(self, background: Callable[[list[PostingsBlock]], bool] | None = None) -> None:
        """Run the merges the policy asks for: small ones now, a large one via
        ``background`` (which returns whether it took the run; without it, all now)."""
        while (run := self.merge_candidate()) is not None:
            if background is not None and sum(s.postings for s in run) > self.sync_merge_postings:
                if background(run):
                    self.busy.update(id(s) for s in run)
                return
            self.install(run, self.merged(run), self.epoch)

    def merged(self, run: Sequence[PostingsBlock]) -> PostingsBlock:
        """One block holding the live postings of ``run`` (reads only immutable arrays and
        a snapshot of ``alive``: safe outside the lock)."""
        lo, hi = run[0].lo, run[-1].hi
        alive = self.alive[lo:hi].copy()
        terms, chunks, tf = [], [], []
        for s in run:
            m = s.matrix
            t = np.repeat(np.arange(m.shape[0], dtype=np.int64), np.diff(m.indptr))
            keep = alive[m.indices - lo]
            terms.append(t[keep])
            chunks.append(m.indices[keep])
            tf.append(m.data[keep])
        shape = (max(s.matrix.shape[0] for s in run), hi)
        matrix = _postings(np.concatenate(tf), np.concatenate(terms), np.concatenate(chunks), shape)
        return PostingsBlock(lo, hi, matrix)

    def install(self, run: Sequence[PostingsBlock], merged: PostingsBlock, epoch: int) -> bool:
        """Replace ``run`` by ``merged`` unless the index was renumbered since (then discard)."""
        for s in run:
            self.busy.discard(id(s))
        if epoch != self.epoch:
            return False
        ids = [id(s) for s in self.blocks]
        at = ids.index(id(run[0]))
        assert ids[at : at + len(run)] == [id(s) for s in run], "merge of non-adjacent blocks"
        self.blocks[at : at + len(run)] = [merged]
        return True

    # ------------------------------------------------------------------ bulk

    def export(self) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """Live chunks as ``(keys, vocab, chunk_indptr, terms, tf, gids)`` (chunk-major CSR,
        terms renumbered densely over the terms still in use)."""
        live = np.flatnonzero(self.alive[: self.n_chunks])
        keys = [self.keys[d] or "" for d in live.tolist()]
        used = np.flatnonzero(self.df[: len(self.terms)] > 0)
        remap = np.full(len(self.terms), -1, dtype=np.int64)
        remap[used] = np.arange(len(used))
        rows: list[np.ndarray] = []
        cols: list[np.ndarray] = []
        vals: list[np.ndarray] = []
        for s in self.blocks:
            m = s.matrix
            t = np.repeat(np.arange(m.shape[0], dtype=np.int64), np.diff(m.indptr))
            keep = self.alive[m.indices]
            rows.append(m.indices[keep])
            cols.append(remap[t[keep]])
            vals.append(m.data[keep])
        renumbered = np.full(self.n_chunks, -1, dtype=np.int64)
        renumbered[live] = np.arange(len(live))
        r = renumbered[np.concatenate(rows)] if rows else np.zeros(0, dtype=np.int64)
        c = np.concatenate(cols) if cols else np.zeros(0, dtype=np.int64)
        v = np.concatenate(vals) if vals else np.zeros(0, dtype=np.uint16)
        chunk_major = sparse.csr_array((v, (r, c)), shape=(len(live), len(used)))
        chunk_major.sort_indices()
        vocab = [self.terms[t] for t in used.tolist()]
        return (
            keys,
            vocab,
            chunk_major.indptr.astype(np.int64),
            chunk_major.indices.astype(np.int32),
            chunk_major.data.astype(np.int32),
            self.gid[live].copy(),
        )

    def load(
        self,
        keys: Sequence[str],
        vocab: Sequence[str],
        chunk_indptr: np.ndarray,
        terms: np.ndarray,
        tf: np.ndarray,
        gids: Sequence[int] | np.ndarray,
    ) -> None:
        """Replace everything with these chunks (the format :meth:`export` writes)."""
        self.reset()
        self.terms = list(vocab)
        self.vocab = {t: i for i, t in enumerate(self.terms)}
        if len(self.vocab) != len(self.terms):
            raise ValueError("the vocabulary has duplicate terms")
        n, v = len(keys), len(self.terms)
        self.chunk_of = {k: d for d, k in enumerate(keys)}
        if len(self.chunk_of) != n:
            raise ValueError("duplicate chunk keys")
        self.keys = list(keys)
        counts = np.diff(chunk_indptr)
        chunks = np.repeat(np.arange(n, dtype=np.int64), counts)
        self._reserve(n, v)
        self.fptr[: n + 1] = chunk_indptr
        self.fterms = terms.astype(np.int32)
        self.dl[:n] = np.bincount(chunks, weights=tf, minlength=n)
        self.alive[:n] = True
        self.gid[:n] = np.asarray(gids, dtype=np.int32)
        self.df[:v] = np.bincount(terms, minlength=v)
        self.n_chunks = self.n_live = n
        self.total_len = int(tf.sum())
        if n:
            matrix = _postings(tf, terms, chunks, (v, n))
            self.blocks = [PostingsBlock(0, n, matrix)]
        self.changes += 1

    def compact(self) -> None:
        """Renumber chunks and terms over the live ones (drops every tombstone)."""
        self.load(*self.export())

    # ------------------------------------------------------------------ scoring

    def _idf(self, df: np.ndarray) -> np.ndarray:
        """The IDF of terms with these document frequencies (all above 0)."""
        n = self.n_live
        df = df.astype(np.float64)
        if self.variant == "lucene":
            return np.log1p((n - df + 0.5) / (df + 0.5))
        idf = np.log(n - df + 0.5) - np.log(df + 0.5)
        if (idf < 0).any():  # BM25Okapi floors negative IDFs at epsilon x the average IDF
            idf[idf < 0] = self.epsilon * self._average_idf()
        return idf

    def _average_idf(self) -> float:
        cached = self._idf_cache
        if cached is None or cached[0] != self.changes:
            df = self.df[: len(self.terms)]
            df = df[df > 0].astype(np.float64)
            mean = (
                float(np.mean(np.log(self.n_live - df + 0.5) - np.log(df + 0.5)))
                if len(df)
                else 0.0
            )
            cached = self._idf_cache = (self.changes, np.array([mean]))
        return float(cached[1][0])

    def scores(self, token_ids: Sequence[int]) -> tuple[np.ndarray, np.ndarray]:
        """``(chunk numbers, scores)`` of the chunks matching any query term, either
        as the matches only or as a dense vector over all chunk numbers (``chunks`` is then
        empty); deleted chunks score 0. A query term counts as often as it occurs."""
        empty = (np.zeros(0, dtype=np.int64), np.zeros(0))
        if not token_ids or self.n_live == 0:
            return empty
        counts: dict[int, int] = {}  # a query has a few terms: counted here, not by np.unique
        for t in token_ids:
            counts[t] = counts.get(t, 0) + 1
        uniq = np.fromiter(sorted(counts), dtype=np.int64, count=len(counts))
        df = self.df[uniq]
        if not (live_terms := df > 0).all():
            uniq, df = uniq[live_terms], df[live_terms]
            if not len(uniq):
                return empty
        mult = np.fromiter(map(counts.__getitem__, uniq.tolist()), np.float64, len(uniq))
        weights: np.ndarray = self._idf(df) * mult
        if self.variant == "okapi":
            weights *= self.k1 + 1.0
        chunks, tfs, w, sizes = [], [], [], []
        term_weights = weights.tolist()
        for block in self.blocks:
            indptr, indices, data = block.matrix.indptr, block.matrix.indices, block.matrix.data
            known = len(indptr) - 1  # terms this block has rows for: a prefix of ``uniq``
            terms = uniq if uniq[-1] < known else uniq[uniq < known]
            starts, ends = indptr[terms].tolist(), indptr[terms + 1].tolist()
            for s, e, wt in zip(starts, ends, term_weights):
                if e > s:
                    chunks.append(indices[s:e])
                    tfs.append(data[s:e])
                    w.append(wt)
                    sizes.append(e - s)
        if not chunks:
            return empty
        d = np.concatenate(chunks, dtype=np.intp)  # widened once (numpy indexes with intp)
        tf = np.concatenate(tfs, dtype=np.float32)  # float32 arithmetic below
        k1, b = self.k1, self.b
        avgdl = self.total_len / self.n_live
        x = self.dl[d]  # float32 throughout: bm25s scores in float32 too
        x *= np.float32(k1 * b / avgdl if avgdl > 0 else 0.0)
        x += np.float32(k1 * (1.0 - b))
        x += tf
        np.divide(tf, x, out=x)
        x *= np.repeat(np.asarray(w, dtype=np.float32), sizes)
        if 4 * len(d) < self.n_chunks:  # few matches: accumulate over the matching chunks only
            rows, inverse = np.unique(d, return_inverse=True)
            return rows, np.bincount(inverse, x, minlength=len(rows))
        return empty[0], np.bincount(d, x, minlength=self.n_chunks)

    def groups_holding(self, token_ids: Sequence[int]) -> np.ndarray:
        """The groups (documents) that have a live chunk holding every term of
        ``token_ids``: their group ids, sorted."""
        chunks = None
        for token_id in token_ids:
            holding = self._live_chunks(token_id)
            if chunks is None:
                chunks = holding
            else:  # those of ``chunks`` that also hold this term: a flag per chunk, no sort
                flag = np.zeros(self.n_chunks, dtype=bool)
                flag[holding] = True
                chunks = chunks[flag[chunks]]
        if chunks is None or not len(chunks):
            return np.zeros(0, dtype=np.int64)
        gids = self.gid[chunks]
        seen = np.zeros(int(gids.max()) + 1, dtype=bool)  # a flag per group: no sort
        seen[gids] = True
        return np.flatnonzero(seen)

    def _live_chunks(self, token_id: int) -> np.ndarray:
        """The live chunks holding the term ``token_id``."""
        if token_id >= len(self.df) or self.df[token_id] == 0:
            return np.zeros(0, dtype=np.int64)
        found = []
        for block in self.blocks:
            indptr = block.matrix.indptr
            if token_id + 1 < len(indptr):
                found.append(block.matrix.indices[indptr[token_id] : indptr[token_id + 1]])
        chunks = np.concatenate(found) if found else np.zeros(0, dtype=np.int64)
        return chunks[self.alive[chunks]]

    def top(
        self,
        token_ids: Sequence[int],
        k: int,
        keep: Callable[[np.ndarray], np.ndarray] | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` best chunks with a positive score, best first (ties: lower chunk
        number first); ``keep`` maps candidate chunk numbers to a mask of those allowed."""
        chunks, scores = self.scores(token_ids)
        if not len(chunks) and len(scores):  # dense: only the scores that can be among the k
            cut = floor(scores, k) if keep is None else 0.0
            chunks = np.flatnonzero(scores >= cut if cut > 0 else scores)
            scores = scores[chunks]
        positive = scores > 0
        chunks, scores = chunks[positive], scores[positive]
        if keep is not None and len(chunks):
            allowed = keep(chunks)
            chunks, scores = chunks[allowed], scores[allowed]
        chunks, scores = best(chunks, scores, k)
        order = np.lexsort((chunks, -scores))
        return chunks[order], scores[order]


BLOCK = 64
"""Scores per group in :func:`floor`."""


def floor(scores: np.ndarray, k: int) -> float:
    """A score that the ``k`` best of ``scores`` all reach, so that only the scores at or
    above it need selecting (``np.argpartition`` over 100k scores took 1.4 ms, this 0.04).

    The ``k``-th largest of the maxima of groups of ``scores``: ``k`` groups hold a score
    at least that high, so the ``k``-th best score is too. A group is every
    ``len(scores) // size``-th score (a strided group: the maxima are one elementwise
    maximum of ``size`` rows, three times faster than the maxima of contiguous blocks).
    0.0 (no bound) for fewer than ``8 k`` scores."""
    size = min(BLOCK, len(scores) // (4 * k)) if k > 0 else 0
    if size < 2:
        return 0.0
    groups = len(scores) // size
    maxima = scores[: groups * size].reshape(size, groups).max(axis=0)
    return float(np.partition(maxima, groups - k)[groups - k])


def best(chunks: np.ndarray, scores: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The ``k`` best-scoring entries (``chunks`` ascending), ties at the cut going to the
    lower chunk numbers; in their original order."""
    if len(chunks) <= k:
        return chunks, scores
    if k <= 0:
        return chunks[:0], scores[:0]
    cut = np.partition(scores, len(scores) - k)[len(scores) - k]
    above = scores > cut
    tied = np.flatnonzero(scores == cut)[: k - int(above.sum())]
    above[tied] = True
    return chunks[above], scores[above]
