"""The write protocol: plan, write a new version's chunks, swap the pointer, remove the old
version, and clean up what a lost race or a killed writer left behind.

For each document a writer

1. records the new version (``ver/`` record) before any of its chunks is written;
2. writes the chunks everywhere (vector store, lexical index) and the version's body;
3. swaps the document's pointer to the new version — readers keep only chunks of the
   pointer's version, so they see the old document or the new one, never a mix (with a
   bound filter, after checking that the pointers read right before still belong to it);
4. reads the pointer again: if another writer swapped after it, it *lost* and deletes its
   own version; otherwise it deletes the versions it replaced.

Steps 3 and 4 run under :attr:`Writer.swaps`, which a query that kept finding replaced
versions holds shared for its last attempt (in process), so that one reads a consistent
state.

Every write makes a new version id (the content fingerprint and a random suffix), so a
version that stopped being current never becomes current again: a cleanup that deletes it
cannot hit a document another worker has just written back (the same text again gets
another id), and a write that failed half-way is retried under fresh chunk ids. A cleanup
also re-reads the pointers right before it deletes, and spares the versions they name.

A version whose writer was killed or failed, or that slipped between two writers' reads,
keeps its ``ver/`` record: :meth:`Writer.vacuum` removes every non-current version found
there, and the pointers whose version is gone (a broken index: re-adding the document
writes it again).
"""

from __future__ import annotations

import logging
import secrets
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from langchain_core.documents import Document
from langchain_core.vectorstores import VectorStore
from langchain_text_splitters import TextSplitter

from langchain_rse.enrichment import index_text
from langchain_rse.filters import Filter
from langchain_rse.indexing.chunking import split_text, validate_documents
from langchain_rse.indexing.records import (
    DocBody,
    Pointer,
    VersionRecord,
    body_key,
    chunk_key,
    chunk_uuid,
    document_version,
    is_version_of,
    pointer_key,
    version_key,
)
from langchain_rse.indexing.recordstore import ReadWriteLock, RecordStore
from langchain_rse.indexing.steps import Plan, Prepared, Todo, check_owner
from langchain_rse.lexical import BM25Index, group_of
from langchain_rse.routing import DocumentRouter, LeadIndex

__all__ = ["LocalIndexes", "Writer", "delete_held"]

logger = logging.getLogger(__name__)

_SCALAR = (str, int, float, bool)
GENERATION_KEY = "meta/generation"
"""Record-store key of the token every write replaces (shared record stores only)."""


@dataclass
class LocalIndexes:
    """The in-process indexes of one index, which its :class:`Writer` keeps in step with the
    records: the BM25 index of the chunks and, when routing uses it, the built-in lead index
    of the documents (rebuilt from the records after a load), with the document version each
    lead reflects."""

    lexical: BM25Index
    leads: LeadIndex | None = None
    lead_versions: dict[str, str] = field(default_factory=dict)

    def forget_leads(self, doc_ids: Sequence[str]) -> None:
        """Forget the lead versions of removed documents."""
        for doc_id in doc_ids:
            self.lead_versions.pop(doc_id, None)


