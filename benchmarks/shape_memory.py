"""Process RSS while a bf16 linear layer sees a new row count (100 to `--max-rows`) on every call: as it comes,
rounded up to a multiple of `--quantum` (`realm.models.encoder.pad_rows` in training), and rounded as `pad_rows`
does without gradients (16 row counts per octave). Each variant runs in its own child process, one after the
other in the same invocation, so their RSS figures are comparable.

`--attention`: the same for inference attention over buckets of 1-40 rows of any length 8-192 (12 heads of 32, bf16,
as a server's reader sees them): plain softmax(QK^T + mask) V on the shapes as they come (the code before 2026-11-28)
vs `realm.models.encoder._attention` (lengths to a multiple of 16, row chunks to a power of two), with the seconds
of each: a call pays for its padding, and for compiling a kernel whenever its shape is new.

    python benchmarks/shape_memory.py [--calls 1000] [--quantum 64] [--max-rows 3000] [--attention]
"""

from __future__ import annotations

import argparse
import json
import random
import subprocess
import sys
from pathlib import Path


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def child(calls: int, quantum: int, max_rows: int) -> None:
    """quantum 0: the encoder's own pad_rows, without gradients."""
    import torch
    import torch.nn.functional as F

    from realm.models.encoder import pad_rows

    weight = torch.randn(1152, 384).bfloat16()
    rng = random.Random(0)
    before = rss_mb()
    with torch.inference_mode():
        for _ in range(calls):
            x = torch.randn(rng.randint(100, max_rows), 384).bfloat16()
            x = pad_rows(x) if quantum == 0 else F.pad(x, (0, 0, 0, -len(x) % quantum))
            F.linear(x, weight)
    print(json.dumps({"quantum": quantum, "rss_mb_before": round(before), "rss_mb_after": round(rss_mb())}))


def attention_child(calls: int, bounded: bool) -> None:
    import time

    import torch

    from realm.models.encoder import _attention

    def plain(q, k, v, mask):
        bias = torch.zeros(mask.shape, dtype=q.dtype).masked_fill(~mask, float("-inf"))
        return torch.softmax((q * q.size(-1) ** -0.5) @ k.transpose(-1, -2) + bias, dim=-1) @ v

    rng = random.Random(0)
    before = rss_mb()
    seconds = 0.0
    with torch.inference_mode():
        for _ in range(calls):
            rows, length = rng.randint(1, 40), rng.randint(8, 192)
            q, k, v = (torch.randn(rows, 12, length, 32).bfloat16() for _ in range(3))
            mask = torch.arange(length)[None, None, None, :] < torch.randint(1, length + 1, (rows, 1, 1, 1))
            started = time.perf_counter()
            _attention(q, k, v, mask, 0.0, False) if bounded else plain(q, k, v, mask)
            seconds += time.perf_counter() - started
    after = {"rss_mb_before": round(before), "rss_mb_after": round(rss_mb()), "seconds": round(seconds, 2)}
    print(json.dumps({"bounded": bounded, **after}))


def attention_variants(calls: int) -> None:
    print("| attention shapes | calls | seconds | RSS MB before -> after |")
    print("|---|---:|---:|---|")
    for bounded in (False, True):
        command = [sys.executable, __file__, "--calls", str(calls), "--attention", "--child", str(int(bounded))]
        result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout.splitlines()[-1])
        name = "`_attention` (lengths by 16, row chunks by powers of two)" if bounded else "as they come"
        print(f"| {name} | {calls} | {result['seconds']} | {result['rss_mb_before']} -> {result['rss_mb_after']} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--quantum", type=int, default=64)
    parser.add_argument("--max-rows", type=int, default=3000)
    parser.add_argument("--attention", action="store_true", help="inference attention's shapes, not a linear layer's")
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        attention_child(args.calls, bool(args.child)) if args.attention else child(
            args.calls, args.child, args.max_rows
        )
        return
    if args.attention:
        attention_variants(args.calls)
        return
    print("| row counts | calls | RSS MB before -> after |")
    print("|---|---:|---|")
    for quantum in (1, args.quantum, 0):
        command = [sys.executable, __file__, "--calls", str(args.calls), "--max-rows", str(args.max_rows)]
        done = subprocess.run([*command, "--child", str(quantum)], check=True, capture_output=True, text=True)
        result = json.loads(done.stdout.splitlines()[-1])
        name = {1: f"any (100-{args.max_rows})", 0: "pad_rows without gradients (16 per octave)"}.get(
            quantum, f"rounded up to a multiple of {quantum}"
        )
        print(f"| {name} | {args.calls} | {result['rss_mb_before']} -> {result['rss_mb_after']} |")


if __name__ == "__main__":
    main()
