"""Line headings (Markdown ``#``, reStructuredText / AsciiDoc / setext underlined and
overlined titles) as sections: the header enricher names them, the default splitter starts
a chunk at each one, and chunks still tile the text exactly."""

from __future__ import annotations

from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document

from langchain_rse.cli.loaders import load_documents
from langchain_rse.enrichment import HeaderEnricher
from langchain_rse.indexing.chunking import make_splitter, split_text
from langchain_rse.indexing.sections import line_headings

RST = """\
========
Sessions
========

How to use sessions in Django.

Enabling sessions
=================

Sessions are implemented through a piece of middleware. To enable session
functionality, edit the ``MIDDLEWARE`` setting and make sure it contains
``'django.contrib.sessions.middleware.SessionMiddleware'``.

Using database-backed sessions
------------------------------

If you want to use a database-backed session, you need to add
``'django.contrib.sessions'`` to your ``INSTALLED_APPS`` setting.

Cookie flags
~~~~~~~~~~~~

Set ``SESSION_COOKIE_SECURE`` to send the cookie over HTTPS only.
"""


def contexts(text: str, chunk_size: int = 300) -> list[tuple[str, str]]:
    """``(chunk text, header)`` of each chunk of ``text`` under the default splitter."""
    chunks = split_text(text, "d", make_splitter(chunk_size))
    enriched = HeaderEnricher().enrich("d", text, {}, chunks)
    return [(c.text, e.text) for c, e in zip(chunks, enriched)]


def test_rst_title_is_the_first_heading_and_underlines_are_sections() -> None:
    got = contexts(RST, chunk_size=100)
    assert all(header.startswith("Document: Sessions") for _, header in got)
    by_start = {text.split("\n")[0]: header for text, header in got}
    assert by_start["Enabling sessions"].endswith("Section: Enabling sessions")
    assert by_start["Using database-backed sessions"].endswith(
        "Section: Enabling sessions > Using database-backed sessions"
    )
    assert by_start["Cookie flags"].endswith(
        "Section: Enabling sessions > Using database-backed sessions > Cookie flags"
    )
    # no chunk is a bare title, nor ends on the next section's title
    assert not any(text.rstrip().endswith(("=", "-", "~")) for text, _ in got)


def test_a_plain_text_title_is_never_a_rule() -> None:
    (_, header), *_ = contexts("=====\n\n-----\n\nLEASE AGREEMENT text follows here.\n")
    assert header == "Document: LEASE AGREEMENT text follows here."


def test_rst_and_asciidoc_files_are_read_by_the_command(tmp_path: Path) -> None:
    for name in ("guide.rst", "guide.adoc", "guide.asciidoc"):
        (tmp_path / name).write_text(RST, encoding="utf-8")
    docs = load_documents([tmp_path])
    assert sorted(Path(d.metadata["source"]).name for d in docs) == [
        "guide.adoc",
        "guide.asciidoc",
        "guide.rst",
    ]
    assert all(isinstance(d, Document) and d.page_content == RST for d in docs)


def test_wrapped_paragraphs_are_packed() -> None:
    # reST wraps at ~70 characters; paragraphs a little over the chunk size left a short
    # tail chunk each (205 characters on average at size 300 for Flask's docs)
    line = "Sessions store data between requests in a signed cookie here."  # 62
    para = "\n".join([line] * 6)  # 377 characters
    text = "Title\n=====\n\n" + "\n\n".join([para] * 20) + "\n"
    chunks = split_text(text, "d", make_splitter(300))
    sizes = [c.end_index - c.start_index for c in chunks]
    assert max(sizes) <= 300 and sum(sizes) / len(sizes) >= 240


ADORNMENTS = "=-~^\"'*+#:._"
WORD = st.text(alphabet=st.sampled_from("abcdéß漢Z09 "), min_size=1, max_size=12).filter(
    lambda w: w.strip() != ""
)


