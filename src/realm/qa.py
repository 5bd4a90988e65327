"""Open-domain QA on REALM: retrieve the top-k blocks, read every short span of each, marginalise.

For a question x, retrieved blocks z_1..z_k (MIPS over the frozen document index) and spans s of z:

    f(x, z)            = Embed_input(x) · Embed_doc(z)             # Embed_doc(z) read from the index
    log p(z | x)       = log_softmax_z f(x, z)                      # over the top k
    S(s)               = w · LayerNorm(ReLU(W_s h_start + W_e h_end))  # span hidden 256 (ORQA / REALM)
    log p(s | z, x)    = log_softmax_s S(s)                         # over the spans of z (width <= W words)
    log p(y | x)       = logsumexp_{z, s : text(s) ≡ y} [log p(z | x) + log p(s | z, x)]

`≡` is exact match after the spec's normalisation (a full regex match for *.regex.jsonl answers).
Fine-tuning keeps the document index frozen and trains the query tower and the reader. As in ORQA,
an example none of whose top-k blocks holds a matching span has no reader loss (log 0 is undefined);
every example whose answer appears in the retrieval beam (top `beam` blocks) adds the early-update
retrieval loss  -log sum_{z in beam, z holds y} softmax_beam f(x, z), which reaches only the query tower.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import BertModel, PreTrainedTokenizerBase

from realm.embed import pad_batch
from realm.evaluation import QAExample, has_answer, is_exact_match, normalize_answer, recall_at_k
from realm.index import MipsIndex
from realm.io import write_atomic, write_dir_atomic
from realm.retriever import Retriever
from realm.search import BM25Searcher, Searcher, SearchHit
from realm.tokenization import MINILM, load_tokenizer, minilm_dir

SPAN_HEAD_FILE = "span_head.safetensors"
READER_META = "reader.json"
READER_SEED = 20200807
SPANS_PER_BLOCK = 32  # spans per block considered as answer strings at prediction time


# -- the reader -----------------------------------------------------------------------------------
class SpanHead(nn.Module):
    """S(s) = w · LayerNorm(ReLU(W_start h_start + W_end h_end)), as in the released ORQA/REALM code."""

    def __init__(self, hidden_size: int, span_hidden: int):
        super().__init__()
        self.start = nn.Linear(hidden_size, span_hidden)
        self.end = nn.Linear(hidden_size, span_hidden)
        self.norm = nn.LayerNorm(span_hidden)
        self.score = nn.Linear(span_hidden, 1)

    def forward(self, hidden: torch.Tensor, starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """hidden (N, L, H); starts, ends (N, S) token positions -> span scores (N, S)."""
        gather = lambda x, at: torch.gather(x, 1, at.unsqueeze(-1).expand(-1, -1, x.size(-1)))  # noqa: E731
        h = torch.relu(gather(self.start(hidden), starts) + gather(self.end(hidden), ends))  # (N, S, span_hidden)
        return self.score(self.norm(h)).squeeze(-1)


class SpanReader(nn.Module):
    """BERT over `[CLS] x [SEP] body [SEP]` with a span head (the knowledge-augmented encoder for QA)."""

    def __init__(self, bert: BertModel, tokenizer: PreTrainedTokenizerBase, span_hidden: int, max_span_width: int):
        super().__init__()
        self.bert = bert
        self.tokenizer = tokenizer
        self.max_span_width = max_span_width
        self.span_head = SpanHead(bert.config.hidden_size, span_hidden)

    @classmethod
    def load(cls, spec: str, span_hidden: int = 256, max_span_width: int = 10) -> SpanReader:
        """A folder saved by `save`; or a warm start with a fresh span head from `minilm`, a REALM
        pretraining reader (BertForMaskedLM folder: its BERT body) or any BERT folder."""
        folder = minilm_dir() if spec == MINILM else Path(spec)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(f"unknown reader {spec!r}: expected 'minilm', a saved QA reader or a BERT folder")
        bert = BertModel.from_pretrained(str(folder), add_pooling_layer=False, attn_implementation="sdpa",
                                         dtype=torch.float32)  # fp32 master weights, as for the towers
        if (folder / READER_META).is_file():
            meta = json.loads((folder / READER_META).read_text())
            span_hidden, max_span_width = meta["span_hidden"], meta["max_span_width"]
        torch.manual_seed(READER_SEED)  # the same fresh head on every run
        reader = cls(bert, load_tokenizer(folder), span_hidden, max_span_width)
        if (folder / SPAN_HEAD_FILE).is_file():
            reader.span_head.load_state_dict(load_file(folder / SPAN_HEAD_FILE))
        return reader

    def save(self, folder: str | Path) -> None:
        def write(tmp: Path) -> None:
            self.bert.save_pretrained(str(tmp))
            self.tokenizer.save_pretrained(str(tmp))
            save_file({k: v.contiguous() for k, v in self.span_head.state_dict().items()}, tmp / SPAN_HEAD_FILE)
            meta = {"span_hidden": self.span_head.norm.normalized_shape[0], "max_span_width": self.max_span_width}
            (tmp / READER_META).write_text(json.dumps(meta) + "\n")

        write_dir_atomic(Path(folder), write)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor,
                starts: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
        """(N, L) inputs and (N, S) span boundaries -> (N, S) span scores."""
        hidden = self.bert(input_ids=input_ids, attention_mask=attention_mask,
                           token_type_ids=token_type_ids).last_hidden_state  # (N, L, H)
        return self.span_head(hidden, starts, ends).float()


# -- reader inputs --------------------------------------------------------------------------------
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
    encoding = tokenizer(body, add_special_tokens=False, return_offsets_mapping=True, truncation=True,
                         max_length=max_tokens)
    ids, offsets, words = encoding["input_ids"], encoding["offset_mapping"], encoding.word_ids()
    starts = [i for i in range(len(ids)) if i == 0 or words[i] != words[i - 1]]
    ends = {i for i in range(len(ids)) if i == len(ids) - 1 or words[i] != words[i + 1]}
    spans = [(i, j) for i in starts for j in range(i, min(len(ids), i + max_width)) if j in ends]
    return BlockSpans(ids, [tuple(o) for o in offsets], spans)


def matching_spans(body: str, spans: BlockSpans, example: QAExample) -> list[bool]:
    """Which spans' text is a reference answer (skips the work when the block holds no answer at all)."""
    if not has_answer(body, example):
        return [False] * len(spans.spans)
    return [is_exact_match(spans.text(body, s), example) for s in spans.spans]


