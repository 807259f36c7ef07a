"""What valid settings and saved indexes are.

The checks of a retriever's settings (:func:`check_settings`, at construction and on every
assignment); the pydantic models of a saved index's manifest and JSON data files (a file
that does not match is rejected at load with :class:`IndexFormatError` naming it: values
checked strictly, unknown keys refused, every key required, and the settings must make a
retriever that can run). The components as saved and rebuilt are in
:mod:`~langchain_rse.persistence.components`.
"""

from __future__ import annotations

from collections.abc import Sequence
from types import SimpleNamespace
from typing import Annotated, Literal, Protocol, TypeVar

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    RootModel,
    field_validator,
    model_validator,
)

from langchain_rse.indexing.chunking import make_splitter
from langchain_rse.lexical.tokenizer import check_stemmer
from langchain_rse.segments import RSEParams, get_preset

__all__ = [
    "EXTENSIONS",
    "FaissVectors",
    "IndexFormatError",
    "InMemoryVectors",
    "Lexical",
    "Manifest",
    "RecordStoreLine",
    "VectorRecord",
    "check_delete_ids",
    "check_expander",
    "check_settings",
]

T = TypeVar("T")

# ---------------------------------------------------------------- settings


_POSITIVE = ("fetch_k", "max_document_chars")


class Settings(Protocol):
    """What :func:`check_settings` reads of a retriever
    (:class:`~langchain_rse.retriever.RSERetriever`)."""

    @property
    def k(self) -> int: ...

    @property
    def max_chars(self) -> int | None: ...

    @property
    def fetch_k(self) -> int: ...

    @property
    def max_document_chars(self) -> int: ...

    @property
    def splitter(self) -> object: ...

    @property
    def chunk_size(self) -> int: ...

    @property
    def weights(self) -> tuple[float, float]: ...

    @property
    def rse_params(self) -> object: ...


def check_settings(r: Settings) -> None:
    """Raise ``ValueError`` for a retriever configuration that could not run (checked at
    construction and on every assignment, so a bad setting fails where it is made)."""
    from langchain_rse.pipeline import check_k, check_max_chars

    check_k(r.k)
    check_max_chars(r.max_chars)
    for name in _POSITIVE:
        if getattr(r, name) < 1:
            raise ValueError(f"{name} must be >= 1, got {getattr(r, name)}")
    if r.splitter is None:
        make_splitter(r.chunk_size)  # validates the size
    w = r.weights
    if len(w) != 2 or min(w) < 0 or max(w) <= 0:
        raise ValueError(f"weights must be two non-negative numbers, not both 0, got {w}")
    if isinstance(r.rse_params, str):
        get_preset(r.rse_params)


def check_delete_ids(ids: Sequence[str] | None) -> list[str]:
    """The document ids of a ``delete`` call: a list, never None (everything) or a string."""
    if ids is None:
        raise ValueError(
            "delete needs a list of document ids (deleting everything is not "
            "supported; create a new retriever instead)"
        )
    if isinstance(ids, str):
        raise TypeError("delete expects a list of document ids, not a string")
    return list(ids)


def check_expander(value: T) -> T:
    """A query expander needs ``expand`` and ``aexpand``."""
    if value is not None and not (hasattr(value, "expand") and hasattr(value, "aexpand")):
        raise TypeError(
            "query_expander must be a QueryExpander (with expand and aexpand), got "
            + type(value).__name__
        )
    return value


# ---------------------------------------------------------------- saved files


EXTENSIONS = {
    "lexical": "json",
    "lexical_tf": "npz",
    "record_store": "jsonl",
    "vectors": "json",
    "vectors_index": "faiss",
}
"""Each data file's role and extension: its name is ``<role>.<generation>.<extension>``."""

Role = Literal["lexical", "lexical_tf", "record_store", "vectors", "vectors_index"]
Plain = str | int | float | bool | None
Setting = Plain | list[Plain]
Weights = tuple[float, float]


MANIFEST = "rse_index.json"
"""The index directory's manifest: settings, components and every data file's checksum."""


class IndexFormatError(ValueError):
    """An index directory that is corrupted, truncated or of an unsupported format."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class FileEntry(_Strict):
    name: str
    size: int = Field(ge=0)
    sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]


class Component(_Strict):
    """A component's class and its plain settings (see ``describe_component``)."""

    class_: str = Field(alias="class")
    module: str
    settings: dict[str, Setting]
    objects: dict[str, str] = {}


class Components(_Strict):
    enricher: Component
    reranker: Component | None
    router: Component | None
    query_expander: Component | None


class Described(_Strict):
    class_: str = Field(alias="class")


class Embedding(_Strict):
    class_: str | None = Field(alias="class")
    model: str | None


class RecordStoreInfo(Described):
    kind: Literal["embedded", "external"]


