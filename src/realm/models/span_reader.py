"""The span reader for open QA: BERT over `[CLS] x [SEP] body [SEP]` and a span head (ORQA / REALM).

    S(s) = w · LayerNorm(ReLU(W_s h_start + W_e h_end))   # span hidden 256; normalised in models/orqa.py

Spans are whole words of at most `max_span_width` wordpieces. Also the reader's inputs: a block tokenised
with its candidate spans, and the padded batch of every (question, block) pair.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import BertModel, PreTrainedTokenizerBase

from realm.common.io import write_dir_atomic
from realm.common.tokenization import load_tokenizer, minilm_dir
from realm.common.weights import MINILM
from realm.data.qa_examples import QAExample, has_answer, span_matcher
from realm.models.bert import fresh_weights, load_bert
from realm.models.encoder import encode, pad_rows
from realm.models.inputs import pad_batch

SPAN_HEAD_FILE = "span_head.safetensors"


READER_META = "reader.json"


SPAN_HEAD_SEED = 20200807

MASKED = -1e4  # a finite "log 0": rows with nothing valid must not turn gradients into NaN


SPAN_HEADS = ("orqa", "start_end")


class SpanHead(nn.Module):
    """S(s) = w · LayerNorm(ReLU(W_start h_start + W_end h_end)), as in the released ORQA/REALM code ("orqa"); or
    BERT's SQuAD head, S(s) = w_start · h_start + w_end · h_end ("start_end", a setting measured against it)."""

    def __init__(self, hidden_size: int, span_hidden: int, kind: str = "orqa"):
        super().__init__()
        if kind not in SPAN_HEADS:
            raise ValueError(f"unknown span head {kind!r}: one of {', '.join(SPAN_HEADS)}")
        self.kind = kind
        width = span_hidden if kind == "orqa" else 1
        self.start = nn.Linear(hidden_size, width)
        self.end = nn.Linear(hidden_size, width)
        if kind == "orqa":
            self.norm = nn.LayerNorm(span_hidden)
            self.score = nn.Linear(span_hidden, 1)
        self.span_hidden = span_hidden

    def forward(
        self, hidden: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor, valid: torch.Tensor
    ) -> torch.Tensor:
        """hidden (N, L, H); starts, ends (N, S) token positions; valid (N, S) bool -> span scores (N, S), MASKED
        where not valid. Only the valid spans are scored (a padded span row is about half padding)."""
        n, length, _ = hidden.shape
        pick = valid.flatten().nonzero().squeeze(1)  # (V,)
        rows = pick // starts.size(1) * length  # (V,) where each span's row starts in (N * L)
        hidden = pad_rows(hidden.flatten(0, 1))  # (N * L rounded up, H)
        h_start = self.start(hidden)[rows + starts.flatten()[pick]]  # (V, span_hidden)
        h_end = self.end(hidden)[rows + ends.flatten()[pick]]
        if self.kind == "orqa":
            scores = self.score(pad_rows(self.norm(torch.relu(h_start + h_end))))[: len(pick), 0].float()  # (V,)
        else:
            scores = (h_start + h_end)[:, 0].float()  # (V,)
        return scores.new_full((starts.numel(),), MASKED).index_copy(0, pick, scores).view(starts.shape)


class SpanReader(nn.Module):
    """BERT over `[CLS] x [SEP] body [SEP]` with a span head (the knowledge-augmented encoder for QA)."""

    def __init__(
        self,
        bert: BertModel,
        tokenizer: PreTrainedTokenizerBase,
        span_hidden: int,
        max_span_width: int,
        span_head: str = "orqa",
    ):
        super().__init__()
        self.bert = bert
        self.tokenizer = tokenizer
        self.max_span_width = max_span_width
        self.span_head = SpanHead(bert.config.hidden_size, span_hidden, span_head)
        self.fine_tuned = False  # True once a trained span head is loaded: a fresh one answers with noise

    @classmethod
    def load(cls, spec: str, span_hidden: int = 256, max_span_width: int = 10, span_head: str = "orqa") -> SpanReader:
        """A folder saved by `save` (its own head and width); or a warm start with a fresh span head of
        `span_head`'s kind from `minilm`, a REALM pretraining reader (BertForMaskedLM folder: its BERT body) or any
        BERT folder."""
        folder = minilm_dir() if spec == MINILM else Path(spec)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"unknown reader {spec!r}: expected 'minilm', a saved QA reader or a BERT folder")
        bert = load_bert(folder)
        if (folder / READER_META).is_file():
            meta = json.loads((folder / READER_META).read_text())
            span_hidden, max_span_width = meta["span_hidden"], meta["max_span_width"]
            span_head = meta.get("span_head", "orqa")  # a reader saved before the setting had ORQA's
        with fresh_weights(SPAN_HEAD_SEED):  # the same fresh head on every run
            reader = cls(bert, load_tokenizer(folder), span_hidden, max_span_width, span_head)
        if (folder / SPAN_HEAD_FILE).is_file():
            reader.span_head.load_state_dict(load_file(folder / SPAN_HEAD_FILE))
            reader.fine_tuned = True
        return reader

    def save(self, folder: str | Path) -> None:
        def write(tmp: Path) -> None:
            self.bert.save_pretrained(str(tmp))
            self.tokenizer.save_pretrained(str(tmp))
            save_file({k: v.contiguous() for k, v in self.span_head.state_dict().items()}, tmp / SPAN_HEAD_FILE)
            head = self.span_head
            meta = {"span_hidden": head.span_hidden, "max_span_width": self.max_span_width, "span_head": head.kind}
            (tmp / READER_META).write_text(json.dumps(meta) + "\n")

        write_dir_atomic(Path(folder), write)

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor,
        starts: torch.Tensor,
        ends: torch.Tensor,
        span_valid: torch.Tensor,
    ) -> torch.Tensor:
        """(N, L) inputs and (N, S) span boundaries -> (N, S) span scores (MASKED at padding spans)."""
        hidden = encode(self.bert, input_ids, attention_mask, token_type_ids)  # (N, L, H)
        return self.span_head(hidden, starts, ends, span_valid)