@dataclass
class ReaderBatch:
    inputs: dict[str, torch.Tensor]  # (N, L) [CLS] x [SEP] body [SEP], N = B * K
    starts: torch.Tensor  # (N, S) token positions in the reader input
    ends: torch.Tensor  # (N, S)
    span_valid: torch.Tensor  # (N, S) bool

    def to(self, device: torch.device) -> ReaderBatch:
        return ReaderBatch({k: v.to(device) for k, v in self.inputs.items()}, self.starts.to(device),
                           self.ends.to(device), self.span_valid.to(device))


def reader_batch(tokenizer: PreTrainedTokenizerBase, question_ids: list[list[int]], blocks: list[list[BlockSpans]]) -> ReaderBatch:
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
    for n, row in enumerate(span_rows):
        if row:
            starts[n, : len(row)] = torch.tensor([s for s, _ in row])
            ends[n, : len(row)] = torch.tensor([e for _, e in row])
            valid[n, : len(row)] = True
    return ReaderBatch(pad_batch(ids, types, tokenizer.pad_token_id), starts, ends, valid)


MASKED = -1e4  # a finite "log 0": rows with nothing valid must not turn gradients into NaN


def span_log_probs(span_scores: torch.Tensor, span_valid: torch.Tensor) -> torch.Tensor:
    """log p(s | z, x): softmax over each block's valid spans -> (N, S), -inf at padding."""
    return torch.log_softmax(span_scores.masked_fill(~span_valid, MASKED), dim=-1).masked_fill(~span_valid, float("-inf"))


