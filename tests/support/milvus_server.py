"""Start a real local Milvus server (Milvus Lite's gRPC server) on 127.0.0.1 for tests.

The ``milvus-lite`` wheel from PyPI ships a ``milvus-lite`` command whose ``server``
subcommand serves the Milvus gRPC protocol over a data directory::

    milvus-lite server --data-dir DIR --host 127.0.0.1 --port PORT

Clients connect with ``pymilvus.MilvusClient(uri="http://127.0.0.1:PORT")`` (or
``langchain_milvus.Milvus(connection_args={"uri": ...})``). One server process owns a
data directory; any number of client processes may connect to it.
"""

from __future__ import annotations

import shutil
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings
from servers import _server, free_port, missing_server

from helpers import HashingEmbeddings


def milvus_lite_exe() -> str | None:
    exe = shutil.which("milvus-lite") or str(Path(sys.executable).parent / "milvus-lite")
    return exe if Path(exe).exists() else None


@contextmanager
def milvus_server(tmp: Path) -> Iterator[str]:
    """A Milvus server on a free port of 127.0.0.1; yields its URI."""
    exe = milvus_lite_exe()
    if exe is None:
        missing_server("the Milvus Lite server is not installed (pip install milvus-lite)")
    try:
        import langchain_milvus  # noqa: F401
    except ImportError:
        missing_server("langchain-milvus is not installed (pip install langchain-milvus)")
    port = free_port()
    cmd = [
        exe,
        "server",
        "--data-dir",
        str(tmp / "milvus"),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
    ]
    with _server(cmd, port, "milvus-lite server", tmp / "milvus.log") as p:
        yield f"http://127.0.0.1:{p}"


# Every process that opens the dense collection must pass the same index parameters:
# langchain-milvus picks the relevance-score function from them (without, it assumes L2
# and inverts a COSINE ranking).
DENSE_INDEX = {"index_type": "FLAT", "metric_type": "COSINE", "params": {}}

# pymilvus pings every 10 s, idle or not; the milvus-lite server keeps gRPC's default
# policy (one ping per 5 minutes) and answers with GOAWAY "too_many_pings", which can
# land while a client is connecting ("Fail connecting to server"). Ping as the server
# allows.
GRPC_OPTIONS = {"grpc.keepalive_time_ms": 300_000, "grpc.keepalive_permit_without_calls": False}


def connection_args(uri: str) -> dict[str, Any]:
    """What every test client of the server passes to pymilvus."""
    return {"uri": uri, "grpc_options": dict(GRPC_OPTIONS)}


def milvus_stores(uri: str, name: str, embedding: Embeddings | None = None) -> tuple[Any, Any]:
    """A dense collection and a BM25 collection for one index (as every worker opens them)."""
    from langchain_milvus import Milvus

    from langchain_rse.integrations.milvus import MilvusLexicalStore

    dense = Milvus(
        embedding or HashingEmbeddings(),
        collection_name=f"d_{name}",
        connection_args=connection_args(uri),
        index_params=dict(DENSE_INDEX),
        enable_dynamic_field=True,
        consistency_level="Strong",
    )
    lexical = MilvusLexicalStore(f"l_{name}", connection_args(uri))
    return dense, lexical
