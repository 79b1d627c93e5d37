"""`specdec serve --replicas 2` on a local Ray instance: requests spread over both replicas, streaming
works through Ray's proxy, and a replica killed under load is replaced without a request left unanswered.

Needs Ray Serve (`pip install -e '.[ray]'`); skipped without it. Command and a recorded run: docs/deploying.md.
"""

import concurrent.futures
import json
import os
import queue
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

import pytest

from tiny_models import save_tiny_model

pytest.importorskip("ray.serve")
pytestmark = pytest.mark.ray


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def get(url: str, timeout: float = 30) -> dict:
    with urllib.request.urlopen(url, timeout=timeout) as reply:
        return json.loads(reply.read())


def post(url: str, body: dict, timeout: float = 120) -> tuple[int, bytes]:
    request = urllib.request.Request(url, json.dumps(body).encode(), {"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as reply:
            return reply.status, reply.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    model = save_tiny_model(tmp_path_factory.mktemp("ray") / "tiny", "llama", seed=7)
    port = free_port()
    env = {**os.environ, "RAY_DEDUP_LOGS": "0"}
    server = subprocess.Popen(
        [sys.executable, "-m", "specdec.cli", "serve", "--target", str(model), "--drafter", "ngram", "--k", "4",
         "--port", str(port), "--replicas", "2", "--max-active", "2"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env, start_new_session=True)
    base = f"http://127.0.0.1:{port}"
    deadline = time.time() + 240
    while time.time() < deadline:
        assert server.poll() is None, server.stderr.read()[-3000:]
        try:
            get(f"{base}/health", timeout=5)
            break
        except (urllib.error.URLError, ConnectionError, TimeoutError, json.JSONDecodeError):
            time.sleep(1)
    else:
        pytest.fail("the replicas did not come up in 240 s")
    yield base
    server.send_signal(signal.SIGTERM)
    try:
        server.wait(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(server.pid, signal.SIGKILL)


def replica_pids(base: str, requests: int = 24) -> set[int]:
    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        return {reply["pid"] for reply in pool.map(lambda _: get(f"{base}/health"), range(requests))}


def test_requests_spread_over_both_replicas_and_stream_through_the_proxy(replicas):
    deadline = time.time() + 60
    while len(pids := replica_pids(replicas)) < 2 and time.time() < deadline:
        time.sleep(1)
    assert len(pids) == 2
    request = urllib.request.Request(
        f"{replicas}/v1/chat/completions",
        json.dumps({"model": "tiny", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 12,
                    "temperature": 0, "stream": True}).encode(), {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as reply:
        assert reply.headers["Content-Type"].startswith("text/event-stream")
        events = [line[6:] for line in reply.read().decode().splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]" and len(events) >= 3
    assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("length", "stop")


def test_a_replica_killed_under_load_is_replaced_and_every_request_is_answered(replicas):
    before = replica_pids(replicas)
    # sampled: no repetition for n-gram lookup to race through; workers keep posting until told to stop,
    # so the kill lands mid-load however fast this machine finishes one request
    body = {"model": "tiny", "prompt": "hello hello", "max_tokens": 400, "temperature": 1.0}
    stop, answered = threading.Event(), queue.Queue()

    def keep_posting() -> list[int]:
        statuses = []
        while not stop.is_set():
            statuses.append(post(f"{replicas}/v1/completions", body)[0])
            answered.put(statuses[-1])
        return statuses

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        workers = [pool.submit(keep_posting) for _ in range(8)]
        for _ in range(4):
            answered.get(timeout=120)  # both replicas are serving
        victim = sorted(before)[0]
        os.kill(victim, signal.SIGKILL)  # the replica's worker process, mid-load
        answered_before_kill = 4 + answered.qsize()
        posting = sum(not worker.done() for worker in workers)
        # the load goes on past the kill: requests routed to the dead replica before Ray notices fail fast,
        # so count answers until 4 completions have come back (the other replica, then the new one)
        answered_after_kill, deadline = [], time.time() + 180
        while answered_after_kill.count(200) < 4 and time.time() < deadline:
            answered_after_kill.append(answered.get(timeout=120))
        stop.set()
        statuses = [status for worker in workers for status in worker.result(timeout=180)]  # none hangs
    # each request got an answer: a completion, or an error response for the ones the dead replica held
    assert all(status == 200 or status >= 500 for status in statuses), statuses
    assert posting == 8 and len(statuses) > answered_before_kill, (posting, answered_before_kill, statuses)
    assert answered_after_kill.count(200) >= 4, answered_after_kill
    print(f"killed a replica with {posting} clients posting: statuses {statuses}")
    deadline = time.time() + 120
    while time.time() < deadline:
        pids = replica_pids(replicas)
        if len(pids) == 2 and victim not in pids:
            break
        time.sleep(2)
    assert len(pids) == 2 and victim not in pids, pids  # Ray started a new replica in its place
    assert post(f"{replicas}/v1/completions", body)[0] == 200