def marginal_answer_log_likelihood(log_pz: torch.Tensor, log_ps: torch.Tensor, match: torch.Tensor) -> torch.Tensor:
    """log p(y | x) = logsumexp over matching (z, s) of log p(z | x) + log p(s | z, x).
    log_pz (B, K); log_ps (B, K, S); match (B, K, S) bool -> (B,); about MASKED where nothing matches."""
    joint = (log_pz.unsqueeze(-1) + log_ps).masked_fill(~match, MASKED)  # (B, K, S)
    return torch.logsumexp(joint.flatten(1), dim=-1)


@dataclass
class QABatch:
    query: dict[str, torch.Tensor]  # (B, Lq) [CLS] x [SEP]
    beam_vectors: torch.Tensor  # (B, R, D) Embed_doc of the retrieval beam, best first, from the index
    beam_valid: torch.Tensor  # (B, R) bool
    beam_answer: torch.Tensor  # (B, R) bool: the block holds a reference answer
    reader: ReaderBatch  # B * K rows: the top K of the beam
    span_match: torch.Tensor  # (B * K, S) bool: the span reads as a reference answer

    def to(self, device: torch.device) -> QABatch:
        return QABatch({k: v.to(device) for k, v in self.query.items()}, self.beam_vectors.to(device),
                       self.beam_valid.to(device), self.beam_answer.to(device), self.reader.to(device),
                       self.span_match.to(device))


