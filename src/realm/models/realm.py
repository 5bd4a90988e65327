"""REALM pretraining: retrieve, score with the current towers, read, marginalise.

For a masked sentence x with masks j and candidates z_0 = null document, z_1..z_{K-1} from MIPS:

    f(x, z)          = Embed_input(x) · Embed_doc(z)                       # recomputed, gradients reach both towers
    f(x, null)       = Embed_input(x) · Embed_doc(null) + b_null           # b_null: a learned scalar
    log p(z | x)     = log_softmax_z f(x, z)                              # over the K candidates only
    log p(y_j | x)   = logsumexp_z [ log p(z | x) + log p(y_j | z, x) ]   # per mask, as the released code does
    loss             = - mean_x mean_j log p(y_j | x)

Retrieval utility = mean_j [ log p(y_j | x) - log p(y_j | null, x) ]: positive when retrieval helps.

b_null is our addition. Through the towers alone, p(null | x) can only rise by moving every query toward the
one null embedding, which bends the geometry retrieval depends on; at the warm start it sits near 0.005, so
the marginal barely contains the null document even where retrieved blocks mislead the reader. The offset
lets the prior of reading nothing follow the data (p(null) is the fraction of the marginal that ignores the
blocks), and leaves the towers the gradient that ranks candidates per query. It is saved with the
retriever (Retriever.null_score)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from realm.config import CorpusConfig
from realm.data.blocks import BlockStore
from realm.data.sentences import MaskedQuery
from realm.models.inputs import encode_blocks, pad_batch
from realm.models.mlm_reader import Reader
from realm.models.retriever import Retriever

NULL_BLOCK = -1  # candidate id of the null document (and of padding where too few blocks remain)


def marginal_mlm_loss(
    retrieval_logits: torch.Tensor,
    candidate_mask: torch.Tensor,
    token_log_probs: torch.Tensor,
    mask_valid: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """retrieval_logits (B, K) f(x, z); candidate_mask (B, K); token_log_probs (B, K, M) log p(y_j | z, x);
    mask_valid (B, M). Candidate 0 is the null document. Returns the loss and detached statistics."""
    log_pz = torch.log_softmax(retrieval_logits.float().masked_fill(~candidate_mask, float("-inf")), dim=-1)  # (B, K)
    marginal = torch.logsumexp(log_pz.unsqueeze(-1) + token_log_probs, dim=1)  # (B, M)
    valid = mask_valid.float()
    per_example = (marginal * valid).sum(1) / valid.sum(1).clamp(min=1)  # (B,)
    null_only = (token_log_probs[:, 0] * valid).sum(1) / valid.sum(1).clamp(min=1)
    stats = {
        "utility": (per_example - null_only).mean().detach(),
        "p_null": log_pz[:, 0].exp().mean().detach(),
        "null_log_likelihood": null_only.mean().detach(),
    }
    return -per_example.mean(), stats


def select_candidates(
    retrieved: np.ndarray, block_doc_ids: np.ndarray, source_doc_ids: list[str], num_retrieved: int
) -> np.ndarray:
    """(B, R) MIPS results -> (B, num_retrieved) block ids, best first, without trivial candidates
    (blocks of the sentence's own document) and padded with NULL_BLOCK if too few remain."""
    out = np.full((len(retrieved), num_retrieved), NULL_BLOCK, dtype=np.int64)
    for b, (row, source) in enumerate(zip(retrieved, source_doc_ids)):
        keep = [int(i) for i in row if i >= 0 and block_doc_ids[i] != source][:num_retrieved]
        out[b, : len(keep)] = keep
    return out


@dataclass
class RealmBatch:
    query: dict[str, torch.Tensor]  # (B, Lq) [CLS] x_masked [SEP]
    docs: dict[str, torch.Tensor]  # (B*(K-1) + 1, Ld) candidate blocks, then the null document last
    reader: dict[str, torch.Tensor]  # (B*K, Lr) [CLS] x_masked [SEP] body [SEP]; candidate 0 is null
    mask_positions: torch.Tensor  # (B, M)
    targets: torch.Tensor  # (B, M)
    mask_valid: torch.Tensor  # (B, M) bool
    candidate_mask: torch.Tensor  # (B, K) bool
    candidate_ids: np.ndarray  # (B, K) block ids, NULL_BLOCK first

    def to(self, device: torch.device) -> RealmBatch:
        move = lambda d: {k: v.to(device) for k, v in d.items()}  # noqa: E731
        return RealmBatch(
            move(self.query),
            move(self.docs),
            move(self.reader),
            self.mask_positions.to(device),
            self.targets.to(device),
            self.mask_valid.to(device),
            self.candidate_mask.to(device),
            self.candidate_ids,
        )


def pad_queries(
    queries: list[MaskedQuery], pad_id: int
) -> tuple[dict[str, torch.Tensor], torch.Tensor, torch.Tensor, torch.Tensor]:
    """Query tensors (B, Lq) and mask positions / targets / validity (B, M)."""
    ids = [q.input_ids for q in queries]
    query = pad_batch(ids, [[0] * len(row) for row in ids], pad_id)
    m = max(len(q.mask_positions) for q in queries)
    positions = torch.zeros(len(queries), m, dtype=torch.long)
    targets = torch.zeros(len(queries), m, dtype=torch.long)
    valid = torch.zeros(len(queries), m, dtype=torch.bool)
    for b, q in enumerate(queries):
        positions[b, : len(q.mask_positions)] = torch.tensor(q.mask_positions)
        targets[b, : len(q.targets)] = torch.tensor(q.targets)
        valid[b, : len(q.targets)] = True
    return query, positions, targets, valid


def make_batch(
    queries: list[MaskedQuery], retrieved: np.ndarray, store: BlockStore, tokenizer, corpus_config: CorpusConfig
) -> RealmBatch:
    """Assemble retriever and reader inputs for B queries and their (B, K-1) retrieved block ids."""
    batch_size, num_retrieved = retrieved.shape
    candidate_ids = np.concatenate([np.full((batch_size, 1), NULL_BLOCK), retrieved], axis=1)  # (B, K)
    flat = retrieved.reshape(-1)
    blocks = dict(zip(flat[flat >= 0].tolist(), store.take(flat[flat >= 0].tolist())))
    titles = [blocks[i].title if i >= 0 else "" for i in flat] + [""]
    bodies = [blocks[i].body if i >= 0 else "" for i in flat] + [""]
    doc_ids, doc_types = encode_blocks(tokenizer, titles, bodies, corpus_config)
    docs = pad_batch(doc_ids, doc_types, tokenizer.pad_token_id)

    query, positions, targets, valid = pad_queries(queries, tokenizer.pad_token_id)
    body_ids = tokenizer(bodies[:-1], add_special_tokens=False)["input_ids"] if num_retrieved else []  # (B*(K-1))
    reader_ids, reader_types = [], []
    for b, q in enumerate(queries):
        for z in range(num_retrieved + 1):
            body = [] if z == 0 else body_ids[b * num_retrieved + z - 1][: corpus_config.max_block_tokens]
            reader_ids.append(q.input_ids + body + [tokenizer.sep_token_id])
            reader_types.append([0] * len(q.input_ids) + [1] * (len(body) + 1))
    reader = pad_batch(reader_ids, reader_types, tokenizer.pad_token_id)
    candidate_mask = torch.from_numpy(candidate_ids >= 0)
    candidate_mask[:, 0] = True
    return RealmBatch(query, docs, reader, positions, targets, valid, candidate_mask, candidate_ids)


class RealmModel(nn.Module):
    """The retriever's two towers and the reader, trained jointly (one module, so DDP sees every parameter)."""

    def __init__(self, retriever: Retriever, reader: Reader):
        super().__init__()
        self.retriever = retriever
        self.reader = reader
        self.null_score = nn.Parameter(torch.tensor(retriever.null_score))  # b_null

    def export_null_score(self) -> None:
        """Copy the trained b_null into the retriever, which saves it."""
        self.retriever.null_score = float(self.null_score.detach())

    def forward(self, batch: RealmBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch_size, k = batch.candidate_mask.shape
        q = self.retriever.query_tower(**batch.query)  # (B, D)
        docs = self.retriever.doc_tower(**batch.docs)  # (B*(K-1) + 1, D)
        null = docs[-1:].expand(batch_size, 1, -1)  # (B, 1, D)
        d = torch.cat([null, docs[:-1].view(batch_size, k - 1, docs.size(-1))], dim=1)  # (B, K, D)
        retrieval_logits = torch.einsum("bd,bkd->bk", q, d)  # f(x, z)
        retrieval_logits = torch.cat([retrieval_logits[:, :1] + self.null_score, retrieval_logits[:, 1:]], 1)

        positions = batch.mask_positions.repeat_interleave(k, dim=0)  # (B*K, M)
        log_probs = self.reader.mask_log_probs(**batch.reader, mask_positions=positions)  # (B*K, M, V)
        log_probs = log_probs.view(batch_size, k, *log_probs.shape[1:])  # (B, K, M, V)
        targets = batch.targets.unsqueeze(1).expand(-1, k, -1)  # (B, K, M)
        token_log_probs = torch.gather(log_probs, 3, targets.unsqueeze(-1)).squeeze(-1)  # (B, K, M)
        loss, stats = marginal_mlm_loss(retrieval_logits, batch.candidate_mask, token_log_probs, batch.mask_valid)
        with torch.no_grad():  # MLM accuracy of the marginal p(y_j | x) = sum_z p(z | x) p(y_j | z, x)
            log_pz = torch.log_softmax(retrieval_logits.float().masked_fill(~batch.candidate_mask, float("-inf")), -1)
            marginal = torch.logsumexp(log_pz[:, :, None, None] + log_probs, dim=1)  # (B, M, V)
            correct = (marginal.argmax(-1) == batch.targets) & batch.mask_valid
            stats["correct"] = correct  # (B, M), for span-level evaluation
            stats["accuracy"] = correct.sum() / batch.mask_valid.sum()
            null_correct = (log_probs[:, 0].argmax(-1) == batch.targets) & batch.mask_valid
            stats["null_accuracy"] = null_correct.sum() / batch.mask_valid.sum()
            stats["null_correct"] = null_correct  # (B, M), the null document alone: the paired baseline
            stats["log_pz"] = log_pz  # (B, K), for per-example reports
            stats["token_log_probs"] = token_log_probs.detach()  # (B, K, M)
            stats["uncentred_queries"] = q.detach() + self.retriever.query_tower.mask_center  # (B, D): all masked
        return loss, stats
