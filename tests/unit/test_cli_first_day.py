"""The command on a real docs folder (issues 54.8, 54.10, 54.14, 57.2-57.7): files refused
from their size and not read again, UTF-16, one-line errors for ordinary mistakes, ids
relative to the indexed folder, --include/--exclude/.gitignore, the estimate before a long
run, and the query knobs (--max-chars, chunk fields, several questions per process)."""

from __future__ import annotations

import codecs
import io
import json
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from langchain_rse import cli
from langchain_rse.cli import main
from langchain_rse.cli.loaders import (
    base_folder,
    changed_files,
    decode_text,
    list_files,
    load_documents,
)

LEASE = (
    "# Office Lease\n\n## Rent\n\nThe tenant pays rent of EUR 2,000 monthly in advance.\n\n"
    "## Termination\n\nThe tenant may terminate the lease with three months notice.\n\n"
    "## Repairs\n\nThe landlord repairs the roof, the walls and the heating at its cost.\n"
)
POLICY = (
    "TRAVEL POLICY\n\nEconomy class is standard for flights under six hours.\n"
    "Hotels are reimbursed up to EUR 160 per night.\n"
)


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def bytes_read() -> int:
    """Bytes this process has read with read() calls so far (Linux)."""
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("rchar:"):
            return int(line.split()[1])
    raise AssertionError("no rchar in /proc/self/io")


needs_proc_io = pytest.mark.skipif(
    not Path("/proc/self/io").is_file(), reason="counts bytes read in /proc/self/io"
)


@pytest.fixture(scope="module")
def indexed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, str]]:
    """A small docs folder indexed once (with the estimate announced whatever the size):
    the folder, the index and the command's stderr."""
    tmp = tmp_path_factory.mktemp("first_day")
    docs = tmp / "docs"
    (docs / "guide").mkdir(parents=True)
    (docs / "lease.md").write_text(LEASE, encoding="utf-8")
    (docs / "guide" / "policy.txt").write_text(POLICY, encoding="utf-8")
    (docs / "guide" / "notes.txt").write_text(
        "Utf-16 notes: the deposit is two months of rent.\n", encoding="utf-16"
    )
    (docs / "_build").mkdir()
    (docs / "_build" / "lease.md").write_text(LEASE, encoding="utf-8")
    (docs / ".gitignore").write_text("_build/\n", encoding="utf-8")
    for n in range(7):
        (docs / f"diagram{n}.svg").write_text("<svg/>", encoding="utf-8")
    index = tmp / "idx"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(cli, "ANNOUNCE_FROM_S", 0.0)
        err = io.StringIO()
        mp.setattr("sys.stderr", err)
        code = main(["index", str(docs), "--index", str(index), "--no-progress"])
    assert code == 0, err.getvalue()
    yield docs, index, err.getvalue()


# ---------------------------------------------------------------- 57.2, 57.3, 57.4


def test_ids_are_relative_to_the_indexed_folder(indexed, capsys) -> None:
    docs, index, _ = indexed
    code, out, _ = run(capsys, "query", str(index), "hotel per night", "-k", "1", "--json")
    hit = json.loads(out)[0]
    assert code == 0 and hit["source"] == hit["doc_id"] == "guide/policy.txt"
    assert str(docs) not in out  # nothing of where it was built
    text = (docs / hit["source"]).read_text(encoding="utf-8")
    assert hit["text"] == text[hit["start_index"] : hit["end_index"]]
    # Python's load_documents makes the same ids (so both share one embedding cache)
    ids = sorted(str(d.id) for d in load_documents([docs]))
    assert ids == ["_build/lease.md", "guide/notes.txt", "guide/policy.txt", "lease.md"]


def test_skipped_files_are_one_line_and_gitignore_is_honoured(indexed, capsys) -> None:
    docs, index, err = indexed
    assert "skipped 7 file(s): 7 .svg (unsupported) (-v lists them)" in err
    assert "left out: 1 ignored by .gitignore" in err
    assert "diagram0.svg" not in err  # no line per file
    code, out, _ = run(capsys, "info", str(index), "--json")
    files = sorted(f["file"] for f in json.loads(out)["file_list"])
    assert len(files) == 3 and not any("_build" in f for f in files)


def test_a_long_run_is_announced_with_what_to_do(indexed) -> None:
    _, _, err = indexed
    assert "million characters: indexing takes about" in err
    assert "--include/--exclude" in err and "hosted embedding model" in err


