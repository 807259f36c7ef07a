"""Reranking: the real cohere SDK against a fake ``/v2/rerank`` server, the compressor adapter,
and score calibration."""

from __future__ import annotations

import asyncio
import email.utils
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pytest
from langchain_core.callbacks import Callbacks
from langchain_core.documents import BaseDocumentCompressor, Document
from langchain_core.embeddings import Embeddings
from pydantic import PrivateAttr, SecretStr

from fake_cohere_server import FakeCohereServer, Reply, overlap_score, running_server
from langchain_rse.llm import is_transient, retry_after
from langchain_rse.rerank import (
    BaseReranker,
    CohereReranker,
    CompressorReranker,
    EmbeddingReranker,
    RerankError,
    RerankResult,
    apply_rank_decay,
    as_reranker,
    beta_cdf,
    calibrate,
    default_calibration,
)

KEY = "test-key-0123456789-do-not-print"
SECRET = SecretStr(KEY)
QUERY = "termination notice period"
TEXTS = [
    "governing law of the state",
    "termination requires thirty days notice",
    "payment terms net thirty",
    "the notice period for termination is sixty days",
    "confidentiality survives termination",
]


# -- fixtures and helpers -----------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("COHERE_API_KEY", "CO_API_KEY", "CO_API_URL"):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def server() -> Iterator[FakeCohereServer]:
    with running_server() as srv:
        yield srv


def make_docs(texts: Sequence[str]) -> list[Document]:
    return [
        Document(page_content=text, metadata={"chunk_id": f"chunk-{i}"})
        for i, text in enumerate(texts)
    ]


def make_reranker(server: FakeCohereServer, **kwargs: Any) -> CohereReranker:
    options: dict[str, Any] = {
        "api_key": KEY,
        "base_url": server.url,
        "timeout": 10.0,
        "backoff_base": 0.01,
        "backoff_max": 0.05,
    }
    options.update(kwargs)
    return CohereReranker(**options)


def expected_order(texts: Sequence[str], query: str = QUERY) -> list[int]:
    scores = [overlap_score(query, text) for text in texts]
    return sorted(range(len(texts)), key=lambda i: (-scores[i], i))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


# -- CohereReranker: requests and results -------------------------------------------------------


def test_request_shape_and_result(server: FakeCohereServer) -> None:
    reranker = make_reranker(server, top_n=3, max_tokens_per_doc=256)
    result = reranker.rerank(QUERY, make_docs(TEXTS))

    assert len(server.requests) == 1
    request = server.requests[0]
    assert request.path == "/v2/rerank"
    assert request.headers["authorization"] == f"Bearer {KEY}"
    assert request.body == {
        "model": "rerank-v3.5",
        "query": QUERY,
        "documents": TEXTS,
        "top_n": 3,
        "max_tokens_per_doc": 256,
    }
    assert result.indices == expected_order(TEXTS)[:3]
    assert result.scores == [overlap_score(QUERY, TEXTS[i]) for i in result.indices]
    assert result.scores == sorted(result.scores, reverse=True)
    assert all(0.0 <= r <= 1.0 for r in result.relevance)


def test_optional_fields_are_omitted_and_all_documents_returned(server: FakeCohereServer) -> None:
    result = make_reranker(server, model="rerank-english-v3.0").rerank(QUERY, make_docs(TEXTS))

    body = server.requests[0].body
    assert body["model"] == "rerank-english-v3.0"
    assert "top_n" not in body
    assert "max_tokens_per_doc" not in body
    assert result.indices == expected_order(TEXTS)


def test_identity_is_kept_by_position_not_text(server: FakeCohereServer) -> None:
    texts = ["notice period", "unrelated words", "notice period", "termination notice period"]
    docs = make_docs(texts)
    result = make_reranker(server).rerank(QUERY, docs)

    assert sorted(result.indices) == [0, 1, 2, 3]
    assert [docs[i].metadata["chunk_id"] for i in result.indices] == [
        "chunk-3",
        "chunk-0",
        "chunk-2",
        "chunk-1",
    ]
    assert [d.metadata for d in docs] == [{"chunk_id": f"chunk-{i}"} for i in range(4)]


def test_empty_candidates_make_no_request(server: FakeCohereServer) -> None:
    assert make_reranker(server).rerank(QUERY, []) == RerankResult([], [], [])
    assert server.requests == []