@dataclass
class Writer:
    """Writes document versions to every store of one index."""

    records: RecordStore
    vectorstore: VectorStore
    local: LocalIndexes
    lexical_store: VectorStore | None
    vs_lock: ReadWriteLock
    lock: threading.RLock = field(default_factory=threading.RLock)
    """Serialises this process's writers (plan to swap)."""
    shared: bool = False
    """The record store is shared with other processes: every write leaves a new
    generation token there, and the in-process indexes reload when the token is not the
    one they last read (:meth:`sync_local`), after this worker's own writes too."""
    swaps: ReadWriteLock = field(init=False)
    """Held exclusively from a pointer swap (or a pointer's removal) to the removal of the
    versions it replaced; a query that kept losing the race to replaces holds it shared for
    its last attempt, so that attempt reads one consistent state (in-process record stores:
    other processes' writers cannot be held off)."""
    _seen: bytes | None = field(default=None, init=False)
    """The generation the in-process indexes reflect (None: unknown)."""

    def __post_init__(self) -> None:
        self.swaps = ReadWriteLock(enabled=not self.shared)

    def _bump(self) -> None:
        """Leave a new generation token after a write.

        The next search reloads even after this worker's own write: a record store has
        no compare-and-set, so two workers' tokens can overwrite each other, and a token
        this worker wrote may hide another worker's write that landed between reading
        the old token and writing the new one. The reload adds only the other workers'
        changes (its cost: one read of every pointer)."""
        if self.shared:
            self.records.store.mset([(GENERATION_KEY, secrets.token_hex(8).encode())])

    def attach_leads(self, leads: LeadIndex | None) -> None:
        """Keep ``leads`` (the built-in document index, or None) in step with the records:
        reloaded with the lexical index, and filled now when it is new and empty."""
        self.local.leads = leads
        if leads is not None and not len(leads):
            self.local.lead_versions.clear()
            self.reload_local(lexical=False)

    def sync_local(self) -> None:
        """Before a search of an in-process index (BM25, leads) over a shared record store:
        one read of the generation token, and a reload when another worker wrote."""
        if not self.shared or (self.lexical_store is not None and self.local.leads is None):
            return
        current = self.records.store.mget([GENERATION_KEY])[0]
        if current == self._seen:
            return
        with self.lock:
            current = self.records.store.mget([GENERATION_KEY])[0]
            if current != self._seen:
                self.reload_local()
                self._seen = current

    def reload_local(self, lexical: bool = True) -> None:
        """Bring the in-process indexes in line with the record store's current versions:
        the BM25 index (unless a lexical store is used, or ``lexical=False``) and the
        document leads (when routing uses them) drop what is no longer current and add
        what is new (cost: the change, plus one read of every pointer)."""
        lexical = lexical and self.lexical_store is None
        if not lexical and self.local.leads is None:
            return
        started = time.perf_counter()
        ids = [k for k in self.records.store.yield_keys() if k.startswith("doc/")]
        raw = self.records.store.mget(ids) if ids else []
        pointers = [Pointer.from_bytes(r) for r in raw if r is not None]
        current = {group_of(chunk_key(p.doc_id, p.version, 0)): p for p in pointers if p.spans}
        new: dict[str, Pointer] = {}
        removed = 0
        if lexical:
            indexed = self.local.lexical.live_groups()
            removed = self.local.lexical.delete_groups(indexed - current.keys())
            new.update((g, p) for g, p in current.items() if g not in indexed)
        if self.local.leads is not None:
            seen = self.local.lead_versions
            live = {p.doc_id for p in pointers}
            gone = [d for d in seen if d not in live]
            self.local.leads.delete(gone)
            for d in gone:
                seen.pop(d)
            new.update((g, p) for g, p in current.items() if seen.get(p.doc_id) != p.version)
        keys: list[str] = []
        texts: list[str] = []
        groups: dict[str, dict[str, object]] = {}
        sources: list[Document] = []
        versions: dict[str, str] = {}
        for record, body in zip(new.values(), self._bodies(list(new.values()))):
            if body is None:
                continue  # replaced while we read: the next generation brings it
            sources.append(
                Document(page_content=body.text, id=record.doc_id, metadata=record.metadata)
            )
            versions[record.doc_id] = record.version
            if not lexical or group_of(chunk_key(record.doc_id, record.version, 0)) in indexed:
                continue
            for i, (start, end) in enumerate(record.spans):
                keys.append(chunk_key(record.doc_id, record.version, i))
                texts.append(index_text(body.contexts[i], body.text[start:end]))
            groups[group_of(chunk_key(record.doc_id, record.version, 0))] = record.metadata
        if lexical:
            self.local.lexical.add(keys, texts, groups)
        if self.local.leads is not None:
            self.local.leads.add_sources(sources)
            self.local.lead_versions.update(versions)
        logger.info(
            "in-process indexes caught up with the record store: %d chunks removed, "
            "%d added (%d documents) in %.2f s",
            removed,
            len(keys),
            len(sources),
            time.perf_counter() - started,
        )

    def _check_deletes(self) -> None:
        """Before a write that removes chunks: a ``ValueError`` (nothing written) when the
        vector store cannot remove them correctly (a FAISS index that cannot remove, or
        LangChain's ``FAISS`` over an IVF index: see
        :func:`~langchain_rse.integrations.faiss.check_deletes`)."""
        faiss = sys.modules.get("faiss")  # a FAISS index exists only once faiss is imported
        if faiss is not None and isinstance(getattr(self.vectorstore, "index", None), faiss.Index):
            from langchain_rse.integrations.faiss import check_deletes

            check_deletes(self.vectorstore)

    def _bodies(self, pointers: Sequence[Pointer]) -> list[DocBody | None]:
        raw = self.records.store.mget([body_key(p.doc_id, p.version) for p in pointers])
        return [DocBody.from_bytes(r) if r is not None else None for r in raw]

    def plan(
        self,
        documents: Sequence[Document],
        ids: Sequence[str] | None,
        *,
        splitter: TextSplitter,
        fingerprints: tuple[str, str],
        max_document_chars: int,
    ) -> Plan:
        """Validate, split and version (no writes); unchanged documents are skipped.

        Each new version's id is the content fingerprint and a random suffix (see the
        module docstring). A document is unchanged when its indexed version has the same
        fingerprint, no fallback contexts and its ``ver/`` record (else it is written again:
        the enricher's cache makes the good chunks free; a version whose records are gone
        is a broken index)."""
        plan = Plan(validate_documents(documents, ids, max_document_chars))
        olds = self.records.pointers(plan.doc_ids) if plan.doc_ids else []
        bases = [document_version(d.page_content, d.metadata, *fingerprints) for d in documents]
        same = [
            p for p, base in zip(olds, bases) if p is not None and is_version_of(p.version, base)
        ]
        recorded = self._recorded(same)
        for doc, doc_id, prev, base in zip(documents, plan.doc_ids, olds, bases):
            if prev is not None and is_version_of(prev.version, base):
                if not prev.fallbacks and prev.version in recorded:
                    logger.debug("document %r unchanged; not re-indexed", doc_id)
                    continue
                if not prev.fallbacks:  # replaced meanwhile, or a broken index
                    logger.info(
                        "document %r: its version %s has no record; writing it again",
                        doc_id,
                        prev.version,
                    )
            version = f"{base}.{secrets.token_hex(6)}"
            if prev is not None:  # its chunks will be removed
                self._check_deletes()
            chunks = split_text(doc.page_content, doc_id, splitter)
            if not chunks:
                logger.warning("document %r has no text; nothing indexed for it", doc_id)
                plan.removals.append(doc_id)
                continue
            replaces = prev.version if prev is not None else None
            plan.todo.append(Todo(doc, doc_id, version, chunks, replaces))
        return plan

    def _recorded(self, pointers: Sequence[Pointer]) -> set[str]:
        """The versions of ``pointers`` whose ``ver/`` record is in the record store."""
        keys = [version_key(p.doc_id, p.version) for p in pointers]
        found = self.records.store.mget(keys) if keys else []
        return {p.version for p, raw in zip(pointers, found) if raw is not None}

    def write(
        self,
        prepared: Sequence[Prepared],
        removals: Sequence[str] = (),
        router: DocumentRouter | None = None,
        batch_size: int = 256,
        progress: Callable[[int], None] | None = None,
        owner: Filter | None = None,
    ) -> None:
        """Write new versions (skipping any another writer already wrote), swap their
        pointers, remove what they replaced, and remove ``removals``; keep ``router``'s
        leads in step. ``progress`` is told the number of chunks of each batch written
        to the vector store (the stage that embeds them).

        With ``owner`` (a retriever's bound filter), every indexed document the write would
        replace or remove must pass it, checked when the write starts and again on the
        pointers read right before the swap (another tenant may have written the id since
        the caller checked): else a ``ValueError``, and this write's versions are removed."""
        with self.lock:
            pointers = self.records.pointers([p.record.doc_id for p in prepared])
            self._check_owner(owner, pointers, removals)
            pairs = [(p, o) for p, o in zip(prepared, pointers) if not p.written_meanwhile(o)]
            todo, planned = [p for p, _ in pairs], [o for _, o in pairs]
            if len(todo) < len(prepared):
                logger.debug("%d documents were written meanwhile", len(prepared) - len(todo))
            versions = [p.record.version_record() for p in todo]
            self.records.put([(version_key(v.doc_id, v.version), v) for v in versions])
            try:
                self._write_chunks(todo, batch_size, progress)
                self.records.put(
                    [(body_key(p.record.doc_id, p.record.version), p.body) for p in todo]
                )
            except Exception:
                self._discard(versions)
                raise
            if progress is not None and len(todo) < len(prepared):
                progress(sum(len(p.chunks) for p in prepared) - sum(len(p.chunks) for p in todo))
            with self.swaps.write():
                self._swap(todo, planned, removals, owner, versions)
            if todo:
                n = sum(len(p.chunks) for p in todo)
                logger.info("indexed %d documents (%d chunks)", len(todo), n)
            self._bump()
            if router is not None:
                sources = [
                    Document(
                        page_content=p.body.text, id=p.record.doc_id, metadata=p.record.metadata
                    )
                    for p in todo
                ]
                router.sync_leads(sources, removals)
                if router.retriever is self.local.leads:
                    self.local.lead_versions.update(
                        (p.record.doc_id, p.record.version) for p in todo
                    )
                    self.local.forget_leads(removals)

    def _swap(
        self,
        todo: Sequence[Prepared],
        planned: Sequence[Pointer | None],
        removals: Sequence[str],
        owner: Filter | None,
        versions: Sequence[VersionRecord],
    ) -> None:
        """Swap the pointers of ``todo`` (written) after the owner check, remove what they
        replaced (or, having lost a race, their own versions), and remove ``removals``."""
        ids = [p.record.doc_id for p in todo]
        before = self.records.pointers(ids)
        try:
            self._check_owner(owner, before, removals)
        except ValueError:
            self._discard(versions)
            raise
        self.records.put([(pointer_key(p.record.doc_id), p.record) for p in todo])
        after = self.records.pointers(ids)
        stale: list[VersionRecord] = []
        for p, old, seen, now in zip(todo, planned, before, after):
            mine = p.record.version
            if now is None or now.version != mine:  # lost the race: another writer won
                logger.info(
                    "document %r changed meanwhile; dropping version %s", p.record.doc_id, mine
                )
                stale.append(p.record.version_record())
                continue
            replaced = {r.version: r for r in (old, seen) if r is not None and r.version != mine}
            stale += [r.version_record() for r in replaced.values()]
        self._remove_versions(stale)
        self._delete(removals)

    def _check_owner(
        self, owner: Filter | None, pointers: Sequence[Pointer | None], removals: Sequence[str]
    ) -> None:
        """:func:`~langchain_rse.indexing.steps.check_owner` of ``pointers`` and the current
        pointers of ``removals``."""
        if owner is not None:
            removed = self.records.pointers(list(removals)) if removals else []
            check_owner(owner, [*pointers, *removed])

    def _discard(self, versions: Sequence[VersionRecord]) -> None:
        """After a write failed half-way: remove what it wrote of ``versions``, or leave
        them (recorded) to :meth:`vacuum` if that fails too."""
        try:
            self._remove_versions(versions)
        except Exception:
            logger.warning(
                "could not remove the %d versions of a failed write; vacuum() removes them later",
                len(versions),
                exc_info=True,
            )

    def _write_chunks(
        self,
        prepared: Sequence[Prepared],
        batch_size: int,
        progress: Callable[[int], None] | None = None,
    ) -> None:
        docs: list[Document] = []
        keys: list[str] = []

        def flush() -> None:
            if docs:
                ids = [chunk_uuid(k) for k in keys[-len(docs) :]]
                with self.vs_lock.write():
                    self.vectorstore.add_documents(docs, ids=ids)
                if self.lexical_store is not None:
                    self.lexical_store.add_documents(docs, ids=ids)
                if progress is not None:
                    progress(len(docs))
                docs.clear()

        texts: list[str] = []
        groups: dict[str, dict[str, object]] = {}
        for p in prepared:
            m = p.record
            # The source's scalar metadata goes on every chunk, so stores can filter on it.
            shared = {k: v for k, v in m.metadata.items() if isinstance(v, _SCALAR)}
            groups[group_of(chunk_key(m.doc_id, m.version, 0))] = dict(m.metadata)
            for chunk, ctx in zip(p.chunks, p.body.contexts):
                key = chunk_key(m.doc_id, m.version, chunk.chunk_index)
                text = index_text(ctx, chunk.text)
                metadata = {
                    **shared,
                    "doc_id": m.doc_id,
                    "doc_version": m.version,
                    "chunk_index": chunk.chunk_index,
                    "start_index": chunk.start_index,
                    "end_index": chunk.end_index,
                    "enrichment": ctx.method,
                }
                docs.append(Document(page_content=text, id=chunk_uuid(key), metadata=metadata))
                keys.append(key)
                texts.append(text)
                if len(docs) >= batch_size:
                    flush()
        flush()
        if self.lexical_store is None:
            self.local.lexical.add(keys, texts, groups)

    def _remove_versions(self, versions: Sequence[VersionRecord]) -> None:
        """Delete these versions' chunks everywhere, then their bodies and records; the
        versions the pointers name now (read right before) are spared. Chunks a store
        does not hold are skipped (a write cut short)."""
        if not versions:
            return
        pointers = self.records.pointers(list(dict.fromkeys(v.doc_id for v in versions)))
        current = {(p.doc_id, p.version) for p in pointers if p is not None}
        spared = [v for v in versions if (v.doc_id, v.version) in current]
        if spared:
            logger.warning(
                "not removing %d versions that are current: %s",
                len(spared),
                ", ".join(f"{v.doc_id!r} {v.version}" for v in spared),
            )
            versions = [v for v in versions if (v.doc_id, v.version) not in current]
        keys = [key for v in versions for key in v.chunk_keys()]
        self.local.lexical.delete(keys)
        if keys:
            ids = [chunk_uuid(k) for k in keys]
            with self.vs_lock.write():
                done = [delete_held(self.vectorstore, ids)]
            if self.lexical_store is not None:
                done.append(delete_held(self.lexical_store, ids))
            if False in done:  # some stores report a failed delete instead of raising
                raise RuntimeError(
                    f"a store failed to delete {len(ids)} chunks; they stay recorded, "
                    "so vacuum() removes them later"
                )
        self.records.delete([body_key(v.doc_id, v.version) for v in versions])
        self.records.delete([version_key(v.doc_id, v.version) for v in versions])

    def _delete(self, doc_ids: Sequence[str]) -> list[str]:
        doc_ids = list(dict.fromkeys(doc_ids))  # a store may refuse an id named twice
        if not doc_ids:
            return []
        pointers = self.records.pointers(list(doc_ids))
        found = [d for d, p in zip(doc_ids, pointers) if p is not None]
        self.records.delete([pointer_key(d) for d in found])  # readers stop seeing them
        # Only the current versions: another worker's version being written is left to
        # its writer (which then finds the pointer gone and drops it) or to vacuum().
        self._remove_versions([p.version_record() for p in pointers if p is not None])
        return found

    def delete(self, doc_ids: Sequence[str], router: DocumentRouter | None = None) -> list[str]:
        """Remove documents everywhere; returns the ids that were indexed."""
        self._check_deletes()
        with self.lock:
            with self.swaps.write():
                found = self._delete(doc_ids)
            self._bump()
            if router is not None:
                router.sync_leads((), found)
                if router.retriever is self.local.leads:
                    self.local.forget_leads(found)
        return found

    def vacuum(self, min_age_s: float = 0.0, router: DocumentRouter | None = None) -> int:
        """Remove every version that is not its document's current one and was recorded
        at least ``min_age_s`` seconds ago (chunks left by a killed or failed writer, or a
        lost race), and every pointer whose version lost its body or record (a broken
        index: the document is gone until it is added again); returns how many versions
        were removed. A version that cannot be removed is logged and left for the next
        vacuum; the others are removed. With several writers, pass a ``min_age_s`` longer
        than any write takes, so versions being written are spared."""
        self._check_deletes()
        with self.lock:
            store = self.records.store
            docs = [k for k in store.yield_keys() if k.startswith("doc/")]
            pointers = [Pointer.from_bytes(r) for r in store.mget(docs) if r is not None]
            keys = set(store.yield_keys())  # after the pointers: their versions were written
            broken = [
                p
                for p in pointers
                if body_key(p.doc_id, p.version) not in keys
                or version_key(p.doc_id, p.version) not in keys
            ]
            if broken:
                self._drop_broken(broken, router)
            versions = self.records.versions()
            current = dict(
                zip(
                    (v.doc_id for v in versions),
                    self.records.pointers([v.doc_id for v in versions]),
                )
            )
            now = time.time()
            stale = [
                v
                for v in versions
                if (c := current.get(v.doc_id)) is None or c.version != v.version
                if now - v.written_at >= min_age_s
            ]
            listed = {(v.doc_id, v.version) for v in stale}
            stale += [p.version_record() for p in broken if (p.doc_id, p.version) not in listed]
            removed = self._remove_each(stale)
            if broken:
                self._bump()
        if removed:
            logger.info("vacuum removed %d stale document versions", removed)
        return removed

    def _drop_broken(self, broken: list[Pointer], router: DocumentRouter | None) -> None:
        """Delete the pointers of ``broken`` (versions whose body or record is gone) that
        still name them."""
        now = self.records.pointers([p.doc_id for p in broken])
        gone = [p.doc_id for p, n in zip(broken, now) if n is not None and n.version == p.version]
        if not gone:
            return
        logger.warning(
            "vacuum: %d documents named a version whose records are gone; "
            "they are removed (add them again): %s",
            len(gone),
            ", ".join(map(repr, gone)),
        )
        self.records.delete([pointer_key(d) for d in gone])
        if router is not None:
            router.sync_leads((), gone)
            if router.retriever is self.local.leads:
                self.local.forget_leads(gone)

    def _remove_each(self, versions: list[VersionRecord]) -> int:
        """:meth:`_remove_versions`, one version at a time when the whole batch fails:
        returns how many were removed (failures are logged and stay recorded)."""
        try:
            self._remove_versions(versions)
            return len(versions)
        except Exception:
            if len(versions) == 1:
                logger.warning(
                    "vacuum could not remove version %s of %r; the next vacuum tries again",
                    versions[0].version,
                    versions[0].doc_id,
                    exc_info=True,
                )
                return 0
        return sum(self._remove_each([v]) for v in versions)


def delete_held(store: VectorStore, ids: list[str]) -> bool | None:
    """``store.delete(ids=ids)``, of the ids the store holds: LangChain's FAISS deletes
    nothing and raises when one is missing (chunks of a write cut short, or removed
    already), so there the ids it holds are looked up and deleted."""
    try:
        return store.delete(ids=ids)
    except ValueError:
        try:
            held = {d.id for d in store.get_by_ids(ids)}
        except NotImplementedError:
            raise
        present = [i for i in ids if i in held]
        if len(present) == len(ids):
            raise
        logger.debug(
            "%d of %d chunks to delete were not in the store", len(ids) - len(present), len(ids)
        )
        return store.delete(ids=present) if present else True
