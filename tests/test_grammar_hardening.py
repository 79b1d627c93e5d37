"""Issue 75: one request must never kill the server. Grammars bounded before the grammar engine sees them and
compiled on a deep stack; every grammar refusal a 400 (or, mid-output, the one request's own end); penalties
that cannot un-mask a token a grammar forbids; schema keywords honoured or refused; unfinished tool calls
not passed off as content; a cap on what one request may generate; a long prompt's progress off a terminal."""

from __future__ import annotations

import io
from pathlib import Path
import json
import subprocess
import sys

import pytest
import torch
from hypothesis import HealthCheck, given, settings, strategies as st

from specdec.api.batch import BatchRunner
from specdec.api.events import Done, Refused
from specdec.api.grammar_bounds import (MAX_GRAMMAR_DEPTH, MAX_GRAMMAR_RULES, check_grammar_bounds, longest_chain,
                                        on_deep_stack)
from specdec.api.request import GenerationRequest
from specdec.api.structured import GrammarSpec, check_json_schema
from specdec.commands.generate import PrefillProgress
from specdec.core.constraint import masked_logits
from specdec.core.sampling import SamplingParams, processed_probs
from specdec.errors import InvalidParameterError
from test_server import MESSAGES, RunningServer, server  # noqa: F401 (the fixture)
from test_server_api import WEATHER, coder  # noqa: F401 (the fixture)

GBNF_CHAIN = "root ::= r0\n{rules}r{n} ::= \"y\"\n"


def gbnf_chain(n: int) -> str:
    """The hostile report's grammar: r0 ::= "x" r1, r1 ::= "x" r2, ..., each rule naming the next."""
    return GBNF_CHAIN.format(rules="".join(f'r{i} ::= "x" r{i + 1}\n' for i in range(n)), n=n)


def ref_chain(n: int) -> dict:
    """A JSON schema whose definitions each refer to the next, n deep."""
    definitions = {f"a{i}": {"$ref": f"#/$defs/a{i + 1}"} for i in range(n)}
    return {"$ref": "#/$defs/a0", "$defs": {**definitions, f"a{n}": {"type": "integer"}}}


RECURSIVE = {"$ref": "#/$defs/a", "$defs": {"a": {"$ref": "#/$defs/a"}}}


# -- bounds -------------------------------------------------------------------------------------------
@pytest.mark.parametrize("kind, source, bound", [
    ("gbnf", gbnf_chain(10_000), "10002 rules"),
    ("gbnf", gbnf_chain(100_000), "characters"),
    ("gbnf", gbnf_chain(400), "a chain of 402 rules"),
    ("gbnf", "root ::= " + "(" * 300 + '"a"' + ")" * 300, "nesting 300 deep"),
    ("lark", "start: r0\n" + "".join(f'r{i}: "x" r{i + 1}\n' for i in range(300)) + 'r300: "y"\n', "a chain"),
    ("json_schema", ref_chain(3000), "3001 definitions"),
    ("json_schema", ref_chain(400), "a chain of 401 definitions"),
    ("regex", "a" * 300_000, "characters"),
])
def test_grammars_past_a_bound_are_refused_naming_it_before_the_engine(kind, source, bound):
    with pytest.raises(InvalidParameterError, match="too large") as refused:
        GrammarSpec(kind, source)
    assert bound in str(refused.value) and "\n" not in str(refused.value)


def test_grammars_within_the_bounds_compile_and_the_bounds_count_what_they_say():
    GrammarSpec("gbnf", gbnf_chain(200))  # a chain well within every bound
    GrammarSpec("json_schema", ref_chain(100))
    GrammarSpec("gbnf", 'root ::= "a" | root "b"')  # a rule naming itself adds nothing to the chain
    assert longest_chain({"a": {"b"}, "b": {"c", "a"}, "c": set()}) == 3
    assert longest_chain({"a": {"a"}}) == 1
    check_grammar_bounds("gbnf", "\n".join(f'r{i} ::= "x"' for i in range(MAX_GRAMMAR_RULES)))
    with pytest.raises(InvalidParameterError, match="rules"):
        check_grammar_bounds("gbnf", "\n".join(f'r{i} ::= "x"' for i in range(MAX_GRAMMAR_RULES + 1)))
    strings = 'root ::= "((((" "]" [(] "))))"'  # parentheses inside literals are not nesting
    check_grammar_bounds("gbnf", strings.replace("((((", "(" * (MAX_GRAMMAR_DEPTH + 1)))


