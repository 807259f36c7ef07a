from __future__ import annotations

import sys
from pathlib import Path

import pytest
from langchain_core.documents import Document

# tests/support holds the servers, fakes and helpers; the integration suites also reuse a few
# corpora and runners of the unit suites (``from test_cli import run``).
sys.path.insert(0, str(Path(__file__).parent / "unit"))
sys.path.insert(0, str(Path(__file__).parent / "support"))

from hypothesis import HealthCheck, settings  # noqa: E402

from helpers import HashingEmbeddings, make_contract  # noqa: E402

# Property tests: the same examples on every run (failures found while developing are kept
# as @example regressions), no per-example deadline on a loaded 2-core machine.
settings.register_profile(
    "repo",
    derandomize=True,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
settings.load_profile("repo")


@pytest.fixture(autouse=True)
def _own_vector_cache(
    tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Each test (and the commands it runs) gets its own default embedding cache, never the
    user's (``LANGCHAIN_RSE_CACHE_DIR``)."""
    monkeypatch.setenv("LANGCHAIN_RSE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))


def pytest_sessionstart(session: pytest.Session) -> None:
    """In CI (``CI=true``) every integration server must be there: stop at once, naming
    what is missing (the same lookups the server fixtures make)."""
    import os

    if os.environ.get("CI") == "true":
        from server_check import missing_servers

        missing = missing_servers()
        if missing:
            pytest.exit("CI=true, but these are missing: " + "; ".join(missing), returncode=3)


CORPUS = {
    "alpha": ["payment terms", "termination", "confidentiality", "indemnity"],
    "beta": ["warranty", "termination", "governing law", "insurance"],
    "gamma": ["licence grant", "royalties", "audit rights", "termination"],
    "delta": ["exclusivity", "non-compete", "marketing", "insurance"],
}


def corpus_documents() -> list[Document]:
    return [
        Document(make_contract(name, topics), metadata={"source": f"{name}.txt", "title": name})
        for name, topics in CORPUS.items()
    ]


@pytest.fixture
def docs() -> list[Document]:
    return corpus_documents()


@pytest.fixture
def embeddings() -> HashingEmbeddings:
    return HashingEmbeddings()
