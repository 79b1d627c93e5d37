"""A long prompt and a short request on one `specdec serve` (issue 52's serving check).

For each --prefill-chunk given (a huge one stands for prefilling a prompt all at once), starts the server,
runs one stream, then sends a prompt of --tokens token ids (streamed, 4 new tokens) and, --delay seconds
later, a 4-token request; prints when each got its first token and the running stream's longest pause.

    python scripts/prefill_fairness.py --target qwen2.5-coder-0.5b-instruct --tokens 16000 --chunks 512,1000000
"""

from __future__ import annotations

import argparse
import http.client
import json
import random
import subprocess
import sys
import threading
import time


def stream(port: int, body: dict, arrivals: list[float]) -> None:
    """POST a streamed completion; append the time of each content event to `arrivals`."""
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    connection.request("POST", "/v1/completions", json.dumps({**body, "stream": True}),
                       {"Content-Type": "application/json"})
    response = connection.getresponse()
    for line in response:
        if line.startswith(b"data: {") and b'"text":""' not in line.replace(b" ", b""):
            arrivals.append(time.perf_counter())


def wait_until_up(port: int, server: subprocess.Popen) -> None:
    deadline = time.monotonic() + 600
    while True:
        try:
            connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            connection.request("GET", "/health")
            if connection.getresponse().status == 200:
                return
        except OSError:
            pass
        if server.poll() is not None or time.monotonic() > deadline:
            raise SystemExit("the server did not start")
        time.sleep(0.5)


def run(target: str, port: int, chunk: int, tokens: int, delay: float) -> dict:
    server = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--target", target, "--port", str(port),
                               "--prefill-chunk", str(chunk), "--prefix-cache", "0"],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_up(port, server)
        stream(port, {"prompt": "Warm up.", "max_tokens": 4}, [])
        running, long_first, short_first = [], [], []
        ids = [random.Random(0).randrange(100, 10_000) for _ in range(tokens)]
        background = threading.Thread(target=stream, args=(port, {"prompt": "Count from one to a thousand: one,",
                                                                  "max_tokens": 100_000, "temperature": 0}, running))
        background.start()
        time.sleep(2)
        long_sent = time.perf_counter()
        long = threading.Thread(target=stream, args=(port, {"prompt": ids, "max_tokens": 4}, long_first))
        long.start()
        time.sleep(delay)
        short_sent = time.perf_counter()
        stream(port, {"prompt": "Hi", "max_tokens": 4}, short_first)
        long.join()
        during = [t for t in running if long_sent <= t <= long_first[0]]
        gaps = [b - a for a, b in zip(during, during[1:])]
        return {"chunk": chunk, "short first token s": short_first[0] - short_sent,
                "long first token s": long_first[0] - long_sent,
                "stream chunks during the long prefill": len(during),
                "stream's longest pause s": max(gaps, default=long_first[0] - long_sent)}
    finally:
        server.terminate()
        server.wait(60)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--tokens", type=int, default=16_000)
    parser.add_argument("--chunks", default="512,1000000")
    parser.add_argument("--delay", type=float, default=3.0, help="seconds between the long prompt and the short one")
    parser.add_argument("--port", type=int, default=8766)
    args = parser.parse_args()
    for chunk in [int(c) for c in args.chunks.split(",")]:
        result = run(args.target, args.port, chunk, args.tokens, args.delay)
        print(", ".join(f"{key} {value:.2f}" if isinstance(value, float) else f"{key} {value}"
                        for key, value in result.items()), flush=True)


if __name__ == "__main__":
    main()
