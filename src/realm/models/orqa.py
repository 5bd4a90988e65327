"""Open-domain QA on REALM: retrieve the top-k blocks, read every short span of each, marginalise.

For a question x, retrieved blocks z_1..z_k (MIPS over the frozen document index) and spans s of z:

    f(x, z)            = Embed_input(x) · Embed_doc(z)             # Embed_doc(z) read from the index
    S(s)               = w · LayerNorm(ReLU(W_s h_start + W_e h_end))  # span hidden 256 (ORQA / REALM)
    log p(z, s | x)    = log_softmax_{(z, s)} [f(x, z) + S(s)]      # jointly over every span of the top k
    log p(y | x)       = logsumexp_{z, s : text(s) ≡ y} log p(z, s | x)

The joint normalisation is the released ORQA/REALM code's (`joint_logits` = retrieval logit + span logit,
one softmax over all blocks and spans): the reader's span scores also rank the blocks, so a block without
the answer can lose to one with it that the retriever ranked lower. (Normalising the spans within each
block instead, p(z | x) p(s | z, x), makes every block spend its whole mass on some span.)
`≡` is exact match after the spec's normalisation (ORQA's `regex_match_score` for *.regex.jsonl answers).
Fine-tuning keeps the document index frozen and trains the query tower and the reader. As in ORQA,
an example none of whose top-k blocks holds a matching span has no reader loss (log 0 is undefined);
every example whose answer appears in the retrieval beam (top `beam` blocks) adds the early-update
retrieval loss  -log sum_{z in beam, z holds y} softmax_beam f(x, z), which reaches only the query tower.
With hybrid retrieval (index/search.py) f(x, z) gains a BM25 term, w · BM25(x, z), and both losses also
train its weight w (saved in the model folder's fusion.json)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from realm.common.io import write_atomic
from realm.common.weights import MINILM
from realm.models.retriever import Retriever, inner_products
from realm.models.span_reader import MASKED, BlockSpans, ReaderBatch, SpanReader, block_spans, reader_batch


def joint_log_probs(block_logits: torch.Tensor, span_scores: torch.Tensor, span_valid: torch.Tensor) -> torch.Tensor:
    """log p(z, s | x) = log_softmax over every valid (z, s) of f(x, z) + S(s).
    block_logits (B, K); span_scores, span_valid (B, K, S) -> (B, K, S), -inf at padding spans."""
    joint = (block_logits.float().unsqueeze(-1) + span_scores.float()).masked_fill(~span_valid, MASKED)  # (B, K, S)
    return torch.log_softmax(joint.flatten(1), dim=-1).view_as(joint).masked_fill(~span_valid, float("-inf"))


def marginal_answer_log_likelihood(log_joint: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
    """log p(y | x) = logsumexp over matching (z, s) of log p(z, s | x).
    log_joint, match (B, K, S) -> (B,); about MASKED where nothing matches."""
    return torch.logsumexp(log_joint.masked_fill(~match, MASKED).flatten(1), dim=-1)


FUSION_FILE = "fusion.json"
# The hybrid retriever's BM25 weight before fine-tuning learns it: the maximum-likelihood w of the answer-bearing
# blocks among the union candidates for squad_open_train questions, with the MiniLM warm start and stemmed BM25
# (1.0; it was 0.8 with exact word forms: docs/log/2026-11-23-results-bm25-with-stemming.md).
DEFAULT_BM25_WEIGHT = 1.0


@dataclass
class QABatch:
    query: dict[str, torch.Tensor]  # (B, Lq) [CLS] x [SEP]
    beam_vectors: torch.Tensor  # (B, R, D) Embed_doc of the retrieval beam, best first, from the index
    beam_bm25: torch.Tensor  # (B, R) BM25(x, z) of the beam (hybrid retrieval; zeros for dense)
    beam_valid: torch.Tensor  # (B, R) bool
    beam_answer: torch.Tensor  # (B, R) bool: the block holds a reference answer
    reader: ReaderBatch  # B * K rows: the top K of the beam
    span_match: torch.Tensor  # (B * K, S) bool: the span reads as a reference answer

    def to(self, device: torch.device) -> QABatch:
        return QABatch(
            {k: v.to(device) for k, v in self.query.items()},
            self.beam_vectors.to(device),
            self.beam_bm25.to(device),
            self.beam_valid.to(device),
            self.beam_answer.to(device),
            self.reader.to(device),
            self.span_match.to(device),
        )


def qa_loss(
    f_beam: torch.Tensor,
    beam_valid: torch.Tensor,
    beam_answer: torch.Tensor,
    span_scores: torch.Tensor,
    span_valid: torch.Tensor,
    span_match: torch.Tensor,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """f_beam (B, R) retrieval logits over the beam, best first; span_scores, span_valid, span_match (B, K, S)
    for its top K. Reader loss on examples with a matching span in the top K; early-update retrieval loss on
    examples with an answer in the beam; both summed over those examples and divided by the batch size."""
    batch_size, k, _ = span_scores.shape
    f_beam = f_beam.float().masked_fill(~beam_valid, MASKED)
    log_joint = joint_log_probs(f_beam[:, :k], span_scores, span_valid)  # (B, K, S)
    answer_ll = marginal_answer_log_likelihood(log_joint, span_match)  # (B,)
    readable = span_match.flatten(1).any(-1)
    beam_ll = torch.logsumexp(torch.log_softmax(f_beam, -1).masked_fill(~beam_answer, MASKED), dim=-1)  # (B,)
    in_beam = beam_answer.any(-1)
    reader_loss = -(answer_ll * readable).sum() / batch_size
    retrieval_loss = -(beam_ll * in_beam).sum() / batch_size
    with torch.no_grad():
        em = span_match.flatten(1).gather(1, log_joint.flatten(1).argmax(-1, keepdim=True)).float().mean()
    stats = {
        "reader_loss": reader_loss.detach(),
        "retrieval_loss": retrieval_loss.detach(),
        "answer_in_top_k": readable.float().mean(),
        "answer_in_beam": in_beam.float().mean(),
        "train_em": em,
    }
    return reader_loss + retrieval_loss, stats


def bm25_weight_of(spec: str) -> float:
    """The BM25 weight a `train qa` output learned (its fusion.json), else DEFAULT_BM25_WEIGHT."""
    path = Path(spec) / FUSION_FILE
    return float(json.loads(path.read_text())["bm25_weight"]) if path.is_file() else DEFAULT_BM25_WEIGHT


class QAModel(nn.Module):
    """Query tower + frozen document index + span reader, and the hybrid retriever's BM25 weight. The document
    tower is kept (to check the index and to embed added documents) but never trained here."""

    def __init__(self, retriever: Retriever, reader: SpanReader, bm25_weight: float = DEFAULT_BM25_WEIGHT):
        super().__init__()
        self.retriever = retriever
        self.reader = reader
        self.bm25_weight = nn.Parameter(torch.tensor(float(bm25_weight)))
        self.retriever.doc_tower.requires_grad_(False)

    @classmethod
    def load(
        cls,
        spec: str,
        retriever_config,
        span_hidden: int = 256,
        max_span_width: int = 10,
        reader: str | None = None,
        span_head: str = "orqa",
    ) -> QAModel:
        """`minilm`; a REALM pretraining output or a fine-tuned QA model (folders with retriever/ and reader/).
        `reader` replaces the folder's reader with another warm start (e.g. an ICT retriever with a BERT reader)."""
        if spec == MINILM:
            return cls(
                Retriever.load(MINILM, retriever_config),
                SpanReader.load(reader or MINILM, span_hidden, max_span_width, span_head),
            )
        folder = Path(spec)
        if not ((folder / "retriever").is_dir() and (reader or (folder / "reader").is_dir())):
            raise FileNotFoundError(
                f"unknown model {spec!r}: expected 'minilm' or a folder with retriever/ and reader/ "
                "(the output of `realm train pretrain` or `realm train qa`)"
            )
        return cls(
            Retriever.load(str(folder / "retriever"), retriever_config),
            SpanReader.load(reader or str(folder / "reader"), span_hidden, max_span_width, span_head),
            bm25_weight_of(str(folder)),
        )

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.retriever.save(folder / "retriever")
        self.reader.save(folder / "reader")
        write_atomic(folder / FUSION_FILE, lambda tmp: tmp.write_text(json.dumps({"bm25_weight": self.fusion_weight})))

    @property
    def fusion_weight(self) -> float:
        """w of the hybrid retriever's f(x, z) + w · BM25(x, z), as a number."""
        return float(self.bm25_weight.detach())

    def beam_logits(self, batch: QABatch) -> torch.Tensor:
        """(B, R) f(x, z) + w · BM25(x, z) over the beam, in fp32 (the document side is the frozen index's)."""
        q = self.retriever.query_tower(**batch.query)  # (B, D)
        f_beam = inner_products("bd,brd->br", q, batch.beam_vectors)  # (B, R) f(x, z)
        with torch.autocast(q.device.type, enabled=False):
            return f_beam + self.bm25_weight.float() * batch.beam_bm25.float()  # hybrid (BM25 zeros for dense)

    def forward(self, batch: QABatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        f_beam = self.beam_logits(batch)  # (B, R)
        scores = self.span_scores(batch.reader)  # (B*K, S)
        shape = (len(f_beam), -1, scores.size(-1))  # (B, K, S)
        return qa_loss(
            f_beam,
            batch.beam_valid,
            batch.beam_answer,
            scores.view(shape),
            batch.reader.span_valid.view(shape),
            batch.span_match.view(shape),
        )

    def reader_inputs(
        self, questions: Sequence[str], bodies: Sequence[Sequence[str]], max_block_tokens: int
    ) -> tuple[ReaderBatch, list[list[BlockSpans]]]:
        """What the reader reads for each question and its blocks' bodies (answering and fine-tuning alike): one row
        [CLS] x [SEP] body [SEP] a block, the question cut to the query length, the body to `max_block_tokens`, and
        every span of at most `max_span_width` wordpieces; with each block's spans (to read answers back)."""
        limit = self.retriever.config.query_max_tokens - 2
        tokenized = self.retriever.tokenizer(list(questions), add_special_tokens=False)["input_ids"]
        width = self.reader.max_span_width
        blocks = [[block_spans(self.reader.tokenizer, body, max_block_tokens, width) for body in row] for row in bodies]
        return reader_batch(self.reader.tokenizer, [ids[:limit] for ids in tokenized], blocks), blocks

    def span_scores(self, batch: ReaderBatch) -> torch.Tensor:
        """S(s) for every span of every row of `reader_inputs`, (N, S); MASKED at padding spans."""
        return self.reader(**batch.inputs, starts=batch.starts, ends=batch.ends, span_valid=batch.span_valid)
