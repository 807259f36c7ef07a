"""Tampered record contents in a saved index (the JSON inside the record store lines, the BM25
chunk keys), with the file's checksum and size kept consistent: ``load``, and a query
after it, raise ``IndexFormatError`` or work — never another exception."""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document

from helpers import HashingEmbeddings, make_contract
from langchain_rse import RSERetriever
from langchain_rse.persistence import MANIFEST, IndexFormatError

Json = Any
KINDS = ("doc", "body", "ver")


@dataclass(frozen=True)
class Mutation:
    """An edit of one record: the ``line``-th record of ``kind`` (``"lexical"``: the BM25
    header), the value reached by ``path`` (a key, or an index into the keys or items),
    and ``op`` applied there: ``replace`` it with ``value``, ``delete`` it, or ``insert``
    ``value`` beside it."""

    kind: str
    line: int
    path: tuple[str | int, ...]
    op: str
    value: Json = None


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=6),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=5,
)
mutations = st.builds(
    Mutation,
    kind=st.sampled_from((*KINDS, "lexical")),
    line=st.integers(0, 20),
    path=st.lists(
        st.integers(0, 40) | st.sampled_from(["spans", "contexts", "text", "keys", "format"]),
        max_size=4,
    ).map(tuple),
    op=st.sampled_from(("replace", "delete", "insert")),
    value=json_values,
)


def _child(node: Json, step: str | int) -> Any:
    """The key (dict) or index (list) ``step`` names in ``node``."""
    if isinstance(node, dict):
        if isinstance(step, str) and step in node:
            return step
        keys = sorted(node)
        return keys[step % len(keys)] if isinstance(step, int) and keys else None
    if isinstance(node, list) and node:
        return step % len(node) if isinstance(step, int) else None
    return None


def _apply(node: Json, m: Mutation) -> Json:
    """``node`` edited by ``m`` (at the top level a replace swaps the whole record)."""
    parent, at = None, None
    for step in m.path:
        key = _child(node if parent is None else parent[at], step)
        if key is None:
            break
        parent, at = (node, key) if parent is None else (parent[at], key)
    if parent is None:
        return m.value if m.op == "replace" else node
    if m.op == "replace":
        parent[at] = m.value
    elif m.op == "delete":
        del parent[at]
    elif isinstance(parent, list):
        parent.insert(at, m.value)
    else:
        parent[f"{at}_"] = m.value
    return node


def _rewrite(directory: Path, role: str, data: bytes) -> None:
    manifest = json.loads((directory / MANIFEST).read_text())
    (directory / manifest["files"][role]["name"]).write_bytes(data)
    manifest["files"][role]["sha256"] = hashlib.sha256(data).hexdigest()
    manifest["files"][role]["size"] = len(data)
    (directory / MANIFEST).write_text(json.dumps(manifest))


def _tamper(directory: Path, m: Mutation) -> None:
    manifest = json.loads((directory / MANIFEST).read_text())
    if m.kind == "lexical":
        path = directory / manifest["files"]["lexical"]["name"]
        _rewrite(
            directory, "lexical", json.dumps(_apply(json.loads(path.read_bytes()), m)).encode()
        )
        return
    path = directory / manifest["files"]["record_store"]["name"]
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    of_kind = [i for i, (key, _) in enumerate(lines) if key.startswith(m.kind + "/")]
    i = of_kind[m.line % len(of_kind)]
    key, record = lines[i]
    lines[i] = [key, json.dumps(_apply(json.loads(record), m))]
    _rewrite(directory, "record_store", "\n".join(json.dumps(x) for x in lines).encode())


@pytest.fixture(scope="module")
def saved(tmp_path_factory: pytest.TempPathFactory) -> Path:
    docs = [
        Document(make_contract("alpha", ["termination", "payment terms"]), id="alpha"),
        Document("Fees:\n\n  due in   thirty days. é ✓\n\nFees: due in thirty days.", id="fees"),
    ]
    directory = tmp_path_factory.mktemp("tamper") / "idx"
    RSERetriever.from_documents(docs, embedding=HashingEmbeddings(), show_progress=False).save(
        directory
    )
    return directory


def _load_and_query(directory: Path) -> None:
    """Load and query; ``IndexFormatError`` is an allowed outcome, anything else fails."""
    try:
        r = RSERetriever.load(directory, embedding=HashingEmbeddings())
        for mode in ("segments", "chunks"):
            for doc in r.invoke("termination fees", mode=mode, k=3):
                source = r.get([doc.metadata["doc_id"]])[0].page_content
                m = doc.metadata
                assert doc.page_content == source[m["start_index"] : m["end_index"]]
    except IndexFormatError:
        pass


NAMED = [  # the reproductions of issue 54, finding 16
    Mutation("doc", 0, ("spans",), "replace", None),
    Mutation("body", 0, ("contexts",), "replace", 5),
    Mutation("body", 0, ("text",), "delete"),
    Mutation("lexical", 0, ("keys", 0), "replace", "bogus"),
]


@pytest.mark.parametrize("m", NAMED, ids=lambda m: f"{m.kind}:{'.'.join(map(str, m.path))}")
def test_the_reported_tamperings_are_index_format_errors(
    saved: Path, tmp_path: Path, m: Mutation
) -> None:
    work = tmp_path / "idx"
    shutil.copytree(saved, work)
    _tamper(work, m)
    with pytest.raises(IndexFormatError):
        RSERetriever.load(work, embedding=HashingEmbeddings())


@settings(max_examples=200)
@given(m=mutations)
@example(m=Mutation("doc", 0, ("spans", 0), "replace", -5))
@example(m=Mutation("doc", 0, ("spans",), "replace", [0, 10**6]))
@example(m=Mutation("doc", 0, ("spans",), "replace", [[0, 1.5]]))
@example(m=Mutation("doc", 0, ("doc_id",), "replace", "other"))
@example(m=Mutation("body", 0, ("contexts", 0), "delete"))
@example(m=Mutation("ver", 0, ("chunks",), "replace", -1))
@example(m=Mutation("lexical", 0, ("keys", 0), "replace", "a\x1fb\x1f-1"))
def test_tampered_records_load_or_raise_index_format_error(saved: Path, m: Mutation) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp) / "idx"
        shutil.copytree(saved, work)
        _tamper(work, m)
        _load_and_query(work)
