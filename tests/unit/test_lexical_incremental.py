"""The incremental BM25 index: read-your-writes, and scores equal to a fresh build.

The oracles are independent implementations: ``bm25s.BM25`` (the ``bm25s`` engine's
formula) and ``rank_bm25.BM25Okapi`` (the ``rank_bm25`` engine's), fitted from scratch
on the live chunks after every step, next to a fresh ``BM25Index`` over the same texts.
Small merge and compaction thresholds put every step on one side or the other of them.
"""

from __future__ import annotations

import random
import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from langchain_rse import lexical
from langchain_rse.filters import Filter, matches, parse
from langchain_rse.lexical import BM25Index, group_of, tokenize

WORDS = [f"{a}{b}" for a in ("ka", "lo", "mi", "nu", "pe", "ro") for b in ("ta", "vi", "zo", "qu")]
"""24 words; the first ones are drawn far more often (common and rare terms)."""

SMALL = {
    "merge_factor": 2,
    "sync_merge_postings": 40,
    "max_block_postings": 400,
    "compact_min": 8,
}
"""Thresholds a few dozen chunks cross: merges in the call and in the background, a
size cap, and renumbering."""


def text(rng: random.Random) -> str:
    n = rng.randint(0, 12)
    return " ".join(WORDS[min(int(rng.expovariate(0.25)), len(WORDS) - 1)] for _ in range(n))


def oracle_scores(engine: str, corpus: dict[str, str], query: str) -> dict[str, float]:
    """Positive scores of a BM25 fitted from scratch on ``corpus``."""
    keys = list(corpus)
    tokens = [tokenize(corpus[k]) for k in keys]
    q = tokenize(query)
    if not keys or not q:
        return {}
    if engine == "bm25s":
        import bm25s

        model = bm25s.BM25(k1=1.5, b=0.75)
        model.index(tokens, show_progress=False)
        q = [t for t in q if t in model.vocab_dict]
        scores = np.asarray(model.get_scores(q), dtype=np.float64) if q else np.zeros(len(keys))
    else:
        from rank_bm25 import BM25Okapi

        if not any(tokens):
            return {}
        scores = np.asarray(BM25Okapi(tokens, k1=1.5, b=0.75).get_scores(q))
    return {k: float(s) for k, s in zip(keys, scores) if s > 0}


def assert_same(index: BM25Index, engine: str, corpus: dict[str, str], queries: list[str]) -> None:
    fresh = BM25Index(engine=engine)  # type: ignore[arg-type]
    fresh.set_texts(corpus)
    assert len(index) == len(corpus) == len(fresh)
    for q in queries:
        got = dict(index.search(q, len(corpus) + 1))
        want = oracle_scores(engine, corpus, q)
        assert got.keys() == want.keys(), q
        assert np.allclose([got[k] for k in want], list(want.values()), rtol=1e-5), q
        again = dict(fresh.search(q, len(corpus) + 1))
        assert again.keys() == got.keys() and np.allclose(
            [again[k] for k in got], list(got.values())
        )


QUERIES = ["kata", "kata lota", "rovi roqu kata", "peqo nuzo", "kata kata mivi", "unknown"]


@pytest.mark.parametrize("engine", ["bm25s", "rank_bm25"])
@pytest.mark.parametrize("thresholds", ["small", "default"])
@pytest.mark.parametrize("seed", [0, 1])
def test_scores_equal_a_fresh_index_after_random_adds_and_deletes(engine, thresholds, seed) -> None:
    if engine == "rank_bm25":
        pytest.importorskip("rank_bm25")
    rng = random.Random(seed)
    index = BM25Index(engine=engine, **(SMALL if thresholds == "small" else {}))
    corpus: dict[str, str] = {}
    for step in range(60):
        action = rng.random()
        if action < 0.55 or not corpus:  # add a batch, some of it replacing chunks
            n = rng.choice([1, 1, 2, 5, 12])
            keys = [f"d{rng.randint(0, 80)}\x1f{rng.randint(0, 3)}" for _ in range(n)]
            texts = [text(rng) for _ in keys]
            index.add(keys, texts)
            corpus.update(zip(keys, texts))
        else:  # delete some known and some unknown chunks
            keys = rng.sample(sorted(corpus), min(len(corpus), rng.choice([1, 3, 9])))
            index.delete([*keys, "never\x1fadded"])
            for k in keys:
                corpus.pop(k)
        if step % 6 == 5:
            assert_same(index, engine, corpus, QUERIES)
    index.refresh()
    assert_same(index, engine, corpus, QUERIES)


