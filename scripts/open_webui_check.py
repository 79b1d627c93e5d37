"""Open WebUI on `specdec serve` through Ollama's API, driven in Debian's Chromium as a user drives it: Open
WebUI started with OLLAMA_BASE_URL pointing at specdec (nothing else configured, no login), its model list
read, a chat streamed, a second turn; specdec's /metrics then says which of its routes Open WebUI called.

Open WebUI is heavy (its own venv: `python3 -m venv OWUI && OWUI/bin/pip install torch==2.13.0 open-webui`),
so this is a script, not a CI test:

    python scripts/open_webui_check.py --open-webui OWUI/bin/open-webui [--target qwen2.5-coder-0.5b-instruct]
        [--screenshot docs/images/open-webui.png]

Prints a markdown table (each step, what came back, seconds). Open WebUI sends its built-in tools with every
chat, so the model must be one whose chat template lists tools (Ollama refuses tools for others too).
"""

from __future__ import annotations

import argparse
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from prometheus_client.parser import text_string_to_metric_families

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
STILL_SECONDS = 2.0  # an answer whose text has not changed for this long (its toolbar showing) has ended
TURNS = ("Write a Python function that reverses a string.", "Now add a docstring to it.")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(url: str, seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as reply:
                if reply.status == 200:
                    return
        except OSError:
            time.sleep(1)
    raise RuntimeError(f"{url} did not answer within {seconds:.0f} s")


def start_servers(args, work: Path) -> tuple[list[subprocess.Popen], int, int]:
    ours, theirs = free_port(), free_port()
    specdec = subprocess.Popen([sys.executable, "-m", "specdec.cli", "serve", "--target", args.target, "--port",
                                str(ours)], stdout=(work / "specdec.log").open("w"), stderr=subprocess.STDOUT)
    environment = os.environ | {
        "DATA_DIR": str(work / "data"), "WEBUI_AUTH": "False", "OLLAMA_BASE_URL": f"http://127.0.0.1:{ours}",
        "ENABLE_OPENAI_API": "False", "OFFLINE_MODE": "true", "HF_HUB_OFFLINE": "1", "RAG_EMBEDDING_ENGINE": "ollama",
        "BYPASS_EMBEDDING_AND_RETRIEVAL": "true", "ENABLE_VERSION_UPDATE_CHECK": "False"}
    (work / "data").mkdir()
    webui = subprocess.Popen([args.open_webui, "serve", "--host", "127.0.0.1", "--port", str(theirs)], env=environment,
                             stdout=(work / "open-webui.log").open("w"), stderr=subprocess.STDOUT)
    wait_for(f"http://127.0.0.1:{ours}/health", 900)
    wait_for(f"http://127.0.0.1:{theirs}/health", 300)
    return [specdec, webui], ours, theirs


def chat(page, turns: tuple[str, ...], seconds: float) -> list[tuple[str, str, float]]:
    """Each turn typed and sent; (step, the answer's first line, seconds until its toolbar showed)."""
    rows = []
    for index, turn in enumerate(turns, start=1):
        page.locator("#chat-input").click()
        page.keyboard.type(turn)
        started = time.monotonic()
        page.keyboard.press("Enter")
        answers = page.locator("#response-content-container")
        deadline, seen, still_since = time.monotonic() + seconds, None, time.monotonic()
        while True:  # done: this turn's answer has text, has not changed for a while, and its toolbar shows
            text = answers.nth(index - 1).inner_text() if answers.count() >= index else ""
            if text != seen:
                seen, still_since = text, time.monotonic()
            toolbar = page.locator("button[aria-label='Regenerate']").count()
            if text.strip() and toolbar and time.monotonic() - still_since > STILL_SECONDS:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"turn {index}: no finished answer within {seconds:.0f} s")
            time.sleep(0.2)
        finished = still_since - started
        text = answers.nth(index - 1).inner_text().strip()
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        first = next((line for line in lines if line.startswith(("def ", "class "))), lines[0] if lines else "")[:60]
        rows.append((f"turn {index}: {turn!r}", f"{len(text)} characters, e.g. {first!r}", finished))
    return rows


def drive(args, port: int) -> list[tuple[str, str, float]]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1280, "height": 800})
        started = time.perf_counter()
        page.goto(f"http://127.0.0.1:{port}/", wait_until="load", timeout=120_000)
        page.locator("#chat-input").wait_for(timeout=120_000)
        time.sleep(3)  # the release notes open once, a moment after the page
        if page.locator("button:has-text('Okay')").count():
            page.locator("button:has-text('Okay')").click()
        selected = page.locator("#model-selector-model-button").inner_text().strip()
        rows = [("the page, its model selected", selected, time.perf_counter() - started)]
        rows += chat(page, TURNS, args.seconds)
        if args.screenshot:
            page.screenshot(path=args.screenshot)
        browser.close()
    return rows


def routes_called(port: int) -> str:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as reply:
        text = reply.read().decode()
    counts = {(s.labels["endpoint"], s.labels["status"]): int(s.value) for family in text_string_to_metric_families(text)
              for s in family.samples if s.name == "specdec_requests_total" and s.labels.get("endpoint") != "/metrics"}
    return ", ".join(f"{endpoint} {status}: {count}" for (endpoint, status), count in sorted(counts.items()))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--open-webui", required=True, help="the open-webui program (its own venv's bin/)")
    parser.add_argument("--target", default="qwen2.5-coder-0.5b-instruct")
    parser.add_argument("--screenshot", default=None)
    parser.add_argument("--seconds", type=float, default=600, help="how long an answer may take")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        processes, ours, theirs = start_servers(args, Path(work))
        try:
            rows = drive(args, theirs)
            rows.append(("specdec's routes Open WebUI called (/metrics)", routes_called(ours), 0.0))
        finally:
            for process in processes:
                process.terminate()
                process.wait(60)
    print("| step | what came back | seconds |\n|---|---|---|")
    for step, result, seconds in rows:
        print(f"| {step} | {result} | {seconds:.1f} |")


if __name__ == "__main__":
    main()