def qa_loss(f_beam: torch.Tensor, beam_valid: torch.Tensor, beam_answer: torch.Tensor, log_ps: torch.Tensor,
            span_match: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """f_beam (B, R) f(x, z) over the beam; log_ps (B, K, S) for its top K; span_match (B, K, S).
    Reader loss on examples with a matching span in the top K; early-update retrieval loss on examples
    with an answer in the beam; both summed over those examples and divided by the batch size."""
    batch_size, k, _ = log_ps.shape
    f_beam = f_beam.float().masked_fill(~beam_valid, MASKED)
    log_pz = torch.log_softmax(f_beam[:, :k], dim=-1)  # (B, K)
    answer_ll = marginal_answer_log_likelihood(log_pz, log_ps, span_match)  # (B,)
    readable = span_match.flatten(1).any(-1)
    beam_ll = torch.logsumexp(torch.log_softmax(f_beam, -1).masked_fill(~beam_answer, MASKED), dim=-1)  # (B,)
    in_beam = beam_answer.any(-1)
    reader_loss = -(answer_ll * readable).sum() / batch_size
    retrieval_loss = -(beam_ll * in_beam).sum() / batch_size
    with torch.no_grad():
        joint = (log_pz.unsqueeze(-1) + log_ps).flatten(1)  # (B, K*S)
        em = span_match.flatten(1).gather(1, joint.argmax(-1, keepdim=True)).float().mean()
    stats = {"reader_loss": reader_loss.detach(), "retrieval_loss": retrieval_loss.detach(),
             "answer_in_top_k": readable.float().mean(), "answer_in_beam": in_beam.float().mean(), "train_em": em}
    return reader_loss + retrieval_loss, stats


# -- the model ------------------------------------------------------------------------------------
class QAModel(nn.Module):
    """Query tower + frozen document index + span reader. The document tower is kept (to check the index
    and to embed added documents) but never trained here."""

    def __init__(self, retriever: Retriever, reader: SpanReader):
        super().__init__()
        self.retriever = retriever
        self.reader = reader
        self.retriever.doc_tower.requires_grad_(False)

    @classmethod
    def load(cls, spec: str, retriever_config, span_hidden: int = 256, max_span_width: int = 10,
             reader: str | None = None) -> QAModel:
        """`minilm`; a REALM pretraining output or a fine-tuned QA model (folders with retriever/ and reader/).
        `reader` replaces the folder's reader with another warm start (e.g. an ICT retriever with a BERT reader)."""
        if spec == MINILM:
            return cls(Retriever.load(MINILM, retriever_config), SpanReader.load(reader or MINILM, span_hidden, max_span_width))
        folder = Path(spec)
        if not ((folder / "retriever").is_dir() and (reader or (folder / "reader").is_dir())):
            raise FileNotFoundError(f"unknown model {spec!r}: expected 'minilm' or a folder with retriever/ and reader/ "
                                    "(the output of `realm train pretrain` or `realm train qa`)")
        return cls(Retriever.load(str(folder / "retriever"), retriever_config),
                   SpanReader.load(reader or str(folder / "reader"), span_hidden, max_span_width))

    def save(self, folder: str | Path) -> None:
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.retriever.save(folder / "retriever")
        self.reader.save(folder / "reader")

    def forward(self, batch: QABatch) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        q = self.retriever.query_tower(**batch.query)  # (B, D)
        f_beam = torch.einsum("bd,brd->br", q.float(), batch.beam_vectors)  # (B, R) f(x, z), doc side frozen
        scores = self.reader(**batch.reader.inputs, starts=batch.reader.starts, ends=batch.reader.ends)  # (B*K, S)
        log_ps = span_log_probs(scores, batch.reader.span_valid)
        batch_size = len(q)
        return qa_loss(f_beam, batch.beam_valid, batch.beam_answer, log_ps.view(batch_size, -1, log_ps.size(-1)),
                       batch.span_match.view(batch_size, -1, log_ps.size(-1)))

    def question_ids(self, questions: Sequence[str]) -> list[list[int]]:
        """Question wordpieces without special tokens, cut to the query length."""
        limit = self.retriever.config.query_max_tokens - 2
        return [row[:limit] for row in self.retriever.tokenizer(list(questions), add_special_tokens=False)["input_ids"]]

    def blocks(self, bodies: Sequence[str], max_tokens: int) -> list[BlockSpans]:
        return [block_spans(self.reader.tokenizer, body, max_tokens, self.reader.max_span_width) for body in bodies]


def stored_vectors(index: MipsIndex, block_ids: np.ndarray) -> torch.Tensor:
    """Embed_doc of the given blocks as stored in the (frozen) index: (..., D) float32."""
    rows = np.searchsorted(index.block_ids, block_ids)
    rows = np.clip(rows, 0, len(index.block_ids) - 1)
    if not np.array_equal(index.block_ids[rows], block_ids):
        raise KeyError("block ids missing from the index")
    return torch.from_numpy(np.asarray(index.embeddings()[rows.ravel()], dtype=np.float32).reshape(*block_ids.shape, -1))


# -- answers --------------------------------------------------------------------------------------
@dataclass
class Evidence:
    block_id: int
    doc_id: str
    title: str
    text: str
    retrieval_prob: float  # p(z | x) among the top k
    answer_prob: float  # p(z | x) * sum of p(s | z, x) over the spans of z that read as the answer
    answer_span: tuple[int, int] | None  # character offsets of the best such span in `text`


@dataclass
class Answer:
    question: str
    answer: str
    score: float  # p(answer | x), marginalised over the blocks and their matching spans
    evidence: list[Evidence] = field(default_factory=list)

    def to_dict(self) -> dict:
        return asdict(self)


def compose_answer(question: str, hits: Sequence[SearchHit], blocks: Sequence[BlockSpans], log_pz: torch.Tensor,
                   log_ps: torch.Tensor) -> Answer:
    """The answer string with the highest marginal p(y | x) among each block's top spans, with its evidence.
    log_pz (K,); log_ps (K, S)."""
    pz = log_pz.exp().tolist()
    totals: dict[str, float] = {}  # normalised answer -> p(y | x)
    shown: dict[str, str] = {}  # normalised answer -> its text as first read
    per_block: list[dict[str, tuple[float, tuple[int, int]]]] = []  # normalised answer -> (sum p(s|z,x), best span)
    for z, (hit, spans) in enumerate(zip(hits, blocks)):
        found: dict[str, tuple[float, tuple[int, int]]] = {}
        count = min(SPANS_PER_BLOCK, len(spans.spans))
        if count:
            top = torch.topk(log_ps[z, : len(spans.spans)], count)
            for lp, s in zip(top.values.tolist(), top.indices.tolist()):
                text = spans.text(hit.text, spans.spans[s])
                key = normalize_answer(text)
                if key:
                    mass, best = found.get(key, (0.0, spans.char_span(spans.spans[s])))
                    found[key] = (mass + float(np.exp(lp)), best)
                    shown.setdefault(key, text)
        for key, (mass, _) in found.items():
            totals[key] = totals.get(key, 0.0) + pz[z] * mass
        per_block.append(found)
    best = max(totals, key=totals.get) if totals else ""
    evidence = []
    for z, hit in enumerate(hits):
        mass, span = per_block[z].get(best, (0.0, None))
        evidence.append(Evidence(hit.block_id, hit.doc_id, hit.title, hit.text, pz[z], pz[z] * mass, span))
    return Answer(question, shown.get(best, ""), totals.get(best, 0.0), evidence)


class Answerer:
    """Questions in, answers with evidence out: a searcher (dense REALM retrieval, or BM25 with a uniform
    p(z | x) since its scores are not retrieval logits) and the span reader, batched."""

    def __init__(self, model: QAModel, searcher: Searcher, k: int, max_block_tokens: int, batch_size: int = 8,
                 dtype: torch.dtype = torch.float32):
        self.model = model.eval()
        self.searcher = searcher
        self.k = k
        self.max_block_tokens = max_block_tokens
        self.batch_size = batch_size
        self.dtype = dtype
        self.uniform_prior = isinstance(searcher, BM25Searcher)

    def ask(self, questions: Sequence[str]) -> list[Answer]:
        answers = []
        for start in range(0, len(questions), self.batch_size):
            part = list(questions[start : start + self.batch_size])
            answers += self.read(part, self.searcher.batch_search(part, self.k))
        return answers

    def _log_ps(self, questions: Sequence[str], blocks: Sequence[Sequence[BlockSpans]]) -> torch.Tensor:
        """log p(s | z, x) for every (question, block) row, in order: (sum of K, S)."""
        batch = reader_batch(self.model.reader.tokenizer, self.model.question_ids(questions), blocks)
        device = next(self.model.parameters()).device
        batch = batch.to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=self.dtype == torch.bfloat16):
            scores = self.model.reader(**batch.inputs, starts=batch.starts, ends=batch.ends)  # (N, S)
        return span_log_probs(scores, batch.span_valid).cpu()

    def _log_pz(self, hits: Sequence[SearchHit]) -> torch.Tensor:
        logits = torch.zeros(len(hits)) if self.uniform_prior else torch.tensor([h.score for h in hits])
        return torch.log_softmax(logits, 0)

    @torch.inference_mode()
    def read(self, questions: Sequence[str], hits: Sequence[Sequence[SearchHit]]) -> list[Answer]:
        """Answers for questions whose blocks are already retrieved (hits: best first, SearchHit.score = f(x, z))."""
        blocks = [self.model.blocks([h.text for h in row], self.max_block_tokens) for row in hits]
        answers: list[Answer | None] = [Answer(q, "", 0.0) if not row else None for q, row in zip(questions, hits)]
        asked = [b for b, row in enumerate(hits) if row]
        if asked:
            log_ps = self._log_ps([questions[b] for b in asked], [blocks[b] for b in asked])
            row = 0
            for b in asked:
                k = len(hits[b])
                answers[b] = compose_answer(questions[b], hits[b], blocks[b], self._log_pz(hits[b]), log_ps[row : row + k])
                row += k
        return answers

    @torch.inference_mode()
    def reference_probability(self, example: QAExample) -> float:
        """p(y | x) of the reference answers: 0 when no retrieved block has a span that reads as one."""
        hits = self.searcher.search(example.question, self.k)
        if not hits:
            return 0.0
        blocks = self.model.blocks([h.text for h in hits], self.max_block_tokens)
        log_ps = self._log_ps([example.question], [blocks])  # (K, S)
        match = torch.zeros_like(log_ps, dtype=torch.bool)
        for z, (hit, spans) in enumerate(zip(hits, blocks)):
            match[z, : len(spans.spans)] = torch.tensor(matching_spans(hit.text, spans, example), dtype=torch.bool)
        if not match.any():
            return 0.0
        return marginal_answer_log_likelihood(self._log_pz(hits)[None], log_ps[None], match[None]).exp().item()


