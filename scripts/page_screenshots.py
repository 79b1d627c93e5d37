"""The chat page's screenshots for docs/server.md: an answer in the speculation view (rendered Markdown in its
tokens' colours, the charts, Compare) on a desktop's width, and the same conversation on a phone's.

    specdec serve --target qwen2.5-coder-1.5b-instruct &
    python scripts/page_screenshots.py --url http://127.0.0.1:8000 --out docs/images

Needs Playwright and Debian's chromium (`/usr/bin/chromium`), as tests/test_page.py does.
"""

from __future__ import annotations

import argparse
import shutil
import sys
from pathlib import Path

PROMPT = ("Write a Python function that returns the n-th Fibonacci number iteratively, then explain it in two "
          "sentences.")


def take(url: str, out: Path, prompt: str = PROMPT, max_tokens: int = 200, timeout_s: float = 300,
         browser=None) -> list[Path]:
    """Ask `prompt` on the page at `url` (greedy, `max_tokens`), compare it with plain decoding, and write
    page.png (1280 x 900) and page-mobile.png (390 x 844) under `out`. browser: a Playwright browser already
    launched (one is launched otherwise)."""
    if browser is None:
        from playwright.sync_api import sync_playwright

        chromium = shutil.which("chromium") or shutil.which("chromium-browser")
        if chromium is None:
            raise SystemExit("page_screenshots: no chromium on PATH (apt install chromium)")
        with sync_playwright() as playwright:
            launched = playwright.chromium.launch(executable_path=chromium, args=["--no-sandbox"])
            try:
                return take(url, out, prompt, max_tokens, timeout_s, launched)
            finally:
                launched.close()
    out.mkdir(parents=True, exist_ok=True)
    written = [out / "page.png", out / "page-mobile.png"]
    desktop = browser.new_context(viewport={"width": 1280, "height": 900})
    page = desktop.new_page()
    page.goto(url)
    page.wait_for_function("document.getElementById('model').value !== ''")
    page.click("#open-settings")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", "0")
    page.click("#save-settings")
    page.fill("#prompt", prompt)
    page.press("#prompt", "Enter")
    page.wait_for_selector('.message.assistant[data-state="done"]', timeout=timeout_s * 1000)
    page.click(".compare-button")
    page.wait_for_selector(".compare.identical, .compare.different, .compare.failed", timeout=timeout_s * 1000)
    page.screenshot(path=str(written[0]))
    stored = page.evaluate("localStorage.getItem('specdec.conversations')")
    desktop.close()
    phone = browser.new_context(viewport={"width": 390, "height": 844}, device_scale_factor=2)
    mobile = phone.new_page()
    mobile.goto(url)
    mobile.evaluate("stored => localStorage.setItem('specdec.conversations', stored)", stored)
    mobile.reload()
    mobile.wait_for_selector('.message.assistant[data-state="done"]')
    mobile.screenshot(path=str(written[1]))
    phone.close()
    return written


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000", help="a running `specdec serve`")
    parser.add_argument("--out", type=Path, default=Path("docs/images"))
    parser.add_argument("--prompt", default=PROMPT)
    parser.add_argument("--max-tokens", type=int, default=200)
    args = parser.parse_args(argv)
    for path in take(args.url, args.out, args.prompt, args.max_tokens):
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
