"""PostgreSQL adapters: a full-text lexical store and a byte store for the records.

With ``langchain_postgres.PGVector`` as the vector store, one database holds the whole
index::

    engine = sqlalchemy.create_engine("postgresql+psycopg://user@host/db")
    retriever = RSERetriever(
        vectorstore=PGVector(embeddings, connection=engine),
        lexical_store=PostgresLexicalStore(engine),
        record_store=PostgresByteStore(engine),
    )

Needs ``sqlalchemy`` and a PostgreSQL driver (``psycopg[binary]``); both come with
``langchain-postgres``. Tables are created when missing (``create_table=False`` to skip);
unqualified names follow the connection's ``search_path``.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

import sqlalchemy as sa
from langchain_core.documents import Document
from langchain_core.embeddings import Embeddings
from langchain_core.stores import BaseStore
from langchain_core.vectorstores import VectorStore

from langchain_rse.filters import filter_sql

__all__ = ["PostgresByteStore", "PostgresLexicalStore"]

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,62}$")
_CONFIG = re.compile(r"^([A-Za-z_][A-Za-z0-9_]*\.)?[A-Za-z_][A-Za-z0-9_]*$")


def _engine(connection: str | sa.Engine, engine_args: dict[str, Any] | None) -> sa.Engine:
    if isinstance(connection, sa.Engine):
        return connection
    return sa.create_engine(connection, **(engine_args or {}))


def _table(name: str) -> str:
    if not _NAME.match(name):
        raise ValueError(f"invalid table name {name!r} (letters, digits, _; at most 63)")
    return f'"{name}"'


def _create(engine: sa.Engine, name: str, statements: Sequence[str]) -> None:
    with engine.begin() as conn:  # serialised: concurrent CREATE ... IF NOT EXISTS can fail
        conn.execute(sa.text("SELECT pg_advisory_xact_lock(hashtext(:n))"), {"n": name})
        for statement in statements:
            conn.execute(sa.text(statement))


# ------------------------------------------------------------------------ lexical store


class PostgresLexicalStore(VectorStore):
    """A lexical ``VectorStore`` on PostgreSQL full-text search, ranked by BM25.

    One table ``(id text primary key, content text, metadata jsonb)`` with generated
    ``tsvector`` and lexeme-array columns and a GIN index. A query is split into lexemes
    by the same text search configuration (stemming, stop words), any of them matches
    (an OR: ``plainto_tsquery``/``websearch_to_tsquery`` AND all words, which finds
    nothing for a long question), and hits are ranked by BM25 (``ts_rank`` has no inverse
    document frequency, so common words outrank a rare identifier). Document frequencies
    and the average length are counted at query time: exact, and proportional to the
    table size.
    """

    def __init__(
        self,
        connection: str | sa.Engine,
        *,
        table: str = "rse_lexical",
        text_search_config: str = "english",
        k1: float = 1.2,
        b: float = 0.75,
        create_table: bool = True,
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        if not _CONFIG.match(text_search_config):
            raise ValueError(f"invalid text search configuration {text_search_config!r}")
        self.engine = _engine(connection, engine_args)
        self.table, self._t = table, _table(table)
        self.text_search_config, self.k1, self.b = text_search_config, k1, b
        if create_table:
            self.create_table()

    @property
    def embeddings(self) -> Embeddings | None:
        return None

    def create_table(self) -> None:
        """Create the table and its index when missing."""
        t, vector = self._t, f"to_tsvector('{self.text_search_config}'::regconfig, content)"
        _create(
            self.engine,
            self.table,
            [
                f"CREATE TABLE IF NOT EXISTS {t} (id text PRIMARY KEY, content text NOT NULL, "
                "metadata jsonb NOT NULL DEFAULT '{}', "
                f"tsv tsvector GENERATED ALWAYS AS ({vector}) STORED, "
                f"lexemes text[] GENERATED ALWAYS AS (tsvector_to_array({vector})) STORED)",
                f'CREATE INDEX IF NOT EXISTS "{self.table}_lexemes" ON {t} USING gin (lexemes)',
            ],
        )

    def drop_table(self) -> None:
        with self.engine.begin() as conn:
            conn.execute(sa.text(f"DROP TABLE IF EXISTS {self._t}"))

    def add_texts(
        self,
        texts: Iterable[str],
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        **kwargs: object,
    ) -> list[str]:
        """Insert or replace (by id) one row per text; returns the ids."""
        texts = list(texts)
        ids = [i or str(uuid.uuid4()) for i in ids] if ids else [str(uuid.uuid4()) for _ in texts]
        if len(ids) != len(texts):
            raise ValueError(f"{len(ids)} ids for {len(texts)} texts")
        metadatas = metadatas or [{}] * len(texts)
        rows = {
            i: {"id": i, "content": c, "metadata": json.dumps(m)}
            for i, c, m in zip(ids, texts, metadatas)
        }
        if rows:
            with self.engine.begin() as conn:  # sorted: concurrent writers lock rows in order
                conn.execute(
                    sa.text(
                        f"INSERT INTO {self._t} (id, content, metadata) "
                        "VALUES (:id, :content, CAST(:metadata AS jsonb)) ON CONFLICT (id) DO "
                        "UPDATE SET content = excluded.content, metadata = excluded.metadata"
                    ),
                    [rows[i] for i in sorted(rows)],
                )
        return list(ids)

    def delete(self, ids: list[str] | None = None, **kwargs: object) -> bool:
        if ids:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text(f"DELETE FROM {self._t} WHERE id = ANY(:ids)"),
                    {"ids": sorted(set(ids))},
                )
        return True

    def get_by_ids(self, ids: Sequence[str], /) -> list[Document]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(f"SELECT id, content, metadata FROM {self._t} WHERE id = ANY(:ids)"),
                {"ids": list(ids)},
            ).all()
        found = {r.id: Document(r.content, metadata=r.metadata, id=r.id) for r in rows}
        return [found[i] for i in dict.fromkeys(ids) if i in found]

    def similarity_search_with_score(
        self,
        query: str,
        k: int = 4,
        filter: Mapping[str, Any] | None = None,
        **kwargs: object,
    ) -> list[tuple[Document, float]]:
        """The ``k`` best rows by BM25 over the query's lexemes, best first."""
        where, params = filter_sql(filter, "d.metadata") if filter else ("true", {})
        t = self._t
        sql = f"""
            WITH q AS MATERIALIZED (SELECT DISTINCT lexeme
                       FROM unnest(to_tsvector(CAST(:config AS regconfig), :query))),
            stats AS MATERIALIZED (SELECT count(*)::float8 AS n,
                             greatest(avg(length(tsv)), 1)::float8 AS avgdl FROM {t}),
            idf AS MATERIALIZED (SELECT lexeme, ln(1 + (s.n - df + 0.5) / (df + 0.5)) AS idf
                    FROM (SELECT lexeme, (SELECT count(*) FROM {t}
                                          WHERE lexemes @> ARRAY[q.lexeme])::float8 AS df
                          FROM q) d, stats s),
            scores AS (
                SELECT d.id, sum(idf.idf * u.tf * (:k1 + 1) / (u.tf + :k1
                           * (1 - :b + :b * length(d.tsv) / s.avgdl))) AS score
                FROM {t} d CROSS JOIN stats s
                     CROSS JOIN LATERAL (SELECT lexeme, cardinality(positions)::float8 AS tf
                                         FROM unnest(d.tsv)) u
                     JOIN idf USING (lexeme)
                WHERE d.lexemes && ARRAY(SELECT lexeme FROM q) AND {where}
                GROUP BY d.id ORDER BY score DESC, d.id LIMIT :k)
            SELECT d.id, d.content, d.metadata, s.score
            FROM scores s JOIN {t} d USING (id) ORDER BY s.score DESC, d.id"""
        params |= {
            "config": self.text_search_config,
            "query": query,
            "k": k,
            "k1": self.k1,
            "b": self.b,
        }
        with self.engine.connect() as conn:
            rows = conn.execute(sa.text(sql), params).all()
        return [(Document(r.content, metadata=r.metadata, id=r.id), float(r.score)) for r in rows]

    def similarity_search(self, query: str, k: int = 4, **kwargs: Any) -> list[Document]:
        return [doc for doc, _ in self.similarity_search_with_score(query, k, **kwargs)]

    @classmethod
    def from_texts(
        cls,
        texts: list[str],
        embedding: Embeddings | None = None,
        metadatas: list[dict] | None = None,
        *,
        ids: list[str] | None = None,
        connection: str | sa.Engine | None = None,
        **kwargs: Any,
    ) -> PostgresLexicalStore:
        """A store on ``connection`` (required) holding ``texts``; ``embedding`` is unused."""
        if connection is None:
            raise ValueError("PostgresLexicalStore.from_texts needs connection=...")
        store = cls(connection, **kwargs)
        store.add_texts(texts, metadatas, ids=ids)
        return store


