"""Schema-driven fuzzing of the live server (schemathesis, from its own /openapi.json): valid and invalid
requests of every operation, no 5xx. CI runs a bounded number of examples; SPECDEC_FUZZ_EXAMPLES raises it
(docs/server.md records a run of over 1,000 requests)."""

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
                if response.status_code >= 400:  # every refusal is an OpenAI-style error in one line
                    message = response.json()["error"]["message"]
                    assert message and "\n" not in message and "Traceback" not in message

            try:
                call()
            except Unsatisfiable:  # e.g. no invalid request exists for an operation without inputs
                pass
    assert statuses.get(200, 0) > 0 and statuses.get(400, 0) > 0, statuses
    print(f"schemathesis: {sum(statuses.values())} requests, statuses {dict(sorted(statuses.items()))}")
