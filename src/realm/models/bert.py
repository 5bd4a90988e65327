"""BERT, built one way for every tower and reader: from a folder, or at random with a preset's shape.

Weights load as fp32 whatever the file holds (transformers 5 keeps a half-precision file's dtype): training
needs fp32 master weights, and bf16 compute comes from autocast. Attention is PyTorch's SDPA.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch
from transformers import BertConfig, BertForMaskedLM, BertModel

from realm.config import EncoderShape

PICKLED_WEIGHTS = ("pytorch_model.bin", "pytorch_model.bin.index.json", "tf_model.h5", "flax_model.msgpack")


def check_weights(folder: str | Path) -> None:
    """Refuse a folder without safetensors weights before transformers looks at it: pickle files are never
    loaded (unpickling runs code), and a folder without weights gets a message, not a traceback."""
    folder = Path(folder)
    if (folder / "model.safetensors").is_file() or (folder / "model.safetensors.index.json").is_file():
        return
    others = [name for name in PICKLED_WEIGHTS if (folder / name).exists()]
    if others:
        raise FileNotFoundError(
            f"{folder}: holds only {others[0]}, which realm never loads (unpickling can run code); convert it to "
            "safetensors where you trust its origin, e.g. transformers' save_pretrained(..., safe_serialization=True)"
        )
    raise FileNotFoundError(f"{folder}: no model weights (model.safetensors) in this folder")


def load_bert(folder: str | Path, pooler: bool = False) -> BertModel:
    """A BERT body, with its pooler (dense + tanh over [CLS]) when `pooler`."""
    check_weights(folder)
    return BertModel.from_pretrained(
        str(folder), add_pooling_layer=pooler, attn_implementation="sdpa", use_safetensors=True, dtype=torch.float32
    )


def load_masked_lm(folder: str | Path) -> BertForMaskedLM:
    """A BERT with its masked-LM head, the decoder tied to the word embeddings."""
    check_weights(folder)
    return BertForMaskedLM.from_pretrained(
        str(folder), attn_implementation="sdpa", use_safetensors=True, tie_word_embeddings=True, dtype=torch.float32
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


@contextmanager
def fresh_weights(seed: int) -> Iterator[None]:
    """Weights created inside come from `seed`, and the caller's random state is as it was afterwards: a fresh head
    is the same on every run, while `--seed` (set by the recipe, per rank) still decides dropout and data order."""
    with torch.random.fork_rng(devices=[]):
        # the CPU generator alone, where weights are made: torch.manual_seed would also (lazily) seed every CUDA
        # device, which fork_rng(devices=[]) does not restore, so CUDA dropout would follow this seed, not `--seed`
        torch.default_generator.manual_seed(seed)
        yield


def random_bert(shape: EncoderShape, vocab_size: int, seed: int, pooler: bool = False) -> BertModel:
    """A randomly initialised BERT body of `shape` (the same weights for the same seed), with a pooler if asked."""
    with fresh_weights(seed):
        return BertModel(bert_config(shape, vocab_size), add_pooling_layer=pooler)


def random_masked_lm(shape: EncoderShape, vocab_size: int, seed: int) -> BertForMaskedLM:
    """A randomly initialised BertForMaskedLM of `shape` (the same weights for the same seed)."""
    with fresh_weights(seed):
        return BertForMaskedLM(bert_config(shape, vocab_size))
