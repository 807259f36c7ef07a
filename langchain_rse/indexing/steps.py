"""``add_documents`` as a sans-I/O generator (:func:`indexing`, driven like the query path
by :func:`~langchain_rse.driver.drive`), its handlers (:func:`index_steps`) and the
progress of each stage.

The generator asks for a :class:`Plan` (documents checked, split and versioned by
:meth:`~langchain_rse.indexing.writer.Writer.plan`), then each document's contexts
(:class:`Enrich`), then each group of about :data:`WRITE_GROUP_CHUNKS` chunks is written
(:class:`WriteGroup`, by :meth:`~langchain_rse.indexing.writer.Writer.write`).

**Progress.** One display for the long part of indexing: the chunks embedded and written,
with the chunks enriched beside them — a tqdm bar on a terminal, plain lines elsewhere.

``show=True`` draws a tqdm bar on stderr at once; ``show=None`` (the retriever's default)
draws one when stderr is a terminal and otherwise writes a line every ``interval`` seconds
(from a timer thread, so a slow batch does not delay it) with the same figures — done,
total, enriched, rate, ETA — so a job log shows that indexing is alive. With ``None``, work
done within :data:`PROGRESS_DELAY_S` shows nothing at all (a service adding a document per
request prints nothing). Work expected to take :data:`LONG_WORK_S` or more is announced
after its first batch with the time it will take at that rate. The lines go to stderr, or
to the ``langchain_rse.progress`` logger (level INFO) when the application has set up
logging that shows it (a handler, INFO enabled), so they need no configuration.
``show=False`` reports nothing.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import sys
import threading
import time
from collections.abc import Callable, Coroutine, Generator, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from types import TracebackType
from typing import Generic, NamedTuple, Protocol, TypeVar, cast

from langchain_core.documents import Document
from langchain_text_splitters import TextSplitter
from tqdm.auto import tqdm

from langchain_rse.driver import Handler, Handlers
from langchain_rse.enrichment import BaseEnricher, ChunkContext
from langchain_rse.filters import Filter, matches, parse
from langchain_rse.indexing.chunking import Chunk, doc_id_for, make_splitter
from langchain_rse.indexing.records import (
    Contexts,
    DocBody,
    Pointer,
    Spans,
    is_version_of,
    splitter_fingerprint,
)
from langchain_rse.indexing.recordstore import RecordStore
from langchain_rse.indexing.sections import line_headings

__all__ = [
    "INDEX_BATCH_SIZE",
    "WRITE_GROUP_CHUNKS",
    "check_owner",
    "check_writable",
    "Plan",
    "Prepared",
    "Progress",
    "Todo",
    "index_steps",
    "indexing",
    "progress_mode",
]


R = TypeVar("R")
R_co = TypeVar("R_co", covariant=True)
R_contra = TypeVar("R_contra", contravariant=True)


@dataclass(frozen=True)
class WriteSettings(Generic[R_co]):
    """What a write reads from the retriever's settings
    (:class:`~langchain_rse.retriever.RSERetriever` builds it); ``R_co``: its router's type."""

    filter: Mapping[str, object] | None
    show_progress: bool | None
    enricher: BaseEnricher
    splitter: TextSplitter | None
    chunk_size: int
    max_document_chars: int
    router: R_co


class GroupWriter(Protocol[R_contra]):
    """What a write asks of the index's writer (:class:`~langchain_rse.indexing.writer.Writer`)."""

    def plan(
        self,
        documents: Sequence[Document],
        ids: Sequence[str] | None,
        *,
        splitter: TextSplitter,
        fingerprints: tuple[str, str],
        max_document_chars: int,
    ) -> Plan: ...

    def write(
        self,
        prepared: Sequence[Prepared],
        removals: Sequence[str],
        router: R_contra,
        batch_size: int,
        progress: Callable[[int], None] | None,
        owner: Filter | None,
    ) -> None: ...


def check_writable(
    bound: Mapping[str, object] | None,
    records: RecordStore,
    documents: Sequence[Document],
    ids: Sequence[str] | None,
) -> None:
    """With a retriever's ``bound`` filter: a ``ValueError`` naming the first document it
    rejects, or whose id an indexed document (in ``records``) it rejects holds (nothing is
    written)."""
    f = parse(bound) if bound else None
    if f is None:
        return
    if ids is not None and len(ids) != len(documents):
        return  # add_documents' own validation says so
    named = [
        (str(ids[n]) if ids is not None else doc_id_for(doc), doc)
        for n, doc in enumerate(documents)
        if isinstance(doc, Document)  # anything else: the validation's error
    ]
    for doc_id, doc in named:
        if not matches(f, {**doc.metadata, "doc_id": doc_id}):
            raise ValueError(
                f"document {doc_id!r} does not pass this retriever's filter "
                f"{bound!r}; a retriever bound to a filter writes only documents "
                "that pass it"
            )
    if named:
        check_owner(f, records.pointers([doc_id for doc_id, _ in named]))


