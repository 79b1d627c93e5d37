"""Send hostile requests to a real `specdec serve` and count what comes back (issue 52's check, repeatable).

Starts the server on a loopback port with an API key (its log to a file), then sends: every field of every
POST endpoint's body (chat, completions, /infill, responses, messages, Ollama's chat and generate and their
`options`; read from the request models) set to each of a list of
hostile values (wrong types, extremes, integers past 4,300 digits, NaN and 1e999 literals, lone surrogates,
deep nesting, huge strings and lists); schemas and grammars that are cyclic, unsatisfiable or too big for
the grammar engine; surrogates in tools; every route without the key and every POST without JSON; bodies
cut short; a 48-token stream beside four clients tokenizing megabytes; 50 sockets trickling their headers;
then SIGTERM under 8 streams. Prints the status counts,
the count of 5xx and of tracebacks in the log, and how the shutdown went.

    python scripts/hostile_requests.py --target smollm2-135m-instruct [--log serve.log]
"""

from __future__ import annotations

import argparse
import http.client
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import Counter

from specdec.server.infill import InfillRequest
from specdec.server.ollama.bodies import ChatBody, GenerateBody, OllamaOptions
from specdec.server.anthropic_messages import MessagesRequest
from specdec.server.protocol import ChatCompletionRequest, CompletionRequest
from specdec.server.responses_api import ResponsesRequest

KEY = "hostile-check"
MODEL_NAME = "hostile"  # the server is started with --model-name this (Anthropic's body requires a model)
HEADERS = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}
DEEP = "[" * 100 + "]" * 100
HOSTILE = [  # JSON text, spliced into bodies as it is (some are not what json.dumps would write)
    "null", "true", "-1", "0", "1", "2.5", str(2**64), str(-(2**70)), "1e308", "1e999", "-1e999", "NaN",
    "Infinity", "9" * 5000, "-" + "9" * 5000, '"x"', '""', '"\\ud800"', '"a\\udfffb"', json.dumps("a" * 100_000),
    "[]", "{}", DEEP, '{"\\udc00": 1}', json.dumps(list(range(10_000))), '[{"role": "user", "content": "\\ud800"}]',
    '{"type": "json_schema", "json_schema": {"name": "x", "schema": {"$ref": "#"}}}', '{"k": -5}',
]
BASES = {
    "/v1/chat/completions": (ChatCompletionRequest, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}),
    "/v1/completions": (CompletionRequest, {"prompt": "hello", "max_tokens": 4}),
    "/infill": (InfillRequest, {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 4}),
    "/v1/responses": (ResponsesRequest, {"input": "hi", "max_output_tokens": 4}),
    "/v1/messages": (MessagesRequest, {"model": MODEL_NAME, "max_tokens": 4,
                                       "messages": [{"role": "user", "content": "hi"}]}),
    "/api/chat": (ChatBody, {"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}], "stream": False,
                             "options": {"num_predict": 4}}),
    "/api/generate": (GenerateBody, {"model": MODEL_NAME, "prompt": "hi", "stream": False, "options": {"num_predict": 4}}),
}
CHAT = BASES["/v1/chat/completions"][1]
OLLAMA_CHAT = BASES["/api/chat"][1]
CYCLE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}}}
SCHEMAS = [CYCLE, {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}},
           {"type": "string", "pattern": "^a{1000000}$"}, {"type": "string", "pattern": "^(a{1000}){1000}$"},
           {"type": "integer", "minimum": 10**50}, {"type": "wat"}, {"enum": []},
           {"allOf": [{"type": "string"}, {"type": "integer"}]},
           {"type": "object", "required": ["a"], "properties": {}, "additionalProperties": False}]
GRAMMARS = ['root ::= "yes" | "no"', "root ::= missing", "root ::= (", 'root ::= "a"{1000000}', "", "root ::= root"]
FUNCTION = {"name": "f", "description": "d", "parameters": {"type": "object"}}
FUNCTIONS = [FUNCTION, {**FUNCTION, "description": "\ud800"},
             {**FUNCTION, "parameters": {"type": "object", "properties": {"\udc00": {}}}},
             {**FUNCTION, "parameters": {"$ref": "#/$defs/L", "$defs": {"L": {"type": "object"}}}},
             {**FUNCTION, "parameters": CYCLE}]
