"""The REALM retriever: a query tower and a document tower, each BERT -> pool -> dense -> LayerNorm.

    Embed_input(x) = LayerNorm(W_input · BERT_pool([CLS] x [SEP]))                 # (B, 128)
    Embed_doc(z)   = LayerNorm(W_doc   · BERT_pool([CLS] title [SEP] body [SEP]))  # (B, 128)
    f(x, z)        = Embed_input(x) · Embed_doc(z)
    p(z | x)       = softmax_z f(x, z)

The paper pools with [CLS]. all-MiniLM-L6-v2, our warm start, was trained with *mean* pooling and
cosine similarity, so its [CLS] vector carries little meaning until trained; the cpu preset pools by
mean. The warm-start projection is one random orthogonal map shared by both towers (each tower keeps
its own copy): inner products of LayerNorm'd orthogonal projections approximate MiniLM's cosine
similarity (Johnson-Lindenstrauss), so the untrained retriever already retrieves sensibly; the
LayerNorm gain starts at sqrt(20 / 128) so that f(x, z) ≈ 20 · cos, MiniLM's training scale.

Masked queries (REALM pretraining's x) are embedded apart from questions, against hubness (masked queries collapsing
onto a few blocks; docs/log/2026-11-23-results-quality-hubness-hybrid-retrieval-the-reader-s-normalisation-issue-16.md):
mean pooling leaves the `[MASK]` positions out (MiniLM never saw `[MASK]`), and a query holding `[MASK]` is centred on
the mean masked query, `mask_center`, a buffer the pretraining recipe estimates and tracks (Suzuki et al. 2013: centring
removes hubs):

    Embed_input(x) = LayerNorm(W_input · BERT_mean(x without [MASK])) - mask_center     # x holds [MASK]

Questions and documents hold no `[MASK]`, so neither pooling nor centring changes them.

A checkpoint is a folder:
    realm.json                      format version, RetrieverConfig, the null document's learned offset
    vocab.txt, tokenizer.json, ...  the WordPiece tokenizer
    query_tower/  doc_tower/        each a plain Hugging Face BertModel (config.json + model.safetensors)
                                    plus projection.safetensors (dense + LayerNorm)
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from torch import nn
from transformers import BertModel, PreTrainedTokenizerBase

from realm.common.io import write_dir_atomic
from realm.common.tokenization import load_tokenizer, minilm_dir
from realm.common.weights import MINILM
from realm.config import RetrieverConfig
from realm.models.bert import fresh_weights, load_bert, random_bert
from realm.models.encoder import encode

CHECKPOINT_FORMAT = 1
CHECKPOINT_META = "realm.json"
TOWERS = ("query_tower", "doc_tower")
PROJECTION_FILE = "projection.safetensors"
MASK_CENTER = "mask_center"
WARM_START_SEED = 20200210  # fixed so `--model minilm` always means the same retriever (and fingerprint)
# all-MiniLM-L6-v2 was trained with scaled cosine similarity, 20 · cos(x, z). LayerNorm'd d-dim vectors have
# norm sqrt(d), so a LayerNorm gain of sqrt(20 / d) makes f(x, z) ≈ 20 · cos at the warm start: a softmax
# over candidates that is neither flat nor one-hot (gain 1 would give f up to 128 and p(null) ≈ 0).
WARM_START_SCALE = 20.0


def pool(
    hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: str, bert: BertModel | None = None
) -> torch.Tensor:
    """(B, L, H) -> (B, H): the [CLS] vector; BERT's pooled output tanh(W · h_[CLS]) (`pooler`, what the released
    code feeds the projection; needs `bert` with its pooler); or the mean over non-padding positions."""
    if pooling == "cls":
        return hidden[:, 0]
    if pooling == "pooler":
        assert bert is not None and bert.pooler is not None, "pooling 'pooler' needs a BERT loaded with its pooler"
        return bert.pooler(hidden)
    mask = attention_mask.unsqueeze(-1).to(hidden.dtype)  # (B, L, 1)
    return (hidden * mask).sum(1) / mask.sum(1).clamp(min=1.0)


def inner_products(equation: str, queries: torch.Tensor, docs: torch.Tensor) -> torch.Tensor:
    """f(x, z) = Embed_input(x) · Embed_doc(z) in fp32 whatever the autocast: bf16 rounding of scores near 20 moves
    each by up to 0.06, and with it p(z | x) and the retriever's gradient."""
    with torch.autocast(queries.device.type, enabled=False):
        return torch.einsum(equation, queries.float(), docs.float())


