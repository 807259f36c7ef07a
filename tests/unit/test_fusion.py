"""Fusion math: weighted reciprocal rank fusion."""

from __future__ import annotations

import numpy as np
import pytest

from langchain_rse.fusion import fuse, quotes_code


def test_rrf_formula_and_dedupe_by_id() -> None:
    dense = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
    lexical = [("c", 12.0), ("a", 3.0), ("a", 2.0)]  # duplicate id keeps its best rank
    out = fuse([dense, lexical], [1.0, 2.0], rrf_k=60)
    scores = {h.id: h.fused_score for h in out}
    assert scores["a"] == pytest.approx(1 / 61 + 2 / 62)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 2 / 61)
    assert [h.id for h in out] == ["c", "a", "b"]
    assert {h.id: h.ranks for h in out} == {"a": (1, 2), "b": (2, None), "c": (3, 1)}


def test_same_text_different_ids_are_not_merged() -> None:
    out = fuse([[("x1", None), ("x2", None)]], None)
    assert [h.id for h in out] == ["x1", "x2"]


def test_zero_weight_branch_only_orders_ties() -> None:
    out = fuse([[("a", 1.0)], [("b", 1.0)]], [1.0, 0.0])
    assert out[0].id == "a" and out[1].fused_score == 0.0


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="weights"):
        fuse([[("a", 1.0)]], [1.0, 1.0])
    with pytest.raises(ValueError, match="non-negative"):
        fuse([[("a", 1.0)]], [-1.0])
    assert fuse([], []) == []


@pytest.mark.parametrize(
    ("query", "code"),
    [
        ("What happens in the `run_target` method of the DiffExecutor?", True),
        ("What does the vuln() function do?", True),
        ("What is the purpose of the SIGNALS_PTR static variable?", True),
        ("How is std::vec::Vec grown?", True),
        ("What does self->count hold?", True),
        ("What is the purpose of the DiffExecutor struct?", False),  # CamelCase alone: brands too
        ("Consider the Agreement between Amazon.com, Inc. and eFashion S.A.; renewal term", False),
        ("Is the Licensee(s) obliged to pay ___ within 30 days (see Section 2(a))?", False),
        ("Can the customer terminate for convenience?", False),
    ],
)
def test_quotes_code(query: str, code: bool) -> None:
    assert quotes_code(query) is code


def _reference_fuse(branches, weights, rrf_k=60.0):  # type: ignore[no-untyped-def]
    """Fusion written out one hit at a time, as the definition reads."""
    totals: dict[str, float] = {}
    ranks: dict[str, list[int | None]] = {}
    for b, (branch, weight) in enumerate(zip(branches, weights)):
        contrib = [weight / (rrf_k + r) for r in range(1, len(branch) + 1)]
        for r, ((hit_id, _), value) in enumerate(zip(branch, contrib), start=1):
            slot = ranks.setdefault(hit_id, [None] * len(branches))
            totals.setdefault(hit_id, 0.0)
            if slot[b] is None:
                slot[b] = r
                totals[hit_id] += float(np.float64(value))
    order = sorted(totals, key=totals.__getitem__, reverse=True)
    return [(i, totals[i], tuple(ranks[i])) for i in order]


def test_fuse_equals_the_hit_by_hit_definition() -> None:
    import random

    rng = random.Random(7)
    for _ in range(200):
        n = rng.randint(0, 4)
        branches = []
        for _b in range(n):
            ids = [f"c{rng.randint(0, 30)}" for _ in range(rng.randint(0, 25))]  # duplicates
            scored = rng.random() < 0.7
            branches.append([(i, rng.uniform(-1, 3) if scored else None) for i in ids])
        weights = [rng.choice([0.0, 0.5, 1.0, 4.0]) for _ in branches]
        got = [tuple(h) for h in fuse(branches, weights)]
        assert got == _reference_fuse(branches, weights)
