"""The in-process lexical branch: a BM25 index over :mod:`langchain_rse.lexical.tokenizer`'s terms.

The index is incremental (:mod:`langchain_rse.lexical.bm25`): every addition and deletion is
visible to the next search, with statistics exactly those of an index built from scratch.
"""

from __future__ import annotations

import io
import logging
import threading
from collections.abc import Callable, Iterable, Mapping, Sequence
from functools import lru_cache, partial
from typing import Any, Literal

import numpy as np

from langchain_rse.filters import Filter, doc_ids, matches
from langchain_rse.indexing.recordstore import ReadWriteLock
from langchain_rse.lexical.bm25 import IncrementalBM25, PostingsBlock
from langchain_rse.lexical.tokenizer import DEFAULT_STEMMER, check_stemmer, tokenize

__all__ = ["BM25Index", "LexicalHit", "tokenize"]

logger = logging.getLogger(__name__)

LexicalEngine = Literal["bm25s", "rank_bm25"]
_VARIANT = {"bm25s": "lucene", "rank_bm25": "okapi"}
SAVE_FORMAT = 3
"""Version of :meth:`BM25Index.export_state`'s layout (1: token lists in JSON; 2: arrays,
terms not stemmed; 3: arrays and the stemmer's name)."""
_BULK = 20_000  # chunks per block when a whole index is loaded
_VERDICTS_KEPT = 64
"""Filters whose verdicts on the groups are kept between writes (the least recently used
goes first): a byte per group each."""


LexicalHit = tuple[str, float]
"""``(chunk_id, bm25_score)``."""


def group_of(chunk_id: str) -> str:
    """A chunk id's group: everything before its last ``\x1f`` (the chunk keys of
    :func:`langchain_rse.indexing.chunking.chunk_key` group by document version)."""
    return chunk_id.rsplit("\x1f", 1)[0]


def _with_doc_id(group: str, metadata: dict[str, Any]) -> dict[str, Any]:
    """A group's metadata as a filter sees it: with its doc id (see :meth:`BM25Index.search`)."""
    return {**metadata, "doc_id": group.rsplit("\x1f", 1)[0]}