@pytest.mark.parametrize("top_n", [None, 4])
def test_batches_above_the_request_limit_are_merged_by_score(top_n: int | None) -> None:
    texts = [f"doc-{i}" for i in range(7)]
    scores = {text: s for text, s in zip(texts, [0.1, 0.9, 0.4, 0.8, 0.2, 0.95, 0.3])}
    with running_server(lambda _query, doc: scores[doc]) as srv:
        reranker = make_reranker(srv, max_documents_per_request=3, top_n=top_n)
        result = reranker.rerank(QUERY, make_docs(texts))

    bodies = sorted((r.body for r in srv.requests), key=lambda b: b["documents"][0])
    assert [b["documents"] for b in bodies] == [texts[0:3], texts[3:6], texts[6:7]]
    if top_n is None:
        assert all("top_n" not in b for b in bodies)
    else:
        assert [b["top_n"] for b in bodies] == [3, 3, 1]
    best = sorted(range(7), key=lambda i: -scores[texts[i]])
    assert result.indices == best[: top_n or 7]
    assert result.scores == [scores[texts[i]] for i in result.indices]


# -- CohereReranker: retries, errors, deadline --------------------------------------------------


def test_429_then_success_honours_retry_after(server: FakeCohereServer) -> None:
    server.enqueue(Reply(429, {"message": "slow down"}, headers={"Retry-After": "1"}))
    started = time.monotonic()
    result = make_reranker(server).rerank(QUERY, make_docs(TEXTS))
    elapsed = time.monotonic() - started

    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body
    assert result.indices == expected_order(TEXTS)
    assert elapsed >= 0.9  # backoff alone is ≤ 0.1s here, so the server's 1s wait was kept


def test_retry_after_beyond_the_deadline_fails_at_once(server: FakeCohereServer) -> None:
    server.enqueue(Reply(429, {"message": "slow down"}, headers={"Retry-After": "60"}))
    started = time.monotonic()
    with pytest.raises(RerankError, match="429"):
        make_reranker(server, timeout=20.0).rerank(QUERY, make_docs(TEXTS))
    assert time.monotonic() - started < 15.0  # neither the 60s asked for nor the 20s deadline
    assert len(server.requests) == 1


def test_persistent_500_raises_after_retries(server: FakeCohereServer) -> None:
    server.enqueue(*[Reply(500, {"message": "internal"})] * 10)
    with pytest.raises(RerankError) as info:
        make_reranker(server, max_retries=2).rerank(QUERY, make_docs(TEXTS))

    assert len(server.requests) == 3
    message = str(info.value)
    assert "HTTP 500" in message and "3 attempt(s)" in message and "rerank-v3.5" in message
    assert KEY not in message


def test_503_with_html_body_is_retried(server: FakeCohereServer) -> None:
    server.enqueue(Reply(503, b"<html>bad gateway</html>"))
    result = make_reranker(server).rerank(QUERY, make_docs(TEXTS))
    assert len(server.requests) == 2
    assert result.indices == expected_order(TEXTS)


@pytest.mark.parametrize("status", [502, 504, 529])
def test_other_5xx_are_retried(server: FakeCohereServer, status: int) -> None:
    server.enqueue(Reply(status, {"message": "upstream"}))
    assert make_reranker(server).rerank(QUERY, make_docs(TEXTS)).indices == expected_order(TEXTS)
    assert len(server.requests) == 2


@pytest.mark.parametrize("status", [400, 401, 404, 422, 501])
def test_client_errors_are_not_retried(server: FakeCohereServer, status: int) -> None:
    server.enqueue(Reply(status, {"message": "invalid model"}))
    with pytest.raises(RerankError, match=f"HTTP {status}"):
        make_reranker(server).rerank(QUERY, make_docs(TEXTS))
    assert len(server.requests) == 1


def test_the_sdk_does_not_retry_on_its_own(server: FakeCohereServer) -> None:
    """max_retries=0: one request per attempt, whatever the SDK's own default (2 retries)."""
    server.enqueue(*[Reply(500, {"message": "internal"})] * 10)
    with pytest.raises(RerankError, match="1 attempt"):
        make_reranker(server, max_retries=0).rerank(QUERY, make_docs(TEXTS))
    assert len(server.requests) == 1


def test_retry_after_ms_is_honoured(server: FakeCohereServer) -> None:
    server.enqueue(Reply(503, {"message": "busy"}, headers={"Retry-After-Ms": "800"}))
    started = time.monotonic()
    make_reranker(server).rerank(QUERY, make_docs(TEXTS))
    assert time.monotonic() - started >= 0.7
    assert len(server.requests) == 2


