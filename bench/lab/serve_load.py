"""Load test of `fastscore serve`: requests/s and p50/p99 latency of /v1/completions prompt log-probs at several
numbers of concurrent clients, all on this machine.

    python -m fastscore.bench.lab.serve_load --clients 1,8,32 --requests 96 [--model M --backend B --quant Q]

It starts `fastscore serve` on 127.0.0.1 (a free port) in a subprocess, or uses --url, which must be a loopback
address: no traffic leaves the machine. Every level sends at most --requests requests and stops after
--max-seconds, so the run is bounded in count and time. Each request is one prompt of about 80 tokens; prompts share
a preamble (what batching into one trie shares) and differ in their question. A warm-up request precedes the levels.
"""

from __future__ import annotations

import argparse
import http.client
import ipaddress
import json
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

PREAMBLE = ("The following are short arithmetic questions with their answers. Each answer is a single number "
            "written without units.\n\n")


def prompt(i: int) -> str:
    a, b = 17 + 7 * i % 89, 3 + 11 * i % 53
    return f"{PREAMBLE}Question {i}: what is {a} plus {b}, and then times two?\nAnswer: {(a + b) * 2}"


@dataclass(frozen=True)
class Level:
    clients: int
    sent: int
    ok: int
    busy: int  # 503: the queue was full
    failed: int
    seconds: float
    latencies_ms: tuple[float, ...]
    errors: tuple[str, ...] = ()  # what the failed requests got (an HTTP status or the client's exception)

    def row(self) -> str:
        lat = np.asarray(self.latencies_ms) if self.latencies_ms else np.asarray([np.nan])
        failures = f"  failures: {', '.join(self.errors)}" if self.errors else ""
        return (f"{self.clients:>7} {self.sent:>8} {self.ok:>6} {self.busy:>5} {self.failed:>6} "
                f"{self.ok / self.seconds:>8.1f} {np.percentile(lat, 50):>8.1f} {np.percentile(lat, 99):>8.1f}"
                f"{failures}")


HEADER = f"{'clients':>7} {'requests':>8} {'ok':>6} {'503':>5} {'failed':>6} {'req/s':>8} {'p50 ms':>8} {'p99 ms':>8}"


def loopback_url(url: str) -> tuple[str, int]:
    """Host and port of `url`, refused unless it names this machine (127.0.0.0/8, ::1 or localhost)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    addresses = {info[4][0] for info in socket.getaddrinfo(host, parts.port or 80)} if host else set()
    if not addresses or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addresses):
        raise SystemExit(f"refusing {url}: the load test only sends to loopback addresses (127.0.0.1, ::1)")
    return host, parts.port or 80


def _client(host: str, port: int, counter, limit: int, deadline: float, out: list, lock: threading.Lock) -> None:
    conn = http.client.HTTPConnection(host, port, timeout=120)
    try:
        while time.monotonic() < deadline:
            with lock:
                i = counter[0]
                if i >= limit:
                    return
                counter[0] += 1
            body = json.dumps({"model": "fastscore", "prompt": prompt(i), "echo": True, "logprobs": 1,
                               "max_tokens": 0})
            start = time.perf_counter()
            try:
                conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
                response = conn.getresponse()
                response.read()
                status = response.status
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                conn = http.client.HTTPConnection(host, port, timeout=120)
                status = type(exc).__name__
            with lock:
                out.append((status, (time.perf_counter() - start) * 1000))
    finally:
        conn.close()


def run_level(host: str, port: int, clients: int, requests: int, max_seconds: float) -> Level:
    counter, out, lock = [0], [], threading.Lock()
    start = time.perf_counter()
    deadline = time.monotonic() + max_seconds
    threads = [threading.Thread(target=_client, args=(host, port, counter, requests, deadline, out, lock))
               for _ in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    seconds = time.perf_counter() - start
    ok = [ms for status, ms in out if status == 200]
    busy = sum(1 for status, _ in out if status == 503)
    errors = sorted({str(status) for status, _ in out if status not in (200, 503)})
    return Level(clients, len(out), len(ok), busy, len(out) - len(ok) - busy, seconds, tuple(ok), tuple(errors))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(args: argparse.Namespace) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    command = [sys.executable, "-c", "from fastscore.cli import main; main()", "serve", "--host", "127.0.0.1",
               "--port", str(port), "--backend", args.backend, "--max-queue", str(args.max_queue)]
    for flag, value in (("--model", args.model), ("--quant", args.quant), ("--threads", args.threads)):
        if value is not None:
            command += [flag, str(value)]
    server = subprocess.Popen(command, stdout=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + args.startup_seconds
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise SystemExit(f"fastscore serve exited with {server.returncode}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return server, url
        except OSError:
            time.sleep(0.5)
    server.terminate()
    raise SystemExit(f"fastscore serve did not answer within {args.startup_seconds:g} s")


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--url", help="An already running server on this machine (default: start one).")
    parser.add_argument("--model")
    parser.add_argument("--backend", default="llamacpp")
    parser.add_argument("--quant")
    parser.add_argument("--threads", type=int)
    parser.add_argument("--clients", default="1,8,32", help="Concurrent clients of each level.")
    parser.add_argument("--requests", type=int, default=96, help="Requests per level (at most).")
    parser.add_argument("--max-seconds", type=float, default=120.0, help="Time limit of each level.")
    parser.add_argument("--max-queue", type=int, default=64, help="The started server's --max-queue.")
    parser.add_argument("--startup-seconds", type=float, default=600.0)
    args = parser.parse_args(argv)
    levels = [int(c) for c in args.clients.split(",")]
    server = None
    if args.url:
        url = args.url
    else:
        server, url = start_server(args)
    host, port = loopback_url(url)
    try:
        run_level(host, port, 1, 1, args.max_seconds)  # warm-up: first-call allocations are not measured
        print(f"fastscore serve at {url}: /v1/completions, echo + logprobs=1 + max_tokens=0, one prompt of "
              f"~{len(prompt(0).split())} words per request, at most {args.requests} requests or "
              f"{args.max_seconds:g} s per level")
        print(HEADER)
        for clients in levels:
            print(run_level(host, port, clients, args.requests, args.max_seconds).row(), flush=True)
        conn = http.client.HTTPConnection(host, port, timeout=10)
        conn.request("GET", "/health")
        batches = json.loads(conn.getresponse().read()).get("batches")
        if batches:
            print(f"server: {batches['requests']} requests in {batches['calls']} backend calls "
                  f"(up to {batches['largest']} requests in one call); {batches['refused']} refused with 503")
    finally:
        if server is not None:
            server.terminate()
            server.wait(30)


if __name__ == "__main__":
    main()
