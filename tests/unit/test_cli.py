"""The langchain-rse command end to end on a temporary folder (offline embedding model)."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest

from langchain_rse.cli import main


def minimal_pdf(*pages: str) -> bytes:
    """A PDF with one page per text, each showing it (written by hand, offsets computed)."""
    n = len(pages)
    kids = " ".join(f"{4 + 2 * i} 0 R" for i in range(n))
    objects = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        f"<< /Type /Pages /Kids [{kids}] /Count {n} >>".encode(),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    for i, text in enumerate(pages):
        stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
        objects.append(
            b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] "
            b"/Resources << /Font << /F1 3 0 R >> >> /Contents %d 0 R >>" % (5 + 2 * i)
        )
        objects.append(b"<< /Length %d >>\nstream\n" % len(stream) + stream + b"\nendstream")
    out = bytearray(b"%PDF-1.4\n")
    offsets = []
    for n, body in enumerate(objects, start=1):
        offsets.append(len(out))
        out += b"%d 0 obj\n" % n + body + b"\nendobj\n"
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objects) + 1)
    for off in offsets:
        out += b"%010d 00000 n \n" % off
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (
        len(objects) + 1,
        xref,
    )
    return bytes(out)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "lease.md").write_text(
        "# Office Lease\n\n## Rent\n\nThe tenant pays rent of EUR 2,000 monthly in advance.\n\n"
        "## Termination\n\nThe tenant may terminate the lease with three months notice.\n",
        encoding="utf-8",
    )
    (docs / "sub" / "policy.txt").write_text(
        "TRAVEL POLICY\n\nEconomy class is standard for flights under six hours.\n"
        "Hotels are reimbursed up to EUR 160 per night.\n",
        encoding="utf-8",
    )
    (docs / "scan.pdf").write_bytes(minimal_pdf("Warranty period is twenty four months"))
    (docs / "broken.pdf").write_bytes(b"%PDF-1.4\nthis is not really a pdf")
    (docs / "blob.txt").write_bytes(b"\x00\x01\x02binary\x00")
    (docs / "ignored.csv").write_text("a,b\n1,2\n")
    return docs


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_index_query_reindex_info(folder: Path, tmp_path: Path, capsys) -> None:
    index = str(tmp_path / "idx")
    code, out, err = run(capsys, "index", str(folder), "--index", index, "--no-progress")
    assert code == 0
    assert "indexed 3 file(s), 0 unchanged, 3 skipped" in out
    assert "broken.pdf: unreadable PDF" in err and "blob.txt: looks like a binary" in err
    assert "ignored.csv: unsupported file type '.csv'" in err  # listed, not silently dropped

    code, out, _ = run(capsys, "query", index, "hotel reimbursement per night", "-k", "1", "--json")
    hits = json.loads(out)
    assert code == 0 and len(hits) == 1
    source = (folder / hits[0]["source"]).read_text(encoding="utf-8")
    assert hits[0]["source"] == "sub/policy.txt"  # relative to the folder indexed
    assert hits[0]["text"] == source[hits[0]["start_index"] : hits[0]["end_index"]]
    assert hits[0]["source"].endswith("policy.txt")

    code, out, _ = run(capsys, "query", index, "warranty period", "-k", "1", "--json")
    hit = json.loads(out)[0]
    assert hit["source"].endswith("scan.pdf") and hit["page_start"] == hit["page_end"] == 1

    # the offline reranker re-scores the candidates with the index's own embedding model
    question = ("query", index, "hotel reimbursement per night", "--json")
    code, out, _ = run(capsys, *question, "--reranker", "embedding")
    reranked = json.loads(out)
    assert code == 0 and reranked[0]["source"].endswith("policy.txt")
    for hit in reranked:
        text = (folder / hit["source"]).read_text(encoding="utf-8")
        assert hit["text"] == text[hit["start_index"] : hit["end_index"]]
    code, out, _ = run(capsys, *question, "--reranker", "embedding", "--mode", "chunks", "-k", "50")
    scores = [h["score"] for h in json.loads(out)]  # min-max calibrated: best 1, worst 0
    assert code == 0 and scores[0] == 1.0 and scores[-1] == 0.0 and scores == sorted(scores)[::-1]

    code, out, _ = run(capsys, "query", index, "How much notice to end the lease?", "-k", "2")
    assert code == 0 and "lease.md" in out and "chars" in out and "three months" in out

    # unchanged files are not read again; a changed file is; a deleted file is removed
    code, out, _ = run(capsys, "index", str(folder), "--index", index, "--no-progress")
    assert "indexed 0 file(s), 3 unchanged" in out
    (folder / "lease.md").write_text("# Office Lease\n\nRent is EUR 2,500 from 2026.\n")
    (folder / "sub" / "policy.txt").unlink()
    code, out, _ = run(capsys, "index", str(folder), "--index", index, "--no-progress")
    assert "indexed 1 file(s), 1 unchanged" in out and "1 removed" in out
    code, out, _ = run(capsys, "query", index, "hotel per night", "-k", "5", "--json")
    assert all(not h["source"].endswith("policy.txt") for h in json.loads(out))

    code, out, _ = run(capsys, "info", index, "--json")
    info = json.loads(out)
    assert info["files"] == 2 and info["chunks"] >= 2
    assert info["embedding"]["class"] == "LocalEmbeddings"
    listed = {Path(f["file"]).name: f for f in info["file_list"]}
    assert set(listed) == {"lease.md", "scan.pdf"}
    assert sum(f["chunks"] for f in listed.values()) == info["chunks"]
    assert all(f["indexed_at"].endswith("Z") for f in listed.values())
    code, out, _ = run(capsys, "info", index)  # the table a person reads
    assert code == 0 and "lease.md" in out and "indexed (UTC)" in out


def test_clear_errors(tmp_path: Path, capsys) -> None:
    code, _, err = run(capsys, "query", str(tmp_path / "none"), "question")
    assert code == 2 and "no langchain-rse index" in err
    code, _, err = run(capsys, "index", str(tmp_path / "missing"), "--index", str(tmp_path / "i"))
    assert code == 2 and "no such file or folder" in err
    with pytest.raises(SystemExit) as exc:
        main(["query", "--no-such-flag"])
    assert exc.value.code == 2


def test_query_rejects_blank_question(folder: Path, tmp_path: Path, capsys) -> None:
    index = str(tmp_path / "idx")
    run(capsys, "index", str(folder / "lease.md"), "--index", index, "--no-progress")
    code, _, err = run(capsys, "query", index, "   ")
    assert code == 2 and "non-empty" in err


def test_llm_flag_needs_a_key(folder: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    code, _, err = run(
        capsys, "index", str(folder), "--index", str(tmp_path / "i"), "--llm", "openai:gpt-4o-mini"
    )
    assert code == 2 and "OPENAI_API_KEY" in err


def test_demo_runs_offline(capsys) -> None:
    code, out, _ = run(capsys, "demo")
    assert code == 0 and "service_agreement.md" in out and "120" in out
    assert "score: " in out and "try next:" in out  # what the numbers mean, what to do next
    assert tempfile.gettempdir() not in out  # no paths of its temporary folder
