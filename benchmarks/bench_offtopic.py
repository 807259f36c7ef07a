"""Off-topic questions with a reranker: does RSE return nothing, and at what cost on CUAD?

Asks the 50 questions of ``offtopic_questions.txt`` (cooking, sport, physics, travel,
programming, medicine, history, ...; none about contracts or business) of the CUAD dev
contracts, and reports for each calibration of the offline ``EmbeddingReranker``:

* the share of off-topic questions that return **no segment** (``rse+rerank``, preset
  ``reranked``: a segment is kept only if its value reaches ``min_segment_value``);
* the share of real CUAD dev queries that return nothing, and their recall / precision at
  a 4k-character budget, per half of the contracts (tune on ``a``, check on ``b``).

The query path is ``tune_cuad.py``'s replay of the retriever (verified there with
``--verify``); ``--check`` also runs the real ``RSERetriever`` with the reranker on the
off-topic questions for the chosen setting and counts its empty answers.

``minmax*sigmoid`` rows (marked ``proto``) are a prototype the library does not have: the
min-max relevance scaled by the absolute sigmoid of each cosine.

Usage::

    python benchmarks/bench_offtopic.py --check
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import tune_cuad as T
from common import CachedEmbeddings, base_embeddings, fmt_table, log
from cuad_data import CuadSubset, Query, build_retriever, halves, load_cuad, make_enricher

from langchain_rse.rerank import EmbeddingReranker
from langchain_rse.rerank.calibration import apply_rank_decay, calibrate
from langchain_rse.segments import get_preset

QUESTIONS = Path(__file__).resolve().parent / "offtopic_questions.txt"
CHOSEN = {"calibration": "sigmoid", "sig_center": 0.84, "sig_temp": 0.02}
"""The setting ``--check`` runs through the real retriever."""


def offtopic_questions(path: Path = QUESTIONS) -> list[str]:
    """The questions of ``path``: one a line, ``#`` lines and blank lines skipped."""
    lines = path.read_text(encoding="utf-8").splitlines()
    return [s.strip() for s in lines if s.strip() and not s.lstrip().startswith("#")]


class _ProductRelevance:
    """Prototype: ``minmax(cos) * sigmoid((cos - center) / temperature)``, then rank decay."""

    def __init__(self, center: float, temperature: float, decay: float | None) -> None:
        self.center, self.temperature, self.decay = center, temperature, decay

    def relevance(self, scores: Sequence[float]) -> list[float]:
        absolute = calibrate(
            scores,
            "sigmoid",
            sigmoid_center=self.center,
            sigmoid_temperature=self.temperature,
        )
        return [float(v) for v in apply_rank_decay(calibrate(scores, "minmax") * absolute,
                                                      self.decay)]  # fmt: skip


def settings() -> list[tuple[str, dict[str, Any]]]:
    """(label, Config overrides or ``{"product": (center, temperature)}``) to compare."""
    out: list[tuple[str, dict[str, Any]]] = [("minmax (default)", {"calibration": "minmax"})]
    for center in (0.80, 0.82, 0.84, 0.86):
        for temp in (0.01, 0.02, 0.03):
            cal = {"calibration": "sigmoid", "sig_center": center, "sig_temp": temp}
            out.append((f"sigmoid({center:.2f}, {temp:.2f})", cal))
    for center, temp in ((0.82, 0.01), (0.84, 0.01), (0.84, 0.02)):
        out.append((f"proto minmax*sigmoid({center:.2f}, {temp:.2f})", {"product": (center, temp)}))
    return out


PRESET = "reranked"
"""The RSE preset of the reranked path (``--preset``)."""


def _run(label: str, over: dict[str, Any], corpus: T.Corpus, branches: Any) -> list[list[T.Span]]:
    base = T.Config(rerank="embedding", params=get_preset(PRESET))
    if "product" in over:
        center, temp = over["product"]
        original = T._reranker
        T._reranker = lambda cfg: _ProductRelevance(center, temp, cfg.rank_decay)  # type: ignore
        try:
            return [T.run_query(base, corpus, br) for br in branches]
        finally:
            T._reranker = original
    cfg = T.Config(rerank="embedding", params=get_preset(PRESET), **over)
    return [T.run_query(cfg, corpus, br) for br in branches]