class LexicalInfo(Described):
    kind: Literal["in_process", "external"]


class VectorStoreInfo(Described):
    kind: Literal["faiss", "in_memory", "external"]


class Stats(_Strict):
    chunks: int = Field(ge=0)


class Config(_Strict):
    """The retriever's saved settings (``SAVED_FIELDS``, ``rse_params``, ``custom_splitter``)."""

    k: int
    mode: Literal["segments", "chunks"]
    chunk_size: int
    chunk_overlap: int
    fetch_k: int
    weights: Weights
    preset: str | None  # rse_params given by name
    rse_params: RSEParams | None
    custom_splitter: bool
    lexical_stemmer: Annotated[str | None, AfterValidator(check_stemmer)]
    max_document_chars: int
    max_chars: int | None

    @model_validator(mode="after")
    def _can_run(self) -> Config:
        """The checks the retriever makes of its settings (``ValueError`` naming the first)."""
        values = self.model_dump()  # every setting check_settings reads is saved
        values["rse_params"] = self.rse_params or self.preset
        if not self.custom_splitter:  # chunk_overlap: what make_splitter takes
            make_splitter(self.chunk_size, self.chunk_overlap)
        values["splitter"] = object() if self.custom_splitter else None
        check_settings(SimpleNamespace(**values))
        return self


class Manifest(_Strict):
    """``rse_index.json``."""

    format: Literal["langchain-rse-index"]
    format_version: Literal[3]
    generation: Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]
    library_version: str
    config: Config
    components: Components
    embedding: Embedding
    record_store: RecordStoreInfo
    lexical: LexicalInfo
    vectorstore: VectorStoreInfo
    stats: Stats
    files: dict[Role, FileEntry]

    @model_validator(mode="after")
    def _files(self) -> Manifest:
        """Each data file is named for its role and this generation, and the files the
        stores need are there."""
        for role, entry in self.files.items():
            if entry.name != f"{role}.{self.generation}.{EXTENSIONS[role]}":
                raise ValueError(f"file name {entry.name!r} for {role!r} is not allowed")
        needed = {"lexical", "lexical_tf"}
        if self.record_store.kind == "embedded":
            needed.add("record_store")
        if self.vectorstore.kind != "external":
            needed.add("vectors")
        if self.vectorstore.kind == "faiss":
            needed.add("vectors_index")
        if missing := needed - set(self.files):
            raise ValueError(f"the files table lacks {', '.join(sorted(missing))}")
        return self


def _unique(values: list[str]) -> list[str]:
    if len(set(values)) != len(values):
        raise ValueError("the values must be unique")
    return values


class Lexical(_Strict):
    """``lexical.<gen>.json`` with its arrays in ``lexical_tf.<gen>.npz``."""

    format: Literal[3]
    stemmer: str | None
    keys: list[str]
    vocab: list[str]
    groups: dict[str, dict[str, JsonValue]]

    _keys = field_validator("keys", "vocab")(_unique)


class VectorRecord(_Strict):
    """One record of ``vectors.<gen>.json`` for an ``InMemoryVectorStore``."""

    id: str
    text: str
    metadata: dict[str, JsonValue]
    vector: list[float]


class FaissDocument(_Strict):
    metadata: dict[str, JsonValue]
    text: str | None = None


class FaissVectors(_Strict):
    """``vectors.<gen>.json`` for a FAISS store (its index in ``vectors_index.<gen>.faiss``)."""

    ids: list[str]
    docstore: Literal["chunks", "in_memory"]
    documents: list[FaissDocument]
    normalize_L2: bool
    distance_strategy: Literal[
        "EUCLIDEAN_DISTANCE", "MAX_INNER_PRODUCT", "DOT_PRODUCT", "JACCARD", "COSINE"
    ]

    _ids = field_validator("ids")(_unique)

    @model_validator(mode="after")
    def _consistent(self) -> FaissVectors:
        if len(self.ids) != len(self.documents):
            raise ValueError(f"{len(self.ids)} ids but {len(self.documents)} documents")
        if self.docstore == "in_memory" and any(d.text is None for d in self.documents):
            raise ValueError("a document of an in-memory docstore has no text")
        return self


class RecordStoreLine(RootModel[tuple[str, str]]):
    """One line of ``record_store.<gen>.jsonl``: ``[key, JSON record]``."""

    model_config = ConfigDict(strict=True)


class InMemoryVectors(RootModel[list[VectorRecord]]):
    """``vectors.<gen>.json`` for an ``InMemoryVectorStore``."""

    model_config = ConfigDict(strict=True)

    @model_validator(mode="after")
    def _consistent(self) -> InMemoryVectors:
        _unique([r.id for r in self.root])
        if len({len(r.vector) for r in self.root}) > 1:
            raise ValueError("the vectors differ in length")
        return self
