"""Fusion math: weighted RRF and the score-based fusions."""

from __future__ import annotations

import numpy as np
import pytest

from langchain_rse.fusion import NO_KEY, Ranked, fuse, fused, key_ids, quotes_code


def test_rrf_formula_and_dedupe_by_id() -> None:
    dense = [("a", 0.9), ("b", 0.8), ("c", 0.1)]
    lexical = [("c", 12.0), ("a", 3.0), ("a", 2.0)]  # duplicate id keeps its best rank
    out = fuse([dense, lexical], [1.0, 2.0], "rrf", rrf_k=60)
    scores = {h.id: h.score for h in out}
    assert scores["a"] == pytest.approx(1 / 61 + 2 / 62)
    assert scores["b"] == pytest.approx(1 / 62)
    assert scores["c"] == pytest.approx(1 / 63 + 2 / 61)
    assert [h.id for h in out] == ["c", "a", "b"]
    assert {h.id: h.ranks for h in out} == {"a": (1, 2), "b": (2, None), "c": (3, 1)}


def test_same_text_different_ids_are_not_merged() -> None:
    out = fuse([[("x1", None), ("x2", None)]], None, "rrf")
    assert [h.id for h in out] == ["x1", "x2"]


def test_zero_weight_branch_only_orders_ties() -> None:
    out = fuse([[("a", 1.0)], [("b", 1.0)]], [1.0, 0.0])
    assert out[0].id == "a" and out[1].score == 0.0


def test_relative_score_is_minmax_weighted_sum() -> None:
    dense = [("a", 0.9), ("b", 0.5), ("c", 0.1)]
    lexical = [("b", 10.0), ("c", 5.0)]
    out = {h.id: h.score for h in fuse([dense, lexical], [0.5, 0.5], "relative_score")}
    assert out["a"] == pytest.approx(0.5 * 1.0)
    assert out["b"] == pytest.approx(0.5 * 0.5 + 0.5 * 1.0)
    assert out["c"] == pytest.approx(0.5 * 0.0 + 0.5 * 0.0)


def test_dist_based_uses_mean_plus_minus_three_std() -> None:
    scores = [("a", 3.0), ("b", 2.0), ("c", 1.0)]
    mean, std = 2.0, (2 / 3) ** 0.5
    out = {h.id: h.score for h in fuse([scores], [1.0], "dist_based")}
    assert out["a"] == pytest.approx((3.0 - (mean - 3 * std)) / (6 * std))
    assert out["b"] == pytest.approx(0.5)


def test_rank_only_branch_in_score_fusion() -> None:
    out = fuse([[("a", None), ("b", None)]], [1.0], "relative_score")
    assert [h.id for h in out] == ["a", "b"]


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="weights"):
        fuse([[("a", 1.0)]], [1.0, 1.0])
    with pytest.raises(ValueError, match="non-negative"):
        fuse([[("a", 1.0)]], [-1.0])
    with pytest.raises(ValueError, match="unknown fusion"):
        fuse([[("a", 1.0)]], None, "max")  # type: ignore[arg-type]
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


def _reference_fuse(branches, weights, method, rrf_k=60.0):  # type: ignore[no-untyped-def]
    """Fusion written out one hit at a time, as the definition reads."""
    import numpy as np

    from langchain_rse.fusion import _branch_scores, _normalise

    totals: dict[str, float] = {}
    ranks: dict[str, list[int | None]] = {}
    for b, (branch, weight) in enumerate(zip(branches, weights)):
        if method == "rrf":
            contrib = [weight / (rrf_k + r) for r in range(1, len(branch) + 1)]
        else:
            contrib = list(weight * _normalise(_branch_scores(branch), method))
        for r, ((hit_id, _), value) in enumerate(zip(branch, contrib), start=1):
            slot = ranks.setdefault(hit_id, [None] * len(branches))
            totals.setdefault(hit_id, 0.0)
            if slot[b] is None:
                slot[b] = r
                totals[hit_id] += float(np.float64(value))
    order = sorted(totals, key=totals.__getitem__, reverse=True)
    return [(i, totals[i], tuple(ranks[i])) for i in order]


@pytest.mark.parametrize("method", ["rrf", "relative_score", "dist_based"])
def test_fuse_equals_the_hit_by_hit_definition(method: str) -> None:
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
        got = [tuple(h) for h in fuse(branches, weights, method)]
        assert got == _reference_fuse(branches, weights, method)


# ------------------------------------------------------------------ ranked branches


