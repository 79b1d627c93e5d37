"""Run the coding agents people use against `specdec serve`, as their users configure them, and record which
complete a small task (issue 72): Codex CLI (`codex exec`, Responses API), Claude Code (`claude -p`,
Anthropic Messages), opencode (`opencode run`, chat completions through @ai-sdk/openai-compatible).

Each agent runs in a fresh working directory holding `calc.py` with a bug (`add` subtracts), with a temporary
HOME holding only its configuration, under a timeout. The task is complete when `add(2, 3) == 5` afterwards.
For each agent the script records the exit status, the wall time, the requests the server answered (by
route and status, from /metrics) and the end of the agent's output.

    python scripts/agent_programs.py --target qwen2.5-coder-1.5b-instruct [--agents codex,claude,opencode]
        [--timeout 900] [--json agents.json] [--follow-up TEXT ...] [--record session.json]

--follow-up TEXT (repeatable) sends more turns in the same session after the task (opencode `run --continue`,
Claude Code `-c`, Codex `exec resume --last`): an agent's later turns resend its long system prompt and
tools, which a server's prefix cache should not compute again.

--record FILE (one agent) puts a recording proxy (scripts/agent_recorder.py) between the agent and the server
and saves the generation requests it sent, in order: the session `scripts/agent_replay.py` sends again.

The agents are installed with npm into --tools (default ~/.cache/specdec/agents), pinned below; `npm` and
`node` must be on PATH. Not in CI: one task takes minutes on a CPU.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path

PACKAGES = {"codex": "@openai/codex@0.169.0", "claude": "@anthropic-ai/claude-code@2.1.328",
            "opencode": "opencode-ai@1.18.33"}
TASK = "Fix the bug in calc.py: add(a, b) must return a + b. Edit the file."
BUGGY = "def add(a, b):\n    return a - b\n"


@dataclass
class AgentRun:
    agent: str
    completed: bool  # add(2, 3) == 5 afterwards
    exit_code: int | None  # None: timed out
    seconds: float
    requests: dict[str, float]  # "route status" -> count, from the server's /metrics
    output_tail: str


def install(tools: Path, agents: list[str]) -> None:
    tools.mkdir(parents=True, exist_ok=True)
    missing = [PACKAGES[agent] for agent in agents if not (tools / "node_modules" / ".bin" / binary(agent)).exists()]
    if missing:
        subprocess.run(["npm", "install", "--no-audit", "--no-fund", "--prefix", str(tools), *missing], check=True)


def binary(agent: str) -> str:
    return {"codex": "codex", "claude": "claude", "opencode": "opencode"}[agent]


def configure(agent: str, home: Path, base: str, model: str) -> tuple[list[str], dict[str, str]]:
    """(the command after the binary, extra environment) for one agent, its configuration written in `home`."""
    if agent == "codex":
        (home / ".codex").mkdir()
        (home / ".codex" / "config.toml").write_text(
            f'model = "{model}"\nmodel_provider = "specdec"\n\n[model_providers.specdec]\nname = "specdec"\n'
            f'base_url = "{base}/v1"\nwire_api = "responses"\n')
        return ["exec", "--skip-git-repo-check", "--sandbox", "workspace-write", TASK], {}  # as docs/server.md
    if agent == "claude":
        return (["-p", TASK, "--permission-mode", "acceptEdits", "--max-turns", "6"],
                {"ANTHROPIC_BASE_URL": base, "ANTHROPIC_API_KEY": "unused", "ANTHROPIC_MODEL": model,
                 "ANTHROPIC_SMALL_FAST_MODEL": model, "ANTHROPIC_DEFAULT_HAIKU_MODEL": model,
                 "DISABLE_TELEMETRY": "1", "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
                 "DISABLE_AUTOUPDATER": "1"})
    config = home / ".config" / "opencode"
    config.mkdir(parents=True)
    (config / "opencode.json").write_text(json.dumps({
        "$schema": "https://opencode.ai/config.json",
        "provider": {"specdec": {"npm": "@ai-sdk/openai-compatible", "name": "specdec",
                                 "options": {"baseURL": f"{base}/v1"}, "models": {model: {"name": model}}}},
        "model": f"specdec/{model}"}))
    return ["run", TASK], {}


def follow_up(agent: str, text: str) -> list[str]:
    """The command after the binary that continues the agent's last session with `text`."""
    return {"codex": ["exec", "resume", "--last", "--skip-git-repo-check", "--sandbox", "workspace-write", text],
            "claude": ["-c", "-p", text, "--permission-mode", "acceptEdits", "--max-turns", "6"],
            "opencode": ["run", "--continue", text]}[agent]


def requests_seen(base: str) -> dict[str, float]:
    text = urllib.request.urlopen(f"{base}/metrics", timeout=30).read().decode()
    counts = {}
    for line in text.splitlines():
        if line.startswith("specdec_requests_total{"):
            labels, value = line.rsplit(" ", 1)
            endpoint = labels.split('endpoint="')[1].split('"')[0]
            status = labels.split('status="')[1].split('"')[0]
            if endpoint != "/metrics":
                counts[f"{endpoint} {status}"] = float(value)
    return counts


