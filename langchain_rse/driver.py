"""The sans-I/O driver of the query path (:mod:`langchain_rse.pipeline`) and the write
path (:mod:`langchain_rse.indexing.steps`): each is a generator that *yields* a typed
request for each I/O it needs and receives the answer. :func:`drive` answers the requests
synchronously and :func:`adrive` awaits them, with a handler per request type, so the sync
and async paths share every line of logic. The ground floor: it imports nothing of the
package.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Generator
from typing import TypeVar

__all__ = ["Handler", "Handlers", "Thrown", "adrive", "drive"]

Handler = Callable[..., object]  # type: ignore[explicit-any]
"""A handler, called with its request's fields (each request type its own signature, hence
``...``)."""
Handlers = dict[type, Handler]
"""A handler per request type."""
Thrown = tuple[type[BaseException], ...]
"""Handler errors raised inside the generator (which may recover from them) rather than
out of the driver."""
T = TypeVar("T")


async def _run(
    gen: Generator[tuple[object, ...], object, T],
    handlers: Handlers,
    awaiting: bool,
    thrown: Thrown,
) -> T:
    """The one driver loop: answer each request with its handler (awaited if ``awaiting``);
    a handler's ``thrown`` exception is raised inside the generator."""
    reply: object = None
    error: BaseException | None = None
    while True:
        try:
            request = gen.throw(error) if error is not None else gen.send(reply)
        except StopIteration as done:
            return done.value
        reply, error = None, None
        try:
            reply = handlers[type(request)](*request)
            if awaiting and inspect.isawaitable(reply):
                reply = await reply
        except thrown as exc:
            error = exc


def drive(
    gen: Generator[tuple[object, ...], object, T], handlers: Handlers, thrown: Thrown = ()
) -> T:
    """Run ``gen`` to its return value with the synchronous ``handlers`` (one step)."""
    coro = _run(gen, handlers, False, thrown)
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise RuntimeError("a synchronous handler suspended")


async def adrive(
    gen: Generator[tuple[object, ...], object, T], handlers: Handlers, thrown: Thrown = ()
) -> T:
    """Run ``gen`` to its return value, awaiting the asynchronous ``handlers``."""
    return await _run(gen, handlers, True, thrown)
