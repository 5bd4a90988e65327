"""What the reader reads in pretraining's warm-up, beside the null document (`PretrainConfig.reader_warmup`).

The warm-up comes before retrieval, while the towers do not train. `null` reads nothing else (the cheapest steps:
a fresh masked-LM head learns to predict). The others give each masked sentence one block, so the reader also
learns to take a span from a block, which is what retrieval offers it afterwards:
- `copy`: the sentence's own block, whole: the masked span stands in it, in the same words (the trivial retrieval
  the towers are barred from, given to the reader alone, to learn to copy);
- `context`: the sentence's own block with the sentence cut out (ICT's trick, for the reader);
- `copy+context`: every other sentence of a batch reads its own block whole, the rest without the sentence, so the
  reader learns to copy and when there is nothing to copy (with `--reader-loss marginal+candidates` a block's own
  reading is taught to fall back on the reader's prediction without it, which the marginal alone does not teach);
- `holder`: a block of another document that holds the masked span, the one the current retriever scores highest
  (none when no other document holds it). The span lookup is a label only the reader sees; the towers never do,
  so nothing learns to match strings, and the candidates of the retrieval steps that follow are the retriever's.
"""

from __future__ import annotations

import numpy as np
import torch

from realm.common.device import autocast
from realm.data.blocks import BlockStore
from realm.data.recoverable import SpanFinder
from realm.data.sentences import MaskedQuery, OwnBlocks
from realm.index.mips import MipsIndex
from realm.models.realm import NULL_BLOCK, pad_queries
from realm.models.retriever import Retriever

OWN_BLOCK_READINGS = ("copy", "context", "copy+context")  # the warm-ups that read the sentence's own block


def best_holders(
    finder: SpanFinder,
    index: MipsIndex,
    query_vectors: np.ndarray,
    span_texts: list[str],
    source_doc_ids: list[str],
) -> np.ndarray:
    """(B, 1): for each masked span, the block of another document that holds it with the largest f(x, z) =
    query_vectors[b] · Embed_doc(z) as the index stores it; NULL_BLOCK where no other document holds it."""
    out = np.full((len(span_texts), 1), NULL_BLOCK, dtype=np.int64)
    for b, (text, source) in enumerate(zip(span_texts, source_doc_ids)):
        held = np.array([z for z in finder.holders(text) if finder.doc_ids[z] != source], dtype=np.int64)
        if len(held):
            out[b, 0] = held[int(np.argmax(index.stored_vectors(held) @ query_vectors[b]))]
    return out


class WarmupReading:
    """The one block each masked sentence reads in the warm-up (`copy`, `context`, `copy+context` or `holder`, see
    the module's doc)."""

    def __init__(
        self, kind: str, store: BlockStore, finder: SpanFinder | None, index: MipsIndex | None, window: int = 0
    ):
        if kind not in OWN_BLOCK_READINGS + ("holder",):
            raise ValueError(f"unknown warm-up reading {kind!r}: {', '.join(OWN_BLOCK_READINGS)} or holder")
        if kind == "holder" and (finder is None or index is None):
            raise ValueError("the holder warm-up needs the span lookup and an index (a corpus of at most 1M blocks)")
        self.own = OwnBlocks(store, window) if kind in OWN_BLOCK_READINGS else None
        self.kind, self.finder, self.index = kind, finder, index

    def blocks(
        self,
        retriever: Retriever,
        queries: list[MaskedQuery],
        sentence_texts: list[str],
        source_doc_ids: list[str],
        dtype: torch.dtype,
        device: torch.device,
    ) -> tuple[np.ndarray, list[str] | None]:
        """(B, 1) block ids and, for the own block, the bodies that replace theirs (without the sentence or whole)."""
        if self.own is not None:
            own = [
                self.own.without(doc_id, text) if self._cut(b) else self.own.holding(doc_id, text)
                for b, (doc_id, text) in enumerate(zip(source_doc_ids, sentence_texts))
            ]
            return np.array([[block] for block, _ in own], dtype=np.int64), [body for _, body in own]
        assert self.finder is not None and self.index is not None
        tokenizer = retriever.tokenizer
        query, *_ = pad_queries(queries, tokenizer.pad_token_id)
        with torch.no_grad(), autocast(dtype, device):
            vectors = retriever.query_vectors(query)
        spans = [str(tokenizer.decode(q.targets)) for q in queries]
        return best_holders(self.finder, self.index, vectors, spans, source_doc_ids), None

    def _cut(self, b: int) -> bool:
        """Whether sentence b of a batch reads its own block without the sentence (else whole)."""
        return self.kind == "context" or (self.kind == "copy+context" and b % 2 == 1)


def warmup_reading(
    kind: str, store: BlockStore, finder: SpanFinder | None, index: MipsIndex | None, window: int = 0
) -> WarmupReading | None:
    """What the warm-up reads beside the null document: None for `null` (nothing), else a `WarmupReading` (the own
    block cut to `window` words each side of the sentence, 0: whole)."""
    return None if kind == "null" else WarmupReading(kind, store, finder, index, window)