def check_owner(f: Filter | None, held: Sequence[Pointer | None]) -> None:
    """A ``ValueError`` naming the first of the indexed documents ``held`` (pointers; None:
    not indexed) that the bound filter ``f`` rejects: a write must not replace or remove it."""
    if f is None:
        return
    for record in held:
        if record is not None and not matches(f, {**record.metadata, "doc_id": record.doc_id}):
            raise ValueError(
                f"document id {record.doc_id!r} is indexed for a document outside this "
                "retriever's filter; it cannot be replaced from here (use another id)"
            )


@dataclass
class Todo:
    """A document to (re)index, split, before enrichment."""

    doc: Document
    doc_id: str
    version: str
    chunks: list[Chunk]
    replaces: str | None = None
    """The version the plan found current (None: the document was not indexed)."""

    @property
    def enrich_args(self) -> tuple[str, str, dict[str, object], list[Chunk]]:
        """The arguments of ``BaseEnricher.enrich`` / ``aenrich`` for this document."""
        return self.doc_id, self.doc.page_content, self.doc.metadata, self.chunks


@dataclass
class Plan:
    doc_ids: list[str]
    """Every document's id, in input order (what ``add_documents`` returns)."""
    todo: list[Todo] = field(default_factory=list)
    removals: list[str] = field(default_factory=list)
    """Documents that became empty: their indexed version is removed."""

    @property
    def chunks(self) -> int:
        """Chunks to enrich and write."""
        return sum(len(t.chunks) for t in self.todo)

    def groups(self, max_chunks: int) -> Iterator[list[Todo]]:
        """The documents to do in groups of about ``max_chunks`` chunks (whole documents;
        at least one group, possibly empty), so only one group's contexts, index texts and
        vectors are in memory at a time."""
        group: list[Todo] = []
        size = 0
        for todo in self.todo:
            if group and size + len(todo.chunks) > max_chunks:
                yield group
                group, size = [], 0
            group.append(todo)
            size += len(todo.chunks)
        if group or not self.todo:
            yield group


@dataclass
class Prepared:
    """A new document version, ready to write."""

    record: Pointer
    body: DocBody
    chunks: list[Chunk]
    replaces: str | None = None
    """The version the plan found current."""

    @classmethod
    def of(cls, todo: Todo, contexts: list[ChunkContext] | None, enricher: object) -> Prepared:
        chunks = todo.chunks
        contexts = contexts if contexts is not None else [ChunkContext("", "none")] * len(chunks)
        if len(contexts) != len(chunks):
            raise RuntimeError(
                f"{enricher!r} returned {len(contexts)} contexts for {len(chunks)} chunks"
            )
        record = Pointer(
            doc_id=todo.doc_id,
            version=todo.version,
            metadata=dict(todo.doc.metadata),
            spans=Spans((c.start_index, c.end_index) for c in chunks),
            fallbacks=sum(ctx.method == "fallback" for ctx in contexts),
            headed=bool(line_headings(todo.doc.page_content)),
        )
        body = DocBody(text=todo.doc.page_content, contexts=Contexts(contexts))
        return cls(record, body, chunks, todo.replaces)

    def written_meanwhile(self, now: Pointer | None) -> bool:
        """Whether ``now`` (the pointer when the write starts) is another writer's version
        of the same content, written since the plan."""
        base = self.record.version.split(".")[0]
        return now is not None and now.version != self.replaces and is_version_of(now.version, base)


class MakePlan(NamedTuple):
    """Validate and split the documents → the :class:`Plan`."""


class Enrich(NamedTuple):
    """One document's chunk contexts → ``list[ChunkContext]``."""

    todo: Todo


class WriteGroup(NamedTuple):
    """Write a group of prepared documents (and the removals, with the first) → None."""

    prepared: list[Prepared]
    removals: list[str]
    progress: Callable[[int], None]


def indexing(
    group_chunks: int, show_progress: bool | None, enricher: BaseEnricher
) -> Generator[tuple[object, ...], object, list[str]]:
    """``add_documents`` as a sans-I/O generator (driven by
    :func:`~langchain_rse.driver.drive`): :class:`MakePlan`, then per document
    :class:`Enrich`, per group :class:`WriteGroup`. Documents go in groups of about
    ``group_chunks`` chunks, enriched then written, so memory holds one group's contexts,
    index texts and vectors; one progress display counts the chunks written, and beside
    them the chunks enriched. Returns every document's id.
    """
    plan = cast(Plan, (yield MakePlan()))
    with Progress("embedding + writing", plan.chunks, show=show_progress) as progress:
        for n, group in enumerate(plan.groups(group_chunks)):
            prepared = []
            for todo in group:
                contexts = cast("list[ChunkContext] | None", (yield Enrich(todo)))
                prepared.append(Prepared.of(todo, contexts, enricher))
                progress.prepared(len(todo.chunks))
            yield WriteGroup(prepared, plan.removals if n == 0 else [], progress.update)
    return plan.doc_ids


