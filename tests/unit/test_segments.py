"""RSE: the fast search equals a brute-force reference; presets and values."""

from __future__ import annotations

import numpy as np
import pytest

from langchain_rse.segments import (
    PRESETS,
    RSEParams,
    Segment,
    best_segments,
    by_best_chunk,
    chunk_values,
    get_preset,
    merge_touching,
    rank_relevance,
)


def brute_force(values, offsets, max_len, max_total, min_value, doc_caps=None):
    """Greedy formulation, straightforwardly: every run, every pick."""
    chosen, blocked, budget = [], set(), max_total
    while budget > 0:
        best = None
        for d in range(len(offsets) - 1):
            longest = max_len if doc_caps is None else doc_caps[d]
            for s in range(offsets[d], offsets[d + 1]):
                for length in range(1, longest + 1):
                    e = s + length
                    if e > offsets[d + 1] or length > budget or blocked & set(range(s, e)):
                        break
                    v = sum(values[s:e])
                    if best is None or v > best[2]:
                        best = (s, e, v)
        if best is None or best[2] < min_value:
            break
        chosen.append(best)
        blocked |= set(range(best[0], best[1]))
        budget -= best[1] - best[0]
    return chosen


@pytest.mark.parametrize("seed", range(300))
def test_matches_brute_force(seed: int) -> None:
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 12, size=rng.integers(1, 4))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    values = rng.normal(-0.1, 0.5, size=offsets[-1])
    max_len, max_total = int(rng.integers(1, 7)), int(rng.integers(1, 16))
    min_value = float(rng.uniform(0, 1))
    got = best_segments(values, offsets, max_len, max_total, min_value)
    want = brute_force(list(values), list(offsets), max_len, max_total, min_value)
    assert [(offsets[s.doc] + s.start, offsets[s.doc] + s.end) for s in got] == [
        (a, b) for a, b, _ in want
    ]
    assert [s.value for s in got] == pytest.approx([v for _, _, v in want])


@pytest.mark.parametrize("seed", range(200))
def test_matches_brute_force_with_a_longest_run_per_document(seed: int) -> None:
    """``doc_caps``: each document's own longest run (documents with headings get longer
    ones)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 12, size=rng.integers(1, 5))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    values = rng.normal(0.0, 0.5, size=offsets[-1])
    caps = rng.integers(1, 7, size=len(counts))
    max_total, min_value = int(rng.integers(1, 16)), float(rng.uniform(-0.2, 0.8))
    got = best_segments(values, offsets, 3, max_total, min_value, doc_caps=caps)
    want = brute_force(list(values), list(offsets), 3, max_total, min_value, list(caps))
    assert [(offsets[s.doc] + s.start, offsets[s.doc] + s.end) for s in got] == [
        (a, b) for a, b, _ in want
    ]
    assert all(s.end - s.start <= caps[s.doc] for s in got)


@pytest.mark.parametrize("seed", [4, 304, 672, 1578, 2336, 2820, 2874])
def test_matches_brute_force_when_the_first_batch_of_runs_runs_out(seed: int) -> None:
    """Long documents, mostly positive values and a small budget: every run is worth the
    floor, and these seeds pick from a second sorted batch of runs (found by counting the
    batches; the search sorts the best ``4 x cap x budget`` runs first)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 40, size=rng.integers(1, 6))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    values = rng.normal(0.3, 0.5, size=offsets[-1])
    max_len, max_total = int(rng.integers(1, 7)), int(rng.integers(1, 40))
    min_value = float(rng.uniform(-0.5, 0.5))
    got = best_segments(values, offsets, max_len, max_total, min_value)
    want = brute_force(list(values), list(offsets), max_len, max_total, min_value)
    assert [(offsets[s.doc] + s.start, offsets[s.doc] + s.end) for s in got] == [
        (a, b) for a, b, _ in want
    ]


