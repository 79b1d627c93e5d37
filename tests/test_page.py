"""The chat page in a real browser (Chromium, driven by Playwright) against a real `specdec serve` on the tiny
model: it loads without console errors, streams an answer whose tokens carry their origin in the counts
the server's statistics give, shows tau and the charts, Compare says the plain decoding is identical, Stop
ends a stream, and with --api-key it works once the key is entered while the API refuses requests without it.
CI installs Debian's chromium (.ci/run); Playwright's own browser download is not used."""

from __future__ import annotations

import json
import shutil
import time

import httpx
import pytest

from test_server import RunningServer

playwright_api = pytest.importorskip("playwright.sync_api")
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = pytest.mark.skipif(CHROMIUM is None, reason="no chromium on PATH (apt install chromium)")
PROMPT = "abc abc abc"


@pytest.fixture(scope="module")
def browser():
    with playwright_api.sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield browser
        browser.close()


@pytest.fixture(scope="module")
def server(tiny_generator):
    running = RunningServer(tiny_generator)
    yield running
    running.stop()


def open_page(browser, server, errors: list):
    page = browser.new_page()
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"http://127.0.0.1:{server.port}/")
    return page


def set_limits(page, max_tokens: int) -> None:
    page.click("#open-settings")
    page.fill("#max-tokens", str(max_tokens))
    page.fill("#temperature", "0")
    page.click("#save-settings")


def send(page, text: str) -> None:
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")


def stored_answer(page) -> dict:
    conversations = json.loads(page.evaluate("localStorage.getItem('specdec.conversations')"))
    return conversations[0]["messages"][-1]


def test_an_answer_streams_with_each_tokens_origin_and_compare_says_identical(browser, server):
    errors: list[str] = []
    page = open_page(browser, server, errors)
    page.wait_for_function("document.getElementById('drafter').textContent.startsWith('drafter:')")
    assert page.text_content("#model") == "tiny" and "ngram" in page.text_content("#drafter")
    set_limits(page, 24)
    send(page, PROMPT)
    page.wait_for_selector('.message.assistant[data-state="done"]', timeout=60_000)
    answer = stored_answer(page)
    origins = page.eval_on_selector_all(".message.assistant .tok", "spans => spans.map(s => s.dataset.origin)")
    assert len(origins) == answer["usage"]["completion_tokens"] == 24
    assert origins.count("drafted") == answer["stats"]["accepted"] > 0
    assert "tau" in page.text_content(".message.assistant .stats .tau")
    assert page.query_selector(".message.assistant .acceptance-chart svg rect") is not None
    samples = page.eval_on_selector_all(".acceptance-chart rect", "bars => bars.map(b => Number(b.dataset.samples))")
    assert samples and min(samples) > 0  # a position no round reached is not drawn as a measured 0
    assert page.query_selector(".message.assistant .speedup-chart .chosen-k") is not None
    page.click(".compare-button")
    page.wait_for_selector(".compare.identical, .compare.different, .compare.failed", timeout=60_000)
    assert page.query_selector(".compare.identical") is not None, page.text_content(".actions")
    api = httpx.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", timeout=60, json={
        "messages": [{"role": "user", "content": PROMPT}], "max_tokens": 24, "temperature": 0})
    assert answer["content"] == api.json()["choices"][0]["message"]["content"]
    assert errors == []
    page.close()


def test_the_first_token_shows_up_as_the_api_streams_it(browser, server):
    """Not a speed test: a page that waited for the whole answer would show its first token late."""
    # 400 tokens (the tiny model's context is 512): the whole answer takes long enough to tell the two apart
    body = {"messages": [{"role": "user", "content": PROMPT}], "max_tokens": 400, "temperature": 0, "stream": True}
    started = time.perf_counter()
    with httpx.stream("POST", f"http://127.0.0.1:{server.port}/v1/chat/completions", json=body, timeout=60) as reply:
        lines = reply.iter_lines()
        first = next(line for line in lines if '"content": "' in line and '"role"' not in line)
        api_first_ms = (time.perf_counter() - started) * 1000
        for _ in lines:
            pass
    whole_ms = (time.perf_counter() - started) * 1000
    assert first
    page = open_page(browser, server, [])
    page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
    set_limits(page, 400)
    send(page, PROMPT)
    page.wait_for_selector('.message.assistant[data-state="done"]', timeout=60_000)
    page_first_ms = float(page.get_attribute(".message.assistant", "data-first-token-ms"))
    page_whole_ms = stored_answer(page)["seconds"] * 1000
    print(f"first token: API {api_first_ms:.0f} ms, page {page_first_ms:.0f} ms (whole answer: API {whole_ms:.0f} ms, "
          f"page {page_whole_ms:.0f} ms)")
    assert page_first_ms < page_whole_ms / 2  # the page's own run: its first token early in it, not at its end
    page.close()


