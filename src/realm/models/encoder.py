"""BERT's forward pass over packed tokens: every tower and reader runs its Hugging Face BertModel through here.
On a GPU, `encode` runs BertModel's own padded forward instead (`encode_padded`): see there why.

A batch of (N, L) padded rows holds T < N * L real tokens (a QA reader batch: about two thirds). Everything
but attention works token by token, so it runs on the (T, H) matrix of real tokens only. Attention alone goes
back to a padded (n, heads, l, d) layout, in buckets of rows of similar length, each padded only to its own
longest row: attention costs n * l^2 per bucket, so one bucket padded to the batch's longest row would spend
most of it on padding. Per layer, on the packed tokens:

    q, k, v = x W_qkv + b_qkv                                    # (T, 3H), one matmul
    a       = softmax(q k^T / sqrt(d) + mask) v                  # per row, padded keys masked
    x       = LayerNorm(x + dropout(a W_o + b_o))
    x       = LayerNorm(x + dropout(GELU(x W_1 + b_1) W_2 + b_2))

Without gradients (the index builder, the reader at answer time) the scores and the feed-forward block run in
cache-sized chunks, and a batch of rows of about one length (the index builder sorts blocks by length) runs padded.

The weights are the BertModel's own (saving, loading and DDP see the usual module), and with dropout off the
result equals `BertModel.forward` on every real position (tests/models/test_encoder.py). Dropout draws its
mask from 16-bit random words: PyTorch's CPU `bernoulli_` costs ~6 ns an element, more than the matmuls of a
MiniLM layer; the drop rate is p rounded to a multiple of 1/65536.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel
from transformers import BertModel
from transformers.activations import ACT2FN


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """Inverted dropout, the mask from full-range int64 random words cut into 16-bit pieces."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu":
        return F.dropout(x, p, training=True)  # CUDA's Philox generator is fast
    words = torch.empty(-(-x.numel() // 4), dtype=torch.int64).random_(-(2**63), None)
    keep = words.view(torch.int16)[: x.numel()].view(x.shape) >= round(p * 65536) - 32768
    return torch.where(keep, x * (1.0 / (1.0 - p)), 0.0)


SCORES_BYTES = 4 << 20  # without gradients, attention scores are formed this many bytes at a time (see _attention)
FFN_ROWS = 1024  # without gradients, the feed-forward block runs on this many tokens at a time (see encode_packed)
DENSE_PADDING = 1 / 16  # without gradients, a batch with at most this share of padding runs padded (encode_packed)


LENGTH_QUANTUM = 16  # without gradients, attention runs on lengths padded to a multiple of this (see _attention)


def _attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, key_mask: torch.Tensor, p: float, training: bool
) -> torch.Tensor:
    """q, k, v (N, heads, L, d); key_mask (N, 1, 1, L) bool, True at real tokens -> (N, heads, L, d).

    Plain softmax(QK^T / sqrt(d) + mask) V in q's dtype, not SDPA's fused kernel: at head size 32 CPU flash attention
    is slower both ways (inference: 20 vs 13 ms for 64 x 128-token rows in bf16, benchmarks/encoder_cpu.py; with
    gradients: 158 vs 73 ms for a 32 x 184-token reader layer), and its dropout falls back to bernoulli_. Without
    gradients the scores are formed a few rows at a time (SCORES_BYTES), so they stay in cache instead of going
    through memory twice, on bounded shapes: the length padded to a multiple of LENGTH_QUANTUM (padded keys masked)
    and each chunk's rows to a power of two. oneDNN keeps a compiled bf16 batched matmul for every distinct shape
    and never frees it (see pad_rows): a server's buckets of 1-40 rows of any length 1-192 grew it without end,
    +1.3 GB over 3,000 calls; bounded shapes stay under 0.3 GB (benchmarks/shape_memory.py --attention)."""
    p = p if training else 0.0
    with torch.autocast("cpu", enabled=False):  # autocast would run the softmax over (N, heads, L, L) in fp32
        bias = torch.zeros(key_mask.shape, dtype=q.dtype, device=q.device).masked_fill(~key_mask, float("-inf"))
        scale = q.size(-1) ** -0.5
        if torch.is_grad_enabled() or p > 0.0:
            probs = torch.softmax((q * scale) @ k.transpose(-1, -2) + bias, dim=-1)  # (N, heads, L, L)
            return dropout(probs, p, True) @ v
        n, heads, length, _ = q.shape
        extra = -length % LENGTH_QUANTUM
        if extra:
            q, k, v = (F.pad(t, (0, 0, 0, extra)) for t in (q, k, v))  # (N, heads, L', d)
            bias = F.pad(bias, (0, extra), value=float("-inf"))  # (N, 1, 1, L')
        rows = SCORES_BYTES // (q.element_size() * heads * q.size(2) ** 2)
        rows = 1 << max(0, rows.bit_length() - 1)  # a power of two, as every chunk below
        out = q.new_empty(q.shape)
        for i in range(0, n, rows):
            chunk = min(rows, n - i)
            qc, kc, vc, bc = (t[i : i + chunk] for t in (q, k, v, bias))
            if grow := (1 << (chunk - 1).bit_length()) - chunk:  # rows up to a power of two
                qc, kc, vc, bc = (F.pad(t, (0, 0) * 3 + (0, grow)) for t in (qc, kc, vc, bc))
            scores = (qc * scale) @ kc.transpose(-1, -2) + bc  # (rows, heads, L', L')
            out[i : i + chunk] = (torch.softmax(scores, dim=-1) @ vc)[:chunk]  # (rows, heads, L', d)
        return out[:, :, :length]


ROW_QUANTUM = 64  # matmul row counts are padded to a multiple of this (see pad_rows)
SHAPES_PER_OCTAVE = 16  # without gradients, coarser: at most this many row counts between n and 2n
BUCKET_OVERHEAD = 128 * 128  # a bucket's fixed cost (index ops, kernel launches) in units of one row * l^2


def pad_rows(x: torch.Tensor) -> torch.Tensor:
    """(M, ...) -> (M rounded up, ...), zeros below. oneDNN keeps a compiled matmul for every distinct shape and
    never frees it (~0.6 MB each): a server whose batches all differ in token count grew by 100 MB a minute.
    Rounded row counts keep the shapes, and the memory, bounded: to a multiple of ROW_QUANTUM in training (at
    most 63 rows wasted), and without gradients (the long-lived server and index builder, whose batches vary
    most) to one of SHAPES_PER_OCTAVE counts per octave (at most 1/16 wasted). benchmarks/shape_memory.py, 1,000
    calls of 100-12,000 rows: RSS +1,626 MB as they come, +470 MB by multiples of 64, +90 MB by octaves."""
    quantum = ROW_QUANTUM
    if not torch.is_grad_enabled():
        quantum = max(ROW_QUANTUM, 1 << max(0, len(x).bit_length() - SHAPES_PER_OCTAVE.bit_length()))
    return F.pad(x, (0, 0) * (x.dim() - 1) + (0, -len(x) % quantum))


@dataclass(frozen=True)
class Bucket:
    """Rows of similar length attended together: their packed tokens and where those sit in (rows * length)."""

    src: torch.Tensor  # (T_b,) indices into the packed tokens
    dst: torch.Tensor  # (T_b,) flat positions in the bucket's padded (rows * length) layout
    key_mask: torch.Tensor  # (rows, 1, 1, length) bool, True at real tokens
    rows: int
    length: int


def length_buckets(spans: list[int]) -> list[list[int]]:
    """Rows grouped so that sum over buckets of rows * longest^2 + BUCKET_OVERHEAD is least (a row's span: its
    last real position + 1). Exact by dynamic programming over the rows sorted by span, O(N^2) in Python."""
    order = sorted(range(len(spans)), key=lambda r: spans[r])
    cost, cut = [0] + [0] * len(order), [0] * (len(order) + 1)
    for i in range(1, len(order) + 1):
        longest = spans[order[i - 1]] ** 2
        cost[i], cut[i] = min((cost[j] + (i - j) * longest + BUCKET_OVERHEAD, j) for j in range(i))
    groups, i = [], len(order)
    while i:
        groups.append(order[cut[i] : i])
        i = cut[i]
    return groups[::-1]


def buckets(real: torch.Tensor, at: torch.Tensor) -> list[Bucket]:
    """real (N, L) bool; at (T,) flat positions of the real tokens -> the attention buckets of the batch."""
    n, length = real.shape
    spans = torch.where(real, torch.arange(1, length + 1, device=real.device), 0).amax(1)  # (N,)
    rows, positions = at // length, at % length  # (T,)
    groups = length_buckets(spans.tolist())
    if len(groups) == 1:
        return [Bucket(torch.arange(len(at), device=at.device), at, real[:, None, None, :], n, length)]
    result = []
    for group in groups:
        members = torch.tensor(group, device=real.device)
        longest = int(spans[members].max())
        slot = torch.full((n,), -1, dtype=torch.long, device=real.device)
        slot[members] = torch.arange(len(group), device=real.device)
        src = (slot[rows] >= 0).nonzero().squeeze(1)
        dst = slot[rows[src]] * longest + positions[src]
        key_mask = real[members, :longest][:, None, None, :]
        result.append(Bucket(src, dst, key_mask, len(group), longest))
    return result


# SDPA backends of the padded path: never cuDNN, which builds a plan for each new shape (~70 ms on an H100)
GPU_ATTENTION = [SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH]


def encode(
    bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
) -> torch.Tensor:
    """(N, L) inputs -> (N, L, H) last hidden states; zeros at padding positions. Packed on a CPU, padded on a GPU:
    packing saves FLOPs a GPU has to spare, and its index copies and per-bucket kernels leave a GPU launch-bound
    (benchmarks/encoder_gpu.py, H100, MiniLM over 512 rows of 40-128 tokens: a training step 175 ms packed,
    41 ms padded)."""
    if input_ids.device.type == "cpu":
        return encode_packed(bert, input_ids, attention_mask, token_type_ids)
    return encode_padded(bert, input_ids, attention_mask, token_type_ids)


def encode_padded(
    bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
) -> torch.Tensor:
    """`encode` by BertModel's own padded forward."""
    with sdpa_kernel(GPU_ATTENTION):
        hidden = bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids)
    states = hidden.last_hidden_state  # (N, L, H), BERT's values at padding too
    return states * attention_mask[..., None].to(states.dtype)


