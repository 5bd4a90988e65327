"""`realm serve` under load, on loopback only: latency (p50/p95), requests/s, errors and the server's RSS.

Starts `realm serve` as a subprocess on 127.0.0.1 twice: first `--batch-size 1` (one question at a time, the
baseline of this run), then with its default micro-batching. Each phase is bounded in requests and time:
  one at a time:  1. one client;  2. `--clients` concurrent clients;
  micro-batched:  3. one client;  4. `--clients` clients, `--soak` times over (the RSS after each must stay
                  flat);  5. the same with `realm index add` publishing a new version in the middle (the
                  service swaps to it);  6. a 100 MB POST with Content-Length and one without (chunked): each
                  must get 413, the RSS must stay flat.

    python benchmarks/serve_load.py --model minilm --index data/squad/index --qa squad-open-dev \\
        --add-docs docs.jsonl [--clients 8] [--requests 200] [--seconds 120] [--soak 3]
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

HOST = "127.0.0.1"


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind((HOST, 0))
        return sock.getsockname()[1]


def start_server(
    model: str, index: Path, corpus: Path, port: int, batch_size: int | None, extra: tuple[str, ...] = ()
) -> subprocess.Popen:
    """`realm serve` (with `extra` flags), once its /health answers."""
    cmd = [
        sys.executable,
        "-m",
        "realm.cli",
        "serve",
        "--model",
        model,
        "--index",
        str(index),
        "--corpus",
        str(corpus),
        "--host",
        HOST,
        "--port",
        str(port),
        "--quiet",
        *(["--batch-size", str(batch_size)] if batch_size else []),
        *extra,
    ]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"realm serve exited: {server.stderr.read() if server.stderr else ''}")
        try:
            if httpx.get(f"http://{HOST}:{port}/health", timeout=1).status_code == 200:
                return server
        except httpx.HTTPError:
            time.sleep(0.5)
    server.kill()
    raise RuntimeError("realm serve did not start within 300 s")


def load(url: str, questions: list[str], clients: int, requests: int, seconds: float, pid: int, during=None) -> dict:
    """`requests` POST /ask spread over `clients` threads (stopping after `seconds`); `during()` runs halfway."""
    latencies: list[float] = []
    errors: list[str] = []
    versions: set[int] = set()
    lock = threading.Lock()
    counter = iter(range(requests))
    stop_at = time.monotonic() + seconds
    rss_before = rss_mb(pid)

    def client() -> None:
        with httpx.Client(timeout=60) as http:
            for n in counter:
                if time.monotonic() > stop_at:
                    return
                started = time.perf_counter()
                try:
                    reply = http.post(f"{url}/ask", json={"question": questions[n % len(questions)]})
                    ok = reply.status_code == 200
                    version = reply.json().get("index_version") if ok else None
                except httpx.HTTPError as err:
                    ok, version, reply = False, None, err
                with lock:
                    latencies.append(time.perf_counter() - started)
                    if ok:
                        versions.add(version)
                    else:
                        errors.append(str(getattr(reply, "status_code", reply)))

    started = time.perf_counter()
    threads = [threading.Thread(target=client) for _ in range(clients)]
    for thread in threads:
        thread.start()
    if during is not None:
        time.sleep(min(seconds / 3, 5))
        during()
    for thread in threads:
        thread.join()
    wall = time.perf_counter() - started
    cut = statistics.quantiles(latencies, n=20) if len(latencies) >= 2 else [float("nan")] * 19
    return {
        "clients": clients,
        "requests": len(latencies),
        "errors": len(errors),
        "error_kinds": sorted(set(errors)),
        "requests_per_s": round(len(latencies) / wall, 2),
        "p50_ms": round(1000 * statistics.median(latencies), 1),
        "p95_ms": round(1000 * cut[18], 1),
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_after": round(rss_mb(pid), 1),
        "index_versions_served": sorted(versions),
    }


def oversize(url: str, pid: int, megabytes: int = 100) -> dict:
    """A `megabytes` body with Content-Length, and the same streamed without it: status and RSS growth."""
    size = megabytes * 2**20
    chunk = b"x" * 2**20
    out = {}
    for name, headers in (("with_length", {"Content-Length": str(size)}), ("chunked", {})):
        before = rss_mb(pid)
        started = time.perf_counter()
        try:
            reply = httpx.post(
                f"{url}/ask",
                content=(chunk for _ in range(megabytes)),
                headers={"Content-Type": "application/json", **headers},
                timeout=60,
            )
            status: object = reply.status_code
        except httpx.HTTPError as err:  # the server may close the connection while the client still sends
            status = type(err).__name__
        out[name] = {
            "status": status,
            "seconds": round(time.perf_counter() - started, 2),
            "rss_growth_mb": round(rss_mb(pid) - before, 1),
        }
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--index", required=True, help="an index folder (copied: the benchmark adds to the copy)")
    parser.add_argument("--qa", required=True, help="questions (JSONL with 'question')")
    parser.add_argument("--add-docs", required=True, help="documents (JSONL) `realm index add` publishes mid-run")
    parser.add_argument("--clients", type=int, default=8)
    parser.add_argument("--requests", type=int, default=200)
    parser.add_argument("--seconds", type=float, default=120)
    parser.add_argument("--soak", type=int, default=3, help="micro-batched concurrent rounds (RSS must stay flat)")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    questions = [json.loads(line)["question"] for line in Path(args.qa).read_text().splitlines() if line.strip()]
    with tempfile.TemporaryDirectory() as tmp:
        index = Path(tmp) / "index"
        shutil.copytree(args.index, index, symlinks=True)
        meta = json.loads(next((index / "versions").glob("v*/meta.json")).read_text())
        corpus = (Path(args.index) / meta["corpus_path"]).resolve()
        results: dict = {}
        port = free_port()
        server = start_server(args.model, index, corpus, port, batch_size=1)
        url = f"http://{HOST}:{port}"
        try:
            results["one_at_a_time_one_client"] = load(url, questions, 1, args.requests // 4, args.seconds, server.pid)
            results["one_at_a_time_concurrent"] = load(
                url, questions, args.clients, args.requests, args.seconds, server.pid
            )
        finally:
            server.terminate()
            server.wait(timeout=30)
        server = start_server(args.model, index, corpus, port, batch_size=None)
        try:
            results["batched_one_client"] = load(url, questions, 1, args.requests // 4, args.seconds, server.pid)
            for round_ in range(args.soak):
                results[f"batched_concurrent_{round_ + 1}"] = load(
                    url, questions, args.clients, args.requests, args.seconds, server.pid
                )

            def add() -> None:
                subprocess.run(
                    [
                        sys.executable,
                        "-m",
                        "realm.cli",
                        "index",
                        "add",
                        "--index",
                        str(index),
                        "--docs",
                        args.add_docs,
                        "--model",
                        args.model,
                        "--corpus",
                        str(corpus),
                        "--quiet",
                    ],
                    check=True,
                )

            results["batched_concurrent_with_index_add"] = load(
                url, questions, args.clients, args.requests, args.seconds, server.pid, during=add
            )
            results["oversize_100mb"] = oversize(url, server.pid)
            results["health_after"] = httpx.get(f"{url}/health").json()
        finally:
            server.terminate()
            server.wait(timeout=30)
    base = results["one_at_a_time_concurrent"]["requests_per_s"]
    print(
        "| phase | clients | requests | errors | requests/s | vs one at a time, same clients | p50 ms | p95 ms | RSS MB |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|---|")
    for name, r in results.items():
        if "requests_per_s" in r:
            ratio = f"{r['requests_per_s'] / base:.2f}x" if r["clients"] == args.clients else ""
            print(
                f"| {name} | {r['clients']} | {r['requests']} | {r['errors']} | {r['requests_per_s']} | {ratio} | "
                f"{r['p50_ms']} | {r['p95_ms']} | {r['rss_mb_before']} -> {r['rss_mb_after']} |"
            )
    print(json.dumps(results, indent=2))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