def open_searcher(index: MipsIndex, kind: str, retriever: Retriever, corpus: str | Path | None = None) -> Searcher:
    """Dense search over `index` (refuses an index built by another document tower), or BM25 over its blocks."""
    from realm.search import DenseSearcher

    store = index.corpus(corpus)
    return BM25Searcher(store) if kind == "bm25" else DenseSearcher(index, retriever, store)


def load_answerer(model_spec: str, index_dir: str | Path, preset, retriever: str = "dense", k: int | None = None,
                  corpus: str | Path | None = None, version: int | None = None) -> Answerer:
    """Model + index version (default: CURRENT) -> an Answerer. `retriever="bm25"` keeps the reader and swaps
    in BM25 over the same blocks."""
    from realm.embed import default_device, resolve_compute_dtype

    index = MipsIndex(index_dir, version)
    config = dataclasses.replace(preset.retriever, **index.meta.retriever)  # pooling etc. of the index's model
    model = QAModel.load(model_spec, config, preset.qa.span_hidden, preset.qa.max_span_width)
    searcher = open_searcher(index, retriever, model.retriever, corpus)
    device = default_device()
    dtype = resolve_compute_dtype(preset.embed.compute_dtype, device)
    return Answerer(model.to(device), searcher, k or preset.qa.top_k, index.corpus(corpus).config.max_block_tokens,
                    dtype=dtype)