def ranked_pair(rng: np.random.Generator, keys: list[str]) -> tuple[Ranked, Ranked]:
    """Two branches over ``keys`` with some hits in both (and, at times, one key at two
    positions of an index: a repeat inside a branch)."""
    table = keys + keys[:3]  # positions n..n+2 hold the first three keys again
    ids = key_ids(table)
    out = []
    for _ in range(2):
        at = rng.choice(len(table), size=int(rng.integers(0, 25)), replace=False)
        scores = np.sort(rng.random(len(at)))[::-1]
        out.append(Ranked(table, at, ids[at], scores))
    return out[0], out[1]


@pytest.mark.parametrize("seed", range(40))
@pytest.mark.parametrize("method", ["rrf", "relative_score", "dist_based"])
def test_ranked_branches_fuse_as_their_pairs_do(seed: int, method: str) -> None:
    """Matched by key id, the same scores, ranks and order as the same hits as pairs."""
    rng = np.random.default_rng(seed)
    dense, lexical = ranked_pair(rng, [f"d{i}\x1fv\x1f{i % 7}" for i in range(30)])
    weights = [float(rng.integers(0, 3)), 1.0]
    got = fused([dense, lexical], weights, method)  # type: ignore[arg-type]
    want = fused([list(dense), list(lexical)], weights, method)  # type: ignore[arg-type]
    assert got.top() == want.top()
    assert sorted(got.ids) == sorted(want.ids)
    assert got.ranked_ids(5) == want.ranked_ids(5)


def test_hits_that_share_a_key_id_but_not_a_key_are_told_apart() -> None:
    """Two keys with one key id (a hash collision, made here by hand) are not merged."""
    keys = ["a", "b", "c"]
    ids = np.array([7, 7, 9], dtype=np.int64)  # "a" and "b" collide
    dense = Ranked(keys, np.array([0, 2]), ids[[0, 2]], np.array([0.9, 0.5]))
    lexical = Ranked(keys, np.array([1, 2]), ids[[1, 2]], np.array([3.0, 1.0]))
    out = fused([dense, lexical], [1.0, 1.0]).top()
    assert {h.id: h.ranks for h in out} == {"a": (1, None), "b": (None, 1), "c": (2, 2)}
    assert out == fuse([list(dense), list(lexical)], [1.0, 1.0])


def test_hits_of_two_indexes_are_compared_by_key_and_one_position_is_one_key() -> None:
    """Branches over two key lists (two indexes): a shared key id with another key is
    told apart, one key in both is merged; a repeat at the same position of the same list
    (a focus search over the same index) is merged."""
    dense_keys, lexical_keys = ["a", "c"], ["b", "c", "x"]
    ids = {"a": 7, "b": 7, "c": 9, "x": 11}  # "a" and "b" collide, at one position

    def branch(keys: list[str], at: list[int], scores: list[float]) -> Ranked:
        pos = np.array(at)
        return Ranked(keys, pos, np.array([ids[keys[p]] for p in at]), np.array(scores))

    dense, lexical = (
        branch(dense_keys, [0, 1], [0.9, 0.5]),
        branch(lexical_keys, [0, 1], [3.0, 1.0]),
    )
    focus = branch(dense_keys, [1, 0], [0.8, 0.7])  # the same list: "c" and "a" again
    for branches in ([dense, lexical], [dense, lexical, focus]):
        got = fused(branches, [1.0] * len(branches)).top()  # type: ignore[arg-type]
        assert got == fuse([list(b) for b in branches], [1.0] * len(branches))
        assert {h.id for h in got} == {"a", "b", "c"}
    lexical = branch(lexical_keys, [2, 1], [3.0, 1.0])  # no collision: matched by key id
    got = fused([dense, lexical, focus], [1.0, 1.0, 1.0]).top()
    assert {h.id: h.ranks for h in got} == {"a": (1, None, 2), "c": (2, 2, 1), "x": (None, 1, None)}


def test_a_ranked_branch_is_a_sequence_of_pairs() -> None:
    keys = ["x", None, "y", "z"]
    r = Ranked(keys, np.array([3, 0]), key_ids(["z", "x"]), np.array([2.0, 1.0]))
    assert len(r) == 2 and r[0] == ("z", 2.0) and r[-1] == ("x", 1.0)
    assert r[:1] == [("z", 2.0)] and list(r) == [("z", 2.0), ("x", 1.0)]
    assert r == [("z", 2.0), ("x", 1.0)] and r != [("z", 2.0)]
    assert Ranked.empty() == [] and len(Ranked.empty()) == 0
    assert key_ids(["x", None, ""]).tolist() == [hash("x"), NO_KEY, NO_KEY]
    with pytest.raises(ValueError, match="as many"):
        Ranked(keys, np.array([0]), np.array([], dtype=np.int64), np.array([1.0]))
