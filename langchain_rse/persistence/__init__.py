"""Saving and loading an index directory: JSON, NumPy and FAISS files, never pickle.

Layout of an index directory::

    rse_index.json            manifest: format name and version, settings, file list
    lexical.<gen>.json        BM25 chunk keys, vocabulary and group metadata
    lexical_tf.<gen>.npz      BM25 term ids and frequencies per chunk (NumPy, no pickle)
    record_store.<gen>.jsonl  the record store's records (only when it is in memory)
    vectors.<gen>.json        vector-store documents (+ vectors for InMemoryVectorStore)
    vectors.<gen>.faiss       FAISS index (when the vector store is FAISS)

Every data file of one save carries the same generation ``<gen>``, and its size and SHA-256
in the manifest: a load opens only regular files (non-blocking, so a named pipe cannot hold
it), refuses one of another size before reading it, and reads no more than that size.
Files are written to temporary names and renamed into place, and the manifest is replaced
last, so a process killed during ``save`` leaves the previous index loadable.
Saves hold ``.rse_index.lock`` (one at a time per directory). Loading checks the manifest
and each JSON file against :mod:`~langchain_rse.persistence.schema`.

The wing: :mod:`~langchain_rse.persistence.directory` (save and load),
:mod:`~langchain_rse.persistence.vectorstores` (the local vector store's files),
:mod:`~langchain_rse.persistence.components` (components as saved and rebuilt),
:mod:`~langchain_rse.persistence.files` (atomic files, the manifest, safe opens) and
:mod:`~langchain_rse.persistence.schema` (valid settings and saved formats).
"""

from langchain_rse.persistence.directory import (
    COMPONENTS,
    SAVED_FIELDS,
    SavedSettings,
    SavedStores,
    load_index,
    save_index,
)
from langchain_rse.persistence.files import (
    FORMAT_NAME,
    FORMAT_VERSION,
    LOCK_FILE,
    SaveWriter,
    atomic_write,
    read_manifest,
)
from langchain_rse.persistence.schema import MANIFEST, IndexFormatError
from langchain_rse.persistence.vectorstores import default_vectorstore

__all__ = [
    "COMPONENTS",
    "FORMAT_NAME",
    "FORMAT_VERSION",
    "LOCK_FILE",
    "MANIFEST",
    "SAVED_FIELDS",
    "IndexFormatError",
    "SaveWriter",
    "SavedSettings",
    "SavedStores",
    "atomic_write",
    "default_vectorstore",
    "load_index",
    "read_manifest",
    "save_index",
]