def run_agent(agent: str, tools: Path, base: str, model: str, timeout: float, metrics: str | None = None,
              follow_ups: tuple[str, ...] = ()) -> AgentRun:
    """One agent on the task, then each follow-up turn in its session, against `base` (`metrics`: the server
    whose /metrics count its requests; default `base`); `timeout` bounds each turn."""
    with tempfile.TemporaryDirectory(prefix=f"agent-{agent}-") as root:
        home, work = Path(root) / "home", Path(root) / "work"
        home.mkdir()
        work.mkdir()
        (work / "calc.py").write_text(BUGGY)
        arguments, environment = configure(agent, home, base, model)
        env = {**os.environ, "HOME": str(home), **environment}
        before, started = requests_seen(metrics or base), time.monotonic()
        binary_path = str(tools / "node_modules" / ".bin" / binary(agent))
        exit_code, output = None, ""
        for turn in [arguments, *(follow_up(agent, text) for text in follow_ups)]:
            try:
                done = subprocess.run([binary_path, *turn], cwd=work, env=env, stdin=subprocess.DEVNULL,
                                      capture_output=True, text=True, timeout=timeout)
                exit_code, output = done.returncode, output + done.stdout + done.stderr
            except subprocess.TimeoutExpired as expired:
                exit_code, output = None, output + as_text(expired.stdout) + as_text(expired.stderr)
                break
        seconds = time.monotonic() - started
        after = requests_seen(metrics or base)
        check = subprocess.run([sys.executable, "-c", "from calc import add; assert add(2, 3) == 5"], cwd=work,
                               capture_output=True)
        return AgentRun(agent, check.returncode == 0, exit_code, round(seconds, 1),
                        {key: after[key] - before.get(key, 0) for key in after if after[key] != before.get(key, 0)},
                        output[-1500:])


def recorded_run(agent: str, args, model: str) -> AgentRun:
    """run_agent through a recording proxy (on the next port), the session saved to args.record."""
    sys.path.insert(0, str(Path(__file__).parent))
    from agent_recorder import RecordingProxy

    with RecordingProxy(f"http://127.0.0.1:{args.port}", args.port + 1) as proxy:
        run = run_agent(agent, args.tools, f"http://127.0.0.1:{args.port + 1}", model, args.timeout,
                        metrics=f"http://127.0.0.1:{args.port}", follow_ups=tuple(args.follow_up))
        proxy.save(args.record)
    print(f"{agent}: {len(proxy.requests)} requests recorded in {args.record}", flush=True)
    return run


def as_text(captured: bytes | str | None) -> str:
    return captured.decode(errors="replace") if isinstance(captured, bytes) else (captured or "")


def start_server(target: str, port: int, model: str, log: Path) -> subprocess.Popen:
    server = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--target", target, "--port", str(port),
                               "--model-name", model], stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 600
    while True:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=5)
            return server
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise SystemExit(f"the server did not start: see {log}")
            time.sleep(1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="qwen2.5-coder-1.5b-instruct")
    parser.add_argument("--agents", default="codex,claude,opencode")
    parser.add_argument("--port", type=int, default=8795)
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per agent")
    parser.add_argument("--tools", type=Path, default=Path.home() / ".cache" / "specdec" / "agents")
    parser.add_argument("--log", type=Path, default=Path("agents-serve.log"))
    parser.add_argument("--json", type=Path, default=None)
    parser.add_argument("--follow-up", action="append", default=[], metavar="TEXT",
                        help="another turn in the agent's session after the task (repeatable)")
    parser.add_argument("--record", type=Path, default=None, help="save the agent's requests (one agent)")
    args = parser.parse_args()
    agents = args.agents.split(",")
    if args.record and len(agents) != 1:
        parser.error("--record records one agent's session: name one with --agents")
    if unknown := set(agents) - set(PACKAGES):
        parser.error(f"unknown agents: {', '.join(sorted(unknown))} (known: {', '.join(PACKAGES)})")
    if shutil.which("npm") is None:
        parser.error("npm is needed to install the agents")
    install(args.tools, agents)
    model = args.target.rsplit("/", 1)[-1]
    server = start_server(args.target, args.port, model, args.log)
    runs = []
    try:
        for agent in agents:
            run = (run_agent(agent, args.tools, f"http://127.0.0.1:{args.port}", model, args.timeout,
                             follow_ups=tuple(args.follow_up))
                   if args.record is None else recorded_run(agent, args, model))
            runs.append(run)
            print(f"{agent}: {'completed' if run.completed else 'not completed'}, exit {run.exit_code}, "
                  f"{run.seconds:.0f} s, requests {run.requests}", flush=True)
    finally:
        server.terminate()
        server.wait(60)
    if args.json:
        args.json.write_text(json.dumps([asdict(run) for run in runs], indent=1))


if __name__ == "__main__":
    main()
