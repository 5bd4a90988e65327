"""The knowledge-augmented encoder: BERT over `[CLS] x [SEP] body [SEP]` with a masked-LM head.

    p(y_j | z, x) ∝ exp(w_j · BERT_MASK(j)(join(x, z)))

The head's decoder is tied to the word embeddings. Warm-started from all-MiniLM-L6-v2, which ships no
masked-LM head: the decoder (tied) and BERT start from MiniLM, the head's transform (dense + GELU +
LayerNorm) and output bias start fresh.
"""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn
from transformers import BertForMaskedLM, PreTrainedTokenizerBase

from realm.common.io import write_dir_atomic
from realm.common.tokenization import load_tokenizer, minilm_dir
from realm.common.weights import MINILM
from realm.config import EncoderShape
from realm.models.bert import fresh_weights, load_masked_lm, random_masked_lm
from realm.models.encoder import encode

MLM_HEAD_SEED = 20200211


class Reader(nn.Module):
    def __init__(self, mlm: BertForMaskedLM, tokenizer: PreTrainedTokenizerBase):
        super().__init__()
        self.mlm = mlm
        self.tokenizer = tokenizer

    @classmethod
    def load(cls, spec: str, shape: EncoderShape | None = None) -> Reader:
        """`minilm`, `random` (needs `shape`), or a folder saved by `save` / any BERT folder."""
        if spec == "random":
            tokenizer = load_tokenizer(minilm_dir())
            return cls(random_masked_lm(shape or EncoderShape(), len(tokenizer), MLM_HEAD_SEED), tokenizer)
        folder = minilm_dir() if spec == MINILM else Path(spec)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"unknown reader {spec!r}: expected 'minilm', 'random' or a BERT folder")
        with fresh_weights(MLM_HEAD_SEED):  # a fresh head transform (MiniLM has none) is the same on every run
            return cls(load_masked_lm(folder), load_tokenizer(folder))

    def save(self, folder: str | Path) -> None:
        """A plain Hugging Face BertForMaskedLM folder (safetensors) with its tokenizer, swapped in atomically."""

        def write(tmp: Path) -> None:
            self.mlm.save_pretrained(str(tmp))
            self.tokenizer.save_pretrained(str(tmp))

        write_dir_atomic(Path(folder), write)

    def mask_log_probs(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        mask_positions: torch.Tensor,
    ) -> torch.Tensor:
        """(N, L) inputs, (N, M) positions -> (N, M, V) log p(token | z, x) at the masked positions only."""
        hidden = encode(self.mlm.bert, input_ids, attention_mask, token_type_ids)  # (N, L, H)
        at_masks = torch.gather(hidden, 1, mask_positions.unsqueeze(-1).expand(-1, -1, hidden.size(-1)))  # (N, M, H)
        return torch.log_softmax(self.mlm.cls(at_masks).float(), dim=-1)  # (N, M, V)