@dataclass(frozen=True)
class BlockSpans:
    """A block body tokenised for the reader, and its candidate spans (whole words, at most W words...
    measured in wordpieces as in the paper)."""

    ids: list[int]
    char_offsets: list[tuple[int, int]]
    spans: list[tuple[int, int]]  # (first, last) body token index, inclusive

    def text(self, body: str, span: tuple[int, int]) -> str:
        return body[self.char_offsets[span[0]][0] : self.char_offsets[span[1]][1]]

    def char_span(self, span: tuple[int, int]) -> tuple[int, int]:
        return self.char_offsets[span[0]][0], self.char_offsets[span[1]][1]


def block_spans(tokenizer: PreTrainedTokenizerBase, body: str, max_tokens: int, max_width: int) -> BlockSpans:
    """Spans start at a word's first wordpiece, end at a word's last, and cover at most `max_width` wordpieces."""
    encoding = tokenizer(
        body, add_special_tokens=False, return_offsets_mapping=True, truncation=True, max_length=max_tokens
    )
    ids, offsets, words = encoding["input_ids"], encoding["offset_mapping"], encoding.word_ids()
    starts = [i for i in range(len(ids)) if i == 0 or words[i] != words[i - 1]]
    ends = {i for i in range(len(ids)) if i == len(ids) - 1 or words[i] != words[i + 1]}
    spans = [(i, j) for i in starts for j in range(i, min(len(ids), i + max_width)) if j in ends]
    return BlockSpans(ids, [tuple(o) for o in offsets], spans)


def matching_spans(body: str, spans: BlockSpans, example: QAExample, holds: bool | None = None) -> list[bool]:
    """Which spans' text is a reference answer, as a training label (skips the work when the block holds no
    answer at all: `holds`, where the caller knows, else `has_answer`)."""
    if not (has_answer(body, example) if holds is None else holds):
        return [False] * len(spans.spans)
    is_answer = span_matcher(example)
    return [is_answer(spans.text(body, s)) for s in spans.spans]


@dataclass
class ReaderBatch:
    inputs: dict[str, torch.Tensor]  # (N, L) [CLS] x [SEP] body [SEP], N = B * K
    starts: torch.Tensor  # (N, S) token positions in the reader input
    ends: torch.Tensor  # (N, S)
    span_valid: torch.Tensor  # (N, S) bool

    def to(self, device: torch.device) -> ReaderBatch:
        return ReaderBatch(
            {k: v.to(device) for k, v in self.inputs.items()},
            self.starts.to(device),
            self.ends.to(device),
            self.span_valid.to(device),
        )


def reader_batch(
    tokenizer: PreTrainedTokenizerBase, question_ids: Sequence[Sequence[int]], blocks: Sequence[Sequence[BlockSpans]]
) -> ReaderBatch:
    """question_ids (B) without special tokens; blocks (B, K) -> reader inputs for every (question, block)."""
    cls, sep = tokenizer.cls_token_id, tokenizer.sep_token_id
    ids, types, span_rows = [], [], []
    for question, row in zip(question_ids, blocks):
        for block in row:
            offset = len(question) + 2  # body token i sits at offset + i
            ids.append([cls, *question, sep, *block.ids, sep])
            types.append([0] * offset + [1] * (len(block.ids) + 1))
            span_rows.append([(offset + i, offset + j) for i, j in block.spans])
    width = max(1, max(len(r) for r in span_rows))
    starts = torch.zeros(len(span_rows), width, dtype=torch.long)
    ends = torch.zeros(len(span_rows), width, dtype=torch.long)
    valid = torch.zeros(len(span_rows), width, dtype=torch.bool)
    for n, spans in enumerate(span_rows):
        if spans:
            starts[n, : len(spans)] = torch.tensor([s for s, _ in spans])
            ends[n, : len(spans)] = torch.tensor([e for _, e in spans])
            valid[n, : len(spans)] = True
    return ReaderBatch(pad_batch(ids, types, tokenizer.pad_token_id), starts, ends, valid)