CALL_WITH_SURROGATE = {"role": "assistant", "content": None, "tool_calls": [
    {"id": "1", "type": "function", "function": {"name": "f", "arguments": '{"a": "\\ud800"}'}}]}
DEEP_SCHEMA = '{"type": "object", "properties": {"a": ' * 1000 + "{}" + "}}" * 1000
# grammar sizes around and past the bounds (api/grammar_bounds.py): rule chains, nesting, $ref chains
SIZED_GRAMMARS = ["root ::= r0\n" + "".join(f'r{i} ::= "x" r{i + 1}\n' for i in range(n)) + f'r{n} ::= "y"\n'
                  for n in (100, 1000, 10_000)] + ["root ::= " + "(" * n + '"a"' + ")" * n for n in (100, 1000)]
SIZED_SCHEMAS = [{"$ref": "#/$defs/a0", "$defs": {**{f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(n)},
                                                  f"a{n}": {"type": "integer"}}} for n in (100, 1000, 3000)]
KEYWORDS = [{"type": "object", "patternProperties": {"^a$": {"type": "integer"}}, "additionalProperties": False},
            {"type": "integer", "multipleOf": -1}, {"type": "string", "format": "email"}]
# repetition penalties and temperatures at float32's edges, with a grammar's mask on
PENALTY_SWEEP = [{"repetition_penalty": penalty, "temperature": temperature, **constraint}
                 for penalty in (2.66e-256, 1e-30, 0.5, 3.0, 1e30, 1e300) for temperature in (0, 1e-300, 0.7)
                 for constraint in ({"response_format": {"type": "json_object"}},
                                    {"tools": [{"type": "function", "function": FUNCTION}], "tool_choice": "auto"})]
SPECIAL = [  # (path, body text)
    *[("/v1/completions", json.dumps({"prompt": "a", "max_tokens": 4, "json_schema": schema})) for schema in SCHEMAS],
    ("/v1/completions", '{"prompt": "a", "json_schema": ' + DEEP_SCHEMA + "}"),
    *[("/v1/completions", json.dumps({"prompt": "a", "max_tokens": 4, "grammar": grammar})) for grammar in GRAMMARS],
    *[("/v1/chat/completions", json.dumps({**CHAT, "tools": [{"type": "function", "function": function}],
                                           "tool_choice": choice}))
      for choice in ("auto", "required") for function in FUNCTIONS],
    ("/v1/chat/completions", json.dumps({**CHAT, "messages": [CALL_WITH_SURROGATE,
                                                             {"role": "user", "content": "hi"}]})),
    *[("/v1/chat/completions", json.dumps({**CHAT, "grammar": grammar})) for grammar in SIZED_GRAMMARS],
    *[("/v1/chat/completions", json.dumps({**CHAT, "json_schema": schema})) for schema in SIZED_SCHEMAS + KEYWORDS],
    *[("/v1/chat/completions", json.dumps({**CHAT, "tools": [{"type": "function", "function": {
        **FUNCTION, "parameters": schema}}], "tool_choice": choice}))
      for schema in SIZED_SCHEMAS + KEYWORDS for choice in ("auto", "required")],
    *[("/v1/chat/completions", json.dumps({**CHAT, "max_tokens": 16, **sweep})) for sweep in PENALTY_SWEEP],
    ("/v1/chat/completions", json.dumps({**CHAT, "tools": [{"type": "function", "function": FUNCTION}],
                                         "tool_choice": "required", "max_tokens": 1})),
    *[("/api/chat", json.dumps({**OLLAMA_CHAT, "format": schema})) for schema in SCHEMAS],
    *[("/api/chat", json.dumps({**OLLAMA_CHAT, "messages": [{"role": role, "content": "hi"}]}))
      for role in ("wizard", "SYSTEM", "", "developer")],
    ("/api/chat", json.dumps({**OLLAMA_CHAT, "options": {"num_predict": 10**9}, "stream": True})),
    *[("/api/chat", json.dumps({**OLLAMA_CHAT, "tools": [{"type": "function", "function": function}]}))
      for function in FUNCTIONS],
    *[("/api/generate", json.dumps({**BASES["/api/generate"][1], **change}))
      for change in ({"context": [10**9]}, {"context": [-1]}, {"suffix": "x"}, {"raw": True, "system": "x"},
                     {"template": "{{ .Prompt }}"}, {"keep_alive": "-5x"}, {"think": "max"})],
]


