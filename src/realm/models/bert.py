"""BERT, built one way for every tower and reader: from a folder, or at random with a preset's shape.

Weights load as fp32 whatever the file holds (transformers 5 keeps a half-precision file's dtype): training
needs fp32 master weights, and bf16 compute comes from autocast. Attention is PyTorch's SDPA.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM, BertModel

from realm.config import EncoderShape


def load_bert(folder: str | Path) -> BertModel:
    """A BERT body (no pooler)."""
    return BertModel.from_pretrained(
        str(folder), add_pooling_layer=False, attn_implementation="sdpa", dtype=torch.float32
    )


def load_masked_lm(folder: str | Path) -> BertForMaskedLM:
    """A BERT with its masked-LM head, the decoder tied to the word embeddings."""
    return BertForMaskedLM.from_pretrained(
        str(folder), attn_implementation="sdpa", tie_word_embeddings=True, dtype=torch.float32
    )


def bert_config(shape: EncoderShape, vocab_size: int) -> BertConfig:
    return BertConfig(
        vocab_size=vocab_size,
        hidden_size=shape.hidden_size,
        num_hidden_layers=shape.num_hidden_layers,
        num_attention_heads=shape.num_attention_heads,
        intermediate_size=shape.intermediate_size,
        hidden_dropout_prob=shape.dropout,
        attention_probs_dropout_prob=shape.dropout,
        max_position_embeddings=512,
        tie_word_embeddings=True,
    )


def random_bert(shape: EncoderShape, vocab_size: int, seed: int) -> BertModel:
    """A randomly initialised BERT body of `shape` (the same weights for the same seed)."""
    torch.manual_seed(seed)
    return BertModel(bert_config(shape, vocab_size), add_pooling_layer=False)


def random_masked_lm(shape: EncoderShape, vocab_size: int, seed: int) -> BertForMaskedLM:
    """A randomly initialised BertForMaskedLM of `shape` (the same weights for the same seed)."""
    torch.manual_seed(seed)
    return BertForMaskedLM(bert_config(shape, vocab_size))
