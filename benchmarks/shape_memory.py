"""Process RSS while a bf16 linear layer sees a new row count (100 to `--max-rows`) on every call: as it comes,
rounded up to a multiple of `--quantum` (`realm.models.encoder.pad_rows` in training), and rounded as `pad_rows`
does without gradients (16 row counts per octave). Each variant runs in its own child process, one after the
other in the same invocation, so their RSS figures are comparable.

    python benchmarks/shape_memory.py [--calls 1000] [--quantum 64] [--max-rows 3000]
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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--quantum", type=int, default=64)
    parser.add_argument("--max-rows", type=int, default=3000)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.calls, args.child, args.max_rows)
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
