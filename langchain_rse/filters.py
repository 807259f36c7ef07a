"""One metadata-filter language, checked, evaluated, and translated for each store.

The language is the subset LangChain's vector stores share::

    {"tenant": "acme"}                                   # equality
    {"tenant": {"$eq": "acme"}}    {"tier": {"$ne": "free"}}
    {"tenant": {"$in": ["acme", "globex"]}}    {"tenant": {"$nin": [...]}}
    {"year": {"$gte": 2020, "$lt": 2025}}                # $gt, $gte, $lt, $lte on numbers
    {"$and": [f1, f2]}    {"$or": [f1, f2]}              # several keys: an implicit $and

Values are strings, finite numbers (no NaN or infinity) or booleans. :func:`parse` checks a
filter and returns it as a small tree; :func:`matches` evaluates it on a document's metadata
(the check every candidate passes before it can be reranked, valued or returned);
:func:`search_kwargs` translates it into the keyword arguments of one store's search. A
store the retriever cannot translate for raises :class:`FilterError`; a filter is never
dropped.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

__all__ = [
    "check_filter",
    "filter_sql",
    "to_postgres_sql",
    "Filter",
    "FilterError",
    "doc_ids",
    "matches",
    "parse",
    "search_kwargs",
    "to_chroma",
    "to_dict",
    "to_pgvector",
]

_SCALAR = (str, int, float, bool)
Scalar = str | int | float | bool
"""A filter's value (a number is finite)."""
T = TypeVar("T")
_ORDER = ("$gt", "$gte", "$lt", "$lte")
_OPS = ("$eq", "$ne", "$in", "$nin", *_ORDER)


class FilterError(ValueError):
    """A filter outside the language, or one a store cannot be given."""


@dataclass(frozen=True)
class Cmp:
    key: str
    op: str
    value: Any


@dataclass(frozen=True)
class Bool:
    op: str  # "$and" | "$or"
    items: tuple[Filter, ...]


Filter = Cmp | Bool


def _scalar(value: object, where: str) -> Scalar:
    if not isinstance(value, _SCALAR):
        raise FilterError(f"{where}: values must be strings, numbers or booleans, got {value!r}")
    _finite(value, where)
    return value


