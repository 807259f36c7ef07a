"""The ``langchain-rse`` command run as a user runs it: a child process, a real pipe, a
pseudo-terminal where a terminal matters (issues 46 and 47: redaction on re-index, links,
terminal control sequences, FIFOs, Ctrl-C, ``| head``, short Latin-1 files, an index inside
its own corpus, the demo's wording, the ``--html`` page's links)."""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import re
import select
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser
from pathlib import Path

import pytest

from helpers import cached_vectors, write_corpus
from langchain_rse.cli import main

ROOT = Path(__file__).resolve().parents[2]
SECRET = "The vault combination is 4921 and only the treasurer holds it."
LEASE = "# Office Lease\n\nThe tenant may terminate the lease with three months notice.\n"


def command(*argv: str) -> list[str]:
    return [sys.executable, "-m", "langchain_rse.cli", *argv]


def environment() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    env.pop("COLUMNS", None)
    return env


def cli(*argv: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """The command in a child process, stdout and stderr captured (pipes, not a terminal)."""
    return subprocess.run(
        command(*argv), env=environment(), capture_output=True, text=True, timeout=timeout
    )


def index(*argv: str) -> subprocess.CompletedProcess[str]:
    return cli("index", *argv, "--no-progress")


def texts(idx: Path, question: str, *extra: str) -> str:
    """Every returned text for ``question``, joined (chunks mode: each candidate chunk)."""
    done = cli("query", str(idx), question, "--json", "--mode", "chunks", "-k", "50", *extra)
    assert done.returncode == 0, done.stderr
    return "\n".join(hit["text"] for hit in json.loads(done.stdout))


# ---------------------------------------------------------------- 46.11 stale text


def test_links_out_of_the_folder_are_not_followed_and_removed_when_gone(tmp_path: Path) -> None:
    docs, outside, idx = tmp_path / "docs", tmp_path / "private", tmp_path / "idx"
    docs.mkdir()
    outside.mkdir()
    (docs / "lease.md").write_text(LEASE, encoding="utf-8")
    (outside / "vault.txt").write_text(SECRET, encoding="utf-8")
    (docs / "vault.txt").symlink_to(outside / "vault.txt")
    (docs / "inside.md").symlink_to(docs / "lease.md")  # a link inside the folder is fine

    done = index(str(docs), "--index", str(idx))
    assert done.returncode == 0, done.stderr
    assert "vault.txt: a link to a file outside" in done.stderr and "--follow-links" in done.stderr
    assert "4921" not in texts(idx, "vault combination treasurer")

    done = index(str(docs), "--index", str(idx), "--follow-links")  # asked: followed
    assert done.returncode == 0 and "indexed 1 file(s)" in done.stdout, done.stderr
    assert "4921" in texts(idx, "vault combination treasurer")

    done = index(str(docs), "--index", str(idx))  # no longer asked: its text goes
    assert done.returncode == 0 and "1 removed" in done.stdout, done.stdout + done.stderr
    assert "4921" not in texts(idx, "vault combination treasurer")

    index(str(docs), "--index", str(idx), "--follow-links")
    (docs / "vault.txt").unlink()  # link and target gone: its text goes too
    (outside / "vault.txt").unlink()
    done = index(str(docs), "--index", str(idx))
    assert done.returncode == 0 and "1 removed" in done.stdout, done.stdout + done.stderr
    assert "4921" not in texts(idx, "vault combination treasurer")
    info = json.loads(cli("info", str(idx), "--json").stdout)
    assert {Path(f["file"]).name for f in info["file_list"]} == {"lease.md"}


def test_an_emptied_or_binary_file_is_redacted(tmp_path: Path) -> None:
    docs, idx = tmp_path / "docs", tmp_path / "idx"
    docs.mkdir()
    (docs / "lease.md").write_text(LEASE, encoding="utf-8")
    (docs / "vault.txt").write_text(SECRET, encoding="utf-8")
    (docs / "memo.txt").write_text("Memo: the treasurer resigns in May.\n", encoding="utf-8")
    assert index(str(docs), "--index", str(idx)).returncode == 0
    assert "4921" in texts(idx, "vault combination treasurer")

    (docs / "vault.txt").write_text("")  # redacted by emptying it
    (docs / "memo.txt").write_bytes(b"\x00\x01binary now\x00")  # or by replacing it
    done = index(str(docs), "--index", str(idx))
    assert done.returncode == 0 and "2 removed" in done.stdout, done.stdout + done.stderr
    assert re.search(r"removed .*vault\.txt from the index: no text", done.stderr), done.stderr
    assert re.search(r"removed .*memo\.txt from the index: looks like a binary", done.stderr)
    found = texts(idx, "vault combination treasurer resigns")
    assert "4921" not in found and "resigns" not in found and "three months" in found
    again = index(str(docs), "--index", str(idx))  # said once: not "removed" on every run
    assert "0 removed" in again.stdout and "removed" not in again.stderr, again.stderr


# ---------------------------------------------------------------- 46.17 terminal, FIFOs


def test_control_sequences_are_escaped_on_screen_and_exact_in_json(tmp_path: Path) -> None:
    docs, idx = tmp_path / "docs", tmp_path / "idx"
    docs.mkdir()
    hostile = (
        "The warranty lasts twenty four months.\x1b]0;pwned title\x07\x1b[2J\x1b[31m "
        "Claims go to the supplier in writing.\x9b31m\r\n"
    )
    name = "warranty\x1b[2J.txt"
    (docs / name).write_text(hostile, encoding="utf-8")
    (docs / "odd\x1b]0;x\x07.csv").write_text("a,b\n")
    done = index(str(docs), "--index", str(idx))
    assert done.returncode == 0, done.stderr
    for stream in (done.stdout, done.stderr):
        assert "\x1b" not in stream and "\x07" not in stream
    assert "odd\\x1b]0;x\\x07.csv" in done.stderr  # shown, escaped

    shown = cli("query", str(idx), "how long is the warranty", "-k", "1", "--explain")
    assert shown.returncode == 0, shown.stderr
    assert "twenty four months" in shown.stdout and "warranty\\x1b[2J.txt" in shown.stdout
    assert not re.search(r"[\x00-\x08\x0b-\x1f\x7f-\x9f]", shown.stdout + shown.stderr)
    assert "\\x1b]0;pwned title\\x07" in shown.stdout  # visible, not acted on

    as_json = cli("query", str(idx), "how long is the warranty", "-k", "1", "--json")
    hit = json.loads(as_json.stdout)[0]
    assert hit["text"] == hostile[hit["start_index"] : hit["end_index"]]
    assert "\x1b]0;pwned title\x07" in hit["text"] and hit["source"].endswith(name)
    assert not re.search(r"[\x00-\x1f\x7f-\x9f]", as_json.stdout.replace("\n", ""))

    listed = cli("info", str(idx))
    assert listed.returncode == 0 and "warranty\\x1b[2J.txt" in listed.stdout
    assert "\x1b" not in listed.stdout


def test_named_pipes_are_skipped_without_opening_them(tmp_path: Path) -> None:
    docs, idx = tmp_path / "docs", tmp_path / "idx"
    docs.mkdir()
    (docs / "lease.md").write_text(LEASE, encoding="utf-8")
    os.mkfifo(docs / "feed.txt")
    done = cli(
        "index",
        str(docs),
        str(docs / "feed.txt"),
        "--index",
        str(idx),
        "--no-progress",
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "feed.txt: not a regular file (a named pipe)" in done.stderr
    assert done.stderr.count("feed.txt") == 1 and "indexed 1 file(s)" in done.stdout
    only = cli("index", str(docs / "feed.txt"), "--index", str(idx), timeout=120)
    assert only.returncode == 2 and "not a regular file" in only.stderr


# ---------------------------------------------------------------- 47.3 Ctrl-C


def run_in_terminal(argv: list[str], idx: Path, ready: int) -> tuple[int, str]:
    """Run ``argv`` on a pseudo-terminal, type Ctrl-C once ``ready`` vectors are cached,
    and return its exit status and everything it wrote to the terminal."""
    pid, fd = pty.fork()
    if pid == 0:  # the child: the pty is its controlling terminal
        os.execve(argv[0], argv, environment())
    output, sent, deadline = b"", False, time.monotonic() + 300
    try:
        while True:
            if not sent and cached_vectors() >= ready:
                os.write(fd, b"\x03")  # Ctrl-C: the terminal sends SIGINT
                sent = True
            assert time.monotonic() < deadline, output.decode(errors="replace")[-2000:]
            if select.select([fd], [], [], 0.05)[0]:
                try:
                    chunk = os.read(fd, 65536)
                except OSError:  # EIO: the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
        _, status = os.waitpid(pid, 0)
    finally:
        os.close(fd)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    assert sent, "finished before Ctrl-C could be typed"
    return os.waitstatus_to_exitcode(status), output.decode("utf-8", "replace")


def test_ctrl_c_during_index_stops_cleanly_and_says_how_to_resume(tmp_path: Path) -> None:
    docs, idx = tmp_path / "docs", tmp_path / "idx"
    write_corpus(docs)
    argv = command("index", str(docs), "--index", str(idx), "--chunk-size", "100")
    code, screen = run_in_terminal(argv, idx, ready=32)
    assert code == 130, screen[-3000:]
    assert "Traceback" not in screen and "KeyboardInterrupt" not in screen, screen[-3000:]
    assert "(done)" not in screen
    assert "interrupted" in screen and "re-run the same command" in screen, screen[-1500:]
    kept = int(re.search(r"(\d+) chunk vector\(s\) .*cached", screen)[1])
    assert kept >= 32 and not (idx / "rse_index.json").exists()  # nothing half-saved

    # off a terminal the progress log lines do not claim a stage finished either
    child = subprocess.Popen(
        argv, env=environment(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    deadline = time.monotonic() + 300
    while child.poll() is None and cached_vectors() < kept + 32:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    child.send_signal(signal.SIGINT)
    out, err = child.communicate(timeout=120)
    assert child.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "(done)" not in err and "re-run" in err, err[-3000:]

    resumed = cli("index", str(docs), "--index", str(idx), "--chunk-size", "100", "--no-progress")
    assert resumed.returncode == 0, resumed.stderr
    found = re.search(r"(\d+) of their (\d+) chunk\(s\) newly embedded", resumed.stdout)
    assert found and int(found[1]) <= int(found[2]) - kept - 32, resumed.stdout


# ---------------------------------------------------------------- 47.4 | head


def piped_to_head(argv: list[str]) -> tuple[subprocess.CompletedProcess[str], str]:
    """``argv | head -1`` over a real pipe, made one page small so that the command is
    still writing when ``head`` has its line and exits (as with long output)."""
    read, write = os.pipe()
    fcntl.fcntl(write, 1031, 4096)  # F_SETPIPE_SZ
    head = subprocess.Popen(["head", "-1"], stdin=read, stdout=subprocess.PIPE, text=True)
    os.close(read)
    try:
        done = subprocess.run(
            argv, env=environment(), stdout=write, stderr=subprocess.PIPE, text=True, timeout=300
        )
    finally:
        os.close(write)
    first = head.communicate(timeout=60)[0]
    return done, first


def test_output_into_a_closed_pipe_ends_quietly(tmp_path: Path) -> None:
    docs, idx = tmp_path / "docs", tmp_path / "idx"
    deep = docs.joinpath(*["d" * 200] * 8)  # long paths: a long file list, cheaply
    paragraph = "The supplier ships every order within ten days of the purchase date. " * 4
    for n in range(8):
        (deep / str(n)).mkdir(parents=True)
        (deep / str(n) / "orders.txt").write_text(f"{paragraph}\n\n" * 20, encoding="utf-8")
    assert index(str(docs), "--index", str(idx)).returncode == 0

    for argv in (
        ["info", str(idx)],
        ["query", str(idx), "when are orders shipped", "--mode", "chunks", "-k", "60"],
    ):
        full = cli(*argv)
        assert full.returncode == 0 and len(full.stdout) > 12_000, len(full.stdout)
        done, first = piped_to_head(command(*argv))
        assert first == full.stdout.splitlines(keepends=True)[0]
        assert done.stderr == "", done.stderr[-2000:]
        assert done.returncode == 1


# ---------------------------------------------------------------- 47.5 encodings


def test_short_latin1_file_and_forced_encoding(tmp_path: Path) -> None:
    dessert, idx = tmp_path / "dessert.txt", tmp_path / "idx"
    dessert.write_bytes("Café crème brûlée".encode("latin-1"))
    done = index(str(dessert), "--index", str(idx))
    assert done.returncode == 0 and "not UTF-8; decoded as cp1252" in done.stderr, done.stderr
    assert texts(idx, "crème brûlée") == "Café crème brûlée"

    done = index(str(dessert), "--index", str(idx), "--encoding", "cp1250")  # forced: re-read
    assert done.returncode == 0 and "indexed 1 file(s)" in done.stdout, done.stderr
    assert texts(idx, "crème brûlée") == "Café crčme brűlée"

    polish = tmp_path / "pl.txt"  # a clear Central European text keeps its own encoding
    polish.write_bytes("Zażółć gęślą jaźń. Pchnąć w tę łódź jeża.".encode("cp1250"))
    done = index(str(polish), "--index", str(tmp_path / "pl"))
    assert done.returncode == 0 and "decoded as cp1250" in done.stderr, done.stderr

    done = index(str(polish), "--index", str(tmp_path / "x"), "--encoding", "utf-8")
    assert done.returncode == 2 and "not valid utf-8" in done.stderr, done.stderr
    done = index(str(polish), "--index", str(tmp_path / "x"), "--encoding", "nonsense")
    assert done.returncode == 2 and "unknown encoding" in done.stderr, done.stderr


# ---------------------------------------------------------------- 47.6 index inside corpus


def test_index_inside_the_indexed_folder_is_left_out_once(tmp_path: Path) -> None:
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    (corpus / "lease.md").write_text(LEASE, encoding="utf-8")
    idx = corpus / "idx"
    for run in range(2):
        done = index(str(corpus), "--index", str(idx))
        assert done.returncode == 0, done.stderr
        assert "0 skipped" in done.stdout and "unsupported" not in done.stderr, done.stderr
        if run:
            assert done.stderr.count(str(idx)) == 1 and "own folder" in done.stderr
    info = json.loads(cli("info", str(idx), "--json").stdout)
    assert [Path(f["file"]).name for f in info["file_list"]] == ["lease.md"]


# ---------------------------------------------------------------- 47.8 demo wording


def test_demo_says_what_the_order_and_score_mean(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["demo", "-k", "3"]) == 0
    out = capsys.readouterr().out
    scores = [float(s) for s in re.findall(r"score (\d+\.\d+)", out)]
    assert len(scores) >= 2
    assert "ranked by it" not in out and "ranked by score" not in out
    assert "most relevant chunk first" in out  # the order the results are in
    assert "not by score" in out or scores == sorted(scores, reverse=True)


# ---------------------------------------------------------------- 47.12 html links


class Anchors(HTMLParser):
    """The result list's links and the highlighted segments' ids."""

    def __init__(self) -> None:
        super().__init__()
        self.links: list[str] = []
        self.marks: dict[str, str] = {}
        self._in_results = False

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        a = dict(attrs)
        if tag == "ul" and a.get("class") == "results":
            self._in_results = True
        elif tag == "a" and self._in_results:
            self.links.append(str(a.get("href")))
        elif tag == "mark" and a.get("id"):
            self.marks[str(a["id"])] = str(a.get("data-result"))

    def handle_endtag(self, tag: str) -> None:
        if tag == "ul":
            self._in_results = False


def test_html_result_list_links_to_the_highlights(tmp_path: Path) -> None:
    docs, idx, page = tmp_path / "docs", tmp_path / "idx", tmp_path / "why.html"
    docs.mkdir()
    (docs / "lease.md").write_text(
        "# Office Lease\n\n## Rent\n\nThe tenant pays rent of EUR 2,000 monthly.\n\n"
        "## Termination\n\nThe tenant may terminate the lease with three months notice.\n",
        encoding="utf-8",
    )
    (docs / "policy.txt").write_text("Hotels are reimbursed up to EUR 160 per night.\n")
    assert index(str(docs), "--index", str(idx)).returncode == 0
    done = cli("query", str(idx), "notice to end the lease", "--html", str(page), "-k", "2")
    assert done.returncode == 0, done.stderr
    parser = Anchors()
    parser.feed(page.read_text(encoding="utf-8"))
    results = len(re.findall(r"^\[\d+\]", done.stdout, flags=re.M))
    assert results and len(parser.links) == results
    for link in parser.links:
        assert link.startswith("#seg-") and parser.marks[link[1:]] == link.removeprefix("#seg-")