def test_stop_ends_a_stream(browser, tiny_dirs):
    """The target slowed to a step every 20 ms, so the answer is still streaming when Stop is clicked."""
    from specdec.api.generator import SpeculativeGenerator

    generator = SpeculativeGenerator.from_pretrained(str(tiny_dirs["llama"]), drafter="ngram", k=4)
    model = generator.target.model
    for name in ("forward", "forward_batch"):
        setattr(model, name, slowed(getattr(model, name)))
    slow = RunningServer(generator)
    try:
        page = open_page(browser, slow, [])
        page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
        set_limits(page, 450)  # the tiny model's context is 512
        send(page, PROMPT)
        page.wait_for_selector('.message.assistant[data-state="streaming"] .tok', timeout=60_000)
        page.click("#stop")
        page.wait_for_selector('.message.assistant[data-state="stopped"]', timeout=30_000)
        assert page.is_visible("#send") and len(stored_answer(page)["tokens"]) < 450
        page.close()
    finally:
        slow.stop()


def test_compare_replays_the_answers_own_request_and_refuses_a_stopped_one(browser, server):
    """Issue 91: Compare re-ran with the current settings, so an answer sampled at 0.9 compared after the
    setting moved to 0 read "different" against the product's own claim. It now replays the answer's request
    (its temperature and seed), and a stopped answer cannot be compared (a plain run would go on)."""
    page = open_page(browser, server, [])
    page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
    page.click("#open-settings")
    page.fill("#max-tokens", "24")
    page.fill("#temperature", "0.9")
    page.click("#save-settings")
    send(page, PROMPT)
    page.wait_for_selector('.message.assistant[data-state="done"]', timeout=60_000)
    assert stored_answer(page)["request"]["temperature"] == 0.9
    set_limits(page, 8)  # now greedy and shorter: the answer's own request must still be the one replayed
    page.click(".compare-button")
    page.wait_for_selector(".compare.identical, .compare.different, .compare.failed", timeout=60_000)
    assert page.query_selector(".compare.identical") is not None, page.text_content(".actions")
    page.evaluate("""() => {  // an answer stopped part-way, as the page keeps one
        const conversations = JSON.parse(localStorage.getItem('specdec.conversations'));
        conversations[0].messages[conversations[0].messages.length - 1].stopped = true;
        localStorage.setItem('specdec.conversations', JSON.stringify(conversations));
    }""")
    page.reload()
    page.wait_for_selector(".compare-button")
    assert page.is_disabled(".compare-button") and "stopped" in page.text_content(".compare.unavailable")
    page.close()


def test_the_page_fits_a_phone_and_follows_a_dark_system(browser, server):
    """Issue 91: at 390 x 844 the fixed sidebar left a 133 px chat column on a 1,073 px-wide page; no dark
    mode. Now the conversations fold behind a button, the page does not scroll sideways, and a dark system
    gets a dark page; the conversations open from the keyboard."""
    context = browser.new_context(viewport={"width": 390, "height": 844}, color_scheme="dark")
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"http://127.0.0.1:{server.port}/")
    page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
    assert page.evaluate("document.documentElement.scrollWidth") <= 390
    assert page.evaluate("document.getElementById('messages').getBoundingClientRect().width") >= 300
    assert not page.is_visible("#sidebar") and page.is_visible("#toggle-sidebar")
    page.click("#toggle-sidebar")
    assert page.is_visible("#sidebar")
    background = page.evaluate("getComputedStyle(document.body).backgroundColor")
    red, green, blue = (int(part) for part in background[background.index("(") + 1:-1].split(",")[:3])
    assert max(red, green, blue) < 60, background  # dark
    page.click("#new-conversation")
    page.keyboard.press("Escape")  # nothing running: nothing happens
    assert page.get_attribute("#prompt", "aria-label") and not errors
    context.close()