WRITE_GROUP_CHUNKS = 2048
"""Chunks enriched and written together by ``add_documents`` (memory: one group at a time)."""
INDEX_BATCH_SIZE = 256
"""Chunks written to the vector store per call."""


def index_steps(
    r: WriteSettings[R],
    writer: GroupWriter[R],
    documents: Sequence[Document],
    ids: Sequence[str] | None,
    asynchronous: bool,
) -> tuple[Generator[tuple[object, ...], object, list[str]], Handlers]:
    """:func:`indexing` of ``documents`` with retriever ``r``'s settings by its ``writer``,
    and its handlers: plan (with ``r``'s splitter and fingerprints), enrich (natively async
    on the async path) and write (in a thread there, under the writer's lock, re-checking
    what another writer wrote and, with a bound filter, that every document it replaces or
    removes is the filter's)."""
    steps = indexing(max(WRITE_GROUP_CHUNKS, INDEX_BATCH_SIZE), r.show_progress, r.enricher)
    enricher = r.enricher

    def plan() -> Plan:
        splitter = r.splitter or make_splitter(r.chunk_size)
        fingerprints = (splitter_fingerprint(r.splitter, r.chunk_size), enricher.fingerprint())
        return writer.plan(
            documents,
            ids,
            splitter=splitter,
            fingerprints=fingerprints,
            max_document_chars=r.max_document_chars,
        )

    owner = parse(r.filter) if r.filter else None

    def write(
        prepared: list[Prepared], removals: list[str], progress: Callable[[int], None]
    ) -> None:
        writer.write(prepared, removals, r.router, INDEX_BATCH_SIZE, progress, owner)

    def enrich(todo: Todo) -> list[ChunkContext]:
        return enricher.enrich(*todo.enrich_args)

    def aenrich(todo: Todo) -> Coroutine[object, object, list[ChunkContext]]:
        return enricher.aenrich(*todo.enrich_args)

    async def aplan() -> Plan:
        return await asyncio.to_thread(plan)

    async def awrite(
        prepared: list[Prepared], removals: list[str], progress: Callable[[int], None]
    ) -> None:
        await asyncio.to_thread(write, prepared, removals, progress)

    if not asynchronous:
        handlers: Handlers = {MakePlan: plan, Enrich: enrich, WriteGroup: write}
        return steps, {kind: _closing(steps, h) for kind, h in handlers.items()}
    ahandlers: Handlers = {MakePlan: aplan, Enrich: aenrich, WriteGroup: awrite}
    return steps, {kind: _aclosing(steps, h) for kind, h in ahandlers.items()}


def _closing(steps: Generator[object, object, object], handler: Handler) -> Handler:
    """``handler``, closing the suspended ``steps`` when it raises (Ctrl-C included), so the
    progress display ends before the caller reports the error, not when the traceback is
    collected."""

    def run(*args: object) -> object:
        try:
            return handler(*args)
        except BaseException:
            steps.close()
            raise

    return run


def _aclosing(steps: Generator[object, object, object], handler: Handler) -> Handler:
    """:func:`_closing` for an asynchronous handler."""

    async def run(*args: object) -> object:
        try:
            reply = handler(*args)
            return await reply if inspect.isawaitable(reply) else reply
        except BaseException:
            steps.close()
            raise

    return run


# ---------------------------------------------------------------- progress

logger = logging.getLogger("langchain_rse.progress")  # the documented name, kept

LOG_INTERVAL_S = 10.0
"""Seconds between two progress lines when stderr is not a terminal."""
LONG_WORK_S = 30.0
"""Work expected to take this long or longer is announced with its expected time."""
PROGRESS_DELAY_S = 2.0
"""With ``show_progress=None``, work done within this many seconds shows nothing (tqdm's
``delay``): a service adding one document per request prints no progress."""


def progress_mode(show: bool | None) -> str:
    """``"bar"``, ``"log"`` or ``"off"`` for a ``show_progress`` setting."""
    if show is None:
        return "bar" if sys.stderr.isatty() else "log"
    return "bar" if show else "off"


def _duration(seconds: float) -> str:
    seconds = int(round(seconds))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


def about(seconds: float) -> str:
    """A rough duration for people: ``about 40 s``, ``about 12 min``, ``about 2 h 5 min``."""
    if seconds < 90:
        return f"about {int(round(seconds))} s"
    minutes = int(round(seconds / 60))
    if minutes < 90:
        return f"about {minutes} min"
    return f"about {minutes // 60} h {minutes % 60} min"


