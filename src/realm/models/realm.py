"""REALM pretraining: retrieve, score with the current towers, read, marginalise.

For a masked sentence x with masks j and candidates z_0 = null document, z_1..z_{K-1} from MIPS:

    f(x, z)          = Embed_input(x) · Embed_doc(z)                       # recomputed in fp32, gradients reach both towers
    p(z | x)         = softmax_z f(x, z)  over z_0..z_{K-1}                # null_document="scored" (the paper)
    log p(y_j | x)   = logsumexp_z [ log p(z | x) + log p(y_j | z, x) ]   # per mask, as the released code does
    loss             = - mean over every masked token j of every x of log p(y_j | x)   # as the released code averages

with f(x, null) = Embed_input(x) · Embed_doc([CLS] [SEP] [SEP]), the null document embedded like an empty block.
Retrieval utility = mean_j [ log p(y_j | x) - log p(y_j | null, x) ] over masked tokens: positive when retrieval helps.
`reader_loss="marginal+candidates"` (off by default) adds - mean_j mean_z log p(y_j | z, x), the reader only.

`null_document="learned_weight"` (the cpu preset) replaces the first line by

    p(null | x)      = sigmoid(b_null)                                    # b_null: a learned scalar
    p(z | x)         = (1 - p(null | x)) · softmax_{z >= 1} f(x, z)       # over the retrieved candidates only

Scored as in the paper, whenever the reader does better without the retrieved blocks (most of the time while it is weak:
they are distractors), the gradient moves every query toward the one null embedding. Measured: after 1,000 null-document
steps the reader reads the null document better than most blocks; within 100 retrieval steps the towers had put p(null)
at 0.4-0.98, and zero-shot recall@5 on questions fell from 70.7 to 20.9
(docs/log/2026-11-23-results-realm-pipeline-in-120-minutes-without-ablations.md). With a learned weight the towers only
rank the retrieved blocks against each other (a softmax over them, whose gradient has no component shared by every
block), and how much the marginal relies on no retrieval at all is one learned number, saved with the retriever
(Retriever.null_score)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from realm.config import CorpusConfig, PretrainConfig
from realm.data.blocks import BlockStore
from realm.data.sentences import MaskedQuery, SentenceSet, mask_sentence
from realm.models.inputs import encode_blocks, pad_batch
from realm.models.mlm_reader import Reader
from realm.models.retriever import Retriever, inner_products

NULL_BLOCK = -1  # candidate id of the null document (and of padding where too few blocks remain)


def retrieval_log_probs(
    retrieval_logits: torch.Tensor, candidate_mask: torch.Tensor, null_score: torch.Tensor
) -> torch.Tensor:
    """retrieval_logits (B, K-1) f(x, z) of the retrieved candidates; candidate_mask (B, K), column 0 the null
    document; null_score: b_null. Returns log p(z | x) (B, K): the null document sigmoid(b_null), the retrieved
    blocks the rest by softmax (-inf at padding); a row without any retrieved block gives all to the null."""
    retrieved = candidate_mask[:, 1:]  # (B, K-1)
    any_retrieved = retrieved.any(1, keepdim=True)  # (B, 1)
    logits = retrieval_logits.float().masked_fill(~retrieved, float("-inf")).masked_fill(~any_retrieved, 0.0)
    log_null = torch.where(any_retrieved, nn.functional.logsigmoid(null_score.float()), 0.0)  # (B, 1)
    log_blocks = nn.functional.logsigmoid(-null_score.float()) + torch.log_softmax(logits, dim=-1)  # (B, K-1)
    return torch.cat([log_null, log_blocks.masked_fill(~retrieved, float("-inf"))], dim=1)


def scored_log_probs(logits: torch.Tensor, candidate_mask: torch.Tensor) -> torch.Tensor:
    """logits (B, K) f(x, z) with column 0 the null document's f(x, null); candidate_mask (B, K). Returns log p(z | x)
    (B, K), one softmax over the null document and the retrieved blocks (-inf at padding): the paper's."""
    return torch.log_softmax(logits.float().masked_fill(~candidate_mask, float("-inf")), dim=-1)


