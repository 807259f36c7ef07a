"""RSE segment search alone: ``best_segments`` next to a pure-Python brute force."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import numpy as np

from langchain_rse.segments import RSEParams, Segment, best_segments, get_preset

DOC_CHUNKS = (50, 100)


def make_values(n: int, penalty: float, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Chunk values of ``n`` candidate chunks, as if a reranker scored every chunk.

    Documents of 50-100 chunks; most relevances are low (Beta(0.5, 6)), and a third
    of the documents hold one relevant run of 1-10 chunks with relevance in [0.5, 1].
    """
    rng = np.random.default_rng(seed)
    lengths: list[int] = []
    while sum(lengths) < n:
        lengths.append(int(rng.integers(DOC_CHUNKS[0], DOC_CHUNKS[1] + 1)))
    lengths[-1] -= sum(lengths) - n
    offsets = np.concatenate(([0], np.cumsum(lengths))).astype(np.int64)
    relevance = rng.beta(0.5, 6.0, size=n)
    for start, length in zip(offsets[:-1], lengths):
        if rng.random() < 1 / 3:
            run = int(rng.integers(1, 11))
            at = start + int(rng.integers(0, max(1, length - run + 1)))
            relevance[at : at + run] = rng.uniform(0.5, 1.0, size=len(relevance[at : at + run]))
    return relevance - penalty, offsets


def brute_force_segments(
    values: np.ndarray,
    offsets: np.ndarray,
    max_segment_chunks: int,
    max_total_chunks: int,
    min_segment_value: float,
) -> list[Segment]:
    """The same greedy search written plainly: every pick sums every allowed run.

    O(n * L^2) Python operations per pick (L = ``max_segment_chunks``).
    """
    vals = values.tolist()
    n = len(vals)
    doc_of = np.repeat(np.arange(len(offsets) - 1), np.diff(offsets)).tolist()
    doc_end = [int(offsets[d + 1]) for d in doc_of]
    taken = [False] * n
    budget = max_total_chunks
    segments: list[Segment] = []
    while budget > 0:
        best: tuple[int, int] | None = None
        best_value = -math.inf
        for start in range(n):
            stop = min(doc_end[start], start + min(max_segment_chunks, budget))
            for end in range(start + 1, stop + 1):
                if taken[end - 1]:
                    break
                value = sum(vals[start:end])
                if value > best_value:
                    best_value, best = value, (start, end)
        if best is None or best_value < min_segment_value:
            break
        start, end = best
        doc = doc_of[start]
        segments.append(
            Segment(doc, start - int(offsets[doc]), end - int(offsets[doc]), best_value)
        )
        taken[start:end] = [True] * (end - start)
        budget -= end - start
    return segments


def _same(a: list[Segment], b: list[Segment]) -> bool:
    """Same segments, values equal up to float summation order."""
    return len(a) == len(b) and all(
        (x.doc, x.start, x.end) == (y.doc, y.start, y.end) and abs(x.value - y.value) < 1e-9
        for x, y in zip(a, b)
    )


@dataclass
class RSETiming:
    """One row of the RSE table."""

    n: int
    preset: str
    params: str  # the preset's values when measured: max segment/total/min value
    repeats: int
    median_ms: float
    p95_ms: float
    cpu_median_ms: float
    segments: int
    brute_ms: float | None = None
    brute_note: str = ""
    agree: bool | None = None


def _params_args(p: RSEParams) -> tuple[int, int, float]:
    return p.max_segment_chunks, p.max_total_chunks, p.min_segment_value


def time_best_segments(
    n: int, preset: str, min_repeats: int = 20, min_seconds: float = 1.0
) -> tuple[RSETiming, np.ndarray, np.ndarray]:
    """Median / p95 of ``best_segments`` on ``n`` candidate chunks."""
    params = get_preset(preset)
    values, offsets = make_values(n, params.irrelevant_chunk_penalty)
    best_segments(values, offsets, *_params_args(params))  # warm-up
    wall: list[float] = []
    cpu: list[float] = []
    started = time.perf_counter()
    while len(wall) < min_repeats or time.perf_counter() - started < min_seconds:
        w, c = time.perf_counter(), time.process_time()
        segs = best_segments(values, offsets, *_params_args(params))
        cpu.append(time.process_time() - c)
        wall.append(time.perf_counter() - w)
        if len(wall) >= 10_000:
            break
    ms = np.asarray(wall) * 1e3
    timing = RSETiming(
        n,
        preset,
        f"{params.max_segment_chunks}/{params.max_total_chunks}/{params.min_segment_value}",
        len(wall),
        float(np.median(ms)),
        float(np.percentile(ms, 95)),
        float(np.median(cpu)) * 1e3,
        len(segs),
    )
    return timing, values, offsets


def run_rse_bench(
    sizes: list[int], presets: list[str], brute_preset: str, brute_cap_s: float
) -> list[RSETiming]:
    """Time ``best_segments`` at each size and preset; brute force while it stays under the cap.

    The brute force runs once per size, in increasing size, for ``brute_preset``
    only; a size is skipped when the time extrapolated linearly from the last
    measured size exceeds ``brute_cap_s`` (its cost per pick is linear in n).
    """
    rows: list[RSETiming] = []
    last: tuple[int, float] | None = None
    for n in sizes:
        for preset in presets:
            timing, values, offsets = time_best_segments(n, preset)
            if preset == brute_preset:
                estimate = None if last is None else last[1] * n / last[0]
                if estimate is not None and estimate > brute_cap_s:
                    timing.brute_ms = estimate * 1e3
                    timing.brute_note = (
                        f"est. (linear from n={last[0]:,}; over {brute_cap_s:g} s cap)"
                    )
                else:
                    t = time.perf_counter()
                    reference = brute_force_segments(
                        values, offsets, *_params_args(get_preset(preset))
                    )
                    seconds = time.perf_counter() - t
                    ours = best_segments(values, offsets, *_params_args(get_preset(preset)))
                    timing.brute_ms, timing.agree = seconds * 1e3, _same(ours, reference)
                    last = (n, seconds)
            rows.append(timing)
    return rows