def _finite(value: object, where: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise FilterError(
            f"{where}: {value!r} is not a JSON number (NaN and infinity cannot be stored as "
            "metadata, so no document has them); use a finite number"
        )


def _condition(key: str, cond: object) -> list[Filter]:
    if not isinstance(cond, Mapping):
        return [Cmp(key, "$eq", _scalar(cond, key))]
    if not cond:
        raise FilterError(f"{key}: an empty condition")
    out: list[Filter] = []
    for op, value in cond.items():
        if op not in _OPS:
            raise FilterError(f"{key}: unknown operator {op!r} (use one of {', '.join(_OPS)})")
        if op in ("$in", "$nin"):
            if not isinstance(value, (list, tuple)) or not value:
                raise FilterError(f"{key}: {op} needs a non-empty list")
            value = tuple(_scalar(v, key) for v in value)
        elif op in _ORDER:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise FilterError(f"{key}: {op} compares numbers, got {value!r}")
            _finite(value, key)
        else:
            value = _scalar(value, key)
        out.append(Cmp(key, op, value))
    return out


def parse(spec: object) -> Filter:
    """Check ``spec`` against the language and return its tree (``FilterError`` if not)."""
    if not isinstance(spec, Mapping) or not spec:
        raise FilterError(f"a filter is a non-empty dict, got {spec!r}")
    items: list[Filter] = []
    for key, cond in spec.items():
        if key in ("$and", "$or"):
            if not isinstance(cond, (list, tuple)) or not cond:
                raise FilterError(f"{key} needs a non-empty list of filters")
            items.append(Bool(key, tuple(parse(c) for c in cond)))
        elif not isinstance(key, str) or key.startswith("$"):
            raise FilterError(f"unknown operator {key!r} (use $and or $or, or a metadata key)")
        else:
            items += _condition(key, cond)
    return items[0] if len(items) == 1 else Bool("$and", tuple(items))


def check_filter(value: T) -> T:
    """``value`` unchanged when it is ``None`` or a filter that parses (else ``ValueError``)."""
    if value is not None:
        parse(value)
    return value


def both(a: Filter | None, b: Filter | None) -> Filter | None:
    """The conjunction of two optional filters (a bound retriever's and a call's)."""
    if a is None or b is None:
        return a or b
    return Bool("$and", (a, b))


def doc_ids(f: Filter | None) -> set[str] | None:
    """The doc ids outside which ``f`` keeps nothing: those of ``{"doc_id": ...}`` (an
    ``$eq`` or ``$in`` of strings), or of the ones an ``$and`` holds (their intersection);
    None when ``f`` does not bound them. A store can read those documents' entries from its
    own index, then check the whole filter on them."""
    if isinstance(f, Cmp) and f.key == "doc_id":
        if f.op == "$eq" and isinstance(f.value, str):
            return {f.value}
        if f.op == "$in" and all(isinstance(v, str) for v in f.value):
            return set(f.value)
    if isinstance(f, Bool) and f.op == "$and":
        bounds = [found for item in f.items if (found := doc_ids(item)) is not None]
        return set.intersection(*bounds) if bounds else None
    return None


# ---------------------------------------------------------------- evaluation


def _number(x: object) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _equal(a: object, b: object) -> bool:
    return bool(a == b) and isinstance(a, bool) == isinstance(b, bool)  # True is not 1


def _cmp(c: Cmp, metadata: Mapping[str, Any]) -> bool:
    if c.key not in metadata:
        return c.op in ("$ne", "$nin")
    v = metadata[c.key]
    if c.op in ("$eq", "$ne"):
        return _equal(v, c.value) == (c.op == "$eq")
    if c.op in ("$in", "$nin"):
        return any(_equal(v, x) for x in c.value) == (c.op == "$in")
    if not _number(v):
        return False
    return {"$gt": v > c.value, "$gte": v >= c.value, "$lt": v < c.value, "$lte": v <= c.value}[
        c.op
    ]


def matches(f: Filter | None, metadata: Mapping[str, Any]) -> bool:
    """Whether a document's metadata passes the filter (``None`` passes everything)."""
    if f is None:
        return True
    if isinstance(f, Cmp):
        return _cmp(f, metadata)
    results = (matches(item, metadata) for item in f.items)
    return all(results) if f.op == "$and" else any(results)


# ---------------------------------------------------------------- translation


def to_dict(f: Filter) -> dict[str, Any]:
    """The filter in the explicit operator form (``{"k": {"$eq": v}}``, ``$and``/``$or``),
    which Chroma, PGVector and most LangChain stores accept."""
    if isinstance(f, Cmp):
        value = list(f.value) if isinstance(f.value, tuple) else f.value
        return {f.key: {f.op: value}}
    return {f.op: [to_dict(item) for item in f.items]}


def to_chroma(f: Filter) -> dict[str, Any]:
    """The operator form for Chroma, with :func:`matches`' semantics.

    Chroma takes ``$in``/``$nin`` lists of one type only and ``$and``/``$or`` of two or
    more filters, so a mixed list is split by type (``{"v": {"$in": [1, 1.5]}}`` becomes
    an ``$or`` of ``$in [1]`` and ``$in [1.5]``; ``$nin``: an ``$and`` of ``$nin``) and a
    one-item ``$and``/``$or`` is its item. Chroma compares ``1 == 1.0``, keeps ``True``
    apart from ``1``, and passes a missing key on ``$ne``/``$nin``, as ``matches`` does.
    """
    if isinstance(f, Bool):
        items = [to_chroma(item) for item in f.items]
        return items[0] if len(items) == 1 else {f.op: items}
    if f.op not in ("$in", "$nin"):
        return {f.key: {f.op: f.value}}
    by_type: dict[type, list[Any]] = {}
    for value in f.value:
        by_type.setdefault(type(value), []).append(value)
    each = [{f.key: {f.op: values}} for values in by_type.values()]
    return each[0] if len(each) == 1 else {"$or" if f.op == "$in" else "$and": each}


def to_milvus_expr(f: Filter) -> str:
    """A Milvus boolean expression (metadata as dynamic fields)."""
    if isinstance(f, Bool):
        joiner = " and " if f.op == "$and" else " or "
        return "(" + joiner.join(to_milvus_expr(item) for item in f.items) + ")"
    field = f.key if f.key.isidentifier() else f"$meta[{json.dumps(f.key)}]"  # key escaped
    value = json.dumps(list(f.value) if isinstance(f.value, tuple) else f.value)
    op = {
        "$eq": "==",
        "$ne": "!=",
        "$in": "in",
        "$nin": "not in",
        "$gt": ">",
        "$gte": ">=",
        "$lt": "<",
        "$lte": "<=",
    }[f.op]
    if f.op in ("$ne", "$nin"):  # a missing key passes, as in `matches` (Milvus: null)
        return f"({field} {op} {value} or {field} is null)"
    return f"({field} {op} {value})"


_SQL_ORDER = {"$gt": ">", "$gte": ">=", "$lt": "<", "$lte": "<="}


def filter_sql(spec: Mapping[str, Any], column: str = "metadata") -> tuple[str, dict[str, Any]]:
    """A metadata filter (the language of :func:`parse`, ``FilterError`` outside it) as a
    Postgres SQL condition on a ``jsonb`` column, with bound parameters: keys and values
    are parameters, never SQL text. Values compare as JSON (``1 == 1.0``, ``True != 1``,
    ``"1" != 1``); a missing key passes ``$ne``/``$nin`` and fails the rest; ``$gt``...
    compare numbers only — :func:`matches`' semantics."""
    return to_postgres_sql(parse(spec), column)


def to_postgres_sql(f: Filter, column: str = "metadata") -> tuple[str, dict[str, Any]]:
    """:func:`filter_sql` of a parsed filter."""
    params: dict[str, Any] = {}

    def bind(value: object) -> str:
        name = f"f{len(params)}"
        params[name] = value
        return f":{name}"

    def clause(f: Filter) -> str:
        if isinstance(f, Bool):
            return "(" + f" {f.op[1:].upper()} ".join(clause(item) for item in f.items) + ")"
        field = f"({column} -> {bind(f.key)})"
        if f.op in ("$eq", "$ne"):
            same = f"CAST({bind(json.dumps(f.value))} AS jsonb)"
            return f"({field} = {same})" if f.op == "$eq" else f"({field} IS DISTINCT FROM {same})"
        if f.op in ("$in", "$nin"):
            values = bind([json.dumps(v) for v in f.value])
            anyof = f"coalesce({field} = ANY(CAST({values} AS jsonb[])), false)"
            return f"({anyof})" if f.op == "$in" else f"(NOT {anyof})"
        return (
            f"(CASE WHEN jsonb_typeof({field}) = 'number' THEN CAST({field} AS numeric) "
            f"{_SQL_ORDER[f.op]} CAST({bind(f.value)} AS numeric) ELSE false END)"
        )

    return clause(f), params


def to_pgvector(f: Filter) -> dict[str, Any]:
    """The operator form for ``langchain_postgres.PGVector``, with ``matches``' semantics.

    PGVector compares ``$eq``/``$ne``/``$gt``... as JSON (``jsonb_path_match``: ``1 ==
    1.0``, ``true != 1``) but ``$in``/``$nin`` as text (``"1"`` would match ``1``), and a
    row without the key fails ``$ne``/``$nin``. So ``$in`` becomes an ``$or`` of ``$eq``,
    and ``$ne``/``$nin`` also pass a row where the key is missing (``$exists: false``).

    One difference remains: ``jsonb_path_match`` compares values of two JSON types (the
    number ``1`` with ``true``, or with ``"1"``) as unknown, so ``$ne``/``$nin`` do not
    return a row whose value has another type than the filter's. That only costs results
    (every candidate is checked again with :func:`matches`); it never lets one through.
    PGVector takes identifier keys only; any other key raises :class:`FilterError`.
    """
    if isinstance(f, Bool):
        return {f.op: [to_pgvector(item) for item in f.items]}
    if not f.key.isidentifier():
        raise FilterError(f"PGVector filters take identifier keys only, got {f.key!r}")
    values = f.value if isinstance(f.value, tuple) else (f.value,)
    if f.op in ("$in", "$nin"):
        op = "$eq" if f.op == "$in" else "$ne"
        each = [{f.key: {op: v}} for v in values]
        same = each[0] if len(each) == 1 else {"$or" if f.op == "$in" else "$and": each}
        if f.op == "$in":
            return same
    elif f.op == "$ne":
        same = {f.key: {"$ne": f.value}}
    else:
        return {f.key: {f.op: f.value}}
    return {"$or": [same, {f.key: {"$exists": False}}]}  # a missing key passes


Translator = Callable[[Filter], dict[str, Any]]


def _callable_on_document(f: Filter) -> dict[str, Any]:
    return {"filter": lambda doc: matches(f, doc.metadata)}


def _callable_on_metadata(f: Filter) -> dict[str, Any]:
    return {"filter": lambda metadata: matches(f, metadata)}


_TRANSLATORS: dict[str, Translator] = {
    "InMemoryVectorStore": _callable_on_document,
    "FAISS": _callable_on_metadata,
    "FaissStore": lambda f: {"filter": f},
    "Chroma": lambda f: {"filter": to_chroma(f)},
    "PGVector": lambda f: {"filter": to_pgvector(f)},
    "PGVectorStore": lambda f: {"filter": to_dict(f)},
    "PostgresLexicalStore": lambda f: {"filter": to_dict(f)},
    "Milvus": lambda f: {"expr": to_milvus_expr(f)},
    "MilvusLexicalStore": lambda f: {"expr": to_milvus_expr(f)},
}


def search_kwargs(
    store: object, f: Filter | None, custom: Translator | None = None
) -> dict[str, Any]:
    """The keyword arguments that push ``f`` down into ``store``'s search."""
    if f is None:
        return {}
    if custom is not None:
        return custom(f)
    for cls in type(store).__mro__:
        translate = _TRANSLATORS.get(cls.__name__)
        if translate is not None:
            return translate(f)
    raise FilterError(
        f"the retriever cannot translate a metadata filter for {type(store).__name__}; "
        "pass filter_translator=... (a function from the filter to that store's search "
        "keyword arguments; langchain_rse.filters.to_dict gives the $-operator dict form)"
    )