@st.composite
def structured_document(draw: st.DrawFn) -> tuple[str, list[tuple[int, str]]]:
    """A reST / Markdown / AsciiDoc-like text and ``(offset, title)`` of its headings."""
    parts: list[str] = []
    headings: list[tuple[int, str]] = []
    markdown = draw(st.booleans())
    for n in range(draw(st.integers(1, 8))):
        title = "T" + draw(WORD).strip()
        # Markdown opens with a ``#`` heading (a lone ``# of Units`` line later on is no heading)
        styles = ["atx"] if markdown and n == 0 else ["under", "over", "atx"][: 2 + markdown]
        style = draw(st.sampled_from(styles))
        ch = draw(st.sampled_from(ADORNMENTS))
        rule = ch * max(3, len(title) + draw(st.integers(0, 3)))
        offset = len("".join(parts))
        if style == "atx":
            parts.append("#" * draw(st.integers(1, 6)) + " " + title + "\n")
        elif style == "over":
            parts.append(f"{rule}\n{title}\n{rule}\n")
        else:
            parts.append(f"{title}\n{rule}\n")
        headings.append((offset, title))
        for _ in range(draw(st.integers(0, 4))):
            blank = draw(st.sampled_from(["\n", "\n\n", "\n \n\n", "\n\t\n"]))
            lines = draw(st.lists(st.lists(WORD, min_size=1, max_size=14), min_size=1, max_size=6))
            indent = draw(st.sampled_from(["", "", "    "]))  # an indented literal block
            parts.append(blank + "\n".join(indent + " ".join(line) for line in lines) + "\n")
        parts.append(draw(st.sampled_from(["\n", "\n\n", "\n\n\n"])))
    return "".join(parts), headings


@settings(max_examples=50)
@given(structured_document(), st.integers(60, 400), st.sampled_from([0, 0, 10]))
def test_chunks_tile_structured_documents_exactly(
    doc: tuple[str, list[tuple[int, str]]], chunk_size: int, overlap: int
) -> None:
    text, headings = doc
    chunks = split_text(text, "d", make_splitter(chunk_size, min(overlap, chunk_size - 1)))
    covered = bytearray(len(text))
    for chunk in chunks:
        assert text[chunk.start_index : chunk.end_index] == chunk.text
        assert len(chunk.text) <= chunk_size
        covered[chunk.start_index : chunk.end_index] = b"\x01" * len(chunk.text)
    assert all(a.start_index < b.start_index for a, b in zip(chunks, chunks[1:]))
    assert all(covered[i] or ch.isspace() for i, ch in enumerate(text))
    # no chunk ends inside or right after a title (a bare title, or a section's cut-off start)
    titles = [(h.start, h.end) for h in line_headings(text)]
    assert [offset for offset, _ in headings] == [start for start, _ in titles]
    stop = len(text.rstrip())  # the text's last title may end it
    assert not any(s < c.end_index <= e < stop for c in chunks for s, e in titles)
    if overlap == 0:
        assert all(a.end_index <= b.start_index for a, b in zip(chunks, chunks[1:]))
    if len(text.strip()) <= chunk_size:  # a document that fits is one chunk
        assert len(chunks) == 1


@settings(max_examples=30)
@given(structured_document())
def test_every_heading_style_is_a_section_and_the_first_is_the_title(
    doc: tuple[str, list[tuple[int, str]]],
) -> None:
    text, headings = doc
    chunks = split_text(text, "d", make_splitter(300))
    enriched = HeaderEnricher(max_depth=100).enrich("d", text, {}, chunks)
    first_title = " ".join(headings[0][1].split())
    header_of = {c.start_index: e.text for c, e in zip(chunks, enriched)}
    for offset, title in headings:
        if offset not in header_of:
            continue  # a short section packed into the chunk before it
        header, title = header_of[offset], " ".join(title.split())
        assert header.startswith(f"Document: {first_title}\n" if header.count("\n") else "Doc")
        assert header.split("\n")[0] == f"Document: {first_title}"
        if title.casefold() != first_title.casefold():  # the title is not repeated
            assert header.split("\n")[-1].endswith(title)