def _recall_precision(data: CuadSubset, ranked: list[list[T.Span]]) -> tuple[float, float]:
    rp = [
        T.recall_precision(q.gold, T.cut_at_budget(r, 4000)) for q, r in zip(data.queries, ranked)
    ]
    return 100 * float(np.mean([r for r, _ in rp])), 100 * float(np.mean([p for _, p in rp]))


def main(argv: Sequence[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--enricher", default="header")
    ap.add_argument("--check", action="store_true", help="run the real retriever too")
    ap.add_argument("--chunk-size", type=int, default=600, help="600: the results of RESULTS.md")
    ap.add_argument("--preset", default="reranked", help="the RSE preset of the reranked path")
    args = ap.parse_args(argv)
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    global PRESET
    PRESET = args.preset

    data = load_cuad(T.DEFAULT_CONTRACTS, T.DEFAULT_SEED)
    inner, model_name = base_embeddings()
    embeddings = CachedEmbeddings(inner, model_name)
    questions = offtopic_questions()
    off = CuadSubset(data.contracts, [Query(q, [], "offtopic") for q in questions])
    retriever = build_retriever(data, embeddings, args.chunk_size, make_enricher(args.enricher))
    corpus = T.corpus_of(retriever)
    real_br = T.precompute(data, corpus, embeddings)
    off_br = T.precompute(off, corpus, embeddings)

    top_real = [float(b.cosine.max()) for b in real_br]
    top_off = [float(b.cosine.max()) for b in off_br]
    pct = (0, 5, 25, 50, 75, 95, 100)
    print("Best cosine of any chunk per question (e5-small), percentiles " + str(pct))
    print(fmt_table(["questions", *map(str, pct)], [
        ["real CUAD dev", *(f"{v:.3f}" for v in np.percentile(top_real, pct))],
        ["off-topic", *(f"{v:.3f}" for v in np.percentile(top_off, pct))],
    ]))  # fmt: skip

    by_half = halves(data)
    rows = []
    for label, over in settings():
        off_empty = 100 * np.mean([r == [] for r in _run(label, over, corpus, off_br)])
        real = _run(label, over, corpus, real_br)
        cells = [label, f"{off_empty:.0f}", f"{100 * np.mean([r == [] for r in real]):.1f}"]
        for idx in [by_half["a"], by_half["b"], list(range(len(real)))]:
            sub = CuadSubset(data.contracts, [data.queries[i] for i in idx])
            rec, prec = _recall_precision(sub, [real[i] for i in idx])
            cells.append(f"{rec:.1f} / {prec:.2f}")
        rows.append(cells)
        log(f"{label}: {cells[1:]}")
    print(
        f"\nrse+rerank (EmbeddingReranker, rank decay 20, preset {PRESET}), CUAD dev "
        f"{len(data.contracts)} contracts, chunk_size={args.chunk_size}, "
        f"enricher={args.enricher}; {len(questions)} off-topic "
        f"questions; real: half a {len(by_half['a'])}, half b {len(by_half['b'])} queries"
    )
    print(fmt_table(
        ["calibration", "off-topic empty %", "real empty %", "half a R/P@4k", "half b R/P@4k",
         "all R/P@4k"],
        rows,
    ))  # fmt: skip

    if args.check:
        reranker = EmbeddingReranker(
            embeddings=embeddings,
            calibration="sigmoid",
            sigmoid_center=CHOSEN["sig_center"],
            sigmoid_temperature=CHOSEN["sig_temp"],
        )
        rse = retriever.model_copy(
            update={"mode": "segments", "reranker": reranker, "rse_params": get_preset(PRESET)}
        )
        got = [rse.invoke(q, k=100) for q in questions]
        replay = _run("chosen", CHOSEN, corpus, off_br)
        same = sum(
            [(d.metadata["doc_id"], d.metadata["start_index"], d.metadata["end_index"]) for d in g]
            == r
            for g, r in zip(got, replay)
        )
        print(
            f"\nRSERetriever.invoke with EmbeddingReranker(calibration='sigmoid', "
            f"sigmoid_center={CHOSEN['sig_center']}, sigmoid_temperature={CHOSEN['sig_temp']}), "
            f"preset {PRESET}: {sum(not g for g in got)}/{len(got)} off-topic questions return "
            f"nothing; {same}/{len(got)} answers identical to the replay"
        )
    embeddings.close()


if __name__ == "__main__":
    main()