class _Failure(Exception):
    def __init__(self, status_code: int | None = None, headers: Any = None) -> None:
        self.status_code, self.headers = status_code, headers


def test_retry_after_parsing() -> None:
    soon = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert retry_after(_Failure(headers={"Retry-After": "2"})) == 2.0
    assert retry_after(_Failure(headers={"retry-after": " 1.5 "})) == 1.5
    assert retry_after(_Failure(headers={"Retry-After-Ms": "250", "Retry-After": "9"})) == 0.25
    assert retry_after(_Failure(headers={"Retry-After-Ms": "soon", "Retry-After": "9"})) == 9.0
    assert 25.0 < (retry_after(_Failure(headers={"Retry-After": soon})) or 0.0) <= 30.0
    past = email.utils.formatdate(time.time() - 30, usegmt=True)
    assert retry_after(_Failure(headers={"Retry-After": past})) == 0.0
    assert retry_after(_Failure(headers={"Retry-After": "-3"})) == 0.0
    for headers in ({}, {"Retry-After": "whenever"}, {"Retry-After": "nan"}, None, ["x"]):
        assert retry_after(_Failure(headers=headers)) is None
    assert retry_after(None) is None


def test_transient_failures() -> None:
    import httpx

    # the package's one classifier (langchain_rse.llm.is_transient): 408 and 409 too
    for code in (408, 409, 429, 500, 502, 503, 504):
        assert is_transient(_Failure(code))
    for code in (200, 400, 401, 404, 422, 501):
        assert not is_transient(_Failure(code))
    assert is_transient(httpx.ConnectError("refused"))
    assert is_transient(httpx.ReadTimeout("slow"))
    assert not is_transient(ValueError("bug"))


@pytest.mark.parametrize(
    "body",
    [
        b"{this is not json",
        b"",
        {"unexpected": True},
        [1, 2, 3],
        {"results": [{"index": 99, "relevance_score": 0.5}]},
        {"results": [{"index": 0, "relevance_score": "high"}]},
        {"results": [{"index": 0, "relevance_score": 0.5}, {"index": 0, "relevance_score": 0.4}]},
    ],
    ids=["garbage", "empty", "no-results", "array", "bad-index", "bad-score", "repeated-index"],
)
def test_malformed_responses_raise(server: FakeCohereServer, body: Any) -> None:
    server.enqueue(Reply(200, body))
    with pytest.raises(RerankError, match="response"):
        make_reranker(server).rerank(QUERY, make_docs(TEXTS))
    assert len(server.requests) == 1


def test_deadline_holds_when_the_server_hangs(server: FakeCohereServer) -> None:
    server.enqueue(Reply(delay=120.0), Reply(delay=120.0))  # cut short when the server stops
    started = time.monotonic()
    with pytest.raises(RerankError, match="time"):
        make_reranker(server, timeout=1.0).rerank(QUERY, make_docs(TEXTS))
    assert time.monotonic() - started < 1.0 + 30.0  # the deadline, not the hang


def test_deadline_covers_all_batches_of_a_query() -> None:
    texts = [f"doc-{i}" for i in range(6)]
    with running_server() as srv:
        reranker = make_reranker(
            srv, timeout=2.0, max_documents_per_request=2, max_concurrent_requests=1
        )
        reranker.rerank(QUERY, make_docs(texts[:1]))  # the client is built and connected
        srv.enqueue(*[Reply(delay=1.3)] * 3)
        started = time.monotonic()
        with pytest.raises(RerankError, match="time"):
            reranker.rerank(QUERY, make_docs(texts))
        assert time.monotonic() - started < 2.0 + 30.0  # generous: the count below is the check
        time.sleep(0.5)
        assert len(srv.requests) == 1 + 2  # the 2nd batch ran out of time, the 3rd never went


