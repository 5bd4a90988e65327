"""`realm serve --api-key` against hostile clients: is an authorised client still answered, and as fast?

Starts `realm serve` on 127.0.0.1 with an API key; one authorised client asks `--questions` questions one after the
other, first alone (the baseline of this run), then while `--attackers` keyless connections (32, then 200 by
default) each POST /ask declaring a 100-byte body and sending a byte a second, reopened whenever the server ends
them (the attack that kept every client out at d1c3134). Reported: the client's statuses, p50/p95 latency and
p95 against its unloaded p95, and GET /health's. Last, `--clients` authorised clients ask in a loop (beyond the
32 requests in flight: some get 503) while /health is timed.

    python benchmarks/serve_hostile.py --model runs/main50/qa/best --index runs/main50/realm_index/index \\
        --qa squad-open-dev --retriever hybrid [--questions 40] [--attackers 32 200]
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import threading
import time
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

import httpx
from serve_load import HOST, free_port, start_server

KEY = "benchmark-key"


def timed(call) -> tuple[float, int]:
    started = time.perf_counter()
    status = call().status_code
    return 1000 * (time.perf_counter() - started), status


def summary(samples: list[tuple[float, int]]) -> dict:
    ms = [m for m, _ in samples]
    return {
        "n": len(ms),
        "statuses": dict(Counter(s for _, s in samples)),
        "p50_ms": round(statistics.median(ms), 1),
        "p95_ms": round(statistics.quantiles(ms, n=20, method="inclusive")[18], 1) if len(ms) >= 2 else ms[0],
        "max_ms": round(max(ms), 1),
    }


def attack(url: str, count: int, stop: threading.Event) -> threading.Thread:
    """`count` keyless slow-body connections, each reopened when the server ends it."""
    host, port = url.removeprefix("http://").split(":")
    head = b"POST /ask HTTP/1.1\r\nHost: b\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{"

    def run() -> None:
        with ExitStack() as stack:
            sockets: list[socket.socket | None] = [None] * count
            while not stop.is_set():
                for n in range(count):
                    try:
                        if sockets[n] is None:
                            sockets[n] = stack.enter_context(socket.create_connection((host, int(port)), timeout=5))
                            sockets[n].sendall(head)
                        else:
                            sockets[n].sendall(b" ")
                    except OSError:
                        sockets[n] = None
                stop.wait(1.0)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


def ask_one_by_one(url: str, questions: list[str]) -> dict:
    with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as http:
        asked = [timed(lambda q=q: http.post(f"{url}/ask", json={"question": q})) for q in questions]
        health = [timed(lambda: http.get(f"{url}/health")) for _ in range(10)]
    return {"ask": summary(asked), "health": summary(health)}


def saturated(url: str, questions: list[str], clients: int, seconds: float) -> dict:
    stop = threading.Event()
    statuses: Counter = Counter()

    def loop(n: int) -> None:
        with httpx.Client(timeout=60, headers={"Authorization": f"Bearer {KEY}"}) as http:
            while not stop.is_set():
                statuses[http.post(f"{url}/ask", json={"question": questions[n % len(questions)]}).status_code] += 1
                n += clients

    threads = [threading.Thread(target=loop, args=(n,)) for n in range(clients)]
    for thread in threads:
        thread.start()
    time.sleep(2)
    health = []
    with httpx.Client(timeout=60) as http:
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            health.append(timed(lambda: http.get(f"{url}/health")))
            time.sleep(0.2)
    stop.set()
    for thread in threads:
        thread.join()
    return {"ask_statuses": dict(statuses), "health": summary(health)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True)
    parser.add_argument("--index", required=True)
    parser.add_argument("--qa", required=True, help="questions (JSONL with 'question')")
    parser.add_argument("--retriever", default="dense", choices=["dense", "bm25", "hybrid"])
    parser.add_argument("--questions", type=int, default=40)
    parser.add_argument("--attackers", type=int, nargs="+", default=[32, 200])
    parser.add_argument("--clients", type=int, default=48, help="authorised clients of the saturation phase")
    parser.add_argument("--seconds", type=float, default=15)
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    lines = [json.loads(line)["question"] for line in Path(args.qa).read_text().splitlines() if line.strip()]
    questions = lines[: args.questions]
    meta = json.loads(next(Path(args.index, "versions").glob("v*/meta.json")).read_text())
    corpus = (Path(args.index) / meta["corpus_path"]).resolve()
    port = free_port()
    server = start_server(
        args.model, Path(args.index), corpus, port, None, ("--retriever", args.retriever, "--api-key", KEY)
    )
    url = f"http://{HOST}:{port}"
    results: dict = {}
    try:
        ask_one_by_one(url, questions[:5])  # warm-up, not reported
        results["alone"] = ask_one_by_one(url, questions)
        for count in args.attackers:
            stop = threading.Event()
            attacker = attack(url, count, stop)
            time.sleep(3)
            results[f"{count} keyless slow bodies"] = ask_one_by_one(url, questions)
            stop.set()
            attacker.join(timeout=30)
        results[f"{args.clients} authorised clients"] = saturated(url, lines, args.clients, args.seconds)
    finally:
        server.terminate()
        server.wait(timeout=30)
    _print(results, args)


def _print(results: dict, args: argparse.Namespace) -> None:
    base = results["alone"]["ask"]["p95_ms"]
    print(
        "| phase | /ask statuses | /ask p50 ms | /ask p95 ms | p95 vs alone | /health statuses | /health p95 ms | max |"
    )
    print("|---|---|---:|---:|---:|---|---:|---:|")
    for name, r in results.items():
        ask, health = r.get("ask"), r["health"]
        cells = (
            [str(ask["statuses"]), ask["p50_ms"], ask["p95_ms"], f"{ask['p95_ms'] / base:.2f}x"]
            if ask
            else [str(r["ask_statuses"]), "", "", ""]
        )
        print(
            f"| {name} | " + " | ".join(map(str, cells)) + f" | {health['statuses']} | {health['p95_ms']} | "
            f"{health['max_ms']} |"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2) + "\n")


if __name__ == "__main__":
    main()
