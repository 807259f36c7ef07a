"""The schema of a saved index: pydantic models of the manifest and of each JSON data file.

A file that does not match its model is rejected at load with
:class:`~langchain_rse.persistence.IndexFormatError` naming the file: every value is
checked for its type (strictly: ``"4"`` is not a number), unknown keys are refused, and
the settings must make a retriever that can run. Keys only older saves lack are optional.
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Annotated, Literal

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

from langchain_rse.lexical.tokenizer import check_stemmer
from langchain_rse.segments import RSEParams

__all__ = [
    "EXTENSIONS",
    "DocstoreLine",
    "FaissVectors",
    "InMemoryVectors",
    "LegacyLexical",
    "Lexical",
    "Manifest",
    "VectorRecord",
]

EXTENSIONS = {"lexical": "json", "lexical_tf": "npz", "docstore": "jsonl", "vectors": "json",
              "vectors_index": "faiss"}  # fmt: skip
"""Each data file's role and extension: its name is ``<role>.<generation>.<extension>``."""

Role = Literal["lexical", "lexical_tf", "docstore", "vectors", "vectors_index"]
Plain = str | int | float | bool | None
Setting = Plain | list[Plain]
Weights = tuple[float, float]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, populate_by_name=True)


class FileEntry(_Strict):
    name: str
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


class Enricher(Described):
    repr: str | None = None  # saved by 0.1


class Embedding(_Strict):
    class_: str | None = Field(alias="class")
    model: str | None


class Docstore(Described):
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
    strict_rerank: bool
    fetch_k: int
    weights: Weights
    preset: str | None
    rse_params: RSEParams | None
    custom_splitter: bool
    # added after 0.1: a save without them gets the retriever's defaults
    lexical_stemmer: Annotated[str | None, AfterValidator(check_stemmer)] = None
    max_document_chars: int = 20_000_000
    max_chars: int | None = None
    # saved by 0.2 and before, ignored since (internal constants now; see docs/decisions.md)
    lexical_engine: JsonValue = None
    candidate_pool: JsonValue = None
    fusion: JsonValue = None
    rrf_k: JsonValue = None
    relevance: JsonValue = None
    code_weights: JsonValue = None
    code_corpus_weights: JsonValue = None
    max_queries: JsonValue = None
    max_query_chars: JsonValue = None
    index_batch_size: JsonValue = None
    # saved by 0.1, ignored since
    route_documents: JsonValue = None
    route_fetch_k: JsonValue = None
    route_check_k: JsonValue = None

    @model_validator(mode="after")
    def _can_run(self) -> Config:
        """The checks the retriever makes of its settings (``ValueError`` naming the first)."""
        from langchain_rse.retriever import RSERetriever
        from langchain_rse.validation import check_settings

        fields = RSERetriever.model_fields
        values = {name: fields[name].get_default(call_default_factory=False) for name in fields}
        values.update(self.model_dump(exclude_unset=True, include=set(fields)))
        values["splitter"] = object() if self.custom_splitter else None
        check_settings(SimpleNamespace(**values))
        return self


class Manifest(_Strict):
    """``rse_index.json``."""

    format: Literal["langchain-rse-index"]
    format_version: Literal[1]
    generation: Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]
    library_version: str = "unknown"
    config: Config
    # optional keys: saved by 0.1 without them (it recorded only the enricher's class)
    components: Components | None = Field(default=None, validate_default=False)
    enricher: Enricher
    embedding: Embedding
    docstore: Docstore
    lexical: LexicalInfo = LexicalInfo.model_validate({"kind": "in_process", "class": "BM25Index"})
    vectorstore: VectorStoreInfo
    stats: Stats = Stats(chunks=0)
    files: dict[Role, FileEntry]

    @model_validator(mode="after")
    def _files(self) -> Manifest:
        """Each data file is named for its role and this generation, and the files the
        stores need are there."""
        if "components" in self.model_fields_set and self.components is None:
            raise ValueError("components must be a table (only saves by 0.1 lack it)")
        for role, entry in self.files.items():
            if entry.name != f"{role}.{self.generation}.{EXTENSIONS[role]}":
                raise ValueError(f"file name {entry.name!r} for {role!r} is not allowed")
        needed = {"lexical"}
        if self.docstore.kind == "embedded":
            needed.add("docstore")
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
    """``lexical.<gen>.json`` with its arrays in ``lexical_tf.<gen>.npz`` (formats 2, 3)."""

    format: int
    stemmer: str | None = None  # format 2 had none (words unstemmed)
    keys: list[str]
    vocab: list[str]
    groups: dict[str, dict[str, JsonValue]]

    _keys = field_validator("keys", "vocab")(_unique)


class LegacyLexical(_Strict):
    """``lexical.<gen>.json`` saved with token lists (no arrays)."""

    keys: list[str]
    tokens: list[list[str]]
    groups: dict[str, dict[str, JsonValue]] | None = None  # saved by 0.1

    _keys = field_validator("keys")(_unique)

    @model_validator(mode="after")
    def _same_length(self) -> LegacyLexical:
        if len(self.keys) != len(self.tokens):
            raise ValueError(f"{len(self.keys)} keys but {len(self.tokens)} token lists")
        return self


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
    docstore: Literal["chunks", "in_memory"] = "in_memory"  # earlier saves: in_memory
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


class DocstoreLine(RootModel[tuple[str, str]]):
    """One line of ``docstore.<gen>.jsonl``: ``[key, JSON record]``."""

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