@pytest.mark.parametrize("background", [True, False])
@pytest.mark.parametrize("size", [0, 1, 7, 30, 120])
def test_read_your_writes_on_both_sides_of_the_thresholds(size, background) -> None:
    """Add then query, delete then query — with the index just below or above the merge,
    size-cap and renumbering thresholds, merges possibly still running."""
    rng = random.Random(size)
    index = BM25Index(background_merges=background, **SMALL)
    corpus = {f"c{i}\x1f0": text(rng) for i in range(size)}
    for key, value in corpus.items():  # one chunk per call: every threshold is crossed
        index.add([key], [value])
    index.add(["new\x1f0"], ["kata zzunique"])
    assert index.search("zzunique", 5)[0][0] == "new\x1f0"  # the very next query sees it
    corpus["new\x1f0"] = "kata zzunique"
    assert_same(index, "bm25s", corpus, ["kata", "zzunique"])
    index.delete(["new\x1f0"])
    assert index.search("zzunique", 5) == []
    del corpus["new\x1f0"]
    assert_same(index, "bm25s", corpus, ["kata"])
    for key in list(corpus)[: max(0, size - 2)]:  # delete past the renumbering threshold
        index.delete([key])
        del corpus[key]
        assert all(k != key for k, _ in index.search(" ".join(WORDS), size + 1))
    assert_same(index, "bm25s", corpus, QUERIES)


def test_merges_and_renumbering_actually_happen() -> None:
    index = BM25Index(background_merges=False, **SMALL)
    for i in range(40):
        index.add([f"c{i}\x1f0"], ["kata lota mivi"])
    assert 1 <= index.blocks < 40  # merged
    bm = index._bm25
    index.delete([f"c{i}\x1f0" for i in range(30)])
    assert bm.n_chunks == len(index) == 10  # renumbered: the tombstones are gone
    assert bm.needs_compaction(8) is False


def test_replacing_a_chunk_and_duplicate_ids_in_one_call() -> None:
    index = BM25Index()
    index.add(["a", "a", "b"], ["kata", "lota lota", "kata"])
    assert dict(index.search("lota", 5)).keys() == {"a"} and len(index) == 2
    index.add(["a"], ["mivi"])
    assert index.search("lota", 5) == [] and index.search("mivi", 5)[0][0] == "a"
    assert sorted(index.tokens()["a"]) == ["mivi"] and len(index) == 2


def test_filters_are_checked_once_per_group(monkeypatch: pytest.MonkeyPatch) -> None:
    index = BM25Index()
    index.add(
        ["x\x1f1\x1f0", "x\x1f1\x1f1", "y\x1f1\x1f0"],
        ["kata", "kata lota", "kata"],
        groups={"x\x1f1": {"t": "x"}, "y\x1f1": {"t": "y"}},
    )
    calls: list[dict] = []
    real = lexical.matches

    def counted(f: Filter | None, metadata: dict) -> bool:
        calls.append(metadata)
        return real(f, metadata)

    monkeypatch.setattr(lexical, "matches", counted)
    x = parse({"t": "x"})
    hits = index.search("kata", 1, x)
    assert [k for k, _ in hits] == ["x\x1f1\x1f1"] or [k for k, _ in hits] == ["x\x1f1\x1f0"]
    assert len(calls) == 2  # two groups, however many chunks
    assert index.search("kata", 1, x) == hits
    assert index.group_frequency(["kata"], x) == ({"kata": 1}, 1)
    assert len(calls) == 2  # until the next write, each group is checked once per filter
    index.delete(["y\x1f1\x1f0"])
    assert "y\x1f1" not in index.groups()


