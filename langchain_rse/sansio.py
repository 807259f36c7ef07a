"""One driver for the sans-I/O generators of the query and write paths.

A stage written as a generator *yields* each I/O it needs as a request ``(kind,
argument)`` and receives the answer; a dict of handlers, one per kind, carries the
requests out. :func:`drive` answers them synchronously and :func:`adrive` awaits the
answers, so the sync and async paths share every line of the stage's logic.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Generator
from typing import Any

__all__ = ["AsyncHandlers", "Handlers", "Request", "adrive", "drive"]

Request = tuple[str, Any]
"""``(kind, argument)``: what a generator asks its driver to do."""
Handlers = dict[str, Callable[[Any], Any]]
AsyncHandlers = dict[str, Callable[[Any], Awaitable[Any]]]


async def _run(
    gen: Generator[Request, Any, Any],
    handlers: Handlers | AsyncHandlers,
    awaiting: bool,
    thrown: tuple[type[BaseException], ...],
) -> Any:
    """The one driver loop: answer each request with its handler (awaited if
    ``awaiting``); a handler's exception of a ``thrown`` type is raised inside the
    generator, where the stage decides what it means; any other propagates."""
    reply, error = None, None
    while True:
        try:
            kind, arg = gen.throw(error) if error is not None else gen.send(reply)
        except StopIteration as done:
            return done.value
        reply, error = None, None
        try:
            reply = handlers[kind](arg)
            if awaiting:
                reply = await reply
        except thrown as exc:
            error = exc


def drive(
    gen: Generator[Request, Any, Any],
    handlers: Handlers,
    thrown: tuple[type[BaseException], ...] = (),
) -> Any:
    """Run ``gen`` to its return value, answering its requests with the synchronous
    ``handlers`` (the driver coroutine never suspends, so it finishes in one step)."""
    coro = _run(gen, handlers, False, thrown)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a synchronous handler suspended")


async def adrive(
    gen: Generator[Request, Any, Any],
    handlers: AsyncHandlers,
    thrown: tuple[type[BaseException], ...] = (),
) -> Any:
    """Run ``gen`` to its return value, awaiting the asynchronous ``handlers``."""
    return await _run(gen, handlers, True, thrown)