@pytest.mark.parametrize("path", ["sync", "async"])
def test_a_failed_batch_stops_the_other_batches(path: str) -> None:
    texts = [f"doc-{i}" for i in range(8)]  # 4 batches in 2 lanes: 2 requests at a time
    with running_server() as srv:
        # The slow reply would take 10 minutes (cut short when the server stops): the error
        # coming back at all shows nobody waited for it; no tight clock on a busy machine.
        srv.enqueue(Reply(400, {"message": "bad request"}), Reply(delay=600.0))
        reranker = make_reranker(
            srv, max_documents_per_request=2, max_concurrent_requests=2, timeout=900.0
        )
        started = time.monotonic()
        with pytest.raises(RerankError, match="HTTP 400"):
            if path == "sync":
                reranker.rerank(QUERY, make_docs(texts))
            else:
                asyncio.run(reranker.arerank(QUERY, make_docs(texts)))
        assert time.monotonic() - started < 300.0  # not the slow batch's 600 s
        time.sleep(0.5)  # a batch wrongly started after the failure would arrive now
        sent = [doc for r in srv.requests for doc in r.body["documents"]]
        assert len(srv.requests) <= 2 and not set(sent) & set(texts[4:])  # 3rd, 4th never went


def test_sync_calls_share_one_bounded_thread_pool(server: FakeCohereServer) -> None:
    import cohere

    threads: list[threading.Thread] = []

    class RecordingClient:
        def __init__(self) -> None:
            self.inner = cohere.ClientV2(api_key=KEY, base_url=server.url, max_retries=0)

        def rerank(self, **kwargs: Any) -> Any:
            threads.append(threading.current_thread())
            return self.inner.rerank(**kwargs)

    reranker = CohereReranker(
        client=RecordingClient(), max_documents_per_request=2, max_concurrent_requests=3
    )
    for _ in range(12):
        result = reranker.rerank(QUERY, make_docs(TEXTS))
        assert result.indices == expected_order(TEXTS)
    assert len(threads) == 36 and len(server.requests) == 36  # 12 calls of 3 batches
    assert all(t.name.startswith("langchain-rse-rerank") for t in threads)
    assert len(set(threads)) <= 32  # the threads are reused, not started per call
    assert threading.current_thread() not in threads


def test_connection_refused_raises() -> None:
    reranker = CohereReranker(
        api_key=SECRET, base_url=f"http://127.0.0.1:{free_port()}", timeout=5.0, backoff_base=0.01
    )
    with pytest.raises(RerankError, match="connection error"):
        reranker.rerank(QUERY, make_docs(TEXTS))


# -- CohereReranker: async ----------------------------------------------------------------------


async def test_async_matches_sync(server: FakeCohereServer) -> None:
    reranker = make_reranker(server, top_n=4)
    docs = make_docs(TEXTS)
    expected = reranker.rerank(QUERY, docs)
    assert await reranker.arerank(QUERY, docs) == expected
    assert len(server.requests) == 2
    assert server.requests[0].body == server.requests[1].body


async def test_async_batches_and_retries(server: FakeCohereServer) -> None:
    texts = [f"notice {'termination ' * (i % 3)}{i}" for i in range(7)]
    server.enqueue(Reply(429, {"message": "slow down"}, headers={"Retry-After": "0"}))
    reranker = make_reranker(server, max_documents_per_request=3)
    result = await reranker.arerank(QUERY, make_docs(texts))

    assert len(server.requests) == 4  # three batches, whichever came first retried
    sent = {tuple(r.body["documents"]) for r in server.requests}
    assert sent == {tuple(texts[0:3]), tuple(texts[3:6]), tuple(texts[6:7])}
    assert result == reranker.rerank(QUERY, make_docs(texts))


async def test_async_errors_and_deadline(server: FakeCohereServer) -> None:
    server.enqueue(Reply(200, b"<<garbage>>"))
    with pytest.raises(RerankError, match="unreadable"):
        await make_reranker(server).arerank(QUERY, make_docs(TEXTS))

    server.enqueue(Reply(delay=120.0), Reply(delay=120.0))  # cut short when the server stops
    started = time.monotonic()
    with pytest.raises(RerankError, match="time"):
        await make_reranker(server, timeout=1.0).arerank(QUERY, make_docs(TEXTS))
    assert time.monotonic() - started < 1.0 + 30.0  # the deadline, not the hang


def test_async_client_works_across_event_loops(server: FakeCohereServer) -> None:
    reranker = make_reranker(server)
    docs = make_docs(TEXTS)
    first = asyncio.run(reranker.arerank(QUERY, docs))
    second = asyncio.run(reranker.arerank(QUERY, docs))
    assert first == second


# -- CohereReranker: configuration and the API key ---------------------------------------------


