"""BM25 product search, standing in for WebShop's pyserini (Lucene) index.

Each product is indexed as WebShop indexes it (title, description, first bullet
point and option list, lower-cased). Like a Lucene term query, a search returns
the documents that contain at least one query term, best BM25 score first (ties
in catalog order), at most 50 of them. Scores are rank-bm25's BM25Okapi scores
(its idf with the epsilon floor) with pyserini's default parameters k1 = 0.9,
b = 0.4, evaluated over per-term posting arrays. Tokens are lower-cased
alphanumeric runs without Lucene's English stop words; there is no stemming.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

import numpy as np
from rank_bm25 import BM25Okapi

from .catalog import Product

SEARCH_RETURN_N = 50
BM25_K1, BM25_B = 0.9, 0.4

# Lucene's default English stop set.
STOP_WORDS = frozenset(
    "a an and are as at be but by for if in into is it no not of on or such that the their then "
    "there these they this to was will with".split()
)
_TOKEN_RE = re.compile(r"[a-z0-9]+")


def tokenize(text: str) -> list[str]:
    return [t for t in _TOKEN_RE.findall(text.lower()) if t not in STOP_WORDS]


class SearchEngine:
    """Ranks catalog products (by index into `products`) for a keyword query."""

    def __init__(self, products: Sequence[Product]) -> None:
        if not products:
            raise ValueError("SearchEngine: no products to index")
        corpus = [tokenize(p.search_document()) for p in products]
        self.bm25 = BM25Okapi(corpus, k1=BM25_K1, b=BM25_B)
        # rank-bm25 scores every candidate in a Python loop per term; the same formula over
        # per-term posting arrays keeps a search fast on large catalogs.
        doc_len = np.asarray(self.bm25.doc_len, dtype=np.float64)
        self._length_norm = self.bm25.k1 * (1 - self.bm25.b + self.bm25.b * doc_len / self.bm25.avgdl)
        postings: dict[str, tuple[list[int], list[int]]] = {}
        for doc_id, freqs in enumerate(self.bm25.doc_freqs):
            for term, tf in freqs.items():
                ids, tfs = postings.setdefault(term, ([], []))
                ids.append(doc_id)
                tfs.append(tf)
        self._postings = {
            t: (np.asarray(ids, dtype=np.int64), np.asarray(tfs, dtype=np.float64)) for t, (ids, tfs) in postings.items()
        }
        self._n_docs = len(corpus)

    def scores(self, query: str) -> tuple[np.ndarray, np.ndarray]:
        """(BM25 score of every document, whether it contains a query term)."""
        scores = np.zeros(self._n_docs)
        hit = np.zeros(self._n_docs, dtype=bool)
        k1 = self.bm25.k1
        for term in tokenize(query):  # repeated terms count again, as in rank-bm25
            if term not in self._postings:
                continue
            ids, tf = self._postings[term]
            scores[ids] += self.bm25.idf[term] * (tf * (k1 + 1) / (tf + self._length_norm[ids]))
            hit[ids] = True
        return scores, hit

    def search(self, query: str, k: int = SEARCH_RETURN_N) -> list[int]:
        scores, hit = self.scores(query)
        candidates = np.flatnonzero(hit)
        # best score first, ties in catalog order
        order = np.lexsort((candidates, -scores[candidates]))
        return candidates[order[:k]].tolist()
