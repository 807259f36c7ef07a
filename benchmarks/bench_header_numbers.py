"""How often ``HeaderEnricher`` makes a bare number the innermost section of a chunk.

Text extracted from PDFs holds table cells (``4.30``, ``12.5``, ``2019``) on lines of
their own; a heading detector that takes them for untitled numbered clauses gives every
chunk after a table a section such as ``PART II > 4.30``. This script splits the first
``--contracts`` CUAD dev contracts (the order of ``dev.json``'s ``contracts`` list) into
the default 600-character chunks, runs ``HeaderEnricher`` over them and reports:

* the share of chunks whose innermost section is a bare number (no letters at all:
  ``4.30``, ``12.``, ``(1,234)``);
* the share whose innermost section is an untitled numbered heading (``1.1`` included:
  those may be real, untitled clauses);
* with ``--baseline REF``: the same for the ``headers.py`` of git revision ``REF``, and
  how many chunk headers differ between the two.

No embeddings and no network. Usage::

    python benchmarks/bench_header_numbers.py --baseline HEAD
    python benchmarks/bench_header_numbers.py --contracts 100 --show 10
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import types
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from langchain_rse.chunking import split_text
from langchain_rse.enrichment import HeaderEnricher

REPO_ROOT = Path(__file__).resolve().parent.parent
HEADERS_PATH = "langchain_rse/enrichment/headers.py"
_BARE_NUMBER = re.compile(r"[\d\s.,()$%\-–—]+")
_UNTITLED_NUMBER = re.compile(r"\d{1,3}(?:\.\d{1,3})*\.?")


def data_root() -> Path:
    """The CUAD folder: ``$RSE_DATA_DIR/cuad`` or ``<repo>/../shared/data/cuad``."""
    base = os.environ.get("RSE_DATA_DIR")
    root = Path(base) if base else REPO_ROOT.parent / "shared" / "data"
    return root / "cuad"


def baseline_enricher(ref: str) -> HeaderEnricher:
    """A ``HeaderEnricher`` built from the ``headers.py`` of git revision ``ref``."""
    source = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "show", f"{ref}:{HEADERS_PATH}"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    module = types.ModuleType("_baseline_headers")
    sys.modules[module.__name__] = module  # dataclasses look their module up
    exec(compile(source, f"{ref}:{HEADERS_PATH}", "exec"), module.__dict__)
    enricher: HeaderEnricher = module.HeaderEnricher()
    return enricher


def innermost(header: str) -> str:
    """The innermost heading of a header's ``Section:`` line ('' when there is none)."""
    for line in header.splitlines():
        if line.startswith("Section: "):
            return line[len("Section: ") :].split(" > ")[-1]
    return ""


def headers_of(enricher: HeaderEnricher, texts: dict[str, str]) -> dict[str, list[str]]:
    """The header of every default-size chunk of every contract."""
    out = {}
    for name, text in texts.items():
        chunks = split_text(text, name)
        out[name] = [c.text for c in enricher.enrich(name, text, {}, chunks)]
    return out


def report(label: str, headers: dict[str, list[str]], show: int) -> None:
    """Print the bare-number and untitled-number shares of one run."""
    sections = [innermost(h) for hs in headers.values() for h in hs]
    bare = [s for s in sections if s and _BARE_NUMBER.fullmatch(s)]
    untitled = [s for s in sections if _UNTITLED_NUMBER.fullmatch(s)]
    docs = sum(
        any(_BARE_NUMBER.fullmatch(innermost(h) or "x") for h in hs) for hs in headers.values()
    )
    n = len(sections)
    print(
        f"{label}: {n} chunks; innermost section a bare number: {len(bare)} "
        f"({len(bare) / n:.1%}) in {docs} contracts; untitled numbered heading: "
        f"{len(untitled)} ({len(untitled) / n:.1%})"
    )
    if show:
        common = sorted({s: bare.count(s) for s in bare}.items(), key=lambda kv: -kv[1])
        print("  most frequent:", ", ".join(f"{s!r} x{k}" for s, k in common[:show]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--contracts", type=int, default=50)
    parser.add_argument("--baseline", metavar="REF", help="git revision to compare with")
    parser.add_argument("--show", type=int, default=8, help="most frequent bare numbers")
    parser.add_argument("--diffs", type=int, default=0, help="print this many changed headers")
    args = parser.parse_args()
    root = data_root()
    if not (root / "dev.json").is_file():
        sys.exit(f"CUAD data not found under {root} (set RSE_DATA_DIR)")
    dev = json.loads((root / "dev.json").read_text(encoding="utf-8"))
    names = dev["contracts"][: args.contracts]
    texts = {
        n: (root / "contracts" / n).read_text(encoding="utf-8", errors="replace") for n in names
    }
    current = headers_of(HeaderEnricher(), texts)
    if args.baseline:
        before = headers_of(baseline_enricher(args.baseline), texts)
        report(f"before ({args.baseline})", before, args.show)
    report("after (working tree)", current, args.show)
    if args.baseline:
        pairs = [(b, a) for n in texts for b, a in zip(before[n], current[n], strict=True)]
        changed = [(b, a) for b, a in pairs if b != a]
        share = len(changed) / len(pairs)
        print(f"chunk headers changed: {len(changed)} of {len(pairs)} ({share:.1%})")
        for b, a in changed[: args.diffs]:
            print(f"  - {innermost(b)!r}\n  + {innermost(a)!r}")


if __name__ == "__main__":
    main()