def slowed(method):
    def wrapper(*args, **kwargs):
        time.sleep(0.02)
        return method(*args, **kwargs)
    return wrapper


def test_with_an_api_key_the_page_asks_for_it_and_the_api_refuses_without_it(browser, tiny_generator):
    guarded = RunningServer(tiny_generator, api_key="s3cret")
    try:
        errors: list[str] = []
        page = open_page(browser, guarded, errors)
        page.wait_for_selector("#key-needed:not([hidden])")
        assert "needs an API key" in page.text_content("#key-status")
        page.fill("#key-entry", "wrong")
        page.press("#key-entry", "Enter")
        page.wait_for_function("document.getElementById('key-status').textContent.startsWith('wrong key')")
        page.fill("#key-entry", "s3cret")
        page.click("#use-key")
        page.wait_for_function("document.getElementById('model').textContent === 'tiny'")
        set_limits(page, 8)
        send(page, PROMPT)
        page.wait_for_selector('.message.assistant[data-state="done"]', timeout=60_000)
        assert len(stored_answer(page)["tokens"]) == 8
        refused = httpx.post(f"http://127.0.0.1:{guarded.port}/v1/chat/completions",
                             json={"messages": [{"role": "user", "content": "x"}], "max_tokens": 2})
        assert refused.status_code == 401
        assert all("401" in error for error in errors)  # the first, keyless calls: the browser logs their status
        page.close()
    finally:
        guarded.stop()


# An answer as the page keeps it: its tokens spell Markdown (bold, a list, a fenced code block), each with its origin.
MARKDOWN_TOKENS = [("Use ", "target"), ("**", "drafted"), ("bold", "drafted"), ("** ", "bonus"), ("text:\n\n", "target"),
                   ("- one", "drafted"), ("\n- two\n\n", "recovered"), ("```python\n", "drafted"), ("x = ", "drafted"),
                   ("1\n", "bonus"), ("```", "target")]


def stored_conversation(tokens) -> list[dict]:
    text = "".join(text for text, _ in tokens)
    rounds = [{"source": "ngram", "k": 4, "drafted": 2, "accepted": 1, "draftMs": 0.1, "verifyMs": 2.0}]
    answer = {"role": "assistant", "content": text, "tokens": [{"text": t, "origin": o, "round": 0} for t, o in tokens],
              "rounds": rounds, "seed": 1, "stats": None}
    return [{"id": "md", "title": "markdown", "messages": [{"role": "user", "content": "show me"}, answer]}]


def test_the_speculation_view_colours_rendered_markdown_and_code_copies(browser, server):
    """Issue 91: the speculation view showed raw monospaced tokens (code fences as backticks): colours or
    Markdown, never both. Now the Markdown is rendered and each text run keeps its tokens' colours, in and out
    of code blocks; a click on a token says its round; a code block's Copy button copies its code."""
    context = browser.new_context(permissions=["clipboard-read", "clipboard-write"])
    page = context.new_page()
    errors: list[str] = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"http://127.0.0.1:{server.port}/")
    page.evaluate(f"localStorage.setItem('specdec.conversations', {json.dumps(json.dumps(stored_conversation(MARKDOWN_TOKENS)))})")
    page.reload()
    page.wait_for_selector(".message.assistant .markdown")
    assert page.eval_on_selector_all(".markdown strong .tok", "spans => spans.map(s => s.dataset.origin)") == ["drafted"]
    assert page.eval_on_selector_all(".markdown li", "items => items.map(i => i.textContent)") == ["one", "two"]
    code_origins = page.eval_on_selector_all(".markdown pre code .tok", "spans => spans.map(s => s.dataset.origin)")
    assert code_origins == ["drafted", "bonus"] and "```" not in page.text_content(".markdown")
    text = "".join(t for t, _ in MARKDOWN_TOKENS)
    shown = page.eval_on_selector_all(".markdown .tok", "spans => spans.map(s => s.textContent).join('')")
    assert all(word in shown for word in ("Use", "bold", "one", "two", "x = 1")) and len(shown) < len(text)
    page.click(".markdown strong .tok")
    assert "round 1: drafted (ngram)" in page.text_content(".token-detail")
    page.click(".markdown pre .copy")
    page.wait_for_function("document.querySelector('.markdown pre .copy').textContent === 'Copied'")
    assert page.evaluate("navigator.clipboard.readText()") == "x = 1\n"
    page.uncheck("#show-speculation")  # the plain rendering: the same Markdown, no colours
    assert page.query_selector(".markdown .tok") is None and page.query_selector(".markdown strong") is not None
    page.check("#show-speculation")
    assert not errors, errors
    context.close()


