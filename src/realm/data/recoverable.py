"""Recoverability of a masked span: can retrieval give it back at all?

A masked span is recoverable when its text, as a run of whole normalised tokens (QA's `has_answer` matching:
DrQA tokens of the tokenizer-normalised text), occurs in the body of a block of another document; the reader
reads block bodies, and the trivial-retrieval rule drops the sentence's own document. It is retrieved when one
of the candidate blocks given to the reader holds it. Over a corpus the recoverable share is the ceiling of what
retrieval can give the masked LM, as recall@k is for open QA.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np
from transformers import PreTrainedTokenizerBase

from realm.data.blocks import BlockStore
from realm.data.qa_examples import answer_tokens


class SpanFinder:
    """An inverted index from normalised tokens to the blocks whose body holds them, for exact run matching."""

    def __init__(self, store: BlockStore, tokenizer: PreTrainedTokenizerBase):
        self.normalise = tokenizer.backend_tokenizer.normalizer.normalize_str  # lowercase, accents off (uncased)
        self.doc_ids = np.array(store.column("doc_id"), dtype=object)
        self.vocab: dict[str, int] = {}
        self.blocks: list[np.ndarray] = []  # each block body's token ids
        for body in store.column("body"):
            words = answer_tokens(self.normalise(body))
            self.blocks.append(np.array([self.vocab.setdefault(w, len(self.vocab)) for w in words], dtype=np.int32))
        lengths = np.array([len(b) for b in self.blocks])
        pairs = np.unique(  # (token, block) once each, sorted by token then block
            np.stack(
                [np.concatenate(self.blocks or [np.zeros(0, np.int32)]), np.repeat(np.arange(len(lengths)), lengths)]
            ).astype(np.int64),
            axis=1,
        )
        starts = np.searchsorted(pairs[0], np.arange(len(self.vocab) + 1))
        self.postings = [pairs[1, starts[t] : starts[t + 1]] for t in range(len(self.vocab))]  # sorted block ids

    def span_ids(self, text: str) -> np.ndarray | None:
        """The span's token ids; None when it has no token or one that no block holds (it occurs nowhere)."""
        words = answer_tokens(self.normalise(text))
        ids = [self.vocab.get(w, -1) for w in words]
        return np.array(ids, dtype=np.int32) if words and min(ids) >= 0 else None

    def holds(self, block_id: int, span: np.ndarray) -> bool:
        """Does block `block_id`'s body hold `span` as a run of whole tokens?"""
        body = self.blocks[block_id]
        n = len(span)
        return any(np.array_equal(body[s : s + n], span) for s in np.flatnonzero(body[: len(body) - n + 1] == span[0]))

    def _holders(self, text: str) -> Iterator[int]:
        """The blocks whose body holds the span `text`, lazily (those holding all its tokens are checked in turn)."""
        span = self.span_ids(text)
        if span is None:
            return
        lists = sorted((self.postings[t] for t in set(span.tolist())), key=len)
        candidates = lists[0]
        for other in lists[1:]:
            candidates = np.intersect1d(candidates, other, assume_unique=True)
        yield from (int(b) for b in candidates if self.holds(int(b), span))

    def holders(self, text: str) -> list[int]:
        """Every block whose body holds the span `text`."""
        return list(self._holders(text))

    def recoverable(self, text: str, source_doc_id: str) -> bool:
        """Does a block of a document other than `source_doc_id` hold the span `text`?"""
        return any(self.doc_ids[b] != source_doc_id for b in self._holders(text))

    def retrieved(self, text: str, candidate_ids: Sequence[int]) -> bool:
        """Does one of the blocks `candidate_ids` (negative ids: the null document or padding) hold the span?"""
        span = self.span_ids(text)
        return span is not None and any(b >= 0 and self.holds(int(b), span) for b in candidate_ids)

    def label(
        self, texts: Sequence[str], source_doc_ids: Sequence[str], candidate_ids: np.ndarray
    ) -> tuple[list[bool], list[bool]]:
        """For each masked span: recoverable (another document holds it) and retrieved (a block of its row of
        `candidate_ids` (B, K) holds it)."""
        recoverable = [self.recoverable(text, doc) for text, doc in zip(texts, source_doc_ids)]
        retrieved = [self.retrieved(text, row.tolist()) for text, row in zip(texts, candidate_ids)]
        return recoverable, retrieved

    def shares(
        self, texts: Sequence[str], source_doc_ids: Sequence[str], candidate_ids: np.ndarray
    ) -> dict[str, float]:
        """The shares of masked spans (`label`) that are recoverable and that are retrieved, for training logs."""
        recoverable, retrieved = self.label(texts, source_doc_ids, candidate_ids)
        return {"span_recoverable": float(np.mean(recoverable)), "span_retrieved": float(np.mean(retrieved))}
