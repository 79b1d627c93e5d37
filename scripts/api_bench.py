"""Our server against llama-server on the requests agents and editors send, same GGUF, one run each side,
interleaved: JSON-schema outputs, a tool-calling round trip through the `openai` client, fill-in-the-middle
(64 new tokens in a ~1,500-token file: ours `/v1/completions` with `suffix`, llama-server's `/infill`),
multi-turn edits (a conversation that edits one function three times, each answer the whole function:
the earlier answers are in the prompt, so the next one mostly repeats them), and ours with `logprobs` on
against off.

    python scripts/api_bench.py --llama-cpp BIN_DIR [--target qwen2.5-coder-1.5b-instruct] [--repeats 3]
        [--workloads json,tools,fim,edits]

llama-server runs once per `--spec-type` listed (`--llama-spec none,ngram-simple,ngram-mod,draft-simple`; the
draft model for draft-simple: the target's zoo sibling), and each workload reports its best. Prints a
markdown table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import openai

SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string"}, "language": {"enum": ["python", "rust", "go", "javascript"]},
    "stars": {"type": "integer", "minimum": 0}, "topics": {"type": "array", "items": {"type": "string"}, "maxItems": 5},
    "maintainers": {"type": "array", "items": {"type": "object", "properties": {"name": {"type": "string"},
                                                                                 "email": {"type": "string"}},
                                               "required": ["name", "email"]}, "maxItems": 3}},
    "required": ["name", "language", "stars", "topics", "maintainers"], "additionalProperties": False}
JSON_PROMPTS = ["Describe the Python package requests as a JSON record.",
                "Describe a small Rust command-line tool for counting words as a JSON record.",
                "Describe a Go web framework as a JSON record.",
                "Describe a JavaScript testing library as a JSON record."]
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}
MODEL = "qwen2.5-coder-1.5b-instruct"  # the name both servers are asked for (llama-server takes any)
TOOL_QUESTION = [{"role": "user", "content": "What is the weather in Paris right now, in Celsius?"}]


def wait_healthy(url: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=2) as reply:
                if reply.status == 200 and b"loading" not in reply.read():
                    return
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} did not come up")


def post(url: str, body: dict) -> dict:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=600) as reply:
        return json.loads(reply.read())


def fim_case() -> tuple[str, str]:
    """About 1,500 tokens of real code (the standard library's textwrap.py), cut inside a function."""
    import textwrap

    source = Path(textwrap.__file__).read_text()[:6000]
    cut = source.index("        chunks = self._split(text)") if "        chunks = self._split(text)" in source \
        else len(source) // 2
    return source[:cut], source[cut:]


def edit_sessions() -> list[tuple[str, tuple[str, ...]]]:
    """(a function's source, the edits asked one after another): real code from the standard library."""
    import glob
    import inspect
    import textwrap

    return [(inspect.getsource(textwrap.dedent),
             ("Add type hints to this function's signature.",
              "Now rename the local variable `margin` to `common_margin` everywhere.",
              "Now translate every comment into French.")),
            (inspect.getsource(glob._iglob),
             ("Add a docstring to this function that explains each parameter.", "Now add type hints to its signature.",
              "Now rename the parameter `dironly` to `directories_only` everywhere."))]


def edits_rate(client: openai.OpenAI) -> float:
    """Completion tokens per second (prompt processing included) over multi-turn editing conversations, each
    turn's answer the whole function again (greedy)."""
    tokens, seconds = 0, 0.0
    for source, edits in edit_sessions():
        messages: list[dict] = []
        for turn, edit in enumerate(edits):
            ask = f"{edit} Reply with the whole function in one code block."
            messages.append({"role": "user", "content": f"{ask}\n\n```python\n{source}```" if turn == 0 else ask})
            start = time.perf_counter()
            reply = client.chat.completions.create(model=MODEL, messages=messages, max_tokens=768, temperature=0)
            seconds += time.perf_counter() - start
            tokens += reply.usage.completion_tokens
            messages.append({"role": "assistant", "content": reply.choices[0].message.content})
    return tokens / seconds


def json_rate(client: openai.OpenAI, ours: bool) -> float:
    """Completion tokens per second over the JSON prompts (greedy, the schema enforced)."""
    tokens, seconds = 0, 0.0
    for prompt in JSON_PROMPTS:
        extra = {} if ours else {"json_schema": SCHEMA}  # llama-server's own field
        fmt = {"response_format": {"type": "json_schema", "json_schema": {"name": "record", "schema": SCHEMA}}} \
            if ours else {}
        start = time.perf_counter()
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=256, temperature=0, extra_body=extra, **fmt)
        seconds += time.perf_counter() - start
        tokens += reply.usage.completion_tokens
        json.loads(reply.choices[0].message.content)  # every output parses
    return tokens / seconds


def tool_round_trip(client: openai.OpenAI) -> float:
    start = time.perf_counter()
    # "required": the call is constrained by its arguments' schema on both servers (with "auto" the 1.5B
    # sometimes answers with a JSON code block instead of its template's <tool_call> tags)
    first = client.chat.completions.create(model=MODEL, messages=TOOL_QUESTION, tools=[WEATHER], temperature=0,
                                           max_tokens=128, tool_choice="required")
    calls = first.choices[0].message.tool_calls
    if not calls:  # reported as a failed round trip (nan), with what came back instead
        print(f"no tool call from {client.base_url}: {first.choices[0].message.content!r:.120}", file=sys.stderr)
        return float("nan")
    history = TOOL_QUESTION + [first.choices[0].message.model_dump(exclude_none=True),
                               {"role": "tool", "tool_call_id": calls[0].id, "content": '{"temperature": 18}'}]
    final = client.chat.completions.create(model=MODEL, messages=history, tools=[WEATHER], temperature=0,
                                           max_tokens=128)
    assert final.choices[0].message.content
    return time.perf_counter() - start


