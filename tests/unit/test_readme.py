"""The README and the pages under docs/: the README stays a short user's guide with its two
set-up commands, every link between the pages resolves, and every row of docs/guarantees.md
names tests that exist."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
NAMED = re.compile(r"`(?:(test_\w+\.py)::|::)?(test_\w+)`|`(test_\w+\.py)`")
README = ROOT / "README.md"
PAGES = [README, *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "benchmarks").glob("*.md"))]
MAX_README_WORDS = 3500
# What `.ci/run` greps for: each command alone on a line of the README.
SET_UP_COMMANDS = (
    'pip install -e ".[local]" && langchain-rse demo',
    'pip install -e ".[all,test]" && python -m pytest -q',
)
FENCED = re.compile(r"^```.*?^```", re.DOTALL | re.MULTILINE)
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
HEADING = re.compile(r"^#{1,6} +(.+?) *$", re.MULTILINE)


def anchor(heading: str) -> str:
    """The anchor GitHub gives a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_the_readme_stays_a_short_guide() -> None:
    words = len(README.read_text(encoding="utf-8").split())
    assert words <= MAX_README_WORDS, (
        f"README.md has {words} words (at most {MAX_README_WORDS}): move reference material "
        "to a page under docs/ and link it"
    )


def test_the_readme_keeps_the_set_up_commands() -> None:
    lines = README.read_text(encoding="utf-8").splitlines()
    for command in SET_UP_COMMANDS:
        assert command in lines, f"README.md lost the set-up command {command!r} (.ci/run needs it)"


def test_every_local_link_resolves() -> None:
    broken = []
    for page in PAGES:
        text = FENCED.sub("", page.read_text(encoding="utf-8"))
        for target in LINK.findall(text):
            if re.match(r"[a-z]+:", target):
                continue  # https:, mailto:
            path, _, fragment = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif fragment and linked.suffix == ".md":
                headings = HEADING.findall(FENCED.sub("", linked.read_text(encoding="utf-8")))
                if fragment not in {anchor(h) for h in headings}:
                    broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert not broken, "\n".join(broken)


def guarantee_rows() -> list[str]:
    table = (ROOT / "docs" / "guarantees.md").read_text(encoding="utf-8")
    return [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]


def test_every_guarantee_names_a_test_that_exists() -> None:
    rows = guarantee_rows()
    assert len(rows) >= 30
    for row in rows:
        test_cell = row.rstrip(" |").rsplit(" | ", 1)[1]
        named = NAMED.findall(test_cell)
        assert named, f"no test named in: {row}"
        current = None
        for file, name, whole_file in named:
            current = file or whole_file or current
            assert current, f"a test without its file in: {row}"
            found = sorted((ROOT / "tests").rglob(current))
            assert len(found) == 1, f"{current}: {len(found)} files of that name under tests/"
            source = found[0].read_text(encoding="utf-8")
            if name:
                assert re.search(rf"^(async )?def {name}\b", source, re.M), f"{current}::{name}"


def test_every_python_block_in_the_pages_compiles() -> None:
    """Blocks that need keys or servers are not run (docs/retrievers.md's are, by
    test_docs.py), but none may be a syntax error."""
    block = re.compile(r"^```python\n(.*?)^```", re.DOTALL | re.MULTILINE)
    count = 0
    for page in PAGES:
        for n, body in enumerate(block.findall(page.read_text(encoding="utf-8")), start=1):
            compile(body, f"{page.relative_to(ROOT)} python block {n}", "exec")
            count += 1
    assert count >= 10