@pytest.mark.parametrize("seed", range(200))
def test_matches_brute_force_with_ties_and_zero_valued_chunks(seed: int) -> None:
    """Values in quarters (sums exact, so runs tie) with zeros among them, and floors
    below zero: runs that start or end on a chunk worth nothing or less, which the search
    leaves out, are never the pick."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 12, size=rng.integers(1, 4))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    values = rng.choice([-0.5, -0.25, 0.0, 0.25, 0.5], size=offsets[-1])
    max_len, max_total = int(rng.integers(1, 7)), int(rng.integers(1, 16))
    min_value = float(rng.choice([-0.5, -0.25, 0.0, 0.25, 0.5]))
    got = best_segments(values, offsets, max_len, max_total, min_value)
    want = brute_force(list(values), list(offsets), max_len, max_total, min_value)
    assert [(offsets[s.doc] + s.start, offsets[s.doc] + s.end) for s in got] == [
        (a, b) for a, b, _ in want
    ]


def test_invariants_on_a_large_random_case() -> None:
    rng = np.random.default_rng(1)
    counts = rng.integers(1, 400, size=60)
    offsets = np.concatenate(([0], np.cumsum(counts)))
    values = rng.normal(-0.15, 0.4, size=offsets[-1])
    segs = best_segments(values, offsets, 10, 40, 0.3)
    assert segs
    assert sum(s.end - s.start for s in segs) <= 40
    covered = set()
    for s in segs:
        assert 0 <= s.start < s.end <= counts[s.doc]  # never crosses a document
        assert s.end - s.start <= 10 and s.value >= 0.3
        span = {(s.doc, i) for i in range(s.start, s.end)}
        assert not covered & span  # never overlaps
        covered |= span
        lo = offsets[s.doc]
        assert s.value == pytest.approx(values[lo + s.start : lo + s.end].sum())
    assert [s.value for s in segs] == sorted((s.value for s in segs), reverse=True)


def test_edge_cases() -> None:
    assert best_segments(np.array([]), np.array([0]), 5, 10, 0.1) == []
    assert best_segments(np.array([-1.0, -2.0]), np.array([0, 2]), 5, 10, 0.0) == []
    assert best_segments(np.array([1.0]), np.array([0, 1]), 5, 0, 0.0) == []
    segs = best_segments(np.array([0.5, 0.5, 0.5]), np.array([0, 3]), 2, 10, 0.0)
    assert [(s.start, s.end) for s in segs] == [(0, 2), (2, 3)]


def test_chunk_values_penalise_unretrieved_chunks() -> None:
    values, offsets = chunk_values([3, 2], [(0, 1, 0.9), (1, 0, 0.5), (0, 1, 0.4)], 0.2)
    assert list(offsets) == [0, 3, 5]
    assert values == pytest.approx([-0.2, 0.7, -0.2, 0.3, -0.2])
    with pytest.raises(IndexError):
        chunk_values([1], [(0, 3, 1.0)], 0.2)


def test_rank_relevance_decays_from_one() -> None:
    rel = rank_relevance(4, decay_rate=10.0)
    assert rel[0] == 1.0 and np.all(np.diff(rel) < 0)
    assert rel[3] == pytest.approx(np.exp(-0.3))


def test_presets() -> None:
    assert PRESETS["balanced"] == RSEParams(15, 30, 0.5, 0.18, 30.0)
    assert get_preset("default") == PRESETS["default"]
    with pytest.raises(ValueError, match="unknown RSE preset"):
        get_preset("nope")
    with pytest.raises(ValueError, match="max_segment_chunks"):
        RSEParams(max_segment_chunks=0)
    assert PRESETS["balanced"].with_overrides(max_total_chunks=5).max_total_chunks == 5


def test_touching_segments_are_merged_into_one() -> None:
    from langchain_rse.segments import Segment

    segs = [
        Segment(0, 2, 6, 2.4),
        Segment(1, 0, 2, 1.0),
        Segment(0, 6, 7, 0.6),
        Segment(0, 7, 8, 0.3),
        Segment(0, 0, 1, 0.2),
    ]
    assert merge_touching(segs) == [
        Segment(0, 2, 8, pytest.approx(3.3)),  # 2-6 + 6-7 + 7-8, worth their total
        Segment(1, 0, 2, 1.0),
        Segment(0, 0, 1, 0.2),  # does not touch: a gap at chunk 1
    ]
    assert merge_touching([]) == []


def merge_reference(segments):
    """Merging as first written: join each segment into the first touching run, again
    until none touch."""
    merged = []
    for seg in segments:
        for i, m in enumerate(merged):
            if m.doc == seg.doc and (m.end == seg.start or seg.end == m.start):
                merged[i] = Segment(
                    m.doc, min(m.start, seg.start), max(m.end, seg.end), m.value + seg.value
                )
                break
        else:
            merged.append(seg)
    if len(merged) < len(segments):
        return merge_reference(merged)
    return sorted(merged, key=lambda g: -g.value)


@pytest.mark.parametrize("seed", range(100))
def test_merging_equals_the_first_written_merge(seed: int) -> None:
    """Picks of real searches (short caps, so that runs touch, often in chains)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(1, 30, size=rng.integers(1, 4))
    offsets = np.concatenate(([0], np.cumsum(counts)))
    values = rng.normal(0.2, 0.5, size=offsets[-1])
    picked = best_segments(values, offsets, int(rng.integers(1, 4)), 40, 0.0)
    got, want = merge_touching(picked), merge_reference(picked)
    assert [(g.doc, g.start, g.end) for g in got] == [(g.doc, g.start, g.end) for g in want]
    assert [g.value for g in got] == pytest.approx([g.value for g in want])


def test_a_strongly_relevant_passage_longer_than_the_cap_comes_back_whole() -> None:
    # Chunks 2..6 of a 10-chunk document all match strongly; the cap is 4 chunks.
    hits = [(0, i, 0.95) for i in range(2, 7)] + [(0, 9, 0.35)]
    values, offsets = chunk_values([10], hits, irrelevant_chunk_penalty=0.3)
    capped = best_segments(values, offsets, 4, 12, 0.2)
    assert [(s.start, s.end) for s in capped] == [(2, 6), (6, 7)]  # split by the cap
    merged = merge_touching(capped)
    assert [(s.start, s.end) for s in merged] == [(2, 7)]  # the whole passage, one segment
    assert "merge_touching" in RSEParams.__dataclass_fields__ and RSEParams().merge_touching


def test_segments_come_in_the_order_of_their_best_chunk() -> None:
    """An exact hit alone (relevance 1) is picked after a run of three middling chunks worth
    more in total, and returned before it; ties keep the picking order."""
    # document 0: one top chunk between irrelevant ones; document 1: three middling chunks
    values, offsets = chunk_values(
        [3, 3], [(0, 1, 1.0), (1, 0, 0.6), (1, 1, 0.6), (1, 2, 0.6)], 0.2
    )
    picked = best_segments(values, offsets, 3, 24, 0.2)
    assert [(g.doc, g.start, g.end) for g in picked] == [(1, 0, 3), (0, 1, 2)]
    assert picked[0].value > picked[1].value
    ordered = by_best_chunk(picked, values, offsets)
    assert [(g.doc, g.start, g.end) for g in ordered] == [(0, 1, 2), (1, 0, 3)]
    same, offsets2 = chunk_values([1, 1], [(0, 0, 0.8), (1, 0, 0.8)], 0.2)
    tied = [Segment(1, 0, 1, 0.6), Segment(0, 0, 1, 0.6)]
    assert by_best_chunk(tied, same, offsets2) == tied
