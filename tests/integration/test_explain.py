"""``explain``: relevance along each document and the chosen segments, as text, as an HTML
page rendered in a real headless browser (Debian's chromium), and from the command."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from html.parser import HTMLParser
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore
from test_cli import run

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.indexing.chunking import combine_pages

QUERY = "termination for convenience notice period"


def contract(n: int) -> str:
    clauses = [
        f"{i}. Clause {i} covers delivery of goods batch {i} to the warehouse."
        for i in range(1, 25)
    ]
    clauses[n] = f"{n}. Either party may end this agreement for convenience with notice period"
    return "\n\n".join(clauses)


@pytest.fixture
def retriever() -> RSERetriever:
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()),
        chunk_size=120,
        show_progress=False,
        k=3,
    )
    r.add_documents(
        [
            Document(contract(5), metadata={"source": "a.txt"}),
            Document(contract(17), metadata={"source": "b.txt"}),
            Document("<b>&amp; markup</b> as text. " + contract(9), metadata={"source": "c.txt"}),
        ]
    )
    return r


def test_explain_matches_invoke(retriever: RSERetriever) -> None:
    explanation = retriever.explain(QUERY)
    results = retriever.invoke(QUERY)
    assert [d.metadata for d in explanation.results] == [d.metadata for d in results]
    assert explanation.documents, "documents with candidates are listed"
    numbers = []
    for d in explanation.documents:
        assert len(d.relevance) == len(d.spans)
        assert all(r is None or 0.0 <= r <= 1.0 for r in d.relevance)
        for num, start, end in d.segments:
            seg = explanation.results[num - 1]
            assert seg.metadata["doc_id"] == d.doc_id
            assert (seg.metadata["chunk_start"], seg.metadata["chunk_end"]) == (start, end)
            assert d.text is not None
            assert (
                d.text[seg.metadata["start_index"] : seg.metadata["end_index"]] == seg.page_content
            )
            numbers.append(num)
    assert sorted(numbers) == list(range(1, len(results) + 1))
    text = explanation.to_text(width=24)
    bar, marks = explanation.documents[0].strip(24)
    assert f"|{bar}|" in text and "1" in marks and len(bar) <= 24


async def test_aexplain_matches_explain(retriever: RSERetriever) -> None:
    sync, async_ = retriever.explain(QUERY), await retriever.aexplain(QUERY)
    assert async_.to_text() == sync.to_text()
    assert [d.page_content for d in async_.results] == [d.page_content for d in sync.results]


def test_explain_without_candidates_and_no_trace_leak(retriever: RSERetriever) -> None:
    empty = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()))
    nothing = empty.explain(QUERY)
    assert nothing.results == [] and nothing.documents == []
    assert nothing.to_text() == "no candidates" and "<h1>" in nothing.to_html()
    retriever.explain(QUERY)
    assert retriever.invoke(QUERY)  # an ordinary call after explain records nothing


def test_pages_through_the_api() -> None:
    pages = [
        Document(f"Page {p}. " + contract(p * 7), metadata={"source": "p.pdf", "page": p - 1})
        for p in range(1, 4)
    ]
    doc = combine_pages(pages)
    offsets = doc.metadata["page_offsets"]
    assert "page" not in doc.metadata and len(offsets) == 3 and offsets[0] == 0
    for page, start in zip(pages, offsets):
        assert doc.page_content[start : start + len(page.page_content)] == page.page_content
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=120, show_progress=False
    )
    r.add_documents([doc])
    for seg in r.invoke(QUERY, k=4):
        m = seg.metadata
        first = max(i for i, o in enumerate(offsets) if o <= m["start_index"]) + 1
        last = max(i for i, o in enumerate(offsets) if o < m["end_index"]) + 1
        assert (m["page_start"], m["page_end"]) == (first, last)
        assert "page_offsets" not in m
    with pytest.raises(ValueError, match="page_offsets"):
        r.add_documents([Document("some text", metadata={"page_offsets": [0, 50]})])
    with pytest.raises(ValueError, match="page_offsets"):
        r.add_documents([Document("some text", metadata={"page_offsets": [3]})])
    with pytest.raises(ValueError, match="at least one page"):
        combine_pages([])


class Marks(HTMLParser):
    """The text inside each ``<mark data-result=N>`` of a page."""

    def __init__(self) -> None:
        super().__init__()
        self.marks: dict[int, str] = {}
        self._open: int | None = None

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        if tag == "mark":
            self._open = int(dict(attrs)["data-result"] or 0)
            self.marks[self._open] = ""

    def handle_endtag(self, tag: str) -> None:
        if tag == "mark":
            self._open = None

    def handle_data(self, data: str) -> None:
        if self._open is not None:
            self.marks[self._open] += data


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        if os.environ.get("CI") == "true":
            pytest.fail("chromium is missing; .ci/run installs it (apt-get install chromium)")
        pytest.skip("chromium is not installed (apt-get install chromium)")
    return found


def headless(browser: str, *args: str) -> subprocess.CompletedProcess[str]:
    flags = [
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--hide-scrollbars",
        "--no-first-run",
        "--disable-extensions",
    ]
    return subprocess.run([browser, *flags, *args], capture_output=True, text=True, timeout=120)


def test_cli_explain_and_html_page_in_a_real_browser(tmp_path: Path, capsys) -> None:
    browser = chromium()
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "lease.md").write_text(
        "# Office Lease\n\n## Rent\n\nThe tenant pays rent of EUR 2,000 <monthly> & in advance."
        "\n\n## Termination\n\nThe tenant may terminate the lease with three months notice.\n",
        encoding="utf-8",
    )
    (docs / "policy.txt").write_text(
        "TRAVEL POLICY\n\nHotels are reimbursed up to EUR 160 per night.\n", encoding="utf-8"
    )
    idx = str(tmp_path / "idx")
    assert run(capsys, "index", str(docs), "--index", idx, "--no-progress")[0] == 0
    page = tmp_path / "why.html"
    code, out, _ = run(
        capsys,
        "query",
        idx,
        "How much notice to end the lease?",
        "--explain",
        "--html",
        str(page),
        "-k",
        "2",
    )
    assert code == 0 and "relevance per chunk" in out and "lease.md" in out and "|" in out
    code, out, _ = run(
        capsys, "query", idx, "How much notice to end the lease?", "--json", "-k", "2"
    )
    segments = json.loads(out)
    assert segments

    dom = headless(browser, "--dump-dom", page.as_uri())
    assert dom.returncode == 0 and "<mark" in dom.stdout, dom.stderr[-2000:]
    parser = Marks()
    parser.feed(dom.stdout)
    assert parser.marks == {n: s["text"] for n, s in enumerate(segments, start=1)}
    assert "<script" not in page.read_text(encoding="utf-8")  # self-contained, no scripts

    shot = tmp_path / "why.png"
    done = headless(browser, f"--screenshot={shot}", "--window-size=1000,1200", page.as_uri())
    assert done.returncode == 0, done.stderr[-2000:]
    assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 5000