@pytest.mark.parametrize("background", [True, False])
def test_a_failed_merge_leaves_the_index_exact(monkeypatch, background) -> None:
    index = BM25Index(background_merges=background, **SMALL)
    bm = index._bm25

    def broken(run):  # the merge's own work fails (e.g. out of memory)
        raise MemoryError("no room to merge")

    monkeypatch.setattr(bm, "merged", broken)
    corpus = {f"c{i}\x1f0": "kata lota " * (i % 5 + 1) for i in range(30)}
    for k, v in corpus.items():
        index.add([k], [v])
        index.refresh()
    assert index.merge_errors > 0 and not bm.busy
    assert_same(index, "bm25s", corpus, ["kata", "lota"])


def test_concurrent_readers_see_every_write_that_returned() -> None:
    index = BM25Index(**SMALL)
    errors: list[BaseException] = []
    done = threading.Event()

    def reader() -> None:
        try:
            while not done.is_set():
                for key, score in index.search("kata lota", 50):
                    assert score > 0 and key.startswith("w")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    readers = [threading.Thread(target=reader) for _ in range(3)]
    for t in readers:
        t.start()
    rng = random.Random(3)
    corpus: dict[str, str] = {}
    try:
        for i in range(150):
            key = f"w{i % 40}\x1f0"
            if rng.random() < 0.3 and key in corpus:
                index.delete([key])
                del corpus[key]
                assert key not in dict(index.search("kata lota zzz", 100))
            else:
                value = text(rng) + " zzz"
                index.add([key], [value])
                corpus[key] = value
                assert key in dict(index.search("zzz", 100))  # read-your-writes
    finally:
        done.set()
        for t in readers:
            t.join()
    assert not errors
    index.refresh()
    assert_same(index, "bm25s", corpus, QUERIES)


def test_term_frequencies_are_stored_in_16_bits_unless_they_need_more() -> None:
    """Postings keep tf as uint16 (memory), uint32 for a chunk repeating a term > 65,535
    times; scores stay those of a fresh BM25 either way, across a merge of both kinds."""
    index = BM25Index(**SMALL)  # type: ignore[arg-type]
    corpus = {"a": "kata lota", "b": "kata " * 70_000 + "rovi", "c": "lota rovi"}
    for key, body in corpus.items():
        index.add([key], [body])
    dtypes = {block.matrix.data.dtype for block in index._bm25.blocks}
    assert dtypes <= {np.dtype(np.uint16), np.dtype(np.uint32)}
    assert np.dtype(np.uint32) in dtypes
    assert_same(index, "bm25s", corpus, ["kata", "rovi lota", "kata rovi"])
    index.delete(["b"])
    del corpus["b"]
    index._bm25.compact()  # renumbered: one new block
    assert {block.matrix.data.dtype for block in index._bm25.blocks} == {np.dtype(np.uint16)}
    assert_same(index, "bm25s", corpus, ["kata", "rovi lota"])


