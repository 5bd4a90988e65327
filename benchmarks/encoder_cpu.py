"""The CPU encoder's inference and packing choices (models/encoder.py), each against what it replaced, on random
MiniLM-shaped tensors in bf16, best of 7:

- attention without gradients: SDPA's CPU flash kernel vs `encoder._attention` (plain, scores SCORES_BYTES at a time),
  and the plain path with the whole batch's scores at once; 64 rows of L tokens, 12 heads of 32;
- the feed-forward block without gradients: one pass over 64 x 288 tokens vs FFN_ROWS tokens at a time;
- a packing gather with its backward (what a training step does per layer): `x[idx]` vs `x.index_select(0, idx)`.

    python benchmarks/encoder_cpu.py
"""

from __future__ import annotations

import time
from collections.abc import Callable

import torch
import torch.nn.functional as F

from realm.models import encoder

HEADS, HEAD_SIZE, HIDDEN, INTERMEDIATE = 12, 32, 384, 1536


def best_ms(fn: Callable[[], object], repeats: int = 7) -> float:
    fn()
    fn()
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - started)
    return best * 1e3


def attention_rows(length: int) -> list[tuple[str, float]]:
    q, k, v = (torch.randn(64, HEADS, length, HEAD_SIZE, dtype=torch.bfloat16) for _ in range(3))
    mask = torch.ones(64, 1, 1, length, dtype=torch.bool)
    mask[::3, ..., length - 20 :] = False
    bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))

    def sdpa() -> torch.Tensor:
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask)

    def whole_batch() -> torch.Tensor:
        return torch.softmax((q * HEAD_SIZE**-0.5) @ k.transpose(-1, -2) + bias, dim=-1) @ v

    def ours() -> torch.Tensor:
        return encoder._attention(q, k, v, mask, 0.0, False)

    with torch.inference_mode():
        return [
            (f"attention, L={length}: SDPA", best_ms(sdpa)),
            (f"attention, L={length}: plain, scores of the whole batch", best_ms(whole_batch)),
            (f"attention, L={length}: plain, in chunks (ours)", best_ms(ours)),
        ]


def ffn_rows() -> list[tuple[str, float]]:
    x = torch.randn(64 * 288, HIDDEN, dtype=torch.bfloat16)
    up, down = torch.nn.Linear(HIDDEN, INTERMEDIATE).bfloat16(), torch.nn.Linear(INTERMEDIATE, HIDDEN).bfloat16()
    with torch.inference_mode():
        return [
            ("feed-forward, 64 x 288 tokens: one pass", best_ms(lambda: down(F.gelu(up(x))))),
            (
                f"feed-forward, 64 x 288 tokens: {encoder.FFN_ROWS} at a time (ours)",
                best_ms(lambda: torch.cat([down(F.gelu(up(c))) for c in x.split(encoder.FFN_ROWS)])),
            ),
        ]


def gather_rows() -> list[tuple[str, float]]:
    x = torch.randn(7_000, 3 * HIDDEN, dtype=torch.bfloat16, requires_grad=True)
    idx = torch.randperm(len(x))
    grad = torch.randn_like(x)

    def step(gather: Callable[[torch.Tensor], torch.Tensor]) -> Callable[[], None]:
        def run() -> None:
            gather(x).backward(grad)
            x.grad = None

        return run

    return [
        ("gather + backward, 7,000 x 1,152: x[idx]", best_ms(step(lambda t: t[idx]))),
        ("gather + backward, 7,000 x 1,152: index_select (ours)", best_ms(step(lambda t: t.index_select(0, idx)))),
    ]


def main() -> None:
    torch.manual_seed(0)
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads")
    print("\n| operation | ms |\n|---|---:|")
    for name, ms in attention_rows(128) + attention_rows(288) + ffn_rows() + gather_rows():
        print(f"| {name} | {ms:.2f} |")


if __name__ == "__main__":
    main()