def _emit(text: str) -> None:
    """One progress line: on the logger when logging shows it, else on stderr."""
    if logger.isEnabledFor(logging.INFO) and logger.hasHandlers():
        logger.info("%s", text)
    else:
        print(text, file=sys.stderr, flush=True)


class Progress:
    """One stage's progress, counted in ``unit`` (e.g. chunks) out of ``total``, with an
    optional count of the units prepared ahead of it (:meth:`prepared`: chunks enriched).

    On a terminal, one tqdm bar; elsewhere a line every ``interval`` seconds from a timer
    thread, whether or not a batch finished in between. With ``show=None`` nothing appears
    for work done within ``delay`` seconds; ``show=True`` shows it at once.
    """

    def __init__(
        self,
        desc: str,
        total: int,
        unit: str = "chunk",
        show: bool | None = None,
        interval: float | None = None,
        delay: float | None = None,
        prepared_desc: str = "enriched",
    ) -> None:
        self.desc, self.total, self.unit, self.prepared_desc = desc, total, unit, prepared_desc
        self.interval = LOG_INTERVAL_S if interval is None else interval
        self.delay = 0.0 if show else PROGRESS_DELAY_S if delay is None else delay
        self.mode = progress_mode(show) if total > 0 else "off"
        self.done = 0
        self.ahead: int | None = None
        """Units prepared for this stage (e.g. enriched); ``None`` until counted."""
        self._started = time.monotonic()
        self._shown = False  # whether a line was written (the final line only follows one)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._bar = (
            tqdm(total=total, desc=desc, unit=unit, dynamic_ncols=True, delay=self.delay)
            if self.mode == "bar"
            else None
        )
        self._ticker: threading.Thread | None = None
        if self.mode == "log":
            self._ticker = threading.Thread(
                target=self._tick, name="langchain-rse-progress", daemon=True
            )
            self._ticker.start()

    def line(self) -> str:
        """The figures as one line: ``embedding: 120/480 chunks (25%), enriched 480, 6.1
        chunks/s, elapsed 0:20, ETA 0:59``."""
        elapsed = max(time.monotonic() - self._started, 1e-9)
        rate = self.done / elapsed
        eta = f"ETA {_duration((self.total - self.done) / rate)}" if rate > 0 else "ETA ?"
        ahead = "" if self.ahead is None else f", {self.prepared_desc} {self.ahead}"
        return (
            f"{self.desc}: {self.done}/{self.total} {self.unit}s ({self.done / self.total:.0%})"
            f"{ahead}, {rate:.1f} {self.unit}s/s, elapsed {_duration(elapsed)}, {eta}"
        )

    def _say(self, text: str) -> None:
        with self._lock:
            if self.mode == "log":
                self._shown = True
                _emit(text)

    def _tick(self) -> None:
        """Off a terminal: a line every ``interval`` seconds until the stage ends (the
        first after ``delay`` at the earliest)."""
        if self._stop.wait(max(self.delay - self.interval, 0.0)):
            return
        while not self._stop.wait(self.interval):
            self._say(self.line())

    def _due(self) -> bool:
        return time.monotonic() - self._started >= self.delay

    def prepared(self, n: int) -> None:
        """Count ``n`` more units prepared for this stage (shown beside the bar's count)."""
        self.ahead = (self.ahead or 0) + n
        if self._bar is not None:
            self._bar.set_postfix_str(f"{self.prepared_desc} {self.ahead}", refresh=False)
            if self._due():
                self._bar.refresh()

    def update(self, n: int) -> None:
        """Count ``n`` more units done."""
        self.done += n
        if self._bar is not None:
            self._bar.update(n)
        elif self.mode == "log" and self.done == n and n < self.total:
            now = time.monotonic()  # the first batch gives the rate
            expected = self.total * (now - self._started) / n
            if expected >= LONG_WORK_S:
                rate = f"{n / (now - self._started):.1f} {self.unit}s/s"
                self._say(
                    f"{self.desc}: {self.total:,} {self.unit}s, {about(expected)} at the "
                    f"measured rate of {rate}"
                )

    def close(self, finished: bool = True) -> None:
        """End the stage: close the bar (left on screen only if it was drawn), or log the
        final figures (``(done)``) when lines were logged and the stage ``finished``; a
        stage cut short by an error or Ctrl-C logs nothing more."""
        self._stop.set()
        if self._ticker is not None and self._ticker is not threading.current_thread():
            self._ticker.join()
        if self._bar is not None:
            self._bar.close()
            self._bar = None
        elif self.mode == "log" and self._shown and finished:
            self._say(f"{self.line()} (done)")
        self.mode = "off"

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close(finished=exc_type is None)
