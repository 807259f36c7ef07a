"""Index directories under shared use and hostile input (issue 46 items 3, 7, 15; issue 47
item 9): concurrent saves, endpoints in a tampered manifest, schema validation of every
file, and file permissions that follow the umask."""

from __future__ import annotations

import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain_core.vectorstores import InMemoryVectorStore

from conftest import corpus_documents
from fake_cohere_server import running_server
from helpers import HashingEmbeddings
from langchain_rse import RSERetriever
from langchain_rse.persistence import MANIFEST, IndexFormatError

LOCK_FILE = ".rse_index.lock"  # persistence.LOCK_FILE (not imported: the test runs on older code)


TESTS = Path(__file__).resolve().parents[1] / "support"
ROOT = TESTS.parents[1]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}


# ---------------------------------------------------------------- 47.9: file permissions


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600), (0o002, 0o664)])
def test_index_files_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    r = RSERetriever.from_documents(corpus_documents(), embedding=HashingEmbeddings())
    old = os.umask(umask)
    try:
        r.save(tmp_path / "idx")
        r.save(tmp_path / "idx")  # a second save replaces every file
    finally:
        os.umask(old)
    files = [p for p in (tmp_path / "idx").iterdir() if p.is_file()]
    assert len(files) >= 5
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: mode for p in files}


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o077, 0o600)])
def test_cli_index_and_html_page_follow_the_umask(tmp_path: Path, umask: int, mode: int) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for doc in corpus_documents():
        (folder / doc.metadata["source"]).write_text(doc.page_content, encoding="utf-8")
    # The child sets its own umask before running the command: no preexec_fn, which forks
    # a copy of this process that runs Python while other tests' threads may hold locks.
    start = (
        f"import os, runpy, sys; os.umask({umask}); sys.argv[0] = 'langchain-rse'; "
        "runpy.run_module('langchain_rse.cli', run_name='__main__')"
    )
    cli = [sys.executable, "-c", start]
    run = {"env": _env(), "check": True, "capture_output": True, "timeout": 300}
    subprocess.run(
        [*cli, "index", str(folder), "--index", str(tmp_path / "idx"), "--no-progress"], **run
    )
    page = tmp_path / "why.html"
    subprocess.run(
        [*cli, "query", str(tmp_path / "idx"), "termination", "--html", str(page)], **run
    )
    written = [p for p in (tmp_path / "idx").rglob("*") if p.is_file()] + [page]
    modes = {str(p.relative_to(tmp_path)): stat.S_IMODE(p.stat().st_mode) for p in written}
    assert modes == {name: mode for name in modes}, modes


# ---------------------------------------------------------------- 3: concurrent saves

SAVER = """
import sys
from helpers import HashingEmbeddings, make_contract
from langchain_core.documents import Document
from langchain_rse import RSERetriever
worker, target, rounds = int(sys.argv[1]), sys.argv[2], int(sys.argv[3])
docs = [Document(make_contract(f"w{worker}d{i}", ["payment", "termination"], 6 + worker),
                 id=f"w{worker}-{i}") for i in range(4 + worker)]
from langchain_rse.indexing import steps
steps.INDEX_BATCH_SIZE = 8
r = RSERetriever.from_documents(docs, embedding=HashingEmbeddings())
print("ready", flush=True)
sys.stdin.readline()  # all workers start saving together
for n in range(rounds):
    r.add_documents([Document(make_contract(f"w{worker}x{n}", ["escrow"], 3), id=f"w{worker}x{n}")])
    r.save(target)
"""


def _concurrent_saves(target: Path, workers: int, rounds: int) -> list[str]:
    """``workers`` processes save to ``target`` ``rounds`` times each, all at once; meanwhile
    this process loads the index again and again. The errors of those loads."""
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", SAVER, str(w), str(target), str(rounds)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env=_env(),
        )
        for w in range(workers)
    ]
    for proc in procs:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    for proc in procs:
        assert proc.stdin is not None
        proc.stdin.write("go\n")
        proc.stdin.flush()
    errors: list[str] = []
    while any(proc.poll() is None for proc in procs):
        if (target / MANIFEST).exists():
            try:
                RSERetriever.load(target, embedding=HashingEmbeddings())
            except Exception as exc:  # noqa: BLE001 - every failure is reported
                errors.append(f"{type(exc).__name__}: {exc}")
        time.sleep(0.01)
    for proc in procs:
        _, err = proc.communicate(timeout=300)
        assert proc.returncode == 0, err
    return errors