def test_postings_keep_32_bit_chunk_numbers_through_adds_merges_and_loads() -> None:
    """A posting is a 32-bit chunk number and a 16-bit frequency (scipy would keep the
    64-bit coordinates it was given: 10 bytes a posting instead of 6), in a new block,
    a merged one, a renumbered index and one loaded from its export."""
    rng = random.Random(3)
    index = BM25Index(background_merges=False, **SMALL)  # type: ignore[arg-type]
    corpus = {f"c{i}": text(rng) for i in range(60)}
    for key, body in corpus.items():
        index.add([key], [body])
    bm = index._bm25

    def widths() -> set[tuple[np.dtype, np.dtype]]:
        return {(s.matrix.indices.dtype, s.matrix.indptr.dtype) for s in bm.blocks}

    assert any(s.hi - s.lo > 1 for s in bm.blocks)  # some were merged
    assert widths() == {(np.dtype(np.int32), np.dtype(np.int32))}
    index.delete(list(corpus)[:40])
    for key in list(corpus)[:40]:
        del corpus[key]
    assert bm.n_chunks == len(corpus)  # renumbered: rebuilt from the export
    assert widths() == {(np.dtype(np.int32), np.dtype(np.int32))}
    loaded = BM25Index()
    loaded.load_state(*index.export_state())
    bm = loaded._bm25
    assert widths() == {(np.dtype(np.int32), np.dtype(np.int32))}
    assert_same(loaded, "bm25s", corpus, QUERIES)


def test_batches_with_a_smaller_remainder_still_merge(monkeypatch) -> None:
    """``add_documents`` writes a few full groups and a smaller remainder per call: runs of
    blocks one size class apart merge too, so the block count stays logarithmic (it
    grew by four per call when only equal classes merged) and scores stay exact."""
    from langchain_rse.lexical import bm25

    monkeypatch.setattr(bm25, "_LEVEL_BASE", 4)  # size classes at a few postings
    index = BM25Index(background_merges=False, sync_merge_postings=10**9, max_block_postings=10**9)  # type: ignore[arg-type]
    corpus: dict[str, str] = {}
    for call in range(32):
        for group, docs in enumerate((4, 4, 4, 2)):  # 16, 16, 16 and 8 postings
            keys = [f"c{call}-{group}-{d}" for d in range(docs)]
            texts = [
                " ".join(WORDS[(call + group + d + j) % len(WORDS)] for j in range(4))
                for d in range(docs)
            ]
            index.add(keys, texts)
            corpus.update(zip(keys, texts))
    assert index.blocks <= 16
    assert_same(index, "bm25s", corpus, QUERIES)


@pytest.mark.parametrize("k", [1, 3, 10, 60])
def test_the_best_k_are_the_head_of_the_full_ranking(k) -> None:
    """``search(q, k)`` selects from block maxima and a partition, not a full sort: it
    must return exactly the first ``k`` of the full ranking (score, then the earlier
    chunk), ties at the cut included. 24 words make many equal scores."""
    rng = random.Random(k)
    index = BM25Index(background_merges=False)
    corpus = {f"c{i}": text(rng) for i in range(2_000)}
    index.add(list(corpus), list(corpus.values()))
    for q in [*QUERIES, "kata kata", "roqu", "nuzo mivi peta"]:
        full = index.search(q, len(corpus) + 1)
        assert index.search(q, k) == full[:k], q


def test_the_score_floor_never_passes_the_kth_best() -> None:
    """The floor is a lower bound of the k-th best score (else a result would be lost),
    none for fewer than 8 k scores, and at 100k scores it leaves few to select from."""
    from langchain_rse.lexical.bm25 import floor

    rng = np.random.default_rng(0)
    for n, k in [(10, 1), (800, 100), (5_000, 10), (100_000, 200), (100_000, 1)]:
        scores = np.round(rng.gamma(0.5, 1.0, n) * (rng.random(n) < 0.3), 1)  # zeros, ties
        kth = np.sort(scores)[::-1][k - 1]
        cut = floor(scores, k)
        assert cut <= kth
        if n < 8 * k:
            assert cut == 0.0
        if n == 100_000:
            assert cut > 0 and (scores >= cut).sum() < n // 20


def test_hits_read_their_keys_after_the_index_changes() -> None:
    """Deleting, replacing and compacting after a search leave its hits as they were."""
    index = BM25Index(**SMALL)  # type: ignore[arg-type]
    index.add([f"c{i}" for i in range(30)], ["kata lota" if i % 3 else "kata" for i in range(30)])
    hits = index.search("kata lota", 10)
    before = list(hits)
    assert len(before) == 10
    index.delete([k for k, _ in before[:5]])
    index.add([before[5][0]], ["mita"])  # replaced: a new document number
    index.delete([f"c{i}" for i in range(0, 30, 2)])  # dead outnumber live: renumbered
    assert index._bm25.n_chunks == len(index)  # compacted
    assert list(hits) == before
    assert all(k not in {h for h, _ in index.search("kata lota", 30)} for k, _ in before[:6])