def encode_packed(
    bert: BertModel, input_ids: torch.Tensor, attention_mask: torch.Tensor, token_type_ids: torch.Tensor
) -> torch.Tensor:
    """`encode` over the packed real tokens (the module's docstring)."""
    config, training = bert.config, bert.training
    n, length = input_ids.shape
    heads, hidden_size = config.num_attention_heads, config.hidden_size
    real = attention_mask.bool()  # (N, L)
    # An inference batch of rows of about one length (the index builder sorts blocks by length) runs every position,
    # padding included: packing would save little and cost index copies in every layer. The padding is zeroed below.
    dense = not torch.is_grad_enabled() and int(real.sum()) >= (1 - DENSE_PADDING) * real.numel()
    if dense:
        at = torch.arange(n * length, device=real.device)  # (N * L,) every position
        groups = [Bucket(at, at, real[:, None, None, :], n, length)]
    else:
        at = real.flatten().nonzero().squeeze(1)  # (T,) flat positions of the real tokens
        groups = buckets(real, at)
    unsort = torch.cat([b.src for b in groups]).argsort() if len(groups) > 1 else None  # bucket order -> packed

    emb = bert.embeddings
    x = (
        emb.word_embeddings(input_ids.flatten()[at])
        + emb.token_type_embeddings(token_type_ids.flatten()[at])
        + emb.position_embeddings(at % length)  # a token's position in its row
    )  # (T, H)
    x = pad_rows(x)  # (T', H): the rows past T are padding, never attended to and never read
    x = dropout(emb.LayerNorm(x), config.hidden_dropout_prob, training)
    act = ACT2FN[config.hidden_act]
    for layer in bert.encoder.layer:
        attn = layer.attention.self
        w_qkv = torch.cat([attn.query.weight, attn.key.weight, attn.value.weight])  # (3H, H)
        b_qkv = torch.cat([attn.query.bias, attn.key.bias, attn.value.bias])
        qkv = F.linear(x, w_qkv, b_qkv)  # (T', 3H)
        parts = []
        for b in groups:
            if dense:
                padded = qkv[: b.rows * b.length]
            else:  # index_select, not [ ]: its backward adds rows (index_add_); [ ]'s sorts them first (index_put_)
                padded = qkv.new_zeros(b.rows * b.length, 3 * hidden_size).index_copy(
                    0, b.dst, qkv.index_select(0, b.src)
                )
            q, k, v = padded.view(b.rows, b.length, 3, heads, -1).permute(2, 0, 3, 1, 4)  # each (n, heads, l, d)
            a = _attention(q, k, v, b.key_mask, config.attention_probs_dropout_prob, training)  # (n, heads, l, d)
            a = a.transpose(1, 2).reshape(b.rows * b.length, hidden_size)  # (n * l, H)
            parts.append(a if dense else a.index_select(0, b.dst))  # (T_b, H)
        a = pad_rows(parts[0] if unsort is None else torch.cat(parts).index_select(0, unsort))  # (T', H)
        out = layer.attention.output
        x = out.LayerNorm(x + dropout(out.dense(a), config.hidden_dropout_prob, training))
        ffn = layer.output
        if torch.is_grad_enabled():
            h = ffn.dense(act(layer.intermediate.dense(x)))  # (T', H)
        else:  # a chunk's (FFN_ROWS, 4H) activations stay in cache: 1.3x faster on 18k tokens (bf16)
            h = torch.cat([ffn.dense(act(layer.intermediate.dense(c))) for c in x.split(FFN_ROWS)])
        x = ffn.LayerNorm(x + dropout(h, config.hidden_dropout_prob, training))
    if dense:
        return (x[: n * length] * real.flatten()[:, None]).view(n, length, hidden_size)
    return x.new_zeros(n * length, hidden_size).index_copy(0, at, x[: len(at)]).view(n, length, hidden_size)