class Tower(nn.Module):
    """One embedder: BERT, pooling (mean pooling skips `mask_token_id`), then dense -> LayerNorm to `proj_dim`, in
    fp32 (outside autocast) where the weights are fp32. Dropout is on the pooled vector (`pooled`, the cpu preset)
    or on the projected embedding (`embedding`, the released code: dense -> LayerNorm -> dropout)."""

    mask_center: torch.Tensor  # (D,) a buffer

    def __init__(
        self,
        bert: BertModel,
        proj_dim: int,
        pooling: str,
        dropout: float,
        mask_token_id: int,
        dropout_position: str = "embedding",
    ):
        super().__init__()
        self.bert = bert
        self.pooling = pooling
        self.mask_token_id = mask_token_id
        self.dropout = nn.Dropout(dropout)
        self.dropout_position = dropout_position
        self.projection = nn.Linear(bert.config.hidden_size, proj_dim)
        self.layer_norm = nn.LayerNorm(proj_dim)
        self.register_buffer("mask_center", torch.zeros(proj_dim))  # subtracted from queries holding [MASK]

    def forward(
        self, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
    ) -> torch.Tensor:
        hidden = encode(self.bert, input_ids, attention_mask, token_type_ids)  # (B, L, H), bf16 under autocast
        is_mask = input_ids == self.mask_token_id  # (B, L)
        with torch.autocast(hidden.device.type, enabled=False):  # the embedding in the weights' precision
            hidden = hidden.to(self.projection.weight.dtype)
            pooled = pool(hidden, attention_mask * ~is_mask, self.pooling, self.bert)  # (B, H)
            if self.dropout_position == "pooled":
                pooled = self.dropout(pooled)
            embedded = self.layer_norm(self.projection(pooled))  # (B, D)
            if self.dropout_position == "embedding":
                embedded = self.dropout(embedded)
            return embedded - is_mask.any(1, keepdim=True) * self.mask_center  # centre masked queries only

    @torch.no_grad()
    def track_mask_center(self, uncentred: torch.Tensor, momentum: float) -> None:
        """Move `mask_center` toward the mean of masked queries' uncentred embeddings (B, D) (1: replace it)."""
        self.mask_center.lerp_(uncentred.float().mean(0).to(self.mask_center.dtype), momentum)

    def projection_state(self) -> dict[str, torch.Tensor]:
        """dense + LayerNorm weights (what a document embedding depends on)."""
        return {f"projection.{k}": v for k, v in self.projection.state_dict().items()} | {
            f"layer_norm.{k}": v for k, v in self.layer_norm.state_dict().items()
        }

    def load_projection_state(self, state: dict[str, torch.Tensor]) -> None:
        for prefix, module in (("projection.", self.projection), ("layer_norm.", self.layer_norm)):
            module.load_state_dict({k.removeprefix(prefix): v for k, v in state.items() if k.startswith(prefix)})
        if MASK_CENTER in state:  # absent from checkpoints written before centring: zeros
            self.mask_center.copy_(state[MASK_CENTER])

    def fingerprint(self) -> str:
        """Hash of everything that decides this tower's document embeddings: weights and pooling (not
        `mask_center`, which only moves queries holding [MASK])."""
        digest = hashlib.sha256(self.pooling.encode())
        state = {f"bert.{k}": v for k, v in self.bert.state_dict().items()} | self.projection_state()
        for name in sorted(state):
            tensor = state[name].detach().to("cpu", torch.float32).contiguous()
            digest.update(name.encode() + str(tuple(tensor.shape)).encode())
            digest.update(tensor.numpy().tobytes())
        return digest.hexdigest()[:16]


def encode_queries(tokenizer: PreTrainedTokenizerBase, queries: list[str], max_tokens: int) -> dict[str, torch.Tensor]:
    """[CLS] x [SEP], padded to the longest query (at most `max_tokens`)."""
    return dict(
        tokenizer(
            queries,
            padding=True,
            truncation=True,
            max_length=max_tokens,
            return_tensors="pt",
            return_token_type_ids=True,
        )
    )