@pytest.mark.parametrize("start", ["valid index", "empty"])
def test_concurrent_saves_to_one_directory_keep_it_loadable(tmp_path: Path, start: str) -> None:
    target = tmp_path / "idx"
    if start == "valid index":
        RSERetriever.from_documents(corpus_documents(), embedding=HashingEmbeddings()).save(target)
    for trial in range(2):
        errors = _concurrent_saves(target, workers=3, rounds=6)
        assert errors == [], errors
        loaded = RSERetriever.load(target, embedding=HashingEmbeddings())
        assert loaded.invoke("termination", k=1), trial
        # one generation: the last save's, complete (no stray data or temporary files)
        manifest = json.loads((target / MANIFEST).read_text())
        data_files = {p.name for p in target.iterdir() if p.name != LOCK_FILE}
        assert data_files == {MANIFEST} | {f["name"] for f in manifest["files"].values()}


# ---------------------------------------------------------------- 7: endpoints in the index

COHERE_KEY = "co-secret-key-7f3a"


def _set_reranker_url(index: Path, url: str) -> None:
    """What an attacker with write access to the index does: point the saved reranker at
    their host (the manifest is JSON, and the checksums cover the data files only)."""
    manifest = json.loads((index / MANIFEST).read_text())
    manifest["components"]["reranker"] = {
        "class": "CohereReranker",
        "module": "langchain_rse.rerank.cohere",
        "settings": {"model": "rerank-v3.5", "base_url": url, "timeout": 5.0},
        "objects": {},
    }
    (index / MANIFEST).write_text(json.dumps(manifest))


def test_a_tampered_reranker_url_gets_no_key_through_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setenv("COHERE_API_KEY", COHERE_KEY)
    monkeypatch.delenv("CO_API_URL", raising=False)
    RSERetriever.from_documents(corpus_documents(), embedding=HashingEmbeddings()).save(
        tmp_path / "idx"
    )
    with running_server() as evil:
        _set_reranker_url(tmp_path / "idx", evil.url)
        with caplog.at_level("WARNING", logger="langchain_rse"):
            loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings())
        loaded.invoke("termination provisions")
        assert evil.requests == []
    assert loaded.reranker is None
    assert "reranker=CohereReranker" in caplog.text  # named: pass it again to rerank
    with pytest.raises(ValueError, match="reranker=CohereReranker"):
        RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), strict=True)


def test_a_saved_reranker_keeps_working_at_the_callers_endpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The endpoint comes from the caller (``CO_API_URL`` here), never from the index."""
    from langchain_rse.rerank import CohereReranker

    monkeypatch.setenv("COHERE_API_KEY", COHERE_KEY)
    with running_server() as server:
        monkeypatch.setenv("CO_API_URL", server.url)
        r = RSERetriever.from_documents(
            corpus_documents(), embedding=HashingEmbeddings(), reranker=CohereReranker()
        )
        r.save(tmp_path / "idx")
        loaded = RSERetriever.load(tmp_path / "idx", embedding=HashingEmbeddings(), strict=True)
        assert isinstance(loaded.reranker, CohereReranker)
        loaded.invoke("termination provisions")
        assert server.requests  # the caller's endpoint, with the key from the environment
        assert server.requests[-1].headers["authorization"] == f"Bearer {COHERE_KEY}"


def test_a_tampered_reranker_url_gets_no_key_through_the_cli_query(tmp_path: Path) -> None:
    folder = tmp_path / "docs"
    folder.mkdir()
    for doc in corpus_documents():
        (folder / doc.metadata["source"]).write_text(doc.page_content, encoding="utf-8")
    cli = [sys.executable, "-m", "langchain_rse.cli"]
    env = {**_env(), "COHERE_API_KEY": COHERE_KEY}
    env.pop("CO_API_URL", None)
    index = [*cli, "index", str(folder), "--index", str(tmp_path / "idx"), "--no-progress"]
    subprocess.run(index, env=env, check=True, capture_output=True, timeout=300)
    with running_server() as evil:
        _set_reranker_url(tmp_path / "idx", evil.url)
        for extra in ([], ["--explain"]):
            done = subprocess.run(
                [*cli, "query", str(tmp_path / "idx"), "termination", *extra],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
            )
            assert done.returncode == 0, done.stderr
        assert evil.requests == []


# ---------------------------------------------------------------- 15: tampered indexes

Path_ = tuple[Any, ...]
OPTIONAL = {  # keys older saves lack (see persistence.schema): deleting them leaves a valid index
    ("library_version",),
    ("stats",),
    ("components",),
    ("lexical",),
    ("config", "lexical_stemmer"),
    ("config", "max_document_chars"),
    ("config", "max_chars"),
}
NULLABLE = {  # keys where null is a valid setting
    ("config", "lexical_stemmer"),
    ("embedding", "class"),
    ("components", "router"),
}
VALID_ALSO = {  # values of another type that are still valid there
    ("components", "reranker"),
    ("components", "query_expander"),
    ("config", "rse_params"),
    ("embedding", "model"),
}


def _leaves(value: Any, at: Path_ = ()) -> Iterator[tuple[Path_, Any]]:
    yield at, value
    if isinstance(value, dict):
        for key, item in value.items():
            yield from _leaves(item, (*at, key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _leaves(item, (*at, i))


def _other_type(value: Any) -> list[Any]:
    """Values of other JSON types than ``value``'s (strings of numbers included)."""
    candidates = ["7", 7, 7.5, True, None, [7], {"x": 7}]
    same = {
        bool: (bool,),
        int: (int,),
        float: (float, int),
        str: (str,),
        list: (list,),
        dict: (dict,),
        type(None): (type(None),),
    }[type(value)]
    return [
        c
        for c in candidates
        if not isinstance(c, same) or (isinstance(c, bool) and type(value) is not bool)
    ]