def test_regenerate_edit_delete_and_a_conversation_exported_and_imported(browser, server, tmp_path):
    """Issue 91's chat basics on a user's path: regenerate the last answer (a new one streams), delete it, edit
    the question (its text back in the box, what followed it gone), export the conversations and import them
    into an empty browser."""
    errors: list[str] = []
    page = open_page(browser, server, errors)
    page.wait_for_function("document.getElementById('model').value === 'tiny'")
    set_limits(page, 8)
    send(page, PROMPT)
    page.wait_for_selector('.message.assistant[data-state="done"]', timeout=60_000)
    first_seed = stored_answer(page)["seed"]
    page.click(".message.assistant .regenerate")
    page.wait_for_function(f"""() => {{
        const messages = JSON.parse(localStorage.getItem('specdec.conversations'))[0].messages;
        return messages.length === 2 && !messages[1].pending && messages[1].seed !== {first_seed};
    }}""", timeout=60_000)
    assert len(stored_answer(page)["tokens"]) == 8
    with page.expect_download() as download:
        page.click("#export")
    exported = tmp_path / "conversations.json"
    download.value.save_as(exported)
    page.click(".message.assistant .delete")
    assert page.query_selector(".message.assistant") is None
    page.click(".message.user .edit")
    assert page.input_value("#prompt") == PROMPT and page.query_selector(".message.user") is None
    fresh = browser.new_context().new_page()
    fresh.goto(f"http://127.0.0.1:{server.port}/")
    fresh.set_input_files("#import", str(exported))
    fresh.wait_for_selector(".message.assistant .markdown")
    assert fresh.text_content("#conversations li span") == PROMPT and not errors
    bad = tmp_path / "bad.json"
    bad.write_text('{"not": "conversations"}')
    fresh.set_input_files("#import", str(bad))
    fresh.wait_for_function("document.getElementById('error').textContent.startsWith('import:')")
    fresh.context.close()
    page.close()


def test_a_failed_answer_is_marked_and_never_sent_back_as_a_turn(browser, server):
    """Issue 91: a failed send left an empty assistant bubble that was sent back as an empty turn."""
    page = open_page(browser, server, [])
    page.wait_for_function("document.getElementById('model').value === 'tiny'")
    page.click("#open-settings")
    page.fill("#top-p", "5")  # the server refuses it: a 400
    page.fill("#max-tokens", "8")
    page.click("#save-settings")
    send(page, PROMPT)
    page.wait_for_selector(".message.assistant .stats .ended")
    assert page.text_content(".message.assistant .stats .ended").startswith("failed:")
    assert "top_p" in page.text_content("#error")
    page.click("#open-settings")
    page.fill("#top-p", "")
    page.click("#save-settings")
    request = page.evaluate("requestFor(current, current.messages.length)")
    assert [m["role"] for m in request["messages"]] == ["user"] and "top_p" not in request
    send(page, "and again")
    page.wait_for_function("document.querySelectorAll('.message.assistant[data-state=\"done\"]').length === 2",
                           timeout=60_000)
    answer = stored_answer(page)
    assert [m["role"] for m in answer["request"]["messages"]] == ["user", "user"] and len(answer["tokens"]) == 8
    page.close()


def test_the_pages_files_weigh_at_most_300_kb():
    from specdec.server.routes_page import PAGE_DIR

    files = [path for path in PAGE_DIR.rglob("*") if path.is_file() and path.suffix in (".html", ".js", ".css")]
    assert sum(path.stat().st_size for path in files) <= 300_000


def test_the_screenshot_script_of_the_docs_runs(browser, server, tmp_path):
    """scripts/page_screenshots.py (docs/server.md's images) on the tiny model: both images written."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "scripts"))
    import page_screenshots

    written = page_screenshots.take(f"http://127.0.0.1:{server.port}/", tmp_path, "abc abc", max_tokens=8,
                                    browser=browser)
    assert [path.name for path in written] == ["page.png", "page-mobile.png"]
    assert all(path.stat().st_size > 10_000 and path.read_bytes()[:4] == b"\x89PNG" for path in written)
