"""Property: a query during replaces returns the old or the new version of a document,
never nothing and never a mix (issue 54, item 15, and the Guarantees row on replaces).

A one-document index over a record store that, when the query reads a pointer or a body,
first lets another thread replace the document (the next of the generated versions) and
waits for it, so every read the schedule picks comes right after a replace: the query's
search found a version that is no longer current. A replace the query holds off (its last
attempt reads one consistent state) is waited for at most :data:`PATIENCE` seconds, then
finishes after the query.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence

from hypothesis import assume, example, given, settings
from hypothesis import strategies as st
from langchain_core.documents import Document
from langchain_core.stores import InMemoryByteStore
from langchain_core.vectorstores import InMemoryVectorStore

from helpers import HashingEmbeddings
from langchain_rse import NoEnricher, RSERetriever

PATIENCE = 0.5
"""Seconds a read waits for a replace that the query itself holds off."""
QUERY = "payment schedule"
WORDS = ("escrow", "notice", "royalty", "naïve", "日本語", "🙂", "Straße", "audit")
GAPS = (" ", "\n\n", "   ", "\n\n\n\n", " \t ", "\u3000")


class ReplaceOnRead(InMemoryByteStore):
    """An in-process record store that, before a query's read of a pointer (``doc/``) or
    a body (``body/``) that ``due`` picks, runs ``replace`` in another thread and waits
    for it (at most :data:`PATIENCE` seconds)."""

    def __init__(self) -> None:
        super().__init__()
        self.replace: Callable[[], None] | None = None
        self.due: Callable[[str], bool] = lambda kind: True
        self.replacers: list[threading.Thread] = []
        self._writing = threading.local()

    def mget(self, keys: Sequence[str]) -> list[bytes | None]:
        kind = keys[0].split("/")[0] if keys else ""
        replace = self.replace
        if (
            replace is not None
            and kind in ("doc", "body")
            and not self._writer()
            and self.due(kind)
        ):
            thread = threading.Thread(target=self._run, args=(replace,), daemon=True)
            self.replacers.append(thread)
            thread.start()
            thread.join(PATIENCE)
        return super().mget(keys)

    def _writer(self) -> bool:
        return getattr(self._writing, "on", False)

    def _run(self, replace: Callable[[], None]) -> None:
        self._writing.on = True
        replace()

    def finish(self) -> None:
        """Stop replacing; wait for the replaces under way."""
        self.replace = None
        for thread in self.replacers:
            thread.join(60)


class Flipping:
    """A one-document index whose document a replace turns into its next version."""

    def __init__(self, texts: list[str]) -> None:
        self.texts = texts
        self.store = ReplaceOnRead()
        self.r = RSERetriever(
            vectorstore=InMemoryVectorStore(HashingEmbeddings()),
            record_store=self.store,
            enricher=NoEnricher(),
            chunk_size=120,
            show_progress=False,
        )
        self.current = 0
        self.started: list[int] = [0]  # versions, in the order their replaces began
        self.done = 1  # replaces finished (the first add counts as one)
        self.lock = threading.Lock()
        self.r.add_documents([Document(texts[0], id="d")])

    def replace(self) -> None:
        with self.lock:
            self.current = (self.current + 1) % len(self.texts)
            self.started.append(self.current)
            version = self.current
        self.r.add_documents([Document(self.texts[version], id="d")])
        with self.lock:
            self.done += 1

    def start(self) -> int:
        """Before a query: the index of the version current then, in :attr:`started`."""
        with self.lock:
            return self.done - 1

    def allowed(self, since: int) -> list[str]:
        """The texts current at some point since ``since`` (from :meth:`start`)."""
        with self.lock:
            return [self.texts[v] for v in self.started[since:]]


def one_version(found: list[Document], texts: list[str]) -> bool:
    """Whether every result is an exact slice of one and the same text of ``texts``."""
    return any(
        all(d.page_content == t[d.metadata["start_index"] : d.metadata["end_index"]] for d in found)
        for t in texts
    )


A = f"The payment schedule is net thirty days.{GAPS[1]}" * 4
B = f"The payment schedule is net sixty days, paid in escrow. {GAPS[3]}" * 4


# ---------------------------------------------------------------- item 15, by hand


def test_a_query_replaced_under_at_every_read_still_finds_the_document() -> None:
    """Each of the query's pointer reads comes right after a replace: its search always
    found a version that is gone. It used to search three times and return nothing."""
    index = Flipping([A, B])
    index.store.replace = index.replace
    since = index.start()
    for mode in ("segments", "chunks"):
        found = index.r.invoke(QUERY, mode=mode)
        assert found and one_version(found, index.allowed(since)), mode
    index.store.finish()


async def test_an_async_query_replaced_under_at_every_read_still_finds_the_document() -> None:
    index = Flipping([A, B])
    index.store.replace = index.replace
    since = index.start()
    found = await index.r.ainvoke(QUERY)
    assert found and one_version(found, index.allowed(since))
    await asyncio.to_thread(index.store.finish)


# ---------------------------------------------------------------- the property


@st.composite
def versions(draw: st.DrawFn) -> list[str]:
    """2-3 texts of one document: repeated passages with whitespace runs and unicode,
    each naming the payment schedule."""
    out = []
    for _ in range(draw(st.integers(2, 3))):
        pool = [
            " ".join(["payment", "schedule", *draw(st.lists(st.sampled_from(WORDS), max_size=8))])
            for _ in range(draw(st.integers(1, 3)))
        ]
        order = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=6))
        out.append("".join(pool[i] + draw(st.sampled_from(GAPS)) for i in order))
    assume(len(set(out)) == len(out))
    return out


@settings(max_examples=25)
@example(texts=[A, B], schedule=[True] * 8, mode="segments")
@given(
    texts=versions(),
    schedule=st.lists(st.booleans(), max_size=12),
    mode=st.sampled_from(["segments", "chunks"]),
)
def test_a_query_during_replaces_returns_the_old_or_the_new_version(
    texts: list[str], schedule: list[bool], mode: str
) -> None:
    """The schedule says, read by read (pointers and bodies), whether a replace comes
    first; a read past its end has none."""
    index = Flipping(texts)
    for t in texts:  # every version alone is found (else there is nothing to promise)
        index.r.add_documents([Document(t, id="d")])
        assume(index.r.invoke(QUERY, mode=mode))
    index.r.add_documents([Document(texts[0], id="d")])
    picks = iter(schedule)
    index.store.due = lambda kind: next(picks, False)
    index.store.replace = index.replace
    since = index.start()
    found = index.r.invoke(QUERY, mode=mode)
    index.store.finish()
    assert found, "nothing found during a replace"
    assert one_version(found, index.allowed(since)), "not one version current during the query"
