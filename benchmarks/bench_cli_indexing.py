"""Indexing time per million characters through the ``langchain-rse index`` command, with the
offline defaults (bundled model, header enricher), on folders you name: e.g. a reST docs tree
from an sdist and a folder of plain text. Each folder is indexed from scratch (a new index,
an empty embedding cache) in a fresh process; wall and CPU seconds are reported (CPU time
is what a busy machine inflates least); files with a suffix the command does not read
(``.rst`` before it did) are copied as ``.txt``.

    pip download --no-deps --no-binary :all: click==8.1.7 -d /tmp/x   # docs/*.rst
    nice -n 10 python benchmarks/bench_cli_indexing.py /tmp/x/click-8.1.7/docs \
        /usr/share/common-licenses
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from langchain_rse.cli.loaders import SUFFIXES


def measure(folder: Path) -> dict[str, float | int | str]:
    """Index ``folder``'s files into a new index; characters, chunks and seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        copy = Path(tmp) / "docs"
        copy.mkdir()
        chars = 0
        for path in sorted(p for p in folder.rglob("*") if p.is_file()):
            suffix = path.suffix.lower() if path.suffix.lower() in SUFFIXES else ".txt"
            text = path.read_text(encoding="utf-8", errors="replace")
            chars += len(text)
            (copy / f"{path.stem}{suffix}").write_text(text, encoding="utf-8")
        cpu_before = resource.getrusage(resource.RUSAGE_CHILDREN)
        started = time.perf_counter()
        subprocess.run(
            [
                sys.executable,
                "-m",
                "langchain_rse.cli",
                "index",
                str(copy),
                "--index",
                str(Path(tmp) / "idx"),
                "--no-progress",
            ],
            check=True,
            capture_output=True,
            # an empty embedding cache of its own (the default lives in the user's cache)
            env={**os.environ, "LANGCHAIN_RSE_CACHE_DIR": str(Path(tmp) / "cache")},
        )
        seconds = time.perf_counter() - started
        cpu_after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (cpu_after.ru_utime + cpu_after.ru_stime) - (
            cpu_before.ru_utime + cpu_before.ru_stime
        )
        record = json.loads((Path(tmp) / "idx" / "cli_files.json").read_text())
        chunks = sum(entry.get("chunks", 0) for entry in record.values())
        shutil.rmtree(copy)
    return {
        "folder": str(folder),
        "characters": chars,
        "chunks": chunks,
        "seconds": round(seconds, 1),
        "seconds_per_million_chars": round(seconds / chars * 1e6, 1),
        "cpu_seconds": round(cpu, 1),
        "cpu_seconds_per_million_chars": round(cpu / chars * 1e6, 1),
        "load_average": os.getloadavg()[0],
        "chars_per_chunk": round(chars / max(chunks, 1)),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folders", nargs="+", type=Path)
    for folder in parser.parse_args().folders:
        print(json.dumps(measure(folder)), flush=True)


if __name__ == "__main__":
    main()