DEEP_COMPILE = """
import sys
from llguidance import LLMatcher
from specdec.api.grammar_bounds import on_deep_stack
sys.path.insert(0, {tests!r})
from test_grammar_hardening import ref_chain
compile = lambda: LLMatcher.validate_grammar_with_warnings(LLMatcher.grammar_from_json_schema(ref_chain(5000)))
print((on_deep_stack(compile) if {deep} else compile())[0])
"""


@pytest.mark.parametrize("deep", [True, False])
def test_a_grammar_the_bounds_missed_cannot_crash_the_process_on_the_deep_stack(deep):
    """A $ref chain of 5,000 (past the bounds, compiled here without them) overflows an ordinary thread's stack
    inside llguidance (the control: the process dies by a signal) and compiles on the deep stack."""
    tests = str(__import__("pathlib").Path(__file__).parent)
    done = subprocess.run([sys.executable, "-c", DEEP_COMPILE.format(tests=tests, deep=deep)], capture_output=True,
                          text=True, timeout=120)
    if deep:
        assert done.returncode == 0 and done.stdout.strip() == "False", done.stderr
    else:
        assert done.returncode < 0  # killed by SIGSEGV: what the server's process suffered


def test_on_deep_stack_returns_the_value_and_raises_the_error():
    assert on_deep_stack(lambda: 41 + 1) == 42
    with pytest.raises(InvalidParameterError, match="boom"):
        on_deep_stack(lambda: (_ for _ in ()).throw(InvalidParameterError("boom")))


@pytest.fixture(scope="module")
def roomy(tiny_generator):
    """A server taking bodies of up to 8 MiB: the 100,000-rule chain (2.2 MB) reaches the grammar's bounds."""
    running = RunningServer(tiny_generator, max_request_bytes=8 << 20)
    yield running
    running.stop()


@pytest.mark.parametrize("grammar", [gbnf_chain(10_000), gbnf_chain(100_000), "root ::= " + "(" * 400 + '"a"' + ")" * 400])
def test_the_server_refuses_huge_grammars_and_answers_the_next_request(roomy, grammar):
    for stream in (False, True):
        status, text = roomy.request("POST", "/v1/chat/completions", json.dumps(
            {"messages": MESSAGES, "grammar": grammar, "max_tokens": 4, "stream": stream}))
        assert status == 400 and "too large" in json.loads(text)["error"]["message"], text
    status, _ = roomy.request("POST", "/v1/chat/completions", json.dumps({"messages": MESSAGES, "max_tokens": 4}))
    assert status == 200


# -- schema keywords: honoured or refused, the same answer wherever the schema goes -------------------
def test_invalid_schemas_and_keywords_we_cannot_honour_are_refused():
    with pytest.raises(InvalidParameterError, match="multipleOf"):
        GrammarSpec("json_schema", {"type": "integer", "multipleOf": -1})
    with pytest.raises(InvalidParameterError, match="type"):
        GrammarSpec("json_schema", {"type": "integr"})
    with pytest.raises(InvalidParameterError, match="patternProperties is not supported"):
        GrammarSpec("json_schema", {"type": "object", "patternProperties": {"^a$": {"type": "integer"}},
                                    "additionalProperties": False})
    # a property that happens to be named like a keyword is a name
    check_json_schema({"type": "object", "properties": {"patternProperties": {"type": "integer"}}})


