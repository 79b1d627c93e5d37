"""Ollama's /api/chat against /v1/chat/completions on one `specdec serve`, interleaved, streamed, greedy: the
same prompts through both routes, each answer's tokens/s (wall time from sending to the last byte) and
whether both routes wrote the same text; and, with --llama-cpp BIN_DIR, llama-server on the same GGUF file
(its chat completions; Ollama runs llama.cpp's server inside) beside them, in each --llama-spec mode.

    python scripts/ollama_route_speed.py [--target qwen2.5-coder-1.5b-instruct] [--repeats 3] [--max-tokens 128]
        [--llama-cpp BIN_DIR --llama-spec none,ngram-map-k]

Prints a markdown table (medians over repeats and prompts) and the ratio /api/chat / /v1/chat/completions.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).resolve().parent))  # its sibling, also when loaded by path
from api_bench import wait_healthy  # noqa: E402

PROMPTS = ["Write a Python function that checks whether a string is a palindrome.",
           "Write a Python class Stack with push, pop, peek and is_empty methods.",
           "Explain what a hash map is, in three sentences.",
           "Rewrite this loop as a list comprehension: result = []\nfor x in xs:\n    if x > 0:\n        result.append(x * 2)"]


@dataclass(frozen=True)
class Answer:
    text: str
    tokens: int
    seconds: float

    @property
    def tokens_per_second(self) -> float:
        return self.tokens / self.seconds


def openai_route(base: str, model: str, prompt: str, max_tokens: int) -> Answer:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens,
            "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    started, text, tokens = time.perf_counter(), "", 0
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as reply:
        for line in reply.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            text += "".join(choice["delta"].get("content") or "" for choice in chunk.get("choices", []))
            tokens = (chunk.get("usage") or {}).get("completion_tokens", tokens)
    return Answer(text, tokens, time.perf_counter() - started)


def ollama_route(base: str, model: str, prompt: str, max_tokens: int) -> Answer:
    body = {"model": model, "messages": [{"role": "user", "content": prompt}],
            "options": {"temperature": 0, "num_predict": max_tokens}}
    started, text, tokens = time.perf_counter(), "", 0
    with httpx.stream("POST", f"{base}/api/chat", json=body, timeout=600) as reply:
        for line in reply.iter_lines():
            chunk = json.loads(line)
            text += chunk["message"]["content"]
            tokens = chunk.get("eval_count", tokens)
    return Answer(text, tokens, time.perf_counter() - started)


def start(command: list[str], port: int, log: Path) -> subprocess.Popen:
    process = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT)
    wait_healthy(f"http://127.0.0.1:{port}", 900)
    return process


def stop(process: subprocess.Popen) -> None:
    process.terminate()
    try:
        process.wait(60)
    except subprocess.TimeoutExpired:
        process.kill()


def measure(base: str, model: str, routes: dict, repeats: int, max_tokens: int) -> dict[str, list[Answer]]:
    """Each route answers each prompt `repeats` times, the routes alternating prompt by prompt and taking turns
    to go first (the second answer of a prompt finds its prompt in the prefix cache); one warm-up answer each
    first, not counted."""
    for route in routes.values():
        route(base, model, PROMPTS[0], 8)
    answers: dict[str, list[Answer]] = {name: [] for name in routes}
    turn = 0
    for _ in range(repeats):
        for prompt in PROMPTS:
            order = list(routes.items())
            for name, route in order[turn % len(order):] + order[:turn % len(order)]:
                answers[name].append(route(base, model, prompt, max_tokens))
            turn += 1
    return answers


def ours(args) -> dict[str, list[Answer]]:
    port = 8731
    command = [sys.executable, "-m", "specdec.cli", "serve", "--target", args.target, "--port", str(port)]
    process = start(command, port, Path("ollama_route_speed.specdec.log"))
    try:
        return measure(f"http://127.0.0.1:{port}", args.target,
                       {"/v1/chat/completions": openai_route, "/api/chat": ollama_route}, args.repeats, args.max_tokens)
    finally:
        stop(process)


def llama_server(args, spec: str) -> list[Answer]:
    from specdec.models.sources.zoo import model_dir

    port = 8732
    gguf = model_dir(args.target) / f"{args.target}.gguf"
    command = [str(Path(args.llama_cpp) / "llama-server"), "-m", str(gguf), "--port", str(port), "-t", "2",
               "-c", "4096", "--jinja"] + ([] if spec == "none" else ["--spec-type", spec])
    process = start(command, port, Path(f"ollama_route_speed.llama-{spec}.log"))
    try:
        return measure(f"http://127.0.0.1:{port}", args.target, {"llama": openai_route}, args.repeats,
                       args.max_tokens)["llama"]
    finally:
        stop(process)


def row(name: str, answers: list[Answer]) -> str:
    rates = [answer.tokens_per_second for answer in answers]
    return f"| {name} | {statistics.median(rates):.1f} | {min(rates):.1f}-{max(rates):.1f} | {len(rates)} |"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--llama-cpp", default=os.environ.get("SPECDEC_LLAMA_CPP"), help="a llama.cpp build's bin/")
    parser.add_argument("--llama-spec", default="none,ngram-map-k", help="llama-server's --spec-type modes to run")
    args = parser.parse_args()
    answers = ours(args)
    same = sum(a.text == b.text for a, b in zip(answers["/v1/chat/completions"], answers["/api/chat"]))
    lines = ["| route | tokens/s (median) | range | answers |", "|---|---|---|---|"]
    lines += [row(f"specdec {name}", found) for name, found in answers.items()]
    if args.llama_cpp:
        lines += [row(f"llama-server, --spec-type {spec}", llama_server(args, spec))
                  for spec in args.llama_spec.split(",")]
    ratio = statistics.median(b.tokens_per_second / a.tokens_per_second
                              for a, b in zip(answers["/v1/chat/completions"], answers["/api/chat"]))
    print("\n".join(lines))
    print(f"\n/api/chat / /v1/chat/completions, median of per-prompt ratios: {ratio:.3f}; "
          f"same text {same}/{len(answers['/api/chat'])}")


if __name__ == "__main__":
    main()
