"""The command's file handling and flags, each friction item a new user hit (offline model)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import docx
import pytest
from test_cli import minimal_pdf, run

from langchain_rse.cli import main

ROOT = Path(__file__).resolve().parents[2]
LEASE = (
    "# Office Lease\n\n## Termination\n\nThe tenant may terminate the lease with three "
    "months notice.\n"
)


def index(capsys, *argv: str) -> tuple[int, str, str]:
    return run(capsys, "index", *argv, "--no-progress")


def test_too_long_file_is_skipped_and_reported(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "lease.md").write_text(LEASE, encoding="utf-8")
    (folder / "huge.txt").write_text("word " * 400, encoding="utf-8")  # 2,000 characters
    idx = str(tmp_path / "idx")
    code, out, err = index(capsys, str(folder), "--index", idx, "--max-document-chars", "1000")
    assert code == 0 and "indexed 1 file(s), 0 unchanged, 1 skipped" in out
    assert "huge.txt: 2,000 characters, over --max-document-chars 1,000" in err
    code, out, _ = run(capsys, "query", idx, "terminate the lease", "--json")
    assert {Path(h["source"]).name for h in json.loads(out)} == {"lease.md"}


def test_non_utf8_file_is_decoded_by_detection(tmp_path: Path, capsys) -> None:
    text = (
        "Le café de la Société Générale ouvre à sept heures. Les employés reçoivent "
        "une prime de fin d'année. Le contrat prévoit un préavis de trois mois.\n"
    ) * 3
    path = tmp_path / "contrat.txt"
    path.write_bytes(text.encode("cp1252"))
    idx = str(tmp_path / "idx")
    code, _, err = index(capsys, str(path), "--index", idx)
    assert code == 0 and "contrat.txt: not UTF-8; decoded as" in err
    code, out, _ = run(capsys, "query", idx, "préavis du contrat", "--json", "-k", "1")
    hit = json.loads(out)[0]
    assert "café" in hit["text"] and "préavis" in hit["text"] and "\ufffd" not in hit["text"]
    assert hit["text"] == text[hit["start_index"] : hit["end_index"]]


def test_nothing_indexable_exits_non_zero(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "table.csv").write_text("a,b\n1,2\n")
    (folder / "empty.md").write_text("   \n")
    (folder / ".hidden.txt").write_text("left out: hidden files are not listed")
    code, out, err = index(capsys, str(folder), "--index", str(tmp_path / "idx"))
    assert code != 0 and "nothing could be indexed: 2 file(s) skipped" in err
    assert "table.csv: unsupported file type '.csv'" in err and "empty.md: no text" in err
    assert ".hidden.txt" not in err and not (tmp_path / "idx").exists()
    code, _, err = index(capsys, str(folder / "table.csv"), "--index", str(tmp_path / "idx"))
    assert code != 0 and "unsupported file type" in err


def test_html_and_docx_are_read(tmp_path: Path, capsys) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    (folder / "policy.html").write_text(
        "<html><head><title>Travel</title><style>p {color: red}</style>"
        "<script>var hidden = 'never indexed';</script></head><body><h1>Travel policy</h1>"
        "<p>Hotels are reimbursed up to EUR 160 per night.</p></body></html>",
        encoding="utf-8",
    )
    word = docx.Document()
    word.add_heading("Warranty", level=1)
    word.add_paragraph("The warranty period is twenty four months from delivery.")
    word.save(str(folder / "warranty.docx"))
    idx = str(tmp_path / "idx")
    code, out, _ = index(capsys, str(folder), "--index", idx)
    assert code == 0 and "indexed 2 file(s)" in out
    code, out, _ = run(capsys, "query", idx, "hotel reimbursement per night", "--json", "-k", "1")
    hit = json.loads(out)[0]
    assert hit["source"].endswith("policy.html") and "EUR 160 per night" in hit["text"]
    assert "never indexed" not in hit["text"] and "color" not in hit["text"]
    code, out, _ = run(capsys, "query", idx, "warranty period months", "--json", "-k", "1")
    hit = json.loads(out)[0]
    assert hit["source"].endswith("warranty.docx") and "twenty four months" in hit["text"]
    (folder / "broken.docx").write_bytes(b"PK\x03\x04 not a real zip")
    code, _, err = index(capsys, str(folder), "--index", idx)
    assert code == 0 and "broken.docx: unreadable Word file" in err


def test_pdf_segments_carry_pages(tmp_path: Path, capsys) -> None:
    pdf = tmp_path / "contract.pdf"
    pdf.write_bytes(
        minimal_pdf(
            "Page one: the parties and the definitions of this agreement",
            "Page two: the supplier delivers the goods within thirty days",
            "Page three: the warranty period is twenty four months",
        )
    )
    idx = str(tmp_path / "idx")
    assert index(capsys, str(pdf), "--index", idx, "--chunk-size", "40")[0] == 0
    code, out, _ = run(capsys, "query", idx, "warranty period months", "--json", "-k", "1")
    hit = json.loads(out)[0]
    assert "warranty period" in hit["text"] and hit["page_end"] == 3
    assert 1 <= hit["page_start"] <= hit["page_end"]
    code, out, _ = run(capsys, "query", idx, "warranty period months", "-k", "1")
    assert code == 0 and ("pages " in out or "page 3" in out)


def test_flags(tmp_path: Path, capsys) -> None:
    idx = str(tmp_path / "idx")
    (tmp_path / "lease.md").write_text(LEASE, encoding="utf-8")
    assert index(capsys, str(tmp_path / "lease.md"), "--index", idx)[0] == 0
    # -v works after the subcommand as well as before it
    assert run(capsys, "info", idx, "-v")[0] == 0
    assert run(capsys, "-v", "info", idx)[0] == 0
    code, out, _ = run(capsys, "query", idx, "notice", "-k", "1", "-v", "--json")
    assert code == 0 and len(json.loads(out)) == 1
    # -k 0 is an error, not "no relevant segments"
    with pytest.raises(SystemExit) as exc:
        main(["query", idx, "notice", "-k", "0"])
    assert exc.value.code == 2 and "must be at least 1" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["index", str(tmp_path), "--index", idx, "--max-document-chars", "0"])


def test_production_example_without_arguments_prints_usage() -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "production.py")],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 2 and done.stderr.startswith("usage:")
    assert "Traceback" not in done.stderr
