"""A scriptable stand-in for Cohere's ``POST /v2/rerank`` endpoint on 127.0.0.1.

Tests point the real ``cohere`` SDK at :attr:`FakeCohereServer.url`. Each incoming request is
recorded; the reply is the next scripted :class:`Reply` if any is queued, else a correct rerank
response computed with :attr:`FakeCohereServer.scorer`.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeCohereServer", "RecordedRequest", "Reply", "overlap_score", "running_server"]


@dataclass(frozen=True)
class Reply:
    """One scripted HTTP reply."""

    status: int = 200
    """HTTP status code."""
    body: Any = None
    """``bytes``/``str`` are sent as they are, anything else as JSON; ``None`` means a correct
    rerank response computed by the server's scorer."""
    headers: dict[str, str] = field(default_factory=dict)
    """Extra response headers, e.g. ``{"Retry-After": "1"}``."""
    delay: float = 0.0
    """Seconds to wait before replying (cut short when the server stops)."""


@dataclass(frozen=True)
class RecordedRequest:
    """What the server received."""

    path: str
    headers: dict[str, str]
    """Header names lower-cased."""
    body: Any
    """The decoded JSON body (``None`` if it was not JSON)."""


def overlap_score(query: str, document: str) -> float:
    """Share of the query's words found in the document, in [0, 1]."""
    query_words = set(query.lower().split())
    if not query_words:
        return 0.0
    return len(query_words & set(document.lower().split())) / len(query_words)


class FakeCohereServer:
    """A threaded HTTP server answering ``/v2/rerank`` like Cohere, with scriptable faults."""

    def __init__(self, scorer: Callable[[str, str], float] = overlap_score) -> None:
        self.scorer = scorer
        """Scores ``(query, document)`` for the default, correct replies."""
        self.requests: list[RecordedRequest] = []
        self._replies: deque[Reply] = deque()
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._httpd.daemon_threads = True
        self._httpd.block_on_close = False  # type: ignore[attr-defined]
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    @property
    def url(self) -> str:
        """Base URL to pass to the SDK (it appends ``/v2/rerank``)."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def enqueue(self, *replies: Reply) -> None:
        """Queue replies for the next requests, in order."""
        with self._lock:
            self._replies.extend(replies)

    def start(self) -> FakeCohereServer:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving; delayed replies are abandoned."""
        self._stopping.set()
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join(timeout=5)

    # -- request handling --------------------------------------------------------------------

    def _next_reply(self) -> Reply:
        with self._lock:
            return self._replies.popleft() if self._replies else Reply()

    def _record(self, request: RecordedRequest) -> None:
        with self._lock:
            self.requests.append(request)

    def rerank_body(self, request: Any) -> dict[str, Any]:
        """A correct ``/v2/rerank`` response for a decoded request body."""
        query = str(request["query"])
        documents = [str(doc) for doc in request["documents"]]
        scored = sorted(
            ((index, self.scorer(query, doc)) for index, doc in enumerate(documents)),
            key=lambda pair: (-pair[1], pair[0]),
        )
        top_n = request.get("top_n")
        if top_n is not None:
            scored = scored[: int(top_n)]
        return {
            "id": f"fake-{len(self.requests)}",
            "results": [{"index": i, "relevance_score": s} for i, s in scored],
            "meta": {"api_version": {"version": "2"}, "billed_units": {"search_units": 1}},
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                """Keep test output quiet."""

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                try:
                    body: Any = json.loads(raw)
                except ValueError:
                    body = None
                server._record(
                    RecordedRequest(
                        path=self.path,
                        headers={k.lower(): v for k, v in self.headers.items()},
                        body=body,
                    )
                )
                reply = server._next_reply()
                if reply.delay and server._stopping.wait(reply.delay):
                    return
                if self.path.rstrip("/") != "/v2/rerank":
                    payload: Any = {"message": f"no route {self.path}"}
                    status = 404
                elif reply.body is None and reply.status == 200:
                    if isinstance(body, dict):
                        payload, status = server.rerank_body(body), 200
                    else:
                        payload, status = {"message": "invalid request body"}, 400
                else:
                    payload = {"message": "scripted"} if reply.body is None else reply.body
                    status = reply.status
                if isinstance(payload, bytes):
                    data = payload
                elif isinstance(payload, str):
                    data = payload.encode()
                else:
                    data = json.dumps(payload).encode()
                try:
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    for name, value in reply.headers.items():
                        self.send_header(name, value)
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test); nothing to do
                    pass

        return Handler


@contextmanager
def running_server(
    scorer: Callable[[str, str], float] = overlap_score,
) -> Iterator[FakeCohereServer]:
    """A started :class:`FakeCohereServer`, stopped on exit."""
    server = FakeCohereServer(scorer).start()
    try:
        yield server
    finally:
        server.stop()