# --------------------------------------------------------------------------- byte store


class PostgresByteStore(BaseStore[str, bytes]):
    """A ``BaseStore[str, bytes]`` in one table ``(key text primary key, value bytea)``.

    Writes are upserts (``INSERT ... ON CONFLICT``), so concurrent writers of the same
    key never fail (``langchain_community.storage.SQLStore`` deletes, then inserts: two
    writers of one key collide on its primary key). ``yield_keys(prefix=...)`` filters in
    the database and reads keys only.
    """

    def __init__(
        self,
        connection: str | sa.Engine,
        *,
        table: str = "rse_records",
        create_table: bool = True,
        engine_args: dict[str, Any] | None = None,
    ) -> None:
        self.engine = _engine(connection, engine_args)
        self.table, self._t = table, _table(table)
        if create_table:
            _create(
                self.engine,
                table,
                [
                    f"CREATE TABLE IF NOT EXISTS {self._t}"
                    " (key text PRIMARY KEY, value bytea NOT NULL)"
                ],
            )

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        with self.engine.connect() as conn:
            rows = conn.execute(
                sa.text(f"SELECT key, value FROM {self._t} WHERE key = ANY(:k)"), {"k": list(keys)}
            ).all()
        found = {r.key: bytes(r.value) for r in rows}
        return [found.get(key) for key in keys]

    def mset(self, key_value_pairs: Sequence[tuple[str, bytes]]) -> None:
        values = dict(key_value_pairs)  # the last value of a repeated key wins
        if values:
            with self.engine.begin() as conn:  # sorted: concurrent writers lock rows in order
                conn.execute(
                    sa.text(
                        f"INSERT INTO {self._t} (key, value) VALUES (:k, :v) "
                        "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                    ),
                    [{"k": k, "v": values[k]} for k in sorted(values)],
                )

    def mdelete(self, keys: Sequence[str]) -> None:
        if keys:
            with self.engine.begin() as conn:
                conn.execute(
                    sa.text(f"DELETE FROM {self._t} WHERE key = ANY(:k)"), {"k": sorted(set(keys))}
                )

    def yield_keys(self, *, prefix: str | None = None) -> Iterator[str]:
        with self.engine.connect() as conn:
            keys = (
                conn.execute(
                    sa.text(f"SELECT key FROM {self._t} WHERE starts_with(key, :p) ORDER BY key"),
                    {"p": prefix or ""},
                )
                .scalars()
                .all()
            )
        yield from keys
