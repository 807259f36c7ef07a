"""Adapters that make third-party stores fit the retriever's store contracts.

Each adapter lives in its own module and imports its store's package there, so
``import langchain_rse`` never needs them::

    from langchain_rse.integrations.milvus import MilvusLexicalStore  # needs langchain-milvus
"""
