"""`realm serve` memory under repeated load: does the server's RSS level off, or grow burst after burst?

Starts `realm serve` on 127.0.0.1 over a copy of an index, then runs `--bursts` bursts of `--clients` concurrent
clients asking for `--seconds` each; between bursts `realm index add` (odd gaps) or `realm index remove` (even
gaps) publishes a new version of the same documents, so the service swaps its searcher as often as it is loaded.
It records the server's RSS after each burst and after the start-up's first answer (burst 0). It levels off when
no burst after the third ends above the third's RSS by more than `--tolerance`: the third is this run's baseline
(the first bursts fill the allocator and the kernel caches).

    python benchmarks/serve_soak.py --model runs/main50/qa/best --index runs/main50/realm_index/index \\
        --qa squad-open-dev --add-docs examples/corpus.jsonl --retriever hybrid \\
        [--bursts 12] [--clients 64] [--seconds 15] [--json soak.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
from serve_load import HOST, free_port, load, rss_mb, start_server


def swap(args: argparse.Namespace, index: Path, corpus: Path, docs: Path, ids: list[str], add: bool) -> float:
    """Publish a version with the documents added (or removed again); returns the seconds it took."""
    cmd = [sys.executable, "-m", "realm.cli", "index", "add" if add else "remove", "--index", str(index)]
    cmd += ["--corpus", str(corpus), "--quiet"]
    cmd += ["--docs", str(docs), "--model", args.model] if add else ["--ids", *ids]
    started = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    return time.perf_counter() - started


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--index", required=True, help="an index folder (copied: the benchmark changes the copy)")
    parser.add_argument("--qa", required=True, help="questions (JSONL with 'question')")
    parser.add_argument("--add-docs", required=True, help="JSONL documents; the first --num-docs are added and removed")
    parser.add_argument("--num-docs", type=int, default=20)
    parser.add_argument("--retriever", default="dense", choices=["dense", "bm25", "hybrid"])
    parser.add_argument("--bursts", type=int, default=12)
    parser.add_argument("--clients", type=int, default=64)
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--tolerance", type=float, default=0.05)
    parser.add_argument("--no-swaps", action="store_true", help="bursts only: is it the load or the swaps?")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    questions = [json.loads(line)["question"] for line in Path(args.qa).read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        index, docs = Path(tmp) / "index", Path(tmp) / "docs.jsonl"
        shutil.copytree(args.index, index, symlinks=True)
        meta = json.loads(next((index / "versions").glob("v*/meta.json")).read_text())
        corpus = (Path(args.index) / meta["corpus_path"]).resolve()
        records = [json.loads(line) for line in Path(args.add_docs).read_text().splitlines()[: args.num_docs]]
        ids = [f"soak-{n}" for n in range(len(records))]
        docs.write_text("".join(json.dumps({**r, "id": i}) + "\n" for r, i in zip(records, ids)))
        port = free_port()
        server = start_server(args.model, index, corpus, port, None, ("--retriever", args.retriever))
        url = f"http://{HOST}:{port}"
        try:
            httpx.post(f"{url}/ask", json={"question": questions[0]}, timeout=60).raise_for_status()
            rows = [{"burst": 0, "rss_mb": round(rss_mb(server.pid), 1)}]
            for burst in range(1, args.bursts + 1):
                if args.clients:
                    result = load(url, questions, args.clients, 10**9, args.seconds, server.pid)
                    rows.append({"burst": burst, "rss_mb": result["rss_mb_after"], **_figures(result)})
                else:  # swaps only: one question to make the service load each version
                    httpx.post(f"{url}/ask", json={"question": questions[burst]}, timeout=60).raise_for_status()
                    rows.append({"burst": burst, "rss_mb": round(rss_mb(server.pid), 1)})
                if burst < args.bursts and not args.no_swaps:
                    rows[-1]["swap_s"] = round(swap(args, index, corpus, docs, ids, add=burst % 2 == 1), 1)
            rows[-1]["index_version"] = httpx.get(f"{url}/health").json()["index_version"]
        finally:
            server.terminate()
            server.wait(timeout=30)
    _print(rows, args)


def _figures(result: dict) -> dict:
    keys = ("requests", "errors", "error_kinds", "requests_per_s", "p50_ms", "p95_ms", "index_versions_served")
    return {key: result[key] for key in keys}


def _print(rows: list[dict], args: argparse.Namespace) -> None:
    third = next((r["rss_mb"] for r in rows if r["burst"] == 3), float("nan"))
    print(
        f"| burst | RSS MB | vs burst 3 | requests | errors | req/s | p95 ms | versions | swap s |  ({args.clients} clients)"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---|---:|")
    for r in rows:
        print(
            f"| {r['burst']} | {r['rss_mb']} | {r['rss_mb'] / third:.3f} | {r.get('requests', '')} | "
            f"{r.get('errors', '')} | {r.get('requests_per_s', '')} | {r.get('p95_ms', '')} | "
            f"{r.get('index_versions_served', '')} | {r.get('swap_s', '')} |"
        )
    after = [r["rss_mb"] / third for r in rows if r["burst"] > 3]
    levels_off = all(ratio <= 1 + args.tolerance for ratio in after)
    spread = f"{min(after):.3f}-{max(after):.3f}" if after else "n/a"
    verdict = "levels off" if levels_off else "GROWS"
    print(f"after burst 3: RSS {spread} of burst 3's -> {verdict} (none above {1 + args.tolerance:.0%} of it)")
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "levels_off": levels_off}, indent=2) + "\n")


if __name__ == "__main__":
    main()