def test_include_and_exclude_globs(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    for name in ["a.md", "guide/b.md", "guide/c.txt", "_build/d.md", "api/e.rst"]:
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text("text", encoding="utf-8")

    def listed(**rules: object) -> list[str]:
        listing = list_files([str(docs)], tmp_path / "idx", **rules)  # type: ignore[arg-type]
        return sorted(listing.ids.values())

    assert listed(include=["*.md"]) == ["_build/d.md", "a.md", "guide/b.md"]
    assert listed(include=["*.md"], exclude=["_build/"]) == ["a.md", "guide/b.md"]
    assert listed(include=["guide/**"]) == ["guide/b.md", "guide/c.txt"]
    (docs / "guide" / ".gitignore").write_text("*.txt\n", encoding="utf-8")
    assert listed() == ["_build/d.md", "a.md", "api/e.rst", "guide/b.md"]
    assert "guide/c.txt" in listed(ignore_files=False)


def test_ids_of_several_paths_and_clashes(tmp_path: Path, capsys) -> None:
    for name in ["one/README.md", "two/README.md"]:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(LEASE, encoding="utf-8")
    paths = [str(tmp_path / "one"), str(tmp_path / "two")]
    assert base_folder(paths) == tmp_path.resolve()
    listing = list_files(paths, tmp_path / "idx")
    assert sorted(listing.ids.values()) == ["one/README.md", "two/README.md"]
    # one folder indexed, then another with the same relative names: refused, not replaced
    record = {str((tmp_path / "one/README.md").resolve()): {"id": "README.md", "stamp": {}}}
    with pytest.raises(cli.CLIError, match="common folder, or set --base"):
        changed_files(list_files(paths[1:], tmp_path / "idx"), record, paths[1:], None, 10**6)


# ---------------------------------------------------------------- 54.8, 54.10


@needs_proc_io
def test_a_file_too_large_is_refused_from_its_size_unread(tmp_path: Path, capsys) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "huge.txt").write_bytes(b"lorem ipsum " * (4 << 20))  # 48 MiB
    before = bytes_read()
    code, _, err = run(
        capsys, "index", str(docs), "--index", str(tmp_path / "idx"), "--max-document-chars", "1000"
    )
    assert code == 2 and "over --max-document-chars 1,000" in err
    assert bytes_read() - before < 4 << 20  # not the 48 MiB


@needs_proc_io
def test_a_refused_file_is_not_read_again(tmp_path: Path, indexed, capsys) -> None:
    docs, index, _ = indexed
    long_file = docs / "guide" / "long.txt"
    long_file.write_text("ipsum " * 200_000, encoding="utf-8")  # 1.2M characters
    args = ["index", str(docs), "--index", str(index), "--max-document-chars", "1100000"]
    try:
        code, out, err = run(capsys, *args)
        assert code == 0 and "8 skipped" in out and "1 over --max-document-chars" in err
        before = bytes_read()
        code, out, err = run(capsys, *args)
        assert code == 0 and "8 skipped" in out and "1 over --max-document-chars" in err
        assert bytes_read() - before < 1_000_000  # the 1.2 MB file was not read again
    finally:
        long_file.unlink()


def test_utf16_files_are_read(indexed, capsys) -> None:
    _, index, _ = indexed
    code, out, _ = run(capsys, "query", str(index), "deposit two months", "-k", "1", "--json")
    assert json.loads(out)[0]["source"] == "guide/notes.txt"


BOMS = {"utf-16": codecs.BOM_UTF16_LE, "utf-32": codecs.BOM_UTF32_LE, "utf-8-sig": b""}


@settings(max_examples=150)
@given(
    text=st.text(st.characters(blacklist_characters="\x00", blacklist_categories=["Cs"])),
    encoding=st.sampled_from(["utf-16", "utf-16-le", "utf-16-be", "utf-32", "utf-8-sig"]),
    named=st.booleans(),
)
@example(text="Caf\u00e9 cr\u00e8me", encoding="utf-16", named=False)
def test_unicode_files_always_decode_to_their_text(text: str, encoding: str, named: bool) -> None:
    """Text in UTF-16/32 with a byte-order mark, or in an encoding named, always decodes
    to itself (never "binary" for its NUL bytes)."""
    data = text.encode(encoding)
    if encoding in ("utf-16-le", "utf-16-be"):
        named = True  # no byte-order mark: only a named encoding reads it
    assert decode_text(data, encoding if named else None)[0] == text