def accepted(spec: GrammarSpec, tokenizer, text: str) -> bool:
    from llguidance import LLMatcher

    from specdec.api.structured import guidance_tokenizer

    matcher = LLMatcher(guidance_tokenizer(tokenizer, len(tokenizer)), spec.grammar)
    ids = tokenizer.encode(text, add_special_tokens=False)
    return matcher.validate_tokens(ids) == len(ids) and matcher.consume_tokens(ids) and matcher.is_accepting()


def test_formats_the_engine_knows_are_enforced_and_unknown_ones_refused(tiny_generator):
    tokenizer = tiny_generator.target.tokenizer
    email = GrammarSpec("json_schema", {"type": "string", "format": "email"})
    assert accepted(email, tokenizer, '"ada@example.org"')
    assert not accepted(email, tokenizer, '"not an email"') and not accepted(email, tokenizer, '"@example.org"')
    date = GrammarSpec("json_schema", {"type": "string", "format": "date"})
    assert accepted(date, tokenizer, '"2026-12-06"') and not accepted(date, tokenizer, '"2026-13-45"')
    with pytest.raises(InvalidParameterError, match="Unknown format"):
        GrammarSpec("json_schema", {"type": "string", "format": "postcode"})


@pytest.mark.parametrize("schema, words", [
    (RECURSIVE, "no output can start"),
    ({"type": "object", "patternProperties": {"^a$": {"type": "integer"}}}, "patternProperties"),
    ({"type": "object", "properties": {"n": {"type": "integer", "multipleOf": -1}}}, "multipleOf"),
])
def test_a_schema_gets_the_same_400_as_response_format_and_as_tool_parameters(coder, schema, words):  # noqa: F811
    tool = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
    bodies = [{"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}},
              {"tools": tool, "tool_choice": "required"}, {"tools": tool, "tool_choice": "auto"},
              {"tools": tool, "tool_choice": {"type": "function", "function": {"name": "f"}}}]
    for body in bodies:
        for stream in (False, True):
            status, text = coder.request("POST", "/v1/chat/completions", json.dumps(
                {"messages": MESSAGES, "max_tokens": 64, "stream": stream, **body}))
            assert status == 400 and words in json.loads(text)["error"]["message"], (body, text)


def test_a_grammar_that_fails_mid_output_ends_its_own_request_and_no_other(tiny_generator):
    """The engine gives up on this grammar only after its literal (a $ref cycle inside an embedded schema):
    the round of a batch it fails in still commits the other request's tokens, which equal its plain run."""
    failing = GrammarSpec("lark", 'start: "abcdefghijklmnopqrstuvwxyzabcdefghijklmnopqrstuvwxyz" %json '
                          + json.dumps(RECURSIVE))
    plain = GenerationRequest("hello there", 24, SamplingParams(), seed=0)
    runner = BatchRunner(tiny_generator)
    runner.admit("failing", GenerationRequest("hello", 80, SamplingParams(), grammar=failing))
    runner.admit("plain", plain)
    events = {}
    while runner.running:
        for key, event in runner.step():
            if isinstance(event, (Done, Refused)):
                events[key] = event
    assert isinstance(events["failing"], Refused) and "gave up" in str(events["failing"].error)
    assert events["plain"].result.token_ids == tiny_generator.run(plain).token_ids
    with pytest.raises(InvalidParameterError, match="gave up"):  # alone, the Python API raises it
        tiny_generator.run(GenerationRequest("hello", 80, SamplingParams(), grammar=failing))


# -- penalties and temperatures that cannot un-mask a token -----------------------------------------
def test_extreme_penalties_and_temperatures_keep_masked_tokens_impossible():
    logits = torch.tensor([[3.0, -2.0, 0.0, 5.0, -7.0]])
    allowed = torch.tensor([[True, True, True, False, True]])
    masked = masked_logits(logits, allowed)
    history = torch.tensor([0, 1, 2, 3, 4])
    # the naive penalty: -inf x (a penalty float32 rounds to 0) is NaN, and NaN wins argmax
    naive = torch.where(masked < 0, masked * 2.66e-256, masked / 2.66e-256)
    assert torch.isnan(naive).any()
    for penalty in (2.66e-256, 1e-30, 0.5, 2.0, 1e30, 1e300):
        for temperature in (0.0, 1e-300, 1e-30, 0.7, 2.0):
            probs = processed_probs(masked, SamplingParams(temperature=temperature, repetition_penalty=penalty),
                                    history)
            assert not torch.isnan(probs).any() and probs[0, 3] == 0 and probs.sum().item() == pytest.approx(1.0)


GRAMMARS = [GrammarSpec("json_object"), GrammarSpec("regex", r"[a-f]{2,8}( [0-9]{1,3})?"),
            GrammarSpec("json_schema", {"type": "object", "properties": {"n": {"type": "integer"}},
                                        "required": ["n"], "additionalProperties": False})]


@settings(max_examples=24, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(grammar=st.sampled_from(GRAMMARS), exponent=st.floats(-300, 300), temperature=st.sampled_from([0.0, 1e-300, 0.8]),
       seed=st.integers(0, 2**31))
def test_every_committed_token_is_allowed_whatever_the_penalty_and_speculation_changes_nothing(
        tiny_generator, grammar, exponent, temperature, seed):
    """A committed token the grammar forbids raises in the grammar's commit; here none may, and the
    speculative text equals plain decoding's (greedy, or the seed's under sampling)."""
    params = SamplingParams(temperature=temperature, repetition_penalty=10.0 ** exponent)
    request = GenerationRequest("hello there", 16, params, seed=seed, grammar=grammar)
    speculative = tiny_generator.run(request)
    plain = tiny_generator.run(request.replace(speculative=False))
    assert speculative.token_ids == plain.token_ids


# -- tool calls that ran out of tokens --------------------------------------------------------------
def test_a_required_call_cut_by_max_tokens_is_length_with_no_content(coder):  # noqa: F811
    body = {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": "required", "max_tokens": 1}
    status, text = coder.request("POST", "/v1/chat/completions", json.dumps(body))
    choice = json.loads(text)["choices"][0]
    assert status == 200 and choice["finish_reason"] == "length"
    assert choice["message"]["content"] is None and not choice["message"].get("tool_calls")
    chunks = list(coder.client.chat.completions.create(model="tiny", stream=True, **body))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    assert chunks[-1].choices[0].finish_reason == "length"


# -- a cap on what one request may generate -----------------------------------------------------------
def test_max_tokens_past_the_cap_is_a_400_and_n_predict_is_cut_to_it(coder):  # noqa: F811
    status, text = coder.request("POST", "/v1/completions", json.dumps({"prompt": "a", "max_tokens": 10**9}))
    assert status == 400 and "at most 2048" in text  # by default the model's context
    capped = RunningServer(coder.generator, max_tokens_cap=6)
    try:
        status, text = capped.request("POST", "/v1/chat/completions",
                                      json.dumps({"messages": MESSAGES, "max_tokens": 7}))
        assert status == 400 and json.loads(text)["error"]["param"] == "max_tokens"
        status, text = capped.request("POST", "/v1/completions", json.dumps({"prompt": "a", "temperature": 0}))
        assert status == 200 and json.loads(text)["usage"]["completion_tokens"] <= 6  # the default, cut
        status, text = capped.request("POST", "/infill", json.dumps(
            {"input_prefix": "def f(", "input_suffix": "):", "n_predict": 10**30, "temperature": 0}))
        assert status == 200 and json.loads(text)["tokens_predicted"] <= 6
    finally:
        capped.stop()


# -- the CLI: a long prompt is never silent ---------------------------------------------------------
class Pipe(io.StringIO):
    def isatty(self) -> bool:
        return False


def test_a_long_prompts_prefill_prints_progress_lines_off_a_terminal():
    stream = Pipe()
    with PrefillProgress(stream) as progress:
        for done in range(512, 20_001, 512):
            progress.update(min(done, 20_000), 20_000)
        progress.update(20_000, 20_000)
    lines = stream.getvalue().splitlines()
    assert lines[0] == "specdec: reading the prompt: 512/20000 tokens" and lines[-1].endswith("20000/20000 tokens")
    quiet = Pipe()
    PrefillProgress(quiet).update(100, 1000)  # a short prompt: nothing
    assert quiet.getvalue() == ""


# -- calls a model wrote as text (issue 72 item 4) -----------------------------------------------------
FIXTURES = next((folder / "shared" / "data" / "agents" / "fenced_tool_calls.jsonl" for folder in Path(__file__).resolve().parents
                 if (folder / "shared" / "data" / "agents" / "fenced_tool_calls.jsonl").exists()), Path("absent"))
GET_WEATHER = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"], "additionalProperties": False}}}]


def streamed_calls(text: str, tools, piece: int = 3) -> tuple[str, list]:
    """(content, calls) of `text` fed to a CallStream `piece` characters at a time, as rounds commit it."""
    from specdec.server.tools import CallStream

    stream, content, calls = CallStream(tools), "", []
    for start in range(0, len(text), piece):
        delta, found = stream.feed(text[start:start + piece])
        content, calls = content + delta, calls + found
    rest, found = stream.finish()
    return content + rest, calls + found


@pytest.mark.skipif(not FIXTURES.exists(), reason="shared/data/agents is not beside this checkout")
def test_the_1_5bs_fenced_calls_are_read_as_tool_calls_whole_and_streamed():
    """The six replies in which Qwen2.5-Coder-1.5B wrote its call in a code fence (javascript, plain, python,
    plaintext, xml) instead of <tool_call>: the four whole ones become get_weather calls; the two cut short
    (a stream's log stopped) and the one naming a file instead of a tool stay text."""
    from specdec.server.tools import parse_calls

    replies = [json.loads(line)["content"] for line in FIXTURES.read_text().splitlines()]
    assert len(replies) == 6
    for index, reply in enumerate(replies):
        for content, calls in (parse_calls(reply, GET_WEATHER), streamed_calls(reply, GET_WEATHER)):
            if index in (2, 3):  # cut short mid-arguments: not a call, and every character is kept
                assert calls == [] and content == reply
            else:
                assert content is None or content == ""
                assert [(c.name, json.loads(c.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]


def test_text_that_only_looks_like_a_call_stays_text():
    from specdec.server.tools import parse_calls

    for text in ('```python\ndef f():\n    return {"name": 1}\n```',  # code, not a call
                 '```json\n{"name": "get_weather", "arguments": {"town": "Paris"}}\n```',  # arguments off-schema
                 '{"name": "delete_everything", "arguments": {}}',  # not a declared tool
                 'Call it like {"name": "get_weather", "arguments": {"city": "Paris"}}'):  # prose around it
        assert parse_calls(text, GET_WEATHER) == (text, []) and streamed_calls(text, GET_WEATHER) == (text, [])
    assert parse_calls('{"name": "get_weather", "arguments": {"city": "Oslo"}}', ())[1] == []  # no tools: text


def test_a_grammar_compiling_past_its_time_bound_is_refused_naming_it(monkeypatch):
    """Issue 94: a compile within the size bounds may still take long; past the time bound the request gets a
    one-line refusal (a 400) and nobody waits on the compile, which ends on its own thread."""
    from specdec.api import structured
    from specdec.api.structured import GrammarSpec
    from specdec.errors import InvalidParameterError

    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    monkeypatch.setattr(structured, "MAX_COMPILE_SECONDS", 0.0)
    with pytest.raises(InvalidParameterError, match="took longer than 0 s to compile"):
        GrammarSpec("json_schema", schema)
    monkeypatch.setattr(structured, "MAX_COMPILE_SECONDS", 60.0)
    assert GrammarSpec("json_schema", schema).grammar
