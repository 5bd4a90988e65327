"""Model inputs shared by the towers and readers: `[CLS] title [SEP] body [SEP]` blocks, padded batches."""

from __future__ import annotations

import torch
from transformers import PreTrainedTokenizerBase

from realm.config import CorpusConfig

PAD_MULTIPLE = 8


def encode_blocks(
    tokenizer: PreTrainedTokenizerBase, titles: list[str], bodies: list[str], config: CorpusConfig
) -> tuple[list[list[int]], list[list[int]]]:
    """Token ids and segment ids of `[CLS] title [SEP] body [SEP]` (title: segment A, body: segment B)."""
    title_ids = tokenizer(titles, add_special_tokens=False)["input_ids"]
    body_ids = tokenizer(bodies, add_special_tokens=False)["input_ids"]
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids, types = [], []
    for title, body in zip(title_ids, body_ids):
        title = title[: config.max_title_tokens]
        body = body[: max(0, config.max_block_tokens - 3 - len(title))]
        ids.append([cls, *title, sep, *body, sep])
        types.append([0] * (len(title) + 2) + [1] * (len(body) + 1))
    return ids, types


def pad_batch(ids: list[list[int]], types: list[list[int]], pad_id: int) -> dict[str, torch.Tensor]:
    """Right-pad to the longest row rounded up to PAD_MULTIPLE -> (B, L) tensors."""
    length = -(-max(len(row) for row in ids) // PAD_MULTIPLE) * PAD_MULTIPLE
    input_ids = torch.full((len(ids), length), pad_id, dtype=torch.long)
    token_type_ids = torch.zeros((len(ids), length), dtype=torch.long)
    attention_mask = torch.zeros((len(ids), length), dtype=torch.long)
    for i, (row, row_types) in enumerate(zip(ids, types)):
        input_ids[i, : len(row)] = torch.tensor(row)
        token_type_ids[i, : len(row)] = torch.tensor(row_types)
        attention_mask[i, : len(row)] = 1
    return {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids}
