"""Citations an application can verify: ``check_citations`` reads every ``[n]`` of an
answer with the passage quoted before it and finds the quote in source ``n``'s exact text.

The agent is ``langchain.agents.create_agent`` with a scripted chat model (as in
``test_agent_tool.py``) that quotes correctly, misquotes, and cites a number that names
no source.
"""

from __future__ import annotations

from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain.agents import create_agent
from langchain_core.documents import Document
from langchain_core.messages import AIMessage, HumanMessage, ToolMessage
from langchain_core.messages.content import create_text_block
from langchain_core.vectorstores import InMemoryVectorStore
from test_agent_tool import script

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.citations import check_citations, citation_annotations

LEASE = (
    "OFFICE LEASE\n\nThe tenant pays rent of EUR 2,000 monthly in advance.\n\n"
    "TERMINATION\n\nThe tenant may terminate the lease with three months\n"
    "written notice to the landlord.\n"
)
HANDBOOK = (
    "Employee Handbook\n\nStaff may work remotely from another country for up to 20 "
    "working days a year, approved by their manager two weeks ahead.\n"
)
CORPUS = {"lease.txt": LEASE, "handbook.txt": HANDBOOK}


def retriever() -> RSERetriever:
    r = RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), show_progress=False)
    r.add_documents([Document(text, metadata={"source": name}) for name, text in CORPUS.items()])
    return r


def test_an_agent_answer_is_checked_quote_by_quote() -> None:
    # the scripted answer: a verbatim quote, the same words across the line break with a
    # space, a misquote, an unquoted citation and a number that names no source
    answer = (
        'The tenant "may terminate the lease with three months" [1], by "three months '
        'written notice" [1]. It says "six weeks notice" [1]. See also [1] and "the '
        'landlord" [7].'
    )
    model = script({"query": "terminate the lease notice", "k": 1}, answer=answer)
    result = create_agent(model, tools=[retriever().as_tool()]).invoke(
        {"messages": [HumanMessage("How do I end the lease?")]}
    )
    final = result["messages"][-1]
    assert isinstance(final, AIMessage) and final.text == answer
    artifact = next(m for m in result["messages"] if isinstance(m, ToolMessage)).artifact
    assert [d.metadata["source"] for d in artifact] == ["lease.txt"]

    checks = check_citations(final.text, artifact)
    assert [c.status for c in checks] == [
        "verbatim",
        "whitespace",
        "misquoted",
        "unquoted",
        "no such source",
    ]
    exact, spaced, wrong, unquoted, unknown = checks
    assert exact.verbatim and exact.doc_id == "lease.txt" and exact.n == 1
    assert LEASE[exact.start : exact.end] == "may terminate the lease with three months"
    assert LEASE[spaced.start : spaced.end] == "three months\nwritten notice"
    assert not spaced.verbatim and spaced.quote == "three months written notice"
    assert wrong.doc_id == "lease.txt" and wrong.start is None and not wrong.verbatim
    meta = artifact[0].metadata
    assert (unquoted.start, unquoted.end) == (meta["start_index"], meta["end_index"])
    assert unknown.n == 7 and unknown.doc_id is None and unknown.quote == "the landlord"
    for check in checks:  # where each citation sits in the answer
        assert answer[check.answer_start : check.answer_end].endswith(f"[{check.n}]")

    blocks = citation_annotations(final.text, artifact)
    annotated = create_text_block(final.text, annotations=blocks)
    assert annotated["annotations"] == blocks and len(blocks) == 5
    first_block = blocks[0]
    assert first_block["type"] == "citation" and first_block["url"] == "lease.txt"
    assert first_block["cited_text"] == "may terminate the lease with three months"
    extras = first_block["extras"]
    assert (extras["source_start"], extras["source_end"]) == (exact.start, exact.end)
    assert extras["verbatim"] is True and extras["status"] == "verbatim"
    assert blocks[1]["cited_text"] == "three months\nwritten notice"
    assert "cited_text" not in blocks[2] and blocks[2]["extras"]["status"] == "misquoted"
    assert blocks[4]["extras"]["status"] == "no such source" and "url" not in blocks[4]


def test_runs_of_citations_share_their_quote() -> None:
    r = retriever()
    artifact = r.invoke("work remotely abroad and terminate the lease", k=2)
    assert len(artifact) == 2
    n = 1 + next(i for i, d in enumerate(artifact) if d.metadata["source"] == "handbook.txt")
    answer = f"“up to 20 working days a year” [{n}][2], «approved by their manager» [{n}, 1]."
    checks = check_citations(answer, artifact)
    assert [c.n for c in checks] == [n, 2, n, 1]
    assert checks[0].status == checks[2].status == "verbatim"
    assert HANDBOOK[checks[0].start : checks[0].end] == "up to 20 working days a year"
    assert HANDBOOK[checks[2].start : checks[2].end] == "approved by their manager"
    other = [c for c in checks if c.n != n]
    assert all(c.status == "misquoted" for c in other)


@settings(max_examples=60)
@example(at=0, size=5, spaces=False)
@example(at=45, size=80, spaces=False)  # a quote across a line break
@given(
    at=st.integers(min_value=0, max_value=200),
    size=st.integers(min_value=1, max_value=80),
    spaces=st.booleans(),
)
def test_a_quote_from_a_source_is_found_at_its_exact_range(
    at: int, size: int, spaces: bool
) -> None:
    """A passage quoted from a cited source always maps back to its own characters of the
    source document (verbatim), or, respaced, to the characters it came from."""
    doc = Document(
        "Alpha  beta\ngamma, delta. Epsilon zeta eta theta; iota kappa lambda mu nu xi "
        "omicron pi rho sigma tau upsilon phi chi psi omega. " * 3,
        metadata={"source": "greek.txt", "doc_id": "greek.txt"},
    )
    segment = Document(
        doc.page_content[17:],
        metadata={**doc.metadata, "start_index": 17, "end_index": len(doc.page_content)},
    )
    quote = segment.page_content[at : at + size].strip()
    if not quote.strip(".,;:!?"):
        return
    shown = " ".join(quote.split()) if spaces else quote
    (check,) = check_citations(f'It says "{shown}" [1].', [segment])
    assert check.status in ("verbatim", "whitespace")
    assert check.verbatim == (
        shown in segment.page_content or shown.rstrip(".,;:!?") in segment.page_content
    )
    found = doc.page_content[check.start : check.end]
    assert " ".join(found.split()) == " ".join(shown.rstrip(".,;:!?").split()) or found == shown
