"""The agent-session tools as a user runs them: a client talks to the server through the recording proxy
(scripts/agent_recorder.py), streamed and whole, and gets the server's own answers; the saved session is then
replayed (scripts/agent_replay.py) against the server, greedy, and every answer equals the reference's."""

from __future__ import annotations

import json
import socket
import sys
from pathlib import Path

import openai
import pytest

from test_server import MESSAGES, RunningServer

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
from agent_recorder import RecordingProxy  # noqa: E402
from agent_replay import replay, summary  # noqa: E402


@pytest.fixture(scope="module")
def running(tiny_generator):
    server = RunningServer(tiny_generator)
    yield server
    server.stop()


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def test_a_session_is_recorded_through_the_proxy_and_replayed_identically(running, tmp_path):
    direct = running.client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
    with RecordingProxy(f"http://127.0.0.1:{running.port}", free_port()) as proxy:
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{proxy.server.server_address[1]}/v1", api_key="x",
                               max_retries=0)
        whole = client.chat.completions.create(model="tiny", messages=MESSAGES, max_tokens=8, temperature=0)
        streamed = "".join(chunk.choices[0].delta.content or "" for chunk in client.chat.completions.create(
            model="tiny", messages=MESSAGES, max_tokens=8, temperature=0, stream=True) if chunk.choices)
        assert client.models.list().data[0].id == "tiny"  # other routes pass through, unrecorded
        proxy.save(tmp_path / "session.json")
    assert whole.choices[0].message.content == streamed == direct.choices[0].message.content
    session = json.loads((tmp_path / "session.json").read_text())
    assert [r["route"] for r in session] == ["/v1/chat/completions"] * 2 and session[1]["body"]["stream"] is True
    first, second = replay(session, f"http://127.0.0.1:{running.port}", 8), replay(
        session, f"http://127.0.0.1:{running.port}", 8)
    assert [r.answer for r in first] == [direct.choices[0].message.content] * 2
    assert all(r.completion_tokens == 8 and r.timings and r.timings["predicted_n"] == 8 for r in first)
    row = summary("again", second, first)
    assert row["identical_to_reference"] == "2/2" and row["refused"] == 0 and row["decode_tokens_per_second"] > 0