def _edit(doc: Any, at: Path_, change: Callable[[Any, Any], None]) -> Any:
    doc = json.loads(json.dumps(doc))
    parent = doc
    for part in at[:-1]:
        parent = parent[part]
    change(parent, at[-1])
    return doc


def _manifest_mutations(manifest: dict[str, Any]) -> Iterator[tuple[str, Any]]:
    for at, value in _leaves(manifest):
        if (
            not at
            or at[:2] in {("components", "enricher"), ("components", "router")}
            and len(at) > 3
        ):  # component settings: the component's own class checks them (below)
            continue
        if isinstance(at[-1], str) and at not in OPTIONAL and at[-1] != "objects":
            yield f"delete {at}", _edit(manifest, at, lambda p, k: p.pop(k))
        if at[:2] not in VALID_ALSO and at not in VALID_ALSO:
            for other in _other_type(value):
                if at in NULLABLE and other is None:
                    continue  # e.g. lexical_stemmer=None: no stemming, a valid setting
                yield (
                    f"{at} = {other!r}",
                    _edit(manifest, at, lambda p, k, o=other: p.__setitem__(k, o)),
                )  # noqa: E501
        if isinstance(value, dict):
            yield (
                f"extra key in {at}",
                _edit(manifest, at, lambda p, k: p[k].__setitem__("unexpected", 1)),
            )
    bad_values = {
        ("config", "k"): [-1],
        ("config", "mode"): ["everything"],
        ("config", "chunk_size"): [0],
        ("config", "chunk_overlap"): [10_000, -1],
        ("config", "weights"): [[0, 0], [1, 2, 3]],
        ("config", "preset"): ["no-such-preset"],
        ("config", "lexical_stemmer"): ["klingon"],
        ("config", "rse_params"): [{"max_segment_chunks": 0}, {"bogus": 1}],
        ("format_version",): [99, 0],
        ("generation",): ["ZZZ", ""],
        ("vectorstore", "kind"): ["s3"],
        ("record_store", "kind"): ["cloud"],
        ("stats", "chunks"): [-1],
        ("files", "lexical", "sha256"): ["abc"],
        ("files", "lexical", "size"): [-1, "12", 1],
        ("files", "lexical", "name"): ["../lexical.json"],
        ("components", "enricher", "settings", "max_depth"): ["4", 4.5],
        ("components", "enricher", "settings", "unexpected"): [1],
        ("components", "router", "settings", "documents"): ["1", None],
    }
    for at, values in bad_values.items():
        for bad in values:
            yield f"{at} = {bad!r}", _edit(manifest, at, lambda p, k, b=bad: p.__setitem__(k, b))
    roles = list(manifest["files"])
    for a in roles:  # swapped files: one role names another's file (and checksum)
        for b in roles:
            if a != b:
                yield (
                    f"{a} names {b}'s file",
                    _edit(manifest, ("files", a), lambda p, k, b=b: p.__setitem__(k, p[b])),
                )
    for role in roles:
        yield f"no {role} file", _edit(manifest, ("files", role), lambda p, k: p.pop(k))