def marginal_mlm_loss(
    log_pz: torch.Tensor, token_log_probs: torch.Tensor, mask_valid: torch.Tensor
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """log_pz (B, K) log p(z | x); token_log_probs (B, K, M) log p(y_j | z, x); mask_valid (B, M). Candidate 0 is
    the null document. Returns the loss, the mean over every masked token of the batch (as the released code's
    masked-LM loss: an example with more masks weighs more), and detached statistics."""
    marginal = torch.logsumexp(log_pz.unsqueeze(-1) + token_log_probs, dim=1)  # (B, M)
    valid = mask_valid.float()
    tokens = valid.sum().clamp(min=1)
    mean_marginal = (marginal * valid).sum() / tokens
    null_only = (token_log_probs[:, 0] * valid).sum() / tokens
    stats = {
        "utility": (mean_marginal - null_only).detach(),
        "p_null": log_pz[:, 0].exp().mean().detach(),
        "null_log_likelihood": null_only.detach(),
    }
    return -mean_marginal, stats


def candidate_mlm_loss(
    token_log_probs: torch.Tensor, candidate_mask: torch.Tensor, mask_valid: torch.Tensor
) -> torch.Tensor:
    """token_log_probs (B, K, M) log p(y_j | z, x); candidate_mask (B, K); mask_valid (B, M). Returns - the mean over
    every masked token of the mean over its candidates of log p(y_j | z, x): each candidate's reading trained on its
    own (`reader_loss="marginal+candidates"`). Under the marginal alone a candidate's reading gets gradient in
    proportion to its posterior p(z | x, y), so a block that does not help is never taught to be ignored."""
    weights = candidate_mask.float() / candidate_mask.sum(1, keepdim=True)  # (B, K), 1/K over the valid candidates
    per_token = (weights.unsqueeze(-1) * token_log_probs).sum(1)  # (B, M)
    valid = mask_valid.float()
    return -(per_token * valid).sum() / valid.sum().clamp(min=1)


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
    docs: dict[str, torch.Tensor]  # (B*(K-1), Ld) the retrieved candidate blocks (empty with K = 1)
    reader: dict[str, torch.Tensor]  # (B*K, Lr) [CLS] x_masked [SEP] body [SEP]; candidate 0 is null
    mask_positions: torch.Tensor  # (B, M)
    targets: torch.Tensor  # (B, M)
    mask_valid: torch.Tensor  # (B, M) bool
    candidate_mask: torch.Tensor  # (B, K) bool
    candidate_ids: np.ndarray  # (B, K) block ids, NULL_BLOCK first

    def masked_texts(self, tokenizer) -> list[str]:
        """Each query's masked wordpieces, decoded (its masked span under salient masking)."""
        targets, valid = self.targets.cpu(), self.mask_valid.cpu()
        return [tokenizer.decode(row[keep]) for row, keep in zip(targets, valid)]

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
    queries: list[MaskedQuery],
    retrieved: np.ndarray,
    store: BlockStore,
    tokenizer,
    corpus_config: CorpusConfig,
    bodies: list[str] | None = None,
) -> RealmBatch:
    """Assemble retriever and reader inputs for B queries and their (B, K-1) retrieved block ids; `bodies`
    (B*(K-1), row-major) replaces the blocks' bodies (the context warm-up's blocks without the sentence)."""
    batch_size, num_retrieved = retrieved.shape
    candidate_ids = np.concatenate([np.full((batch_size, 1), NULL_BLOCK), retrieved], axis=1)  # (B, K)
    flat = retrieved.reshape(-1)
    blocks = dict(zip(flat[flat >= 0].tolist(), store.take(flat[flat >= 0].tolist())))
    titles = [blocks[i].title if i >= 0 else "" for i in flat]
    bodies = bodies if bodies is not None else [blocks[i].body if i >= 0 else "" for i in flat]
    docs = pad_batch(*encode_blocks(tokenizer, titles, bodies, corpus_config), tokenizer.pad_token_id) if titles else {}

    query, positions, targets, valid = pad_queries(queries, tokenizer.pad_token_id)
    body_ids = tokenizer(bodies, add_special_tokens=False)["input_ids"] if num_retrieved else []  # (B*(K-1))
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

    def __init__(self, retriever: Retriever, reader: Reader, reader_loss: str = "marginal"):
        super().__init__()
        self.retriever = retriever
        self.reader = reader
        self.reader_loss = reader_loss  # PretrainConfig.reader_loss
        self.null_document = retriever.config.null_document
        if self.null_document == "learned_weight":
            self.null_score = nn.Parameter(torch.tensor(retriever.null_score))  # b_null

    def export_null_score(self) -> None:
        """Copy the trained b_null (learned_weight) into the retriever, which saves it."""
        if self.null_document == "learned_weight":
            self.retriever.null_score = float(self.null_score.detach())

    def null_embedding(self) -> torch.Tensor:
        """(1, D) Embed_doc(null): the document tower over an empty block, [CLS] [SEP] [SEP]."""
        tokenizer = self.retriever.tokenizer
        inputs = pad_batch(*encode_blocks(tokenizer, [""], [""], CorpusConfig()), tokenizer.pad_token_id)
        device = next(self.retriever.doc_tower.parameters()).device
        return self.retriever.doc_tower(**{k: v.to(device) for k, v in inputs.items()})

    def forward(self, batch: RealmBatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        batch_size, k = batch.candidate_mask.shape
        # b_null and one block a row (the warm-up's): p(z | x) = 1 - sigmoid(b_null) whatever f(x, z), so neither
        # tower gets a gradient, the document tower need not run, and the queries only feed the mask centre
        unscored = self.null_document == "learned_weight" and k == 2
        with torch.set_grad_enabled(torch.is_grad_enabled() and not unscored):
            q = self.retriever.query_tower(**batch.query)  # (B, D), fp32
        if k > 1 and not unscored:
            d = self.retriever.doc_tower(**batch.docs)  # (B*(K-1), D)
            retrieval_logits = inner_products("bd,bkd->bk", q, d.view(batch_size, k - 1, -1))  # f(x, z), (B, K-1)
        else:  # nothing to score: the null document alone, or one block whose score cannot matter
            retrieval_logits = q.new_zeros(batch_size, k - 1)
        if self.null_document == "learned_weight":
            log_pz = retrieval_log_probs(retrieval_logits, batch.candidate_mask, self.null_score)  # (B, K)
        elif k > 1:
            f_null = inner_products("bd,nd->bn", q, self.null_embedding())  # (B, 1) f(x, null)
            log_pz = scored_log_probs(torch.cat([f_null, retrieval_logits], dim=1), batch.candidate_mask)  # (B, K)
        else:  # the null document alone: p(null | x) = 1
            log_pz = q.new_zeros(batch_size, 1)

        positions = batch.mask_positions.repeat_interleave(k, dim=0)  # (B*K, M)
        log_probs = self.reader.mask_log_probs(**batch.reader, mask_positions=positions)  # (B*K, M, V)
        log_probs = log_probs.view(batch_size, k, *log_probs.shape[1:])  # (B, K, M, V)
        targets = batch.targets.unsqueeze(1).expand(-1, k, -1)  # (B, K, M)
        token_log_probs = torch.gather(log_probs, 3, targets.unsqueeze(-1)).squeeze(-1)  # (B, K, M)
        loss, stats = marginal_mlm_loss(log_pz, token_log_probs, batch.mask_valid)
        if self.reader_loss == "marginal+candidates" and k > 1:  # the reader alone: no gradient reaches p(z | x)
            loss = loss + candidate_mlm_loss(token_log_probs, batch.candidate_mask, batch.mask_valid)
        with torch.no_grad():  # MLM accuracy of the marginal p(y_j | x) = sum_z p(z | x) p(y_j | z, x)
            log_pz = log_pz.detach()
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


CENTER_SAMPLE = 1024  # masked training queries whose mean is the first mask_center


def estimate_mask_center(
    retriever: Retriever, sentences: SentenceSet, cfg: PretrainConfig, query_max_tokens: int, device: torch.device
) -> None:
    """Set the query tower's mask_center to the mean uncentred embedding of CENTER_SAMPLE masked training
    queries: the centre the first steps retrieve with (the trainer then tracks it)."""
    tower, tokenizer = retriever.query_tower, retriever.tokenizer
    tower.mask_center.zero_()
    rng = np.random.default_rng(cfg.seed)
    rows = rng.choice(len(sentences), min(CENTER_SAMPLE, len(sentences)), replace=False)
    queries = [
        mask_sentence(
            sentences.texts[i], sentences.spans[i], cfg.masking, tokenizer, query_max_tokens, cfg.max_masks, rng
        )
        for i in rows
    ]
    vectors = []
    for start in range(0, len(queries), 128):
        query, *_ = pad_queries(queries[start : start + 128], tokenizer.pad_token_id)
        vectors.append(retriever.query_vectors({k: v.to(device) for k, v in query.items()}))
    tower.track_mask_center(torch.from_numpy(np.concatenate(vectors)).to(device), 1.0)
