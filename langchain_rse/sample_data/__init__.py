"""A small sample corpus (written for this project) for the demo and the examples."""

from __future__ import annotations

from importlib import resources

from langchain_core.documents import Document

__all__ = ["load_sample_documents"]


def load_sample_documents() -> list[Document]:
    """The bundled sample documents, with ``source`` and ``title`` metadata."""
    docs = []
    for entry in sorted(resources.files(__name__).iterdir(), key=lambda p: p.name):
        if entry.name.endswith(".md"):
            text = entry.read_text(encoding="utf-8")
            title = text.splitlines()[0].lstrip("# ").strip()
            docs.append(Document(text, metadata={"source": entry.name, "title": title}))
    return docs
