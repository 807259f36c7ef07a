"""The shared-index engines as API workers use them, for tests and benchmarks.

Each engine holds one index in servers started here on 127.0.0.1 (the way the tests
start them, ``servers.py``, ``milvus_server.py``, ``postgres_server.py``):

================  ======================  ======================  ====================
engine            vector store            lexical index           record store
================  ======================  ======================  ====================
``chroma_redis``  Chroma collection       bm25s in each process   Redis namespace
``milvus``        Milvus collection       Milvus BM25 collection  Redis namespace
``postgres``      PGVector (pgvector)     full-text BM25 table    ``bytea`` table
================  ======================  ======================  ====================

:func:`servers_for` starts an engine's servers and yields a JSON-able config;
:func:`new_index` adds a fresh, empty index to it (a collection name, or a database), and
:func:`build` opens a retriever over that index, in any process. :func:`stored_versions`
lists the ``(doc_id, version)`` of every chunk each store holds (for orphan checks).
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from langchain_core.embeddings import Embeddings

from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.indexing.records import chunk_key

__all__ = ["ENGINES", "build", "drop", "new_index", "servers_for", "stored_versions"]

ENGINES = ("chroma_redis", "milvus", "postgres")
CHUNK_KEY_SEP = chunk_key("a", "b", 0)[1]


@contextmanager
def servers_for(engine: str, tmp: Path) -> Iterator[dict[str, Any]]:
    """Start the servers of ``engine`` (skips, or fails when ``CI=true``, if one is missing)."""
    from servers import chroma_server, redis_server

    cfg: dict[str, Any] = {"engine": engine}
    with ExitStack() as stack:
        if engine in ("chroma_redis", "milvus"):
            cfg["redis"] = stack.enter_context(redis_server(tmp))
        if engine == "chroma_redis":
            cfg["chroma"] = stack.enter_context(chroma_server(tmp))
        elif engine == "milvus":
            from milvus_server import milvus_server

            cfg["milvus"] = stack.enter_context(milvus_server(tmp))
        elif engine == "postgres":
            from postgres_server import postgres_server

            try:
                import langchain_postgres  # noqa: F401
            except ImportError:
                from servers import missing_server

                missing_server("langchain-postgres is not installed")
            cfg["postgres"] = stack.enter_context(postgres_server(tmp))
        else:
            raise ValueError(f"unknown engine {engine!r} (one of {', '.join(ENGINES)})")
        yield cfg


def new_index(cfg: dict[str, Any]) -> dict[str, Any]:
    """``cfg`` plus a fresh index: a new name (collections, namespace) or database."""
    out = {**cfg, "name": f"t{uuid.uuid4().hex[:12]}"}
    if cfg["engine"] == "postgres":
        from postgres_server import new_database

        out["url"] = new_database(cfg["postgres"])
    return out


def _chroma_client(cfg: dict[str, Any]) -> Any:
    import chromadb

    settings = chromadb.config.Settings(anonymized_telemetry=False)
    return chromadb.HttpClient(host="127.0.0.1", port=cfg["chroma"], settings=settings)


def build(cfg: dict[str, Any], embedding: Embeddings | None = None, **kwargs: Any) -> RSERetriever:
    """A retriever over the index of ``cfg``, opened as a worker process would open it."""
    emb = embedding or HashingEmbeddings()
    engine, name = cfg["engine"], cfg["name"]
    stores: dict[str, Any] = {}
    if engine in ("chroma_redis", "milvus"):
        from langchain_community.storage import RedisStore

        redis_url = f"redis://127.0.0.1:{cfg['redis']}"
        stores["record_store"] = RedisStore(redis_url=redis_url, namespace=name)
    if engine == "chroma_redis":
        from langchain_chroma import Chroma

        stores["vectorstore"] = Chroma(
            collection_name=name, embedding_function=emb, client=_chroma_client(cfg)
        )
    elif engine == "milvus":
        from milvus_server import milvus_stores

        stores["vectorstore"], stores["lexical_store"] = milvus_stores(cfg["milvus"], name, emb)
    else:
        from postgres_server import postgres_stores

        vs, lexical, docstore = postgres_stores(cfg["url"], emb)
        stores |= {"vectorstore": vs, "lexical_store": lexical, "record_store": docstore}
    return RSERetriever(**stores, **kwargs)


def stored_versions(r: RSERetriever) -> dict[str, list[tuple[str, str]]]:
    """``(doc_id, doc_version)`` of every chunk in each store of ``r`` (one per chunk,
    sorted), read from the servers themselves."""
    vs = r.vectorstore
    out: dict[str, list[tuple[str, str]]] = {}
    kind = type(vs).__name__
    if kind == "Chroma":
        metas = vs.get(include=["metadatas"])["metadatas"]  # type: ignore[attr-defined]
        out["vectorstore"] = sorted((m["doc_id"], m["doc_version"]) for m in metas)
    elif kind == "Milvus":
        for which, store in (("vectorstore", vs), ("lexical_store", r.lexical_store)):
            fields = ["doc_id", "doc_version"]
            rows = store.client.query(  # type: ignore[union-attr]
                store.collection_name, filter="", output_fields=fields, limit=16_384
            )
            out[which] = sorted((row["doc_id"], row["doc_version"]) for row in rows)
    elif kind == "PGVector":
        import sqlalchemy as sa

        with r.record_store.engine.connect() as conn:  # type: ignore[attr-defined]
            for which, sql in (
                (
                    "vectorstore",
                    "SELECT cmetadata->>'doc_id', cmetadata->>'doc_version' "
                    "FROM langchain_pg_embedding",
                ),
                (
                    "lexical_store",
                    "SELECT metadata->>'doc_id', metadata->>'doc_version' FROM rse_lexical",
                ),
            ):
                out[which] = sorted((a, b) for a, b in conn.execute(sa.text(sql)).all())
    else:
        raise ValueError(f"no listing for {kind}")
    if r.lexical_store is None:
        keys = (key.split(CHUNK_KEY_SEP) for key in r.index.lexical.tokens())
        out["bm25 (in process)"] = sorted((doc_id, version) for doc_id, version, _ in keys)
    return out


def drop(cfg: dict[str, Any], r: RSERetriever) -> None:
    """Remove the index of ``cfg`` (collections; the database stays until the server goes)."""
    if cfg["engine"] == "chroma_redis":
        _chroma_client(cfg).delete_collection(cfg["name"])
    elif cfg["engine"] == "milvus":
        r.vectorstore.drop()  # type: ignore[attr-defined]
        r.lexical_store.drop()  # type: ignore[union-attr]
    else:
        r.record_store.engine.dispose()  # type: ignore[attr-defined]
