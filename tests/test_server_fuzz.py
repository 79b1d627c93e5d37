"""Schema-driven fuzzing of the live server (schemathesis, from its own /openapi.json): valid and invalid
requests of every operation, no 5xx. CI runs a bounded number of examples; SPECDEC_FUZZ_EXAMPLES raises it
(docs/server.md records a run of over 1,000 requests)."""

import json
import os

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402 (after the import check)
from hypothesis.errors import Unsatisfiable  # noqa: E402

from specdec.api.generator import SpeculativeGenerator  # noqa: E402
from test_server import RunningServer  # noqa: E402
from tiny_models import save_tiny_model  # noqa: E402

EXAMPLES = int(os.environ.get("SPECDEC_FUZZ_EXAMPLES", "25"))  # per operation and generation mode


@pytest.fixture(scope="module")
def short_context_server(tmp_path_factory):
    # a 64-token context: any max_tokens a fuzzer picks ends quickly
    path = save_tiny_model(tmp_path_factory.mktemp("fuzz") / "tiny", "llama", seed=1, max_position_embeddings=64)
    running = RunningServer(SpeculativeGenerator.from_pretrained(str(path), drafter="ngram", k=4))
    yield running
    running.stop()


def test_generated_requests_never_get_a_server_error(short_context_server):
    base_url = f"http://127.0.0.1:{short_context_server.port}"
    schema = schemathesis.openapi.from_url(f"{base_url}/openapi.json")
    statuses: dict[int, int] = {}
    for result in schema.get_all_operations():
        operation = result.ok()
        for mode in (schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE):
            @settings(max_examples=EXAMPLES, deadline=None, derandomize=True, database=None,
                      suppress_health_check=list(HealthCheck))
            @given(case=operation.as_strategy(generation_mode=mode))
            def call(case):
                response = case.call(base_url=base_url, timeout=60)
                statuses[response.status_code] = statuses.get(response.status_code, 0) + 1
                assert response.status_code < 500, (operation.label, case.body, response.text)
                if response.status_code >= 400:  # every refusal is an error in its dialect's shape, in one line
                    error = response.json()["error"]
                    message = error if operation.path.startswith("/api/") else error["message"]
                    assert message and "\n" not in message and "Traceback" not in message

            try:
                call()
            except Unsatisfiable:  # e.g. no invalid request exists for an operation without inputs
                pass
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses
    print(f"schemathesis: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")


# -- the request parser alone, in-process: thousands of bodies a second -------------------------------------
from hypothesis import strategies as st  # noqa: E402

from specdec.errors import SpecdecError  # noqa: E402
from specdec.server.protocol import ChatCompletionRequest, CompletionRequest  # noqa: E402
from specdec.server.request_body import parse_request

PARSER_EXAMPLES = int(os.environ.get("SPECDEC_PARSER_EXAMPLES", "2000"))
# What broke the parser before (issue 52): integers past int()'s 4,300 digits, lone surrogates, deep nesting,
# non-finite numbers; mixed with ordinary values.
EXTREME_INTEGERS = st.one_of(st.integers(), st.integers(min_value=10**60, max_value=10**70))
EXTREME_TEXT = st.one_of(st.text(max_size=20), st.sampled_from(["\ud800", "a\udfffb", "\x00", "😀", "x" * 5000]))
SCALARS = st.one_of(st.none(), st.booleans(), EXTREME_INTEGERS, st.floats(allow_nan=True, allow_infinity=True),
                    EXTREME_TEXT)
VALUES = st.recursive(SCALARS, lambda inner: st.one_of(st.lists(inner, max_size=3),
                                                       st.dictionaries(EXTREME_TEXT, inner, max_size=3)), max_leaves=8)
FIELDS = ["model", "max_tokens", "max_completion_tokens", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
          "stream", "stream_options", "speculative", "n", "response_format", "json_schema", "grammar", "tools",
          "tool_choice", "logprobs", "top_logprobs", "suffix", "presence_penalty", "logit_bias", "user"]


def deep(depth: int) -> str:
    return "[" * depth + "]" * depth


@st.composite
def bodies(draw) -> bytes:
    """A valid body of either endpoint with some fields set to extreme values, or raw extremes as text."""
    body = dict(draw(st.sampled_from([{"prompt": "a"}, {"messages": [{"role": "user", "content": "hi"}]}])))
    for name in draw(st.lists(st.sampled_from(FIELDS + ["prompt", "messages"]), max_size=4)):
        body[name] = draw(VALUES)
    text = json.dumps(body, allow_nan=True)
    if draw(st.booleans()):  # nesting and numbers json.dumps does not write (hypothesis cannot print them)
        extreme = draw(st.sampled_from([deep(70), deep(3000), "1e999", "-Infinity", "9" * 5000, "-" + "9" * 5000]))
        text = text[:-1] + f', "extra": {extreme}}}'
    return text.encode("utf-8", "surrogatepass")


@settings(max_examples=PARSER_EXAMPLES, deadline=None, derandomize=True, database=None,
          suppress_health_check=list(HealthCheck))
@given(body=bodies())
def test_the_request_parser_answers_any_body_with_a_request_or_one_line(body):
    for kind in (CompletionRequest, ChatCompletionRequest):
        try:
            request = parse_request(body, kind)
            request.generation_request(16)
        except SpecdecError as error:  # a 400: one readable line
            assert str(error) and "\n" not in str(error)
