"""Process RSS while a bf16 linear layer sees a new row count on every call, with and without rounding the
row count up to a multiple of `--quantum` (what `realm.models.encoder.pad_rows` does). Each variant runs in
its own child process, one after the other in the same invocation, so their RSS figures are comparable.

    python benchmarks/shape_memory.py [--calls 1000] [--quantum 64]
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


def child(calls: int, quantum: int) -> None:
    import torch
    import torch.nn.functional as F

    weight = torch.randn(1152, 384).bfloat16()
    rng = random.Random(0)
    before = rss_mb()
    with torch.inference_mode():
        for _ in range(calls):
            rows = rng.randint(100, 3000)
            rows = -(-rows // quantum) * quantum
            F.linear(torch.randn(rows, 384).bfloat16(), weight)
    print(json.dumps({"quantum": quantum, "rss_mb_before": round(before), "rss_mb_after": round(rss_mb())}))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--quantum", type=int, default=64)
    parser.add_argument("--child", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.calls, args.child)
        return
    print("| row counts | calls | RSS MB before -> after |")
    print("|---|---:|---|")
    for quantum in (1, args.quantum):
        command = [sys.executable, __file__, "--calls", str(args.calls), "--child", str(quantum)]
        result = json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)
        name = "any (100-3000)" if quantum == 1 else f"rounded up to a multiple of {quantum}"
        print(f"| {name} | {args.calls} | {result['rss_mb_before']} -> {result['rss_mb_after']} |")


if __name__ == "__main__":
    main()
