"""What valid settings and saved indexes are.

The checks of a retriever's settings (:func:`check_settings`, at construction and on every
assignment); the pydantic models of a saved index's
manifest and JSON data files (a file that does not match is rejected at load with
:class:`~langchain_rse.persistence.IndexFormatError` naming it: values checked strictly,
unknown keys refused, every key required, and the settings must make a retriever that
can run); and its components (enricher, reranker, router, query expander)
as saved — class and non-secret settings (:func:`describe_component`) — and rebuilt
(:func:`restore_components`).
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Annotated, Any, Literal, Protocol, TypeVar

from langchain_core.embeddings import Embeddings
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    RootModel,
    SecretStr,
    field_validator,
    model_validator,
    validate_call,
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
    "describe_component",
    "restore_components",
]

logger = logging.getLogger(__name__)

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


# ---------------------------------------------------------------- components

_PRIMITIVES = (str, int, float, bool, type(None))
_ENDPOINT = re.compile(r"url|uri|host|endpoint|api_base|base_path|proxy|domain|server", re.I)
"""Settings that say where a component connects: never taken from an index, which anyone
who can write to it could point at their own host (with the caller's key in the request)."""


def _plain(value: object) -> bool:
    if isinstance(value, (list, tuple)):
        return all(isinstance(v, _PRIMITIVES) for v in value)
    return isinstance(value, _PRIMITIVES)


def describe_component(component: object) -> dict[str, Any] | None:
    """A component's class and its non-secret settings (plain values only: no keys, no
    models, no stores), as saved in the manifest."""
    if component is None:
        return None
    cls = type(component)
    if isinstance(component, BaseModel):
        values = {name: getattr(component, name) for name in type(component).model_fields}
    else:
        values = {k: v for k, v in vars(component).items() if not k.startswith("_")}
    settings = {k: list(v) if isinstance(v, tuple) else v for k, v in values.items() if _plain(v)}
    objects = {
        k: type(v).__name__
        for k, v in values.items()
        if not _plain(v) and not isinstance(v, SecretStr)
    }
    return {
        "class": cls.__name__,
        "module": cls.__module__,
        "settings": settings,
        "objects": objects,
    }


def _restore(spec: dict[str, Any], embedding: Embeddings | None) -> object:
    """Rebuild a component this library can rebuild from its saved settings, else None;
    ``IndexFormatError`` when the settings do not fit the class."""
    name, settings, objects = spec["class"], dict(spec["settings"]), spec.get("objects", {})
    if not spec["module"].startswith("langchain_rse."):
        return None
    endpoints = {k: settings.pop(k) for k in list(settings) if _ENDPOINT.search(k)}
    component = _build(name, settings, objects, embedding)
    if component is not None and any(
        getattr(component, k, None) != v for k, v in endpoints.items()
    ):  # saved with another endpoint than the caller's (its default or environment)
        logger.warning(
            "not rebuilding %s: its saved %s is not this process's",
            name,
            ", ".join(sorted(endpoints)),
        )
        return None
    return component


def _checked(cls: type, settings: dict[str, Any]) -> object:
    """``cls(**settings)``, the values checked strictly (``"4"`` is not an ``int``): by
    the model of a pydantic class, else by the annotations of its ``__init__``."""
    if issubclass(cls, BaseModel):
        return cls.model_validate(settings, strict=True)
    component = cls.__new__(cls)
    if cls.__init__ is object.__init__:  # no settings to check (e.g. NoEnricher)
        if settings:
            raise TypeError(f"{cls.__name__} takes no settings, got {sorted(settings)}")
        return component
    validate_call(config=ConfigDict(strict=True))(cls.__init__)(component, **settings)
    return component


def _build(
    name: str, settings: dict[str, Any], objects: dict[str, str], embedding: Embeddings | None
) -> object:
    from langchain_rse import enrichment, rerank

    try:
        if name in ("NoEnricher", "HeaderEnricher"):
            return _checked(getattr(enrichment, name), settings)
        if name == "DocumentRouter" and objects.get("retriever") == "LeadIndex":
            from langchain_rse.routing import DocumentRouter, LeadIndex

            return _checked(DocumentRouter, {"retriever": LeadIndex(), **settings})
        if name == "CohereReranker":  # the key comes from the environment again
            return _checked(rerank.CohereReranker, settings)
        if name == "EmbeddingReranker":
            wanted = objects.get("embeddings")
            if embedding is not None and type(embedding).__name__ == wanted:
                return _checked(rerank.EmbeddingReranker, {"embeddings": embedding, **settings})
            if wanted == "LocalEmbeddings":
                from langchain_rse.embeddings import LocalEmbeddings

                values = {"embeddings": LocalEmbeddings(), **settings}
                return _checked(rerank.EmbeddingReranker, values)
    except (TypeError, ValueError) as exc:
        raise IndexFormatError(
            f"{MANIFEST}: the saved settings of {name} do not fit it: {exc}"
        ) from None
    return None


def _router(given: object, spec: dict[str, Any]) -> object:
    """A bare retriever passed for a saved router gets the saved routing settings."""
    from langchain_core.retrievers import BaseRetriever

    from langchain_rse.routing import DocumentRouter

    if isinstance(given, BaseRetriever):
        return DocumentRouter(retriever=given, **spec["settings"])
    return given


def restore_components(
    manifest: dict[str, Any], given: dict[str, Any], embedding: Embeddings | None, strict: bool
) -> dict[str, Any]:
    """The components to pass to the loaded retriever: what the caller gave, else what can
    be rebuilt from the manifest. For the rest: a warning naming each (``strict``: raise)."""
    out: dict[str, Any] = {}
    missing = []
    for field_name, spec in manifest.get("components", {}).items():
        if field_name == "router" and spec is not None and field_name in given:
            out["router"] = _router(given["router"], spec)
        if spec is None or field_name in given:
            continue
        component = _restore(spec, embedding)
        if component is None:
            missing.append(f"{field_name}={spec['class']}")
            if field_name == "router":  # not the built-in default in its place
                out["router"] = None
        else:
            out[field_name] = component
    if missing:
        message = (
            "this index was saved with " + ", ".join(missing) + ", which cannot be rebuilt "
            "from the saved settings; pass "
            + ", ".join(m.split("=")[0] + "=..." for m in missing)
            + " to load() to get the same results"
        )
        if strict:
            raise ValueError(message)
        logger.warning(message)
    return out
