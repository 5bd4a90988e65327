"""Fast block embedding with the document tower: length-bucketed batches, bf16 where the hardware has it.

The naive loop pads every block to the maximum length in fp32; sorting blocks by length and padding
each batch only to its own longest block (rounded to a multiple of 8) does far less work on real text,
and bf16 weights use the CPU's AVX-512-BF16/AMX units (about 3x the fp32 matmul rate on our machine)."""

from __future__ import annotations

import copy
from collections.abc import Callable

import numpy as np
import torch
from transformers import PreTrainedTokenizerBase

from realm.common.device import default_device, resolve_compute_dtype
from realm.config import CorpusConfig, EmbedConfig
from realm.models.inputs import encode_blocks, pad_batch
from realm.models.retriever import Tower


class BlockEmbedder:
    """Embeds blocks with an inference copy of a document tower (the original is left untouched)."""

    def __init__(
        self,
        doc_tower: Tower,
        tokenizer: PreTrainedTokenizerBase,
        corpus_config: CorpusConfig,
        embed_config: EmbedConfig,
        device: torch.device | None = None,
    ):
        self.device = device or default_device()
        self.dtype = resolve_compute_dtype(embed_config.compute_dtype, self.device)
        self.tower = copy.deepcopy(doc_tower).to(self.device, self.dtype).eval()
        self.tokenizer = tokenizer
        self.corpus_config = corpus_config
        self.batch_size = embed_config.batch_size

    @torch.inference_mode()
    def embed(self, titles: list[str], bodies: list[str], on_batch: Callable[[int], None] | None = None) -> np.ndarray:
        """(N, D) float32 embeddings, in input order."""
        ids, types = encode_blocks(self.tokenizer, titles, bodies, self.corpus_config)
        order = np.argsort([len(row) for row in ids], kind="stable")
        out = np.empty((len(ids), self.tower.projection.out_features), dtype=np.float32)
        for start in range(0, len(order), self.batch_size):
            rows = order[start : start + self.batch_size]
            batch = pad_batch([ids[i] for i in rows], [types[i] for i in rows], self.tokenizer.pad_token_id)
            batch = {k: v.to(self.device) for k, v in batch.items()}
            out[rows] = self.tower(**batch).float().cpu().numpy()
            if on_batch is not None:
                on_batch(len(rows))
        return out
