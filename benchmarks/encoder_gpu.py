"""BERT's forward on a GPU: `encode` (padded there: BertModel's forward, SDPA without cuDNN) against the CPU's
packed path (`encode_packed`) and Hugging Face's BertModel with SDPA's default choice. One MiniLM-shaped BERT
(random weights) over ICT-like batches (rows of 40-128 real tokens, cut to the batch's longest row), a new batch
each call as in training, so shape-specialised kernels pay for every new shape. Forward + backward under bf16
autocast with dropout, and forward alone without gradients (the index builder); median of 10 after 3 warm-ups.

    python benchmarks/encoder_gpu.py [--rows 512] [--length 128] [--shape minilm|base] [--device cuda]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import nullcontext

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from realm.config import EncoderShape
from realm.models.bert import random_bert
from realm.models.encoder import GPU_ATTENTION, encode, encode_packed

SHAPES = {
    "minilm": EncoderShape(hidden_size=384, num_hidden_layers=6, num_attention_heads=12, intermediate_size=1536),
    "base": EncoderShape(),
}
WARMUP, REPEATS = 3, 10


def hf_forward(bert, input_ids, attention_mask, token_type_ids) -> torch.Tensor:
    return bert(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=token_type_ids).last_hidden_state


VARIANTS = {  # name: (forward, SDPA backends or None for SDPA's own choice)
    "encode (padded, no cuDNN): ours": (encode, None),
    "encode_packed, SDPA's choice (cuDNN)": (encode_packed, None),
    "encode_packed, no cuDNN": (encode_packed, GPU_ATTENTION),
    "HF BertModel, SDPA's choice (cuDNN)": (hf_forward, None),
    "HF BertModel, math attention": (hf_forward, [SDPBackend.MATH]),
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", type=int, default=512)
    parser.add_argument("--length", type=int, default=128)
    parser.add_argument("--shape", default="minilm", choices=sorted(SHAPES))
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    device = torch.device(args.device)
    sync = torch.cuda.synchronize if device.type == "cuda" else lambda: None
    bert = random_bert(SHAPES[args.shape], 30522, 0).to(device)
    gen = torch.Generator().manual_seed(0)

    def batch() -> tuple[torch.Tensor, ...]:
        """A fresh batch: new lengths, so new bucket shapes and a new padded length."""
        lengths = torch.randint(40, args.length + 1, (args.rows,), generator=gen)
        longest = int(lengths.max())
        mask = (torch.arange(longest)[None] < lengths[:, None]).long()  # (N, L)
        ids = torch.randint(1000, 30000, (args.rows, longest), generator=gen) * mask
        return ids.to(device), mask.to(device), torch.zeros_like(ids, device=device)

    def timed(forward, grad: bool) -> float:
        times = []
        for i in range(WARMUP + REPEATS):
            inputs = batch()
            sync()
            started = time.perf_counter()
            with torch.autocast(device.type, dtype=torch.bfloat16), torch.set_grad_enabled(grad):
                out = forward(bert, *inputs)
            if grad:
                out.float().square().mean().backward()
            sync()
            if i >= WARMUP:
                times.append(time.perf_counter() - started)
        return statistics.median(times) * 1e3

    print(f"| {args.shape}, {args.rows} rows of 40-{args.length} tokens | train step ms | forward (no grad) ms |")
    print("|---|---:|---:|")
    for name, (forward, backends) in VARIANTS.items():
        with nullcontext() if backends is None else sdpa_kernel(backends):
            bert.train()
            train_ms = timed(forward, True)
            bert.eval()
            forward_ms = timed(forward, False)
        print(f"| {name} | {train_ms:.1f} | {forward_ms:.1f} |", flush=True)


if __name__ == "__main__":
    main()