def test_key_is_read_from_the_environment(
    server: FakeCohereServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("CO_API_KEY", "from-co-api-key")
    CohereReranker(base_url=server.url).rerank(QUERY, make_docs(TEXTS[:1]))
    monkeypatch.setenv("COHERE_API_KEY", "from-cohere-api-key")
    CohereReranker(base_url=server.url).rerank(QUERY, make_docs(TEXTS[:1]))
    assert [r.headers["authorization"] for r in server.requests] == [
        "Bearer from-co-api-key",
        "Bearer from-cohere-api-key",
    ]


def test_base_url_is_read_from_the_environment(
    server: FakeCohereServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert CohereReranker(api_key=SECRET).base_url == "https://api.cohere.com"
    monkeypatch.setenv("CO_API_URL", server.url)
    CohereReranker(api_key=SECRET).rerank(QUERY, make_docs(TEXTS[:1]))
    assert len(server.requests) == 1


def test_missing_key_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="COHERE_API_KEY"):
        CohereReranker()


def test_key_never_shown() -> None:
    reranker = CohereReranker(api_key=SECRET)
    for text in (repr(reranker), str(reranker), reranker.model_dump_json()):
        assert KEY not in text
    assert reranker.cohere_api_key is not None
    assert reranker.cohere_api_key.get_secret_value() == KEY


def test_invalid_settings_are_rejected() -> None:
    bad_settings: list[dict[str, Any]] = [
        {"timeout": 0},
        {"max_retries": -1},
        {"max_documents_per_request": 0},
    ]
    for bad in bad_settings:
        with pytest.raises(ValueError):
            CohereReranker(api_key=SECRET, **bad)


# -- calibration --------------------------------------------------------------------------------


def test_beta_cdf_shape() -> None:
    x = np.linspace(0.0, 1.0, 101)
    y = beta_cdf(x)
    assert np.all(np.diff(y) >= 0)
    assert y[0] == 0.0 and y[-1] == 1.0
    assert beta_cdf([0.5])[0] == pytest.approx(0.5)
    assert beta_cdf([-0.3, 1.7]).tolist() == [0.0, 1.0]
    # a = b < 1: steep near the ends, flat in the middle, symmetric about 0.5
    low, high = beta_cdf([0.2, 0.8])
    assert 0.2 < low < 0.5 < high < 0.8
    assert low + high == pytest.approx(1.0)
    assert np.diff(beta_cdf([0.0, 0.05]))[0] > np.diff(beta_cdf([0.5, 0.55]))[0]
    assert beta_cdf([0.3], 2.0, 5.0)[0] == pytest.approx(0.579825, abs=1e-5)


def test_calibration_methods() -> None:
    scores = [2.0, 0.5, -1.0]
    assert calibrate(scores, "identity").tolist() == [1.0, 0.5, 0.0]
    assert calibrate(scores, "minmax").tolist() == [1.0, 0.5, 0.0]
    assert calibrate([3.0, 3.0], "minmax").tolist() == [0.5, 0.5]
    assert calibrate([], "minmax").tolist() == []
    sig = calibrate([0.0, 10.0, -10.0], "sigmoid")
    assert sig[0] == pytest.approx(0.5) and sig[1] > 0.99 and sig[2] < 0.01
    shifted = calibrate([4.0], "sigmoid", sigmoid_center=4.0, sigmoid_temperature=2.0)
    assert shifted[0] == pytest.approx(0.5)
    assert calibrate([float("nan")], "identity").tolist() == [0.0]
    with pytest.raises(ValueError):
        calibrate(scores, "nonsense")  # type: ignore[arg-type]


def test_rank_decay() -> None:
    assert apply_rank_decay([1.0, 1.0, 1.0], None).tolist() == [1.0, 1.0, 1.0]
    decayed = apply_rank_decay([1.0, 1.0, 0.5], 2.0)
    assert decayed.tolist() == pytest.approx([1.0, np.exp(-0.5), 0.5 * np.exp(-1.0)])


def test_default_calibration_per_model() -> None:
    assert default_calibration("rerank-v3.5") == "beta"
    assert default_calibration("rerank-multilingual-v3.0") == "beta"
    assert default_calibration("cohere.rerank-v3-5:0") == "beta"
    assert default_calibration("cross-encoder/ms-marco-MiniLM-L-6-v2") == "identity"
    assert default_calibration(None) == "identity"


def test_cohere_relevance_is_calibrated(server: FakeCohereServer) -> None:
    docs = make_docs(TEXTS)
    auto = make_reranker(server).rerank(QUERY, docs)
    assert auto.relevance == pytest.approx(beta_cdf(auto.scores).tolist())

    identity = make_reranker(server, calibration="identity").rerank(QUERY, docs)
    assert identity.relevance == pytest.approx(identity.scores)

    decayed = make_reranker(server, calibration="beta", rank_decay=3.0).rerank(QUERY, docs)
    ranks = np.arange(len(decayed.scores))
    expected = beta_cdf(decayed.scores) * np.exp(-ranks / 3.0)
    assert decayed.relevance == pytest.approx(expected.tolist())


# -- CompressorReranker -------------------------------------------------------------------------


class KeywordCompressor(BaseDocumentCompressor):
    """Sorts documents by query-word overlap, like a reranking compressor."""

    model: str | None = None
    with_scores: bool = True
    keep_metadata: bool = True
    fail: bool = False
    _seen_callbacks: list[Callbacks] = PrivateAttr(default_factory=list)

    def compress_documents(
        self, documents: Sequence[Document], query: str, callbacks: Callbacks = None
    ) -> Sequence[Document]:
        self._seen_callbacks.append(callbacks)
        if self.fail:
            raise ConnectionError("service unavailable")
        ranked = sorted(
            enumerate(documents),
            key=lambda pair: (-overlap_score(query, pair[1].page_content), pair[0]),
        )
        outputs = []
        for _, doc in ranked[:3]:
            metadata = dict(doc.metadata) if self.keep_metadata else {}
            if self.with_scores:
                metadata["relevance_score"] = overlap_score(query, doc.page_content)
            outputs.append(Document(page_content=doc.page_content, metadata=metadata))
        return outputs


def test_compressor_scores_are_mapped_back_by_position() -> None:
    texts = TEXTS + [TEXTS[1]]  # a duplicate text keeps its own position
    docs = make_docs(texts)
    compressor = KeywordCompressor()
    sentinel: list[Any] = []
    result = CompressorReranker(compressor=compressor).rerank(QUERY, docs, callbacks=sentinel)

    assert result.indices == expected_order(texts)[:3]
    assert result.scores == [overlap_score(QUERY, texts[i]) for i in result.indices]
    assert result.relevance == pytest.approx(np.clip(result.scores, 0, 1).tolist())
    assert compressor._seen_callbacks == [sentinel]
    assert [d.metadata for d in docs] == [{"chunk_id": f"chunk-{i}"} for i in range(len(texts))]


def test_compressor_without_scores_is_rank_based() -> None:
    docs = make_docs(TEXTS)
    result = CompressorReranker(compressor=KeywordCompressor(with_scores=False)).rerank(QUERY, docs)
    assert result.indices == expected_order(TEXTS)[:3]
    assert result.scores == pytest.approx([1.0, 0.8, 0.6])
    assert result.relevance == pytest.approx([1.0, 0.8, 0.6])


async def test_compressor_async_matches_sync() -> None:
    reranker = CompressorReranker(compressor=KeywordCompressor(), rank_decay=10.0)
    docs = make_docs(TEXTS)
    assert await reranker.arerank(QUERY, docs) == reranker.rerank(QUERY, docs)


async def test_compressor_failures_raise_rerank_error() -> None:
    failing = CompressorReranker(compressor=KeywordCompressor(fail=True))
    with pytest.raises(RerankError, match="KeywordCompressor.*ConnectionError"):
        failing.rerank(QUERY, make_docs(TEXTS))
    with pytest.raises(RerankError, match="KeywordCompressor"):
        await failing.arerank(QUERY, make_docs(TEXTS))

    forgetful = CompressorReranker(compressor=KeywordCompressor(keep_metadata=False))
    with pytest.raises(RerankError, match="mapped back"):
        forgetful.rerank(QUERY, make_docs(TEXTS))


def test_compressor_calibration_follows_its_model() -> None:
    cohere_like = CompressorReranker(compressor=KeywordCompressor(model="rerank-v3.5"))
    assert cohere_like.calibration_method == "beta"
    result = cohere_like.rerank(QUERY, make_docs(TEXTS))
    assert result.relevance == pytest.approx(beta_cdf(result.scores).tolist())
    assert CompressorReranker(compressor=KeywordCompressor()).calibration_method == "identity"
    sigmoid = CompressorReranker(compressor=KeywordCompressor(), calibration="sigmoid")
    assert sigmoid.calibration_method == "sigmoid"


def test_as_reranker() -> None:
    compressor = KeywordCompressor()
    wrapped = as_reranker(compressor)
    assert isinstance(wrapped, CompressorReranker) and wrapped.compressor is compressor
    cohere = CohereReranker(api_key=SECRET)
    assert as_reranker(cohere) is cohere
    assert as_reranker(None) is None
    assert isinstance(cohere, BaseReranker)
    for bad in ("rerank-v3.5", 3, KeywordCompressor):
        with pytest.raises(TypeError, match="BaseReranker.*BaseDocumentCompressor.*None"):
            as_reranker(bad)


# -- EmbeddingReranker --------------------------------------------------------------------------


class TableEmbeddings(Embeddings):
    """Fixed vectors per text (unit length or not), counting calls."""

    def __init__(self, table: dict[str, list[float]], fail: bool = False) -> None:
        self.table, self.fail, self.calls = table, fail, 0

    def embed_documents(self, texts: list[str]) -> list[list[float]]:
        self.calls += 1
        if self.fail:
            raise ConnectionError("model server down")
        return [self.table[t] for t in texts]

    def embed_query(self, text: str) -> list[float]:
        return self.embed_documents([text])[0]


def angle_table() -> dict[str, list[float]]:
    # cosines to the query: 1.0, 0.0, -1.0 and 0.8 (vector lengths vary on purpose)
    return {
        QUERY: [1.0, 0.0],
        "same direction": [3.0, 0.0],
        "orthogonal": [0.0, 2.0],
        "opposite": [-1.0, 0.0],
        "close": [0.8, 0.6],
        "zero vector": [0.0, 0.0],
    }


def test_embedding_reranker_orders_by_cosine_and_keeps_positions() -> None:
    texts = ["orthogonal", "close", "same direction", "opposite", "close", "zero vector"]
    reranker = EmbeddingReranker(
        embeddings=TableEmbeddings(angle_table()), calibration="identity", rank_decay=None
    )
    result = reranker.rerank(QUERY, make_docs(texts))
    assert result.indices[:3] == [2, 1, 4]  # duplicates keep their own positions, stable order
    assert sorted(result.indices) == list(range(len(texts)))
    assert result.scores == pytest.approx([1.0, 0.8, 0.8, 0.0, 0.0, -1.0])
    assert result.indices[-1] == 3
    assert result.relevance == pytest.approx([1.0, 0.8, 0.8, 0.0, 0.0, 0.0])
    assert reranker.rerank(QUERY, []) == RerankResult(indices=[], scores=[], relevance=[])


def test_embedding_reranker_calibrations() -> None:
    docs = make_docs(["orthogonal", "close", "same direction"])
    default = EmbeddingReranker(embeddings=TableEmbeddings(angle_table()))
    assert (default.calibration_method, default.rank_decay) == ("minmax", 20.0)
    result = default.rerank(QUERY, docs)
    assert result.indices == [2, 1, 0] and result.scores == pytest.approx([1.0, 0.8, 0.0])
    minmax = np.array([1.0, 0.8, 0.0])  # (cos - 0) / (1 - 0)
    assert result.relevance == pytest.approx((minmax * np.exp(-np.arange(3) / 20.0)).tolist())

    sigmoid = EmbeddingReranker(
        embeddings=TableEmbeddings(angle_table()),
        calibration="sigmoid",
        sigmoid_center=0.84,
        sigmoid_temperature=0.02,
        rank_decay=None,
    )
    out = sigmoid.rerank(QUERY, docs)
    expected = 1 / (1 + np.exp(-(np.array([1.0, 0.8, 0.0]) - 0.84) / 0.02))
    assert out.relevance == pytest.approx(expected.tolist())


async def test_embedding_reranker_async_matches_sync_and_failures_raise() -> None:
    texts = ["orthogonal", "close", "same direction"]
    reranker = EmbeddingReranker(embeddings=TableEmbeddings(angle_table()))
    docs = make_docs(texts)
    assert await reranker.arerank(QUERY, docs) == reranker.rerank(QUERY, docs)
    failing = EmbeddingReranker(embeddings=TableEmbeddings(angle_table(), fail=True))
    with pytest.raises(RerankError, match="TableEmbeddings.*ConnectionError"):
        failing.rerank(QUERY, make_docs(texts))
    with pytest.raises(RerankError, match="TableEmbeddings"):
        await failing.arerank(QUERY, make_docs(texts))