def evaluate_qa(answerer: Answerer, examples: Sequence[QAExample], recall_ks: Sequence[int],
                predictions: Path | None = None) -> dict:
    """Exact match and recall@k on `examples` (one search serves both); optionally a predictions JSONL with
    each question's answer, score and evidence. Returns the summary (percentages rounded to 0.01)."""
    from realm.search import search_all

    ks = sorted(set(recall_ks) | {answerer.k})
    started = time.monotonic()
    hits = search_all(answerer.searcher, [e.question for e in examples], max(ks), batch_size=answerer.batch_size)
    answers: list[Answer] = []
    for start in range(0, len(examples), answerer.batch_size):
        part = examples[start : start + answerer.batch_size]
        answers += answerer.read([e.question for e in part], [row[: answerer.k] for row in hits[start : start + len(part)]])
    correct = [is_exact_match(a.answer, e) for a, e in zip(answers, examples)]
    if predictions is not None:
        lines = [json.dumps({"question": e.question, "references": list(e.answers), "prediction": a.answer,
                             "score": a.score, "exact_match": ok, "evidence": [asdict(v) for v in a.evidence]},
                            ensure_ascii=False) + "\n" for e, a, ok in zip(examples, answers, correct)]
        write_atomic(Path(predictions), lambda tmp: tmp.write_text("".join(lines)))
    return {"exact_match": round(100.0 * sum(correct) / len(examples), 2),
            **{name: round(value, 2) for name, value in recall_at_k(examples, hits, ks).items()},
            "questions": len(examples), "reader_top_k": answerer.k, "seconds": round(time.monotonic() - started, 1)}
