"""`specdec bench serve`: our server and llama.cpp's, each started on the same model, driven one after the
other by the same concurrent streaming clients (bench/server_load.py); one table of throughput and latency.

    specdec bench serve --target smollm2-135m-instruct --clients 1,64 --max-tokens 128 --peers llamacpp

Each server is started once, listening on a free loopback port, and measured at every client count; then it
is stopped (SIGTERM) before the next starts, so they never share the cores. llama.cpp's `llama-server` comes
from $SPECDEC_LLAMA_CPP or PATH and runs the GGUF file the target was pulled as, with --parallel as many
slots as the most clients (continuous batching) and the same threads.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

from specdec.bench.llama_cpp import find_program, gguf_file
from specdec.bench.server_load import LoadReport, run_load
from specdec.bench.tasks import load_prompts
from specdec.errors import InvalidParameterError, SpecdecError

STARTUP_SECONDS = 900  # loading and converting a model the first time takes minutes on a small CPU


@dataclass
class ServerUnderTest:
    name: str
    command: list[str]  # starts it listening on 127.0.0.1:port
    port: int


@dataclass
class ServeBenchRow:
    server: str
    report: LoadReport


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def ours(target: str, extra: str, port: int) -> ServerUnderTest:
    command = [sys.executable, "-m", "specdec.cli", "serve", "--target", target, "--port", str(port),
               *shlex.split(extra)]
    label = "specdec serve" + (f" {extra}" if extra else "")
    return ServerUnderTest(label, command, port)


def llama_server(target: str, parallel: int, threads: int, slot_context: int, port: int) -> ServerUnderTest:
    command = [str(find_program("llama-server")), "-m", str(gguf_file(target)), "--port", str(port),
               "--host", "127.0.0.1", "-t", str(threads), "--parallel", str(parallel),
               "-c", str(parallel * slot_context)]
    return ServerUnderTest(f"llama.cpp llama-server --parallel {parallel}", command, port)


def wait_until_ready(process: subprocess.Popen, port: int, log: Path) -> None:
    """Until GET /health answers 200 (both servers answer 503 or nothing while loading)."""
    deadline = time.monotonic() + STARTUP_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            tail = log.read_text(errors="replace").strip().splitlines()[-1:] or ["(no output)"]
            raise SpecdecError(f"the server exited with status {process.returncode} before it was ready: {tail[0]}")
        try:
            if urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5).status == 200:
                return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise SpecdecError(f"the server was not ready after {STARTUP_SECONDS} s")


def stop(process: subprocess.Popen) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def measure(server: ServerUnderTest, clients: list[int], max_tokens: int, system_prompt: str | None,
            tasks: tuple[str, ...], progress=print) -> list[ServeBenchRow]:
    rows = []
    with tempfile.TemporaryDirectory() as folder:
        log = Path(folder) / "server.log"
        with log.open("w") as sink:
            process = subprocess.Popen(server.command, stdout=sink, stderr=subprocess.STDOUT,
                                       stdin=subprocess.DEVNULL, env={**os.environ, "TOKENIZERS_PARALLELISM": "false"})
        try:
            progress(f"{server.name}: starting")
            wait_until_ready(process, server.port, log)
            url = f"http://127.0.0.1:{server.port}/v1"
            run_load(url, 1, 4, system_prompt, tasks)  # a warm-up request: first-call costs are not the load's
            for count in clients:
                report, _ = run_load(url, count, max_tokens, system_prompt, tasks)
                progress(f"{server.name}: {count} clients, {report.tokens_per_second:.1f} tokens/s")
                rows.append(ServeBenchRow(server.name, report))
        finally:
            stop(process)
    return rows


def format_table(rows: list[ServeBenchRow]) -> str:
    def ms(seconds: float) -> str:
        return "-" if math.isnan(seconds) else f"{seconds * 1e3:.0f}"

    lines = ["| server | clients | tokens/s | TTFT p50 / p99 (s) | TPOT p50 / p99 (ms) | ITL p50 / p99 (ms) | errors |",
             "|---|---|---|---|---|---|---|"]
    for row in rows:
        r = row.report
        lines.append(f"| {row.server} | {r.clients} | {r.tokens_per_second:.1f} | {r.ttft_p50:.2f} / {r.ttft_p99:.2f} "
                     f"| {ms(r.tpot_p50)} / {ms(r.tpot_p99)} | {ms(r.itl_p50)} / {ms(r.itl_p99)} | {r.errors} |")
    return "\n".join(lines)


def run_serve_bench(args) -> int:
    try:
        clients = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        clients = []
    if not clients or min(clients) < 1 or args.max_tokens < 1 or args.server_threads < 1 or args.slot_context < 1:
        raise InvalidParameterError("--clients takes positive counts, e.g. 1,64; --max-tokens, --threads and "
                                    "--slot-context must be >= 1")
    tasks = tuple(t for t in args.tasks.split(",") if t)
    load_prompts(list(tasks), 1)  # a missing Spec-Bench file or an unknown task: one line, before any start
    peers = [p for p in args.peers.split(",") if p]
    if any(p != "llamacpp" for p in peers):
        raise InvalidParameterError(f"unknown serve peers {peers}: the one known is llamacpp")
    servers = [ours(args.target, args.server_args, free_port())] if args.ours and not args.url else []
    if "llamacpp" in peers:  # checked before anything starts: the program and the GGUF file exist
        servers.append(llama_server(args.target, max(clients), args.server_threads, args.slot_context, free_port()))
    progress = (lambda text: print(f"specdec: {text}", file=sys.stderr))
    rows: list[ServeBenchRow] = []
    if args.url:
        for count in clients:
            report, _ = run_load(args.url, count, args.max_tokens, args.system_prompt, tasks)
            rows.append(ServeBenchRow(args.url, report))
    for server in servers:
        rows += measure(server, clients, args.max_tokens, args.system_prompt, tasks, progress)
    print(format_table(rows))
    if args.json_out:
        Path(args.json_out).write_text(json.dumps([{"server": r.server, **asdict(r.report)} for r in rows], indent=1))
    return 0