def fim_latency(base: str, ours: bool) -> float:
    prefix, suffix = fim_case()
    start = time.perf_counter()
    if ours:
        post(base + "/v1/completions", {"model": MODEL, "prompt": prefix, "suffix": suffix, "max_tokens": 64,
                                        "temperature": 0})
    else:
        post(base + "/infill", {"input_prefix": prefix, "input_suffix": suffix, "n_predict": 64, "temperature": 0})
    return time.perf_counter() - start


def logprobs_rate(client: openai.OpenAI, on: bool) -> float:
    tokens, seconds = 0, 0.0
    for prompt in JSON_PROMPTS[:2]:
        start = time.perf_counter()
        extra = {"logprobs": True, "top_logprobs": 5} if on else {}
        reply = client.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": prompt}],
                                               max_tokens=128, temperature=0, **extra)
        seconds += time.perf_counter() - start
        tokens += reply.usage.completion_tokens
    return tokens / seconds


def best_mode(results: dict[str, dict], workload: str, higher_is_better: bool) -> str:
    """The peer's --spec-type with its highest rate or shortest time on the workload (a failed run, nan, never
    unless every one failed)."""
    values = {spec: measured[workload][1] for spec, measured in results.items()}
    ran = [spec for spec, value in values.items() if not math.isnan(value)] or list(values)
    return (max if higher_is_better else min)(ran, key=values.get)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-cpp", default=os.environ.get("SPECDEC_LLAMA_CPP"), required=False)
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--draft", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--llama-spec", default="none,ngram-simple,ngram-mod,draft-simple")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--server-args", default="", help="more `specdec serve` options")
    parser.add_argument("--workloads", default="json,tools,fim,edits", help="comma-separated, of json,tools,fim,edits")
    args = parser.parse_args()
    global MODEL
    MODEL = args.target
    workloads = args.workloads.split(",")
    if not set(workloads) <= {"json", "tools", "fim", "edits"}:
        parser.error(f"--workloads: choose from json,tools,fim,edits, not {args.workloads!r}")

    from specdec.bench.llama_cpp import gguf_file

    ours_port, theirs_port = 8701, 8702
    ours = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--target", args.target, "--port",
                             str(ours_port), *args.server_args.split()], stderr=subprocess.DEVNULL)
    results: dict[str, dict] = {}
    try:
        ours_url = f"http://127.0.0.1:{ours_port}"
        wait_healthy(ours_url)
        ours_client = openai.OpenAI(base_url=ours_url + "/v1", api_key="x", max_retries=0)
        for spec in args.llama_spec.split(","):
            command = [str(Path(args.llama_cpp) / "llama-server"), "-m", str(gguf_file(args.target)), "-t", "2",
                       "--port", str(theirs_port), "--jinja", "-c", "8192", "-np", "1"]
            if spec != "none":
                command += ["--spec-type", spec]
            if spec.startswith("draft"):
                command += ["-md", str(gguf_file(args.draft)), "--spec-draft-n-max", "8"]
            theirs = subprocess.Popen(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            try:
                theirs_url = f"http://127.0.0.1:{theirs_port}"
                wait_healthy(theirs_url)
                theirs_client = openai.OpenAI(base_url=theirs_url + "/v1", api_key="x", max_retries=0)
                measures = {"json": (lambda: json_rate(ours_client, True), lambda: json_rate(theirs_client, False)),
                            "tools": (lambda: tool_round_trip(ours_client), lambda: tool_round_trip(theirs_client)),
                            "fim": (lambda: fim_latency(ours_url, True), lambda: fim_latency(theirs_url, False)),
                            "edits": (lambda: edits_rate(ours_client), lambda: edits_rate(theirs_client))}
                rows = {name: ([], []) for name in workloads}
                json_rate(ours_client, True), json_rate(theirs_client, False)  # warm both
                for _ in range(args.repeats):  # interleaved: each measurement ours then theirs
                    for name in workloads:
                        rows[name][0].append(measures[name][0]())
                        rows[name][1].append(measures[name][1]())
                results[spec] = {name: (statistics.median(a), statistics.median(b)) for name, (a, b) in rows.items()}
                print(f"llama-server --spec-type {spec}: {results[spec]}", file=sys.stderr, flush=True)
            finally:
                theirs.terminate()
                theirs.wait(30)
        on = [logprobs_rate(ours_client, True) for _ in range(args.repeats)]
        off = [logprobs_rate(ours_client, False) for _ in range(args.repeats)]
    finally:
        ours.terminate()
        ours.wait(30)
    print("| workload | ours | llama-server (its best --spec-type) | ratio |")
    print("|---|---|---|---|")
    rows_printed = {"json": ("JSON-schema outputs, tokens/s", True), "tools": ("tool-call round trip, s", False),
                    "fim": ("fill-in-the-middle, 64 tokens, s", False),
                    "edits": ("multi-turn edits (2 conversations, 3 turns), tokens/s", True)}
    for name in workloads:
        label, higher_is_better = rows_printed[name]
        best = best_mode(results, name, higher_is_better)
        ours_value, theirs_value = results[best][name]
        unit = "x" if higher_is_better else "x the time"
        print(f"| {label} | {ours_value:.2f} | {theirs_value:.2f} ({best}) | {ours_value / theirs_value:.2f}{unit} |")
    print(f"| logprobs on / off, tokens/s (ours) | {statistics.median(on):.1f} / {statistics.median(off):.1f} | - | "
          f"{statistics.median(on) / statistics.median(off):.2f}x |")
    print(json.dumps(results), file=sys.stderr)


if __name__ == "__main__":
    main()
