"""Serving the models a user has by name (`specdec serve --models-dir DIR`, server/served_models.py): every
model of the folder in /v1/models, each request answered by the model it names (greedy equal to that
model's own plain decoding, through chat completions and Anthropic's Messages), loaded on first use and,
with a budget of one, unloaded and loaded again as requests alternate; an unknown name is a 404 in each
dialect's shape; the command line builds the catalog from the folder."""

from __future__ import annotations

import httpx
import pytest

from specdec.api.generator import SpeculativeGenerator
from specdec.api.options import GeneratorOptions
from specdec.commands.serve import ServeOptions, served_by_name
from specdec.errors import InvalidParameterError
from specdec.models.sources.loading import load_model
from specdec.server.served_models import ModelCatalog
from specdec.server.state import ServerSettings
from test_server import RunningServer
from tiny_models import make_hf_model, write_tiny_gguf

PROMPT = [{"role": "user", "content": "hello hello the world"}]


@pytest.fixture
def folder(tmp_path, monkeypatch):
    """Two tiny models of one architecture and different weights, as a user's models folder."""
    mine = tmp_path / "mine"
    mine.mkdir()
    write_tiny_gguf(mine / "alpha.gguf", make_hf_model("qwen2", seed=21), "F32")
    write_tiny_gguf(mine / "beta.gguf", make_hf_model("qwen2", seed=22), "F32")
    monkeypatch.setenv("SPECDEC_MODELS_DIR", str(mine))
    return mine


def plain_answer(path, max_tokens=12) -> list[int]:
    generator = SpeculativeGenerator(load_model(str(path), weights="auto"), None)
    return generator.generate(PROMPT, max_tokens).token_ids


def serve(folder, max_loaded: int) -> RunningServer:
    options = GeneratorOptions(str(folder / "alpha.gguf"), "ngram", 4)
    catalog = ModelCatalog(dict(served_by_name(str(folder), False)), options, max_loaded)
    return RunningServer(SpeculativeGenerator.from_options(options), catalog=catalog)


def text_of(running: RunningServer, model: str, stream: bool = False) -> str:
    if stream:
        pieces = running.client.chat.completions.create(model=model, messages=PROMPT, max_tokens=12, temperature=0,
                                                        stream=True)
        return "".join(chunk.choices[0].delta.content or "" for chunk in pieces if chunk.choices)
    reply = running.client.chat.completions.create(model=model, messages=PROMPT, max_tokens=12, temperature=0)
    return reply.choices[0].message.content


def test_each_model_answers_by_its_name_as_its_own_plain_decoding(folder):
    running = serve(folder, max_loaded=2)
    try:
        listed = {m.id for m in running.client.models.list().data}
        assert listed == {"tiny", "alpha", "beta"}
        for name in ("alpha", "beta"):
            expected = load_model(str(folder / f"{name}.gguf"), weights="auto").tokenizer.decode(
                plain_answer(folder / f"{name}.gguf"), skip_special_tokens=True)
            assert text_of(running, name) == expected and text_of(running, name, stream=True) == expected
        assert text_of(running, "alpha") != text_of(running, "beta")  # two models, two answers
        # Anthropic's Messages route picks by the same name
        message = httpx.post(f"http://127.0.0.1:{running.port}/v1/messages", timeout=120, json={
            "model": "beta", "max_tokens": 12, "messages": PROMPT, "temperature": 0}).json()
        assert message["content"][0]["text"] == text_of(running, "beta")
    finally:
        running.stop()


def test_with_one_loaded_alternating_requests_unload_and_reload(folder):
    running = serve(folder, max_loaded=1)
    try:
        served = running.app.state.server.models
        answers = {name: text_of(running, name) for name in ("alpha", "beta")}
        for name in ("alpha", "beta", "alpha", "beta"):
            assert text_of(running, name) == answers[name]
            assert list(served.loaded) == [name]  # the other was idle: unloaded
        tiny = text_of(running, "tiny")  # the --target model itself, unloaded above, loads again
        assert list(served.loaded) == ["tiny"] and tiny == answers["alpha"]  # tiny is alpha.gguf, as served
    finally:
        running.stop()


def test_an_unknown_model_is_a_404_in_each_dialects_shape(folder):
    running = serve(folder, max_loaded=1)
    try:
        openai_reply = httpx.post(f"http://127.0.0.1:{running.port}/v1/chat/completions",
                                  json={"model": "gamma", "messages": PROMPT, "max_tokens": 2})
        assert openai_reply.status_code == 404
        assert openai_reply.json()["error"]["code"] == "model_not_found"
        anthropic_reply = httpx.post(f"http://127.0.0.1:{running.port}/v1/messages",
                                     json={"model": "gamma", "messages": PROMPT, "max_tokens": 2})
        assert anthropic_reply.status_code == 404
        assert anthropic_reply.json()["error"]["type"] == "not_found_error"
    finally:
        running.stop()


def test_the_command_line_checks_what_it_serves_by_name(folder):
    options = GeneratorOptions(str(folder / "alpha.gguf"), "ngram", 4)
    settings = ServerSettings("alpha")
    with pytest.raises(InvalidParameterError, match="--max-loaded"):
        ServeOptions(options, settings, max_loaded=0)
    with pytest.raises(InvalidParameterError, match="one process"):
        ServeOptions(options, settings, by_name=(("beta", "beta"),), replicas=2)
    assert dict(served_by_name(str(folder), False)) == {"alpha": str(folder / "alpha.gguf"),
                                                         "beta": str(folder / "beta.gguf")}
    assert served_by_name(None, False) == ()


def test_the_prefix_cache_default_is_an_eighth_of_the_machine_within_bounds(monkeypatch):
    """Issue 90: 512 MiB held no agent's prompt of the 1.5B (57 KB a token); the default follows the machine."""
    from types import SimpleNamespace

    from specdec.commands import serve

    for total, expected in ((4 << 30, 512 << 20), (8 << 30, 1 << 30), (64 << 30, 2 << 30)):
        monkeypatch.setattr(serve.psutil, "virtual_memory", lambda total=total: SimpleNamespace(total=total))
        assert serve.default_prefix_cache_bytes() == expected
    from specdec.cli import build_parser

    args = build_parser().parse_args(["serve", "--target", "smollm2-135m-instruct"])
    assert ServeOptions.from_args(args).settings.prefix_cache_bytes == serve.default_prefix_cache_bytes()
    args = build_parser().parse_args(["serve", "--target", "smollm2-135m-instruct", "--prefix-cache", "0"])
    assert ServeOptions.from_args(args).settings.prefix_cache_bytes == 0