@pytest.fixture(scope="module", params=["faiss", "in_memory"])
def saved_index(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    vs = None if request.param == "faiss" else InMemoryVectorStore(HashingEmbeddings())
    directory = tmp_path_factory.mktemp(request.param) / "idx"
    RSERetriever.from_documents(
        corpus_documents(), embedding=HashingEmbeddings(), vectorstore=vs
    ).save(directory)
    return directory


def _load_must_refuse(directory: Path, what: str, names: set[str]) -> None:
    try:
        RSERetriever.load(directory, embedding=HashingEmbeddings())
    except IndexFormatError as exc:
        assert any(name in str(exc) for name in names), (what, str(exc))
    except Exception as exc:  # noqa: BLE001
        pytest.fail(f"{what}: {type(exc).__name__} instead of IndexFormatError: {exc}")
    else:
        pytest.fail(f"{what}: loaded")


def _copy(src: Path, dst: Path) -> Path:
    import shutil

    shutil.rmtree(dst, ignore_errors=True)
    shutil.copytree(src, dst)
    return dst


def test_every_tampered_manifest_is_an_index_format_error(
    saved_index: Path, tmp_path: Path
) -> None:
    manifest = json.loads((saved_index / MANIFEST).read_text())
    work = _copy(saved_index, tmp_path / "idx")
    count = 0
    for what, mutated in _manifest_mutations(manifest):
        (work / MANIFEST).write_text(json.dumps(mutated))
        _load_must_refuse(work, what, {MANIFEST, *(f["name"] for f in manifest["files"].values())})
        count += 1
    for size in (0, 1, 50, len((saved_index / MANIFEST).read_bytes()) - 2):
        (work / MANIFEST).write_bytes((saved_index / MANIFEST).read_bytes()[:size])
        _load_must_refuse(work, f"manifest cut at {size}", {MANIFEST})
    assert count > 300, count


def _file_mutations(role: str, data: bytes) -> Iterator[tuple[str, bytes]]:
    """Structural mutations of a data file (its checksum is updated: they test the schema)."""
    yield "truncated", data[: len(data) // 2]
    if role != "record_store":  # an empty record store is well-formed (see the README note)
        yield "empty", b""
    if role == "record_store":
        lines = data.decode().splitlines()
        first = json.loads(lines[0])
        for bad in (
            [first[0]],
            [first[0], first[1], "x"],
            [1, first[1]],
            [first[0], 5],
            [first[0], "not json"],
            [first[0], "[1, 2]"],
            {"k": first[0]},
        ):
            yield f"line {bad!r}", "\n".join([json.dumps(bad), *lines[1:]]).encode()
        yield "a key twice", "\n".join([lines[0], *lines]).encode()
        return
    if role not in ("lexical", "vectors"):
        yield "garbage", b"\x93NUMPY garbage" if role == "lexical_tf" else b"IxF2garbage"
        return
    doc = json.loads(data)
    for at, value in _leaves(doc):
        if len(at) > 3 or (len(at) >= 1 and isinstance(at[0], int) and at[0] > 0):
            continue  # the first record stands for all
        if at and isinstance(at[-1], int) and at[-1] > 0:
            continue
        if any(part in ("groups", "metadata") for part in at[:-1]):
            continue  # metadata: free JSON
        if at and isinstance(at[-1], str) and at[-1] not in ("stemmer", "docstore"):
            yield f"delete {at}", json.dumps(_edit(doc, at, lambda p, k: p.pop(k))).encode()
        if at:
            for other in _other_type(value):
                if at[-1] == "stemmer" and other is None:
                    continue
                if (
                    isinstance(value, float)
                    and isinstance(other, int)
                    and not isinstance(other, bool)
                ):
                    continue  # an int where a float is expected is a number
                yield (
                    f"{at} = {other!r}",
                    json.dumps(_edit(doc, at, lambda p, k, o=other: p.__setitem__(k, o))).encode(),
                )
        if isinstance(value, dict) and not (at and at[-1] in ("groups", "metadata")):
            edited = json.loads(json.dumps(doc))
            node = edited
            for part in at:
                node = node[part]
            node["unexpected"] = 1
            yield f"extra key in {at or 'top'}", json.dumps(edited).encode()


def test_every_tampered_data_file_is_an_index_format_error(
    saved_index: Path, tmp_path: Path
) -> None:
    manifest = json.loads((saved_index / MANIFEST).read_text())
    work = _copy(saved_index, tmp_path / "idx")
    count = 0
    for role, entry in manifest["files"].items():
        original = (saved_index / entry["name"]).read_bytes()
        for what, data in _file_mutations(role, original):
            for checksum in ("updated", "stale"):
                if checksum == "stale" and what != "truncated":
                    continue
                (work / entry["name"]).write_bytes(data)
                edited = json.loads(json.dumps(manifest))
                if checksum == "updated":
                    edited["files"][role]["sha256"] = hashlib.sha256(data).hexdigest()
                    edited["files"][role]["size"] = len(data)
                (work / MANIFEST).write_text(json.dumps(edited))
                _load_must_refuse(work, f"{role}: {what} ({checksum} checksum)", {entry["name"]})
                count += 1
        (work / entry["name"]).write_bytes(original)
        for other_role, other in manifest["files"].items():  # another file's bytes in its place
            if other_role != role:
                data = (saved_index / other["name"]).read_bytes()
                (work / entry["name"]).write_bytes(data)
                edited = json.loads(json.dumps(manifest))
                edited["files"][role]["sha256"] = hashlib.sha256(data).hexdigest()
                edited["files"][role]["size"] = len(data)
                (work / MANIFEST).write_text(json.dumps(edited))
                _load_must_refuse(work, f"{role} holds {other_role}'s bytes", {entry["name"]})
                count += 1
        (work / entry["name"]).write_bytes(original)
    (work / MANIFEST).write_bytes((saved_index / MANIFEST).read_bytes())
    assert RSERetriever.load(work, embedding=HashingEmbeddings()).invoke("termination")
    assert count > 40, count


# ------------------------------------------------------------------ special and oversized files


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="named pipes")
@pytest.mark.parametrize("role", ["lexical", "vectors", "record_store"])
def test_a_named_pipe_in_place_of_a_data_file_is_refused_at_once(
    saved_index: Path, tmp_path: Path, role: str
) -> None:
    """A named pipe where a data file was: ``load`` raises ``IndexFormatError`` naming it,
    without waiting for a writer that never comes."""
    import threading

    work = _copy(saved_index, tmp_path / "idx")
    name = json.loads((work / MANIFEST).read_text())["files"][role]["name"]
    (work / name).unlink()
    os.mkfifo(work / name)
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            RSERetriever.load(work, embedding=HashingEmbeddings())
            outcome.append(None)
        except BaseException as exc:  # noqa: BLE001 - reported below
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(timeout=60)  # generous: the fixed load returns at once
    waited = thread.is_alive()
    if waited:  # let the blocked open go on (a writer opens the pipe and closes it)
        os.close(os.open(work / name, os.O_WRONLY | os.O_NONBLOCK))
        thread.join(timeout=60)
    assert not waited, "load waited on a named pipe"
    assert isinstance(outcome[0], IndexFormatError) and name in str(outcome[0]), outcome
    assert "not a regular file" in str(outcome[0])


@pytest.mark.parametrize("role", ["lexical", "vectors"])
def test_a_data_file_of_another_size_is_refused_before_it_is_read(
    saved_index: Path, tmp_path: Path, role: str
) -> None:
    """A 256 MiB sparse file in place of a data file (its checksum in the manifest kept):
    ``IndexFormatError`` naming the file and both sizes, and the load allocates nothing
    near the file's size (it is not read)."""
    import tracemalloc

    work = _copy(saved_index, tmp_path / "idx")
    entry = json.loads((work / MANIFEST).read_text())["files"][role]
    with open(work / entry["name"], "r+b") as handle:
        handle.truncate(256 * 1024 * 1024)
    tracemalloc.start()
    try:
        with pytest.raises(IndexFormatError, match=f"{entry['name']}.*{256 * 1024 * 1024} bytes"):
            RSERetriever.load(work, embedding=HashingEmbeddings())
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 32 * 1024 * 1024, peak


def test_the_manifest_records_each_files_size(saved_index: Path) -> None:
    manifest = json.loads((saved_index / MANIFEST).read_text())
    for entry in manifest["files"].values():
        assert entry["size"] == (saved_index / entry["name"]).stat().st_size