class BM25Index:
    """BM25 over chunk texts, keyed by chunk id; incremental, with read-your-writes.

    ``engine="bm25s"`` (default) scores like ``bm25s.BM25()`` (Lucene's BM25);
    ``engine="rank_bm25"`` like ``rank_bm25.BM25Okapi`` (Robertson's IDF, negative IDFs
    floored at ``epsilon`` times the average). Both are computed here, over immutable
    blocks of term frequencies plus tombstones, with the corpus statistics (chunks,
    average length, document frequencies) kept exact after every change: a search always
    sees every write that returned before it, and scores what an index built from scratch
    over the same chunks would (see :mod:`langchain_rse.lexical.bm25`). Adding or deleting a chunk
    costs time proportional to its length; blocks merge in the writing call when small,
    on a background thread when large (``background_merges=False``: always in the call).

    Searches run concurrently; writes are exclusive (a writer-preferring lock).
    """

    def __init__(
        self,
        engine: LexicalEngine = "bm25s",
        k1: float = 1.5,
        b: float = 0.75,
        *,
        epsilon: float = 0.25,
        merge_factor: int = 4,
        sync_merge_postings: int = 2_000_000,
        max_block_postings: int = 8_000_000,
        background_merges: bool = True,
        compact_min: int = 50_000,
        stemmer: str | None = DEFAULT_STEMMER,
    ) -> None:
        if engine not in _VARIANT:
            raise ValueError(f"unknown lexical engine {engine!r}; use 'bm25s' or 'rank_bm25'")
        self.engine: LexicalEngine = engine
        self.stemmer = check_stemmer(stemmer)
        """The Snowball stemmer of every text and query (:func:`tokenize`)."""
        self.k1 = k1
        self.b = b
        self.background_merges = background_merges
        self.compact_min = compact_min
        """Renumber the index when at least this many, and more than half, of the
        chunk numbers are deleted ones."""
        self._bm25 = IncrementalBM25(
            k1,
            b,
            _VARIANT[engine],  # type: ignore[arg-type]
            epsilon,
            merge_factor,
            sync_merge_postings,
            max_block_postings,
        )
        self._groups: dict[str, dict[str, Any]] = {}
        """Metadata per group (a document version): what filters are checked against."""
        self._gid: dict[str, int] = {}
        self._group_keys: list[str | None] = []
        """Each group id's group (None: free, reused by the next new group)."""
        self._group_live: list[int] = []
        """Each group id's live chunks: a group whose last chunk goes is forgotten."""
        self._free_gids: list[int] = []
        self._rw = ReadWriteLock()
        self._verdicts = lru_cache(maxsize=_VERDICTS_KEPT)(self._unknown_verdicts)
        """Per filter (its ``repr``), each group id's verdict: 1 accepted, 0 refused, -1 not
        asked yet. Searches fill it in; every write empties the cache."""
        self._merger: threading.Thread | None = None
        self.merge_errors = 0
        """Background merges that failed (logged; the blocks stay unmerged, still exact)."""

    def __len__(self) -> int:
        return len(self._bm25)

    def __repr__(self) -> str:
        return f"BM25Index(engine={self.engine!r}, stemmer={self.stemmer!r}, chunks={len(self)})"

    def add(
        self,
        ids: Sequence[str],
        texts: Sequence[str],
        groups: Mapping[str, dict[str, Any]] | None = None,
    ) -> None:
        """Add (or replace) chunks; ``groups``: metadata per group (see :func:`group_of`)
        that :meth:`search`'s ``filter`` is checked against. Visible to the next search."""
        if len(ids) != len(texts):
            raise ValueError("ids and texts must have the same length")
        tokens = {i: tokenize(t, self.stemmer) for i, t in zip(ids, texts)}  # last duplicate wins
        with self._rw.write():
            self._verdicts.cache_clear()
            bm = self._bm25
            self._release(bm.delete([i for i in tokens if i in bm.chunk_of]))  # replaced ones
            self._groups.update(groups or {})
            self._add_locked(list(tokens), list(tokens.values()))

    def _add_locked(self, ids: list[str], tokens: list[list[str]]) -> None:
        bm = self._bm25
        gids = self._group_ids(ids)
        term_ids = [bm.term_ids(t, grow=True) for t in tokens]
        bm.add(ids, term_ids, gids)
        self._merge_now()
        self._maybe_compact()

    def _group_ids(self, ids: Sequence[str]) -> list[int]:
        """The group id of each chunk id (a new group gets a free one), counted as live."""
        gids = []
        for chunk_id in ids:
            group = group_of(chunk_id)
            g = self._gid.get(group)
            if g is None:
                if self._free_gids:
                    g = self._free_gids.pop()
                    self._group_keys[g] = group
                else:
                    g = len(self._group_keys)
                    self._group_keys.append(group)
                    self._group_live.append(0)
                self._gid[group] = g
            self._group_live[g] += 1
            gids.append(g)
        return gids

    def _release(self, gids: Sequence[int]) -> None:
        """Count these chunks' groups down; forget each group (its id, name and metadata)
        whose last chunk went, so deleted versions leave nothing behind."""
        live = self._group_live
        for g in gids:
            live[g] -= 1
        for g in set(gids):
            if live[g] == 0:
                group = self._group_keys[g]
                assert group is not None
                del self._gid[group]
                self._groups.pop(group, None)
                self._group_keys[g] = None
                self._free_gids.append(g)

    def delete(self, ids: Iterable[str]) -> None:
        """Remove chunks (and the metadata of their groups); unknown ids are ignored.
        Visible to the next search."""
        ids = list(ids)
        with self._rw.write():
            self._verdicts.cache_clear()
            self._release(self._bm25.delete(ids))
            self._maybe_compact()

    def delete_groups(self, groups: Iterable[str]) -> int:
        """Remove every chunk of these groups (document versions); returns how many."""
        with self._rw.write():
            self._verdicts.cache_clear()
            bm = self._bm25
            gids = [self._gid[g] for g in groups if g in self._gid]
            if not gids:
                return 0
            n = bm.n_chunks
            chunks = np.flatnonzero(np.isin(bm.gid[:n], gids) & bm.alive[:n])
            keys = [bm.keys[d] for d in chunks.tolist()]
            self._release(bm.delete([k for k in keys if k is not None]))
            self._maybe_compact()
            return len(keys)

    def live_groups(self) -> set[str]:
        """The groups that have chunks in the index."""
        with self._rw.read():
            bm = self._bm25
            n = bm.n_chunks
            gids = np.unique(bm.gid[:n][bm.alive[:n]])
            return {g for g in map(self._group_keys.__getitem__, gids.tolist()) if g}

    def group_frequency(
        self, terms: Iterable[str], filter: Filter | None = None
    ) -> tuple[dict[str, int], int]:
        """For analyzed ``terms`` (as :func:`tokenize` gives them), how many groups (document
        versions) hold each in some chunk, and how many groups there are; with ``filter``
        (parsed, see :func:`~langchain_rse.filters.parse`), only the groups it allows (as
        :meth:`search` checks them)."""
        with self._rw.read():
            vocab = self._bm25.vocab
            count = self._group_counter(filter)
            found = {t: count([vocab[t]]) if t in vocab else 0 for t in terms}
            return found, self._groups_allowed(filter)

    def pair_frequency(
        self, pairs: Iterable[tuple[str, str]], filter: Filter | None = None
    ) -> tuple[dict[tuple[str, str], int], int]:
        """For pairs of analyzed terms, how many groups (document versions) hold both terms
        of each in one chunk, and how many groups there are; with ``filter``, only the
        groups it allows."""
        with self._rw.read():
            vocab = self._bm25.vocab
            count = self._group_counter(filter)
            found = {
                (a, b): count([vocab[a], vocab[b]]) if a in vocab and b in vocab else 0
                for a, b in pairs
            }
            return found, self._groups_allowed(filter)

    def _group_counter(self, filter: Filter | None) -> Callable[[list[int]], int]:
        """Counts the groups ``filter`` allows (all without it) that have a live chunk
        holding every one of some term ids (read lock held)."""
        bm = self._bm25
        if filter is None:
            return lambda token_ids: len(bm.groups_holding(token_ids))
        return lambda token_ids: int(self._verdict(filter, bm.groups_holding(token_ids)).sum())

    def _groups_allowed(self, filter: Filter | None) -> int:
        """How many groups have a live chunk, of those ``filter`` allows (read lock held)."""
        if filter is None:
            return len(self._gid)
        return int(self._verdict(filter, np.fromiter(self._gid.values(), dtype=np.intp)).sum())

    def _unknown_verdicts(self, filter_repr: str) -> np.ndarray:
        """A verdict per group id, none asked yet."""
        return np.full(len(self._group_keys), -1, dtype=np.int8)

    def _verdict(self, filter: Filter, gids: np.ndarray) -> np.ndarray:
        """Whether ``filter`` allows each of the live groups ``gids``; each group's metadata
        is checked once per filter between two writes (for the most recently used
        :data:`_VERDICTS_KEPT` filters that do not name doc ids; read lock held)."""
        if doc_ids(filter) is None:
            known = self._verdicts(repr(filter))  # (repr: the equal Filters 1 and True differ)
        else:  # a routed or pinned query's own documents: seldom asked again
            known = self._unknown_verdicts("")
        asked = known[gids]
        if (asked < 0).any():
            names, groups = self._group_keys, self._groups
            for g in np.unique(gids[asked < 0]).tolist():
                name = names[g] or ""  # (live chunks' groups are never free)
                known[g] = matches(filter, _with_doc_id(name, groups.get(name, {})))
            asked = known[gids]
        return asked > 0

    def _maybe_compact(self) -> None:
        bm = self._bm25
        if bm.n_chunks and not bm.n_live:  # everything deleted: start afresh (cheap)
            self._reset(None)
        elif bm.needs_compaction(self.compact_min):
            dead = bm.n_chunks - bm.n_live
            bm.compact()
            logger.info("BM25 index renumbered: %d deleted chunks dropped", dead)

    def set_texts(
        self, texts: Mapping[str, str], groups: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """Replace the whole index with these chunk texts (a reload)."""
        self.set_tokens({key: tokenize(text, self.stemmer) for key, text in texts.items()}, groups)

    def set_tokens(
        self, tokens: Mapping[str, list[str]], groups: dict[str, dict[str, Any]] | None = None
    ) -> None:
        """Replace the whole index with pre-tokenized chunks (for loading)."""
        ids = list(tokens)
        with self._rw.write():
            self._reset(groups)
            for at in range(0, len(ids), _BULK):
                part = ids[at : at + _BULK]
                bm = self._bm25
                gids = self._group_ids(part)
                bm.add(part, [bm.term_ids(tokens[i], grow=True) for i in part], gids)
                bm.merge()

    def _reset(self, groups: dict[str, dict[str, Any]] | None) -> None:
        self._verdicts.cache_clear()
        self._bm25.reset()
        self._groups = dict(groups or {})
        self._gid, self._group_keys, self._group_live, self._free_gids = {}, [], [], []

    # ------------------------------------------------------------------ merges

    def _merge_now(self) -> None:
        """The merges the policy asks for after a write (under the lock). A failure is
        logged and counted, never raised: the write itself is complete, and unmerged
        blocks score exactly the same."""
        try:
            self._bm25.merge(self._schedule if self.background_merges else None)
        except Exception:
            self.merge_errors += 1
            logger.exception(
                "BM25 block merge failed; the blocks stay unmerged (scores are unaffected)"
            )

    def _schedule(self, run: list[PostingsBlock]) -> bool:
        """Start a background merge of ``run`` unless one is running (called under the lock)."""
        if self._merger is not None and self._merger.is_alive():
            return False
        epoch = self._bm25.epoch
        self._merger = threading.Thread(
            target=self._merge, args=(run, epoch), name="bm25-merge", daemon=True
        )
        self._merger.start()
        return True

    def _merge(self, run: list[PostingsBlock], epoch: int) -> None:
        bm = self._bm25
        try:
            merged = bm.merged(run)  # outside the lock: searches and writes go on
        except Exception:
            logger.exception(
                "background BM25 merge of %d blocks failed; they stay "
                "unmerged (scores are unaffected)",
                len(run),
            )
            with self._rw.write():
                bm.busy.difference_update(id(s) for s in run)
                self.merge_errors += 1
            return
        with self._rw.write():
            bm.install(run, merged, epoch)
            self._merger = None
            self._merge_now()  # what the merge made possible

    def refresh(self) -> None:
        """Wait for background merges to finish (every write is searchable already; this
        only settles the block layout, e.g. before measuring)."""
        while (merger := self._merger) is not None and merger.is_alive():
            merger.join()

    @property
    def nbytes(self) -> int:
        """Bytes of the index's arrays (see :attr:`IncrementalBM25.nbytes`)."""
        return self._bm25.nbytes

    @property
    def blocks(self) -> int:
        """Number of blocks searched (for diagnostics)."""
        return len(self._bm25.blocks)

    # ------------------------------------------------------------------ reads

    def keys(self) -> list[str]:
        """The chunk ids indexed."""
        with self._rw.read():
            return list(self._bm25.chunk_of)

    def groups(self) -> dict[str, dict[str, Any]]:
        """A copy of the metadata per group (for saving)."""
        with self._rw.read():
            return dict(self._groups)

    def tokens(self) -> dict[str, list[str]]:
        """Each chunk's tokens as a bag (term repeated by its frequency; the original order
        is not kept: BM25 does not use it)."""
        keys, vocab, indptr, terms, tf, _ = self._export()
        words = [vocab[t] for t in terms.tolist()]
        counts = tf.tolist()
        return {
            key: [w for i in range(indptr[d], indptr[d + 1]) for w in [words[i]] * counts[i]]
            for d, key in enumerate(keys)
        }

    def _export(self) -> tuple[list[str], list[str], np.ndarray, np.ndarray, np.ndarray, Any]:
        with self._rw.read():
            return self._bm25.export()

    def idf(self, terms: Iterable[str]) -> dict[str, float]:
        """The IDF over the chunks indexed now (as Lucene's BM25 computes it) of each of
        these analyzed terms that some chunk holds; terms no chunk holds are left out."""
        with self._rw.read():
            bm = self._bm25
            ids = {t: i for t in terms if (i := bm.vocab.get(t)) is not None and bm.df[i] > 0}
            df = bm.df[list(ids.values())].astype(np.float64)
            return dict(zip(ids, np.log1p((bm.n_live - df + 0.5) / (df + 0.5)).tolist()))

    def search(self, query: str, k: int, filter: Filter | None = None) -> list[LexicalHit]:
        """The ``k`` best chunks with a positive BM25 score, best first (ties: the earlier
        added first); with ``filter`` (parsed, see :func:`~langchain_rse.filters.parse`),
        only chunks whose group's metadata it allows, with the group's ``doc_id`` added
        (its name up to the last ``\x1f``: the doc id of the retriever's chunk keys),
        checked before the top ``k`` is cut, so a selective filter still gets ``k``."""
        q = tokenize(query, self.stemmer)
        if not q or k <= 0:
            return []
        with self._rw.read():
            bm = self._bm25
            keep = None if filter is None else partial(self._allowed, filter)
            chunks, scores = bm.top(bm.term_ids(q, grow=False), k, keep)
            keys = bm.keys
            return [(keys[d], s) for d, s in zip(chunks.tolist(), scores.tolist())]

    def _allowed(self, filter: Filter, chunks: np.ndarray) -> np.ndarray:
        """Which of ``chunks`` have a group ``filter`` allows (read lock held)."""
        return self._verdict(filter, self._bm25.gid[chunks])

    # ------------------------------------------------------------------ persistence

    def export_state(self) -> tuple[dict[str, Any], bytes]:
        """The index as ``(JSON-able header, .npz bytes)``: keys, vocabulary and groups in
        the header; per chunk its term ids and frequencies (chunk-major CSR, its row offsets
        saved as ``doc_indptr``) in the arrays."""
        keys, vocab, indptr, terms, tf, _ = self._export()
        buffer = io.BytesIO()
        np.savez_compressed(buffer, doc_indptr=indptr, terms=terms, tf=tf)
        header = {
            "format": SAVE_FORMAT,
            "stemmer": self.stemmer,
            "keys": keys,
            "vocab": vocab,
            "groups": self.groups(),
        }
        return header, buffer.getvalue()

    def load_state(self, header: Mapping[str, Any], arrays: bytes) -> None:
        """Replace the index with one :meth:`export_state` wrote; ``ValueError`` when the
        two parts are malformed or disagree."""
        try:
            with np.load(io.BytesIO(arrays), allow_pickle=False) as data:
                indptr, terms, tf = (np.asarray(data[n]) for n in ("doc_indptr", "terms", "tf"))
        except (OSError, ValueError, KeyError) as exc:
            raise ValueError(f"the BM25 arrays cannot be read: {exc}") from None
        if header.get("format") != SAVE_FORMAT:
            raise ValueError(
                f"BM25 save format {header.get('format')!r} is not supported "
                f"(this version reads {SAVE_FORMAT})"
            )
        if (saved := header.get("stemmer")) != self.stemmer:
            raise ValueError(
                f"the BM25 index was saved with stemmer={saved!r}; "
                f"this index uses stemmer={self.stemmer!r}"
            )
        keys, vocab = header.get("keys"), header.get("vocab")
        if not isinstance(keys, list) or not isinstance(vocab, list):
            raise ValueError("the BM25 header lacks its keys or vocabulary")
        if not all(isinstance(x, str) for x in keys) or not all(isinstance(x, str) for x in vocab):
            raise ValueError("BM25 keys and terms must be strings")
        ok = (
            indptr.ndim == terms.ndim == tf.ndim == 1
            and all(a.dtype.kind in "iu" for a in (indptr, terms, tf))
            and len(indptr) == len(keys) + 1
            and len(terms) == len(tf)
            and (len(indptr) == 0 or (indptr[0] == 0 and indptr[-1] == len(terms)))
            and bool(np.all(np.diff(indptr) >= 0))
            and (not len(terms) or (int(terms.min()) >= 0 and int(terms.max()) < len(vocab)))
            and (not len(tf) or int(tf.min()) > 0)
        )
        if not ok:
            raise ValueError("the BM25 arrays are inconsistent with their header")
        groups = header.get("groups") or {}
        with self._rw.write():
            self._reset(groups)
            gids = self._group_ids(keys)
            self._bm25.load(
                keys,
                vocab,
                indptr.astype(np.int64),
                terms.astype(np.int64),
                tf.astype(np.int64),
                gids,
            )
