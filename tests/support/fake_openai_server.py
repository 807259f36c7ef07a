"""A tiny OpenAI-compatible chat-completions server on 127.0.0.1, for tests.

It answers ``POST /v1/chat/completions`` the way the OpenAI API does (enough for
``langchain_openai.ChatOpenAI``), records every request, reports ``usage`` with
``prompt_tokens_details.cached_tokens`` (it simulates a provider prefix cache: the system
message plus the first user content part, seen before, count as cached), and can be told
to fail some requests with an HTTP status.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

__all__ = ["FakeOpenAIServer", "chunk_of", "prompt_parts"]

_CHUNK = re.compile(r"<chunk>\n(.*?)\n</chunk>", re.DOTALL)


def prompt_parts(request: dict[str, Any]) -> list[str]:
    """All text of a chat request, in order: system content, then user content parts."""
    parts: list[str] = []
    for message in request.get("messages", []):
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return parts


def chunk_of(request: dict[str, Any]) -> str:
    """The text between ``<chunk>`` tags in a request ('' when absent)."""
    found = _CHUNK.search("\n".join(prompt_parts(request)))
    return found.group(1) if found else ""


def _default_reply(request: dict[str, Any]) -> str:
    words = chunk_of(request).split()[:6]
    return "Context for: " + " ".join(words) + "."


class FakeOpenAIServer:
    """Serve ``/v1/chat/completions`` from a thread; use as a context manager."""

    def __init__(
        self,
        reply: Callable[[dict[str, Any]], str | dict[str, Any]] = _default_reply,
        fail: Callable[[dict[str, Any]], int | None] = lambda request: None,
    ) -> None:
        """``reply`` builds the answer: its text, or a whole assistant message (a dict, e.g.
        with ``tool_calls``); ``fail`` returns an HTTP status to fail with, or None."""
        self.reply = reply
        self.fail = fail
        self.requests: list[dict[str, Any]] = []
        self._prefixes: set[str] = set()
        self._lock = threading.Lock()
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def base_url(self) -> str:
        """The ``base_url`` to give ``ChatOpenAI``."""
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}/v1"

    def __enter__(self) -> FakeOpenAIServer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5)

    def _answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        """Status and JSON body for one request."""
        with self._lock:
            self.requests.append(request)
        status = self.fail(request)
        if status is not None:
            return status, {"error": {"message": "simulated failure", "type": "server_error"}}
        parts = prompt_parts(request)
        prefix = "\x00".join(parts[:2])
        with self._lock:
            cached = len(prefix) // 4 if prefix in self._prefixes else 0
            self._prefixes.add(prefix)
        answer = self.reply(request)
        message = answer if isinstance(answer, dict) else {"role": "assistant", "content": answer}
        prompt_tokens = max(1, sum(len(p) for p in parts) // 4)
        completion_tokens = max(1, len(json.dumps(message)) // 4)
        body = {
            "id": f"chatcmpl-{len(self.requests)}",
            "object": "chat.completion",
            "created": 0,
            "model": request.get("model", "fake"),
            "choices": [
                {
                    "index": 0,
                    "message": message,
                    "finish_reason": "tool_calls" if message.get("tool_calls") else "stop",
                }
            ],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
                "prompt_tokens_details": {"cached_tokens": cached},
            },
        }
        return 200, body

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                """Answer a chat-completions request."""
                length = int(self.headers.get("Content-Length", "0"))
                request = json.loads(self.rfile.read(length) or b"{}")
                if self.path.rstrip("/").endswith("/chat/completions"):
                    status, body = server._answer(request)
                else:
                    status, body = 404, {"error": {"message": "not found"}}
                payload = json.dumps(body).encode("utf-8")
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

            def log_message(self, format: str, *args: Any) -> None:
                """Keep test output quiet."""

        return Handler