class Retriever(nn.Module):
    """Query tower (Embed_input) and document tower (Embed_doc), with their tokenizer and config."""

    def __init__(
        self,
        query_tower: Tower,
        doc_tower: Tower,
        tokenizer: PreTrainedTokenizerBase,
        config: RetrieverConfig,
        null_score: float = 0.0,
    ):
        super().__init__()
        self.query_tower = query_tower
        self.doc_tower = doc_tower
        self.tokenizer = tokenizer
        self.config = config
        self.null_score = null_score  # b_null of REALM pretraining's f(x, null) (models/realm.py)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def warm_start(cls, bert: BertModel, tokenizer: PreTrainedTokenizerBase, config: RetrieverConfig) -> Retriever:
        """Both towers from the same BERT, with one shared random orthogonal projection (see module doc)."""
        generator = torch.Generator().manual_seed(WARM_START_SEED)
        with fresh_weights(WARM_START_SEED):  # nn.Linear's own init draws, then is overwritten: keep the caller's RNG
            query = Tower(
                bert, config.proj_dim, config.pooling, config.dropout, tokenizer.mask_token_id, config.dropout_position
            )
        nn.init.orthogonal_(query.projection.weight, generator=generator)
        nn.init.zeros_(query.projection.bias)
        nn.init.constant_(query.layer_norm.weight, math.sqrt(WARM_START_SCALE / config.proj_dim))
        doc = copy.deepcopy(query)
        return cls(query, doc, tokenizer, config)

    @classmethod
    def load(cls, spec: str, config: RetrieverConfig) -> Retriever:
        """`minilm`, `random` (the preset's BERT shape), a REALM checkpoint folder (or a training output holding
        one in retriever/), or a BERT folder.

        A checkpoint carries its own RetrieverConfig, which wins over `config`."""
        if spec == MINILM:
            folder = minilm_dir()
            return cls.warm_start(load_bert(folder, config.pooling == "pooler"), load_tokenizer(folder), config)
        if spec == "random":
            tokenizer = load_tokenizer(minilm_dir())
            bert = random_bert(config.shape, len(tokenizer), WARM_START_SEED, config.pooling == "pooler")
            return cls.warm_start(bert, tokenizer, config)
        folder = Path(spec)
        if (folder / "retriever" / CHECKPOINT_META).is_file():  # a `train pretrain` / `train qa` output
            folder = folder / "retriever"
        if (folder / CHECKPOINT_META).is_file():
            return cls._load_checkpoint(folder)
        if (folder / "config.json").is_file():
            return cls.warm_start(load_bert(folder, config.pooling == "pooler"), load_tokenizer(folder), config)
        raise FileNotFoundError(
            f"unknown model {spec!r}: expected 'minilm', 'random', a REALM checkpoint folder "
            f"(with {CHECKPOINT_META}) or a Hugging Face BERT folder (with config.json)"
        )

    @classmethod
    def _load_checkpoint(cls, folder: Path) -> Retriever:
        meta = json.loads((folder / CHECKPOINT_META).read_text())
        if meta.get("format_version") != CHECKPOINT_FORMAT:
            raise ValueError(f"{folder}: checkpoint format {meta.get('format_version')}, expected {CHECKPOINT_FORMAT}")
        config = RetrieverConfig.from_dict(meta["retriever"])
        tokenizer = load_tokenizer(folder)
        towers = []
        for name in TOWERS:
            with fresh_weights(WARM_START_SEED):  # overwritten by the checkpoint's projection below
                tower = Tower(
                    load_bert(folder / name, config.pooling == "pooler"),
                    config.proj_dim,
                    config.pooling,
                    config.dropout,
                    tokenizer.mask_token_id,
                    config.dropout_position,
                )
            tower.load_projection_state(load_file(folder / name / PROJECTION_FILE))
            towers.append(tower)
        return cls(towers[0], towers[1], tokenizer, config, meta.get("null_score", 0.0))

    def save(self, folder: str | Path) -> None:
        """Write the checkpoint to a temporary sibling and swap it in, so a crash never leaves half a checkpoint."""

        def write(tmp: Path) -> None:
            self.tokenizer.save_pretrained(str(tmp))
            for name in TOWERS:
                tower: Tower = getattr(self, name)
                tower.bert.save_pretrained(str(tmp / name))
                state = tower.projection_state() | {MASK_CENTER: tower.mask_center}
                save_file({k: v.contiguous() for k, v in state.items()}, tmp / name / PROJECTION_FILE)
            meta = {
                "format_version": CHECKPOINT_FORMAT,
                "retriever": dataclasses.asdict(self.config),
                "doc_tower_fingerprint": self.doc_tower.fingerprint(),
                "null_score": self.null_score,
            }
            (tmp / CHECKPOINT_META).write_text(json.dumps(meta, indent=2) + "\n")

        write_dir_atomic(Path(folder), write)

    # -- inference ----------------------------------------------------------------------------
    def doc_fingerprint(self) -> str:
        return self.doc_tower.fingerprint()

    def encode_queries(self, queries: list[str]) -> dict[str, torch.Tensor]:
        return encode_queries(self.tokenizer, queries, self.config.query_max_tokens)

    @torch.no_grad()
    def query_vectors(self, inputs: dict[str, torch.Tensor]) -> np.ndarray:
        """Embed_input of tokenised queries, (Q, D) float32 on the CPU, for MIPS: no gradient, the tower's current
        mode (a trainer retrieves with dropout on, as the gradient step sees the tower)."""
        device = next(self.query_tower.parameters()).device
        return self.query_tower(**{k: v.to(device) for k, v in inputs.items()}).float().cpu().numpy()

    def embed_queries(self, queries: list[str], batch_size: int = 128) -> torch.Tensor:
        """(Q, D) float32 embeddings of query texts, on the CPU (inference: the query tower in eval mode)."""
        self.query_tower.eval()
        parts = [
            self.query_vectors(self.encode_queries(queries[start : start + batch_size]))
            for start in range(0, len(queries), batch_size)
        ]
        return torch.from_numpy(np.concatenate(parts)) if parts else torch.empty(0, self.config.proj_dim)