FILTERS = [
    parse({"tenant": "acme"}),
    parse({"tenant": {"$ne": "acme"}}),
    parse({"flag": True}),
    parse({"flag": 1}),  # equal to True in Python, not in the filter language
]


@settings(max_examples=40)
@given(
    seed=st.integers(0, 10_000),
    steps=st.integers(1, 40),
    small=st.booleans(),
    background=st.booleans(),
)
def test_group_and_pair_frequency_count_the_groups_whose_live_chunks_hold_the_terms(
    seed: int, steps: int, small: bool, background: bool
) -> None:
    """Brute force after each of random adds, replaces and deletes (merges and renumbering
    crossed; a group's metadata rewritten by a later add): a term's count is the number of
    groups (document versions) with a live chunk holding it, a pair's those with a live
    chunk holding both, and the number of groups is those with a live chunk; under a
    filter, of the groups whose metadata it allows now, and a filtered search returns the
    unfiltered hits of exactly those groups (a verdict kept from before a write would
    show)."""
    rng = random.Random(seed)
    index = BM25Index(background_merges=background, **(SMALL if small else {}))
    corpus: dict[str, str] = {}
    metadata: dict[str, dict[str, object]] = {}
    terms = {t for w in WORDS for t in tokenize(w)} | {"unknown"}
    common = sorted({t for w in WORDS[:10] for t in tokenize(w)}) + ["unknown"]
    pairs = [(a, b) for a in common for b in common if a < b]  # (the frequent terms)
    for _ in range(steps):
        if rng.random() < 0.6 or not corpus:
            keys = [
                f"d{rng.randint(0, 12)}\x1f{rng.randint(0, 3)}" for _ in range(rng.randint(1, 6))
            ]
            texts = [text(rng) for _ in keys]
            groups = {group_of(k): random_metadata(rng) for k in keys}
            index.add(keys, texts, groups)
            corpus.update(zip(keys, texts))
            metadata.update(groups)
        else:
            gone = rng.sample(sorted(corpus), min(len(corpus), rng.randint(1, 4)))
            index.delete(gone)
            for k in gone:
                corpus.pop(k)
        holders: dict[str, set[str]] = {t: set() for t in terms}
        both: dict[tuple[str, str], set[str]] = {p: set() for p in pairs}
        for key, body in corpus.items():
            held = set(tokenize(body))
            for t in held & terms:
                holders[t].add(group_of(key))
            for a, b in pairs:
                if a in held and b in held:
                    both[(a, b)].add(group_of(key))
        live = {group_of(k) for k in corpus}
        everything = index.search("kata lota mivi", len(corpus) + 1)
        for f in [None, *rng.sample(FILTERS, len(FILTERS))]:
            seen = {g for g in live if matches(f, {**metadata[g], "doc_id": g.split("\x1f")[0]})}
            counts, n = index.group_frequency(terms, f)
            assert counts == {t: len(g & seen) for t, g in holders.items()} and n == len(seen)
            together, n = index.pair_frequency(pairs, f)
            assert together == {p: len(g & seen) for p, g in both.items()} and n == len(seen)
            assert index.search("kata lota mivi", len(corpus) + 1, f) == [
                (k, s) for k, s in everything if group_of(k) in seen
            ]


def random_metadata(rng: random.Random) -> dict[str, object]:
    """A group's metadata: a tenant, and a flag that is ``True``, ``1`` or absent."""
    flag = rng.choice([{"flag": True}, {"flag": 1}, {}])
    return {"tenant": rng.choice(["acme", "globex"]), **flag}
