"""An index's components (enricher, reranker, router, query expander) as saved — class and
non-secret settings (:func:`describe_component`) — and rebuilt (:func:`restore_components`)."""

from __future__ import annotations

import logging
import re
from typing import Any

from langchain_core.embeddings import Embeddings
from pydantic import BaseModel, ConfigDict, SecretStr, validate_call

from langchain_rse.persistence.schema import MANIFEST, IndexFormatError

__all__ = ["describe_component", "restore_components"]

logger = logging.getLogger(__name__)


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
