"""What is a valid document and a valid query: checked before anything is searched or written."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

from langchain_core.documents import Document

from langchain_rse.filters import parse
from langchain_rse.indexing.chunking import (
    PAGE_OFFSETS,
    check_page_offsets,
    doc_id_for,
    make_splitter,
)
from langchain_rse.pipeline import check_k, check_max_chars
from langchain_rse.segments import get_preset

__all__ = [
    "check_delete_ids",
    "check_expander",
    "check_filter",
    "check_settings",
    "looks_binary",
    "validate_documents",
]

_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")


def looks_binary(text: str) -> bool:
    """NUL characters, or over 10% control/replacement characters in the first 100k."""
    if "\x00" in text:
        return True
    head = text[:100_000]
    odd = len(_CONTROL.findall(head)) + head.count("\ufffd")
    return odd > 0.1 * max(len(head), 1)


_SURROGATE = (
    "contains a lone surrogate (e.g. from json.loads('\"\\ud800\"')), which is not valid "
    "UTF-8 and cannot be stored; replace it first (s.encode('utf-8', 'replace').decode())"
)


def _is_utf8(text: str) -> bool:
    """Whether ``text`` encodes to UTF-8 (no lone surrogates)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_problem(value: Any) -> str | None:
    """What keeps a JSON-serialisable value from being stored and filtered exactly: a lone
    surrogate in a string, or NaN / infinity (JSON has neither; they came back as ``null``)."""
    if isinstance(value, str):
        return None if _is_utf8(value) else _SURROGATE
    if isinstance(value, float) and not math.isfinite(value):
        return (
            f"contains {value!r}: NaN and infinity are not JSON numbers, so they could be "
            "neither stored nor filtered on (use None or a finite number)"
        )
    if isinstance(value, dict):
        items = [*value.keys(), *value.values()]
    elif isinstance(value, (list, tuple)):
        items = list(value)
    else:
        return None
    return next((p for p in map(_json_problem, items) if p), None)


def validate_documents(
    documents: Sequence[Document], ids: Sequence[str] | None, max_document_chars: int
) -> list[str]:
    """The doc id of each document; raises before anything is written if one is invalid
    (not a ``Document``, binary, too long, metadata that is not JSON, a lone surrogate in
    the id, text or metadata, NaN or infinity in metadata, duplicate ids)."""
    if isinstance(documents, (str, Document)):
        raise TypeError("add_documents expects a list of Documents")
    if ids is not None and len(ids) != len(documents):
        raise ValueError(f"got {len(ids)} ids for {len(documents)} documents")
    doc_ids: list[str] = []
    for n, doc in enumerate(documents):
        if not isinstance(doc, Document):
            raise TypeError(f"documents[{n}] is {type(doc).__name__}, not a Document")
        if not isinstance(doc.page_content, str):
            raise TypeError(f"documents[{n}].page_content is not a string")
        doc_id = str(ids[n]) if ids is not None else doc_id_for(doc)
        if len(doc.page_content) > max_document_chars:
            raise ValueError(
                f"document {doc_id!r} has {len(doc.page_content):,} characters; the limit "
                f"is max_document_chars={max_document_chars:,} (split it, or raise the limit)"
            )
        if looks_binary(doc.page_content):
            raise ValueError(
                f"document {doc_id!r} looks like binary data decoded as text (NUL or "
                "many control characters); extract its text first"
            )
        if not _is_utf8(doc_id):
            raise ValueError(f"document id {doc_id!r} {_SURROGATE}")
        if not _is_utf8(doc.page_content):
            raise ValueError(f"the text of document {doc_id!r} {_SURROGATE}")
        for key, value in doc.metadata.items():
            try:
                json.dumps(value)
            except (TypeError, ValueError) as exc:
                raise TypeError(
                    f"metadata[{key!r}] of document {doc_id!r} is not JSON-serialisable "
                    f"({type(value).__name__}); convert it to a string or number first"
                ) from exc
            problem = _json_problem(key) or _json_problem(value)
            if problem:
                raise ValueError(f"metadata[{key!r}] of document {doc_id!r} {problem}")
        if PAGE_OFFSETS in doc.metadata:
            check_page_offsets(doc.metadata[PAGE_OFFSETS], len(doc.page_content), doc_id)
        doc_ids.append(doc_id)
    if len(set(doc_ids)) != len(doc_ids):
        dup = next(d for d in doc_ids if doc_ids.count(d) > 1)
        raise ValueError(f"duplicate document id {dup!r} in one add_documents call")
    return doc_ids


_POSITIVE = ("fetch_k", "max_document_chars")


def check_settings(r: Any) -> None:
    """Raise ``ValueError`` for a retriever configuration that could not run (checked at
    construction and on every assignment, so a bad setting fails where it is made)."""
    check_k(r.k)
    check_max_chars(r.max_chars)
    for name in _POSITIVE:
        if getattr(r, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(r, name)}")
    if r.splitter is None:
        make_splitter(r.chunk_size, r.chunk_overlap)  # validates size/overlap
    w = r.weights
    if len(w) != 2 or min(w) < 0 or max(w) <= 0:
        raise ValueError(f"weights must be two non-negative numbers, not both 0, got {w}")
    if r.rse_params is None and r.preset is not None:
        get_preset(r.preset)


def check_filter(value: Any) -> Any:
    """A metadata filter must parse (see :mod:`langchain_rse.filters`)."""
    if value is not None:
        parse(value)
    return value


def check_expander(value: Any) -> Any:
    """A query expander needs ``expand`` and ``aexpand``."""
    if value is not None and not (hasattr(value, "expand") and hasattr(value, "aexpand")):
        raise TypeError(
            "query_expander must be a QueryExpander (with expand and aexpand), got "
            + type(value).__name__
        )
    return value


def check_delete_ids(ids: Any) -> list[str]:
    """The document ids of a ``delete`` call: a list, never None (everything) or a string."""
    if ids is None:
        raise ValueError(
            "delete needs a list of document ids (deleting everything is not "
            "supported; create a new retriever instead)"
        )
    if isinstance(ids, str):
        raise TypeError("delete expects a list of document ids, not a string")
    return list(ids)
