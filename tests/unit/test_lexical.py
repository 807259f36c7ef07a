"""The tokenizer and the BM25 index."""

from __future__ import annotations

import pytest

from langchain_rse.lexical import BM25Index, tokenize


def test_tokenizer_splits_identifiers_and_punctuation() -> None:
    toks = tokenize("The getUserName() of user_name, HTTPServer.run!", stemmer=None)
    assert {
        "getusername",
        "get",
        "user",
        "name",
        "user_name",
        "httpserver",
        "http",
        "server",
        "run",
    } <= set(toks)
    assert "the" not in toks and "of" not in toks  # stop words
    assert all(t == t.lower() for t in toks)


def test_tokenizer_handles_cjk_and_accents() -> None:
    assert tokenize("東京タワー") == ["東", "京", "タ", "ワ", "ー"]
    assert tokenize("café naïve", stemmer=None) == ["café", "naïve"]
    assert tokenize("café naïve") == ["café", "naïv"]  # the English stemmer keeps accents


def test_tokenizer_stems_words_and_keeps_identifiers_whole() -> None:
    assert tokenize("Executors terminated; termination") == ["executor", "termin", "termin"]
    assert tokenize("Executors terminated", stemmer=None) == ["executors", "terminated"]
    toks = tokenize("getRunningTasks() in running_tasks")
    assert {"get", "run", "task", "running_tasks"} <= set(toks)  # snake_case kept whole
    assert "running" not in toks and "tasks" not in toks
    assert tokenize("DiffExecutors") == tokenize("DiffExecutor")  # stemmed like a word
    assert tokenize("Kündigungen", stemmer="german") == ["kundig"]


def test_a_stemmer_must_exist() -> None:
    with pytest.raises(ValueError, match="unknown stemmer 'klingon'"):
        tokenize("text", stemmer="klingon")
    with pytest.raises(ValueError, match="unknown stemmer"):
        BM25Index(stemmer="klingon")


def test_the_index_stems_what_it_indexes_and_what_it_is_asked() -> None:
    index = BM25Index()
    index.add(["a", "b"], ["the contract was terminated", "payment is due"])
    assert [i for i, _ in index.search("termination of contracts", 2)] == ["a"]
    plain = BM25Index(stemmer=None)
    plain.add(["a", "b"], ["the contract was terminated", "payment is due"])
    assert plain.search("termination", 2) == []


def corpus() -> BM25Index:
    index = BM25Index()
    index.add(
        ["a", "b", "c"],
        ["the DiffExecutor wraps two executors", "termination for convenience", "payment terms"],
    )
    return index


def test_search_returns_best_first_with_positive_scores() -> None:
    index = corpus()
    hits = index.search("diff executor", 3)
    assert hits[0][0] == "a" and all(score > 0 for _, score in hits)
    assert [s for _, s in hits] == sorted((s for _, s in hits), reverse=True)
    assert index.search("nothing matches this", 3) == []
    assert index.search("", 3) == [] and index.search("payment", 0) == []


def test_delete_and_replace() -> None:
    index = corpus()
    index.delete(["a", "unknown"])
    assert index.search("executor", 3) == []
    index.add(["b"], ["executor replaced text"])
    assert index.search("executor", 3)[0][0] == "b" and len(index) == 2


def test_rank_bm25_engine_agrees_on_the_top_hit() -> None:
    pytest.importorskip("rank_bm25")
    ids = ["a", "b", "c", "d", "e"]
    texts = ["alpha beta", "gamma delta", "epsilon zeta", "eta theta", "iota kappa alpha alpha"]
    slow, fast = BM25Index(engine="rank_bm25"), BM25Index()
    slow.add(ids, texts)
    fast.add(ids, texts)
    assert slow.search("alpha", 1)[0][0] == fast.search("alpha", 1)[0][0] == "e"
    with pytest.raises(ValueError, match="unknown lexical engine"):
        BM25Index(engine="lucene")  # type: ignore[arg-type]
