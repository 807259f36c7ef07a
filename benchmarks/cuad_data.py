"""CUAD dev split: a seeded sample of contracts, their questions and gold spans, in halves."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

from common import Span, require_data

DEFAULT_CONTRACTS = 50
DEFAULT_SEED = 0


@dataclass(frozen=True)
class Query:
    text: str
    gold: list[Span]
    category: str


@dataclass(frozen=True)
class CuadSubset:
    contracts: dict[str, str]
    """file name -> text (UTF-8, errors="replace")."""
    queries: list[Query]


def load_cuad(
    n_contracts: int | None = DEFAULT_CONTRACTS, seed: int = DEFAULT_SEED, untuned: bool = False
) -> CuadSubset:
    """A seeded sample of dev contracts with all their dev queries (``None``: all).

    ``untuned``: sample only among the dev contracts outside the default sample (50, seed
    0), the one every default was chosen on, to check the defaults on contracts they never saw.
    """
    root = require_data("cuad")
    dev = json.loads((root / "dev.json").read_text(encoding="utf-8"))
    files = sorted({s["file_path"] for t in dev["tests"] for s in t["snippets"]})
    if untuned:
        tuned = set(random.Random(DEFAULT_SEED).sample(files, DEFAULT_CONTRACTS))
        files = [f for f in files if f not in tuned]
    if n_contracts is not None and n_contracts < len(files):
        files = sorted(random.Random(seed).sample(files, n_contracts))
    chosen = set(files)
    contracts = {
        f: (root / "contracts" / f).read_text(encoding="utf-8", errors="replace") for f in files
    }
    queries = []
    for t in dev["tests"]:
        snippet_files = {s["file_path"] for s in t["snippets"]}
        if snippet_files <= chosen:
            gold = [(s["file_path"], s["span"][0], s["span"][1]) for s in t["snippets"]]
            queries.append(Query(t["query"], gold, t["tags"][-1]))
    return CuadSubset(contracts, queries)


def halves(data: CuadSubset) -> dict[str, list[int]]:
    """Query positions of each half: ``a`` asks about the contracts at even positions in
    name order, ``b`` about the odd ones (all stay indexed). Tune on one, check on the other."""
    names = sorted(data.contracts)
    parts = {"a": set(names[0::2]), "b": set(names[1::2])}
    return {
        h: [i for i, q in enumerate(data.queries) if q.gold[0][0] in part]
        for h, part in parts.items()
    }


WORDINGS = (
    "consider",
    "asked",
    "question",
    "inside",
    "end",
    "possessive",
    "partial",
    "noname",
)
"""How ``bench_quality.py --wording`` phrases the questions (``consider``: the contract's
full name is ``<type> between <party> and <party>``; ``<ask>`` is what CUAD asks):

* ``consider`` as CUAD does: a naming clause first (``Consider the <name>; <ask>``);
* ``asked``: one question that names the contract, then an instruction (``In the <name>,
  <ask>? Quote the contract.``), the form of benchmarks that ask about a named filing;
* ``question``: the name first inside the question (``In the <name>, <ask>?``);
* ``inside``: the name inside the question, where it says "the contract" (``On what date
  will the <name>'s initial term expire?``), else ``What does the <name> say about <ask>``;
* ``end``: the name at the end (``<ask>, according to the <name>?``);
* ``possessive``: ``<first party>'s <type>: <ask>``;
* ``partial``: a partial, lower-case name (``in the <type> with <first two words of the
  first party>, <ask>``);
* ``noname``: what is asked alone; it names no contract, so it must not be routed.
"""
NAMING_WORDINGS = WORDINGS[:-1]
"""The wordings that name the contract (routing should treat them alike)."""


def _phrased(name: str, ask: str, wording: str) -> str:
    """One question in ``wording`` (see :data:`WORDINGS`)."""
    body = ask.strip().rstrip("?.").strip()
    lower = f"{body[:1].lower()}{body[1:]}"
    kind, _, parties = name.partition(" between ")
    first = parties.split(" and ")[0].strip().rstrip(",")
    if wording == "asked":
        return f"In the {name}, {lower}? Quote the contract."
    if wording == "question":
        return f"In the {name}, {lower}?"
    if wording == "inside":
        for said in ("the contract", "this contract", "this\xa0 contract"):
            if said in ask:
                return ask.replace(said, f"the {name}", 1)
        return f"What does the {name} say about {lower}?"
    if wording == "end":
        return f"{body}, according to the {name}?"
    if wording == "possessive":
        return f"{first}'s {kind}: {ask}"
    if wording == "partial":
        short = " ".join(first.split()[:2]).lower().rstrip(",")
        return f"in the {kind.lower()} with {short}, {lower}?"
    if wording == "noname":
        return ask
    raise ValueError(f"wording must be one of {WORDINGS}, got {wording!r}")


def reworded(data: CuadSubset, wording: str) -> CuadSubset:
    """``data`` with its questions in ``wording`` (see :data:`WORDINGS`)."""
    if wording not in WORDINGS:
        raise ValueError(f"wording must be one of {WORDINGS}, got {wording!r}")
    if wording == "consider":
        return data
    queries = []
    for q in data.queries:
        head, sep, ask = q.text.partition("; ")
        if not sep or not head.startswith("Consider the "):
            raise ValueError(f"not a CUAD question: {q.text!r}")
        text = _phrased(head.removeprefix("Consider the "), ask, wording)
        queries.append(Query(text, q.gold, q.category))
    return CuadSubset(data.contracts, queries)