# ---------------------------------------------------------------- 54.14


def test_ordinary_mistakes_are_one_line_errors(indexed, tmp_path: Path, capsys) -> None:
    _, index, _ = indexed
    missing = tmp_path / "no" / "such" / "why.html"
    code, _, err = run(capsys, "query", str(index), "rent", "--html", str(missing))
    assert (
        code == 2 and err.startswith("langchain-rse: error: cannot write") and err.count("\n") == 1
    )
    blocker = tmp_path / "a-file"
    blocker.write_text("x", encoding="utf-8")
    code, _, err = run(capsys, "index", str(tmp_path / "a-file"), "--index", str(blocker / "idx"))
    assert code == 2 and err.startswith("langchain-rse: error: cannot write the index")
    with pytest.raises(SystemExit) as info:
        main(["mcp", str(index), "--http", "70000"])
    assert info.value.code == 2 and "a port is 1 to 65535" in capsys.readouterr().err


@pytest.mark.skipif(os.name != "posix" or os.geteuid() == 0, reason="root writes anywhere")
def test_a_read_only_index_folder_is_refused_before_any_work(indexed, tmp_path, capsys) -> None:
    docs, _, _ = indexed
    locked = tmp_path / "locked"
    locked.mkdir(mode=0o555)
    code, _, err = run(capsys, "index", str(docs), "--index", str(locked / "idx"))
    assert code == 2 and "is not writable" in err


# ---------------------------------------------------------------- 57.6, 57.7


def test_query_max_chars_and_chunk_fields(indexed, capsys) -> None:
    _, index, _ = indexed
    code, out, _ = run(capsys, "query", str(index), "rent termination repairs", "--json")
    assert sum(len(h["text"]) for h in json.loads(out)) > 120
    code, out, _ = run(
        capsys, "query", str(index), "rent termination repairs", "--json", "--max-chars", "120"
    )
    hits = json.loads(out)
    assert code == 0 and hits and sum(len(h["text"]) for h in hits) <= 120
    code, out, _ = run(capsys, "query", str(index), "hotel", "--mode", "chunks", "--json")
    hit = json.loads(out)[0]
    assert {"context", "fused_score", "dense_rank", "lexical_rank", "chunk_index"} <= set(hit)
    assert isinstance(hit["context"], str) and hit["chunk_index"] == hit["chunk_start"]


def test_several_questions_in_one_process(indexed, capsys, monkeypatch) -> None:
    _, index, _ = indexed
    monkeypatch.setattr("sys.stdin", io.StringIO("hotel per night\n\nthree months notice\n"))
    code, out, _ = run(capsys, "query", str(index), "-k", "1", "--json")
    lines = [json.loads(line) for line in out.splitlines()]
    assert code == 0 and [line["question"] for line in lines] == [
        "hotel per night",
        "three months notice",
    ]
    assert lines[0]["results"][0]["source"] == "guide/policy.txt"
    assert lines[1]["results"][0]["source"] == "lease.md"


def test_query_help_shows_the_defaults_and_what_the_rerankers_are_for(capsys) -> None:
    with pytest.raises(SystemExit):
        main(["query", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 4)" in text and "--max-chars" in text
    assert "slower and no better in our tests" in text


@pytest.mark.skipif(not hasattr(os, "openpty"), reason="needs a pseudo-terminal")
def test_a_prompt_on_a_terminal_when_no_question_is_given(indexed) -> None:
    import subprocess
    import sys

    _, index, _ = indexed
    root = Path(__file__).resolve().parents[2]
    master, terminal = os.openpty()  # the child's stdin is a terminal (no fork here)
    try:
        proc = subprocess.Popen(
            [sys.executable, "-m", "langchain_rse.cli", "query", str(index), "-k", "1"],
            stdin=terminal,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env={**os.environ, "PYTHONPATH": str(root)},
            text=True,
        )
        os.write(master, b"hotel per night\nthree months notice\n\n")
        out, err = proc.communicate(timeout=300)
    finally:
        os.close(terminal)
        os.close(master)
    assert proc.returncode == 0, err
    assert "ask a question" in err
    assert out.count("[1] ") == 2 and "guide/policy.txt" in out and "lease.md" in out