def body_variants() -> list[tuple[str, str]]:
    """(path, body text): each field of each endpoint's request model at each hostile value; Ollama's options
    each at each hostile value too (num_predict past the context, a negative num_ctx, ...)."""
    cases = []
    for path, (model, base) in BASES.items():
        for field in [*model.model_fields, "unknown_field"]:
            for value in HOSTILE:
                rest = {key: item for key, item in base.items() if key != field}
                cases.append((path, json.dumps(rest)[:-1] + (", " if rest else "") + f'"{field}": {value}}}'))
    for path in ("/api/chat", "/api/generate"):
        base = {key: item for key, item in BASES[path][1].items() if key != "options"}
        for option in [*OllamaOptions.model_fields, "unknown_option"]:
            for value in HOSTILE:
                cases.append((path, json.dumps(base)[:-1] + f', "options": {{"num_predict": 4, "{option}": {value}}}}}'))
    return cases


def send(port: int, method: str, path: str, body: str | bytes = b"", headers: dict | None = None) -> int:
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    connection.request(method, path, body=body.encode("utf-8", "surrogatepass") if isinstance(body, str) else body,
                       headers=HEADERS if headers is None else headers)
    response = connection.getresponse()
    response.read()
    return response.status


def protocol_cases(port: int, statuses: Counter) -> None:
    routes = ["/v1/chat/completions", "/v1/completions", "/infill", "/v1/responses", "/v1/responses/x", "/v1/messages",
              "/v1/messages/count_tokens", "/v1/models", "/openapi.json", "/docs", "/redoc", "/docs/oauth2-redirect",
              "/nope"]
    for path in routes:
        for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": KEY},
                        {"Authorization": f"Basic {KEY}"}):
            statuses[("no or wrong key", send(port, "GET", path, headers=headers))] += 1
        for media in ("", "text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            headers = {"Authorization": HEADERS["Authorization"], **({"Content-Type": media} if media else {})}
            statuses[("POST not JSON", send(port, "POST", path, "{}", headers))] += 1
    for path in BASES:  # bodies cut short: a Content-Length longer than what is sent, then the client leaves
        with socket.create_connection(("127.0.0.1", port)) as sock:
            sock.sendall(f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                         f"Authorization: Bearer {KEY}\r\nContent-Length: 1000\r\n\r\n{{\"prompt\"".encode())
        statuses[("cut body", "sent")] += 1


def stream_beside_tokenizers(port: int, clients: int = 4, each: int = 3) -> tuple[float, float]:
    """(seconds of a 48-token stream alone, seconds of the same stream while `clients` clients each send `each`
    /tokenize requests of ~1 MB): what one client's tokenizing costs another's stream (issue 94)."""
    body = json.dumps({"messages": [{"role": "user", "content": "Count from one to fifty."}], "max_tokens": 48,
                       "temperature": 0, "stream": True})
    heavy = json.dumps({"content": "hello world " * 85000, "with_pieces": True})

    def timed_stream() -> float:
        started = time.monotonic()
        send(port, "POST", "/v1/chat/completions", body)
        return time.monotonic() - started

    alone = timed_stream()

    def tokenizer() -> None:
        for _ in range(each):
            send(port, "POST", "/tokenize", heavy)

    workers = [threading.Thread(target=tokenizer) for _ in range(clients)]
    for worker in workers:
        worker.start()
    time.sleep(0.2)
    beside = timed_stream()
    for worker in workers:
        worker.join()
    return alone, beside


def slow_heads(port: int, count: int = 50) -> float:
    """Open `count` sockets that trickle a request head; seconds until the server has closed them all."""
    sockets = [socket.create_connection(("127.0.0.1", port)) for _ in range(count)]
    start = time.monotonic()
    for sock in sockets:
        sock.sendall(b"GET /health HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        sock.settimeout(60)
    for sock in sockets:
        try:
            while sock.recv(100):
                pass
        except OSError:
            pass
        sock.close()
    return time.monotonic() - start


def shutdown_under_streams(server: subprocess.Popen, port: int, streams: int = 8) -> tuple[float, list[str]]:
    """SIGTERM while `streams` long streams run: (seconds to exit, each stream's last event before [DONE])."""
    endings: list[str] = [""] * streams

    def stream(index: int) -> None:
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=120)
        connection.request("POST", "/v1/completions", json.dumps({"prompt": "Once upon a time", "max_tokens": 4000,
                                                                  "temperature": 0, "stream": True}), HEADERS)
        events = [line for line in connection.getresponse().read().decode().split("\n\n") if line.startswith("data:")]
        endings[index] = events[-2][:160] if len(events) > 1 and events[-1] == "data: [DONE]" else f"cut: {events[-1:]}"

    threads = [threading.Thread(target=stream, args=(index,)) for index in range(streams)]
    for thread in threads:
        thread.start()
    time.sleep(3)
    start = time.monotonic()
    server.send_signal(signal.SIGTERM)
    server.wait(120)
    seconds = time.monotonic() - start
    for thread in threads:
        thread.join(60)
    return seconds, endings


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m-instruct")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--grace", type=float, default=5.0)
    parser.add_argument("--log", default="hostile-serve.log")
    parser.add_argument("--max-prompt-tokens", type=int, default=None,
                        help="the server's --max-prompt-tokens: a slower model refuses the 100,000-character prompts "
                             "instead of spending minutes on each")
    args = parser.parse_args()
    log = open(args.log, "w")
    server = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--target", args.target, "--port",
                               str(args.port), "--api-key", KEY, "--default-max-tokens", "8", "--model-name", MODEL_NAME,
                               "--max-tokens-cap", "64",  # Ollama's open-ended answers end there
                               "--shutdown-grace", str(args.grace),
                               *(["--max-prompt-tokens", str(args.max_prompt_tokens)] if args.max_prompt_tokens else [])],
                              stdout=log, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 300
    while True:
        try:
            if send(args.port, "GET", "/health", headers={}) == 200:
                break
        except OSError:
            assert time.monotonic() < deadline and server.poll() is None, "the server did not start"
            time.sleep(0.5)
    statuses: Counter = Counter()
    started = time.monotonic()
    for path, body in body_variants() + SPECIAL:
        sent = time.monotonic()
        try:
            statuses[("body", send(args.port, "POST", path, body))] += 1
        except TimeoutError:
            statuses[("body", "no answer in 600 s")] += 1
        if time.monotonic() - sent > 10:
            print(f"slow ({time.monotonic() - sent:.0f} s): {path} {body[:200]}", flush=True)
    protocol_cases(args.port, statuses)
    print(f"requests: {sum(statuses.values())} in {time.monotonic() - started:.0f} s")
    for (kind, status), count in sorted(statuses.items(), key=str):
        print(f"  {kind}: {status} x {count}")
    alone, beside = stream_beside_tokenizers(args.port)
    print(f"a 48-token stream: {alone:.2f} s alone, {beside:.2f} s beside 4 clients sending 1 MB /tokenize bodies "
          f"({beside / alone:.2f}x)")
    print(f"50 slow heads closed after {slow_heads(args.port):.1f} s")
    seconds, endings = shutdown_under_streams(server, args.port)
    print(f"SIGTERM with 8 streams: exit {server.returncode} after {seconds:.1f} s (grace {args.grace:g} s)")
    for ending in sorted(set(endings)):
        print(f"  {endings.count(ending)} streams ended: {ending}")
    log.close()
    text = open(args.log).read()
    fives = sum(count for (kind, status), count in statuses.items() if isinstance(status, int) and status >= 500)
    print(f"5xx: {fives}; tracebacks in the log: {text.count('Traceback')}")


if __name__ == "__main__":
    main()
