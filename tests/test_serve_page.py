"""The page of `ottvid serve` (GET /) and the endpoints it uses.

The endpoints are checked with httpx against a real uvicorn server with the tiny Qwen2.5-VL on a
loopback port. The page itself runs in a real browser: Debian's chromium, headless, driven by
Playwright's Python package (never `playwright install`: it downloads browsers). Without chromium
or Playwright those tests skip, except in CI (CI=true), where they fail.
"""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import threading
import time

import httpx
import pytest
from test_serve import DATA, KEY, SlowEngine, ThreadServer

from ottvid_cli.serve.app import ServeSettings, create_app

CHROMIUM = os.environ.get("OTTVID_CHROMIUM", "/usr/bin/chromium")  # Debian's package
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update", "--disable-sync"]
IN_CI = os.environ.get("CI", "").lower() in ("true", "1", "yes")
UPLOAD_MB = 1.0  # fire2.mp4 (1.7 MB) is over it, realshort.mp4 (95 KB) under
TIMEOUT_MS = 120_000  # a question on the tiny model on a busy CPU


# ------------------------------------------------------------------------------------------------
# servers


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """The allowed folder: two clips, one in a subfolder, a file that is no video, a hidden clip, a
    link out of the folder, a text file; and a file that is no video, for a bad upload."""
    root = tmp_path_factory.mktemp("page")
    allowed, outside = root / "media", root / "outside"
    (allowed / "sub").mkdir(parents=True)
    outside.mkdir()
    shutil.copy(DATA / "bikes.mp4", allowed / "bikes.mp4")
    shutil.copy(DATA / "realshort.mp4", allowed / "sub" / "short clip.mp4")
    shutil.copy(DATA / "realshort.mp4", allowed / ".hidden.mp4")
    (allowed / "notes.txt").write_text("not a video")
    shutil.copy(DATA / "yoga.mp4", outside / "secret.mp4")
    (allowed / "escape.mp4").symlink_to(outside / "secret.mp4")
    (allowed / "notes.mp4").symlink_to(allowed / "notes.txt")  # a link named .mp4 to a text file
    junk = root / "junk.mp4"
    junk.write_bytes(b"\x00this is not a video\n" * 500)
    return allowed, outside, junk


@pytest.fixture(scope="module")
def engine(tiny_qwen):
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.session import Engine

    return Engine(load_backbone(str(tiny_qwen), device="cpu"))


def _serve(engine, model, folder, **settings):
    return ThreadServer(create_app(engine, ServeSettings(model_id=model, allowed_media_dir=str(folder),
                                                         max_upload_mb=UPLOAD_MB, timeout=120, **settings)))


@pytest.fixture(scope="module")
def open_server(engine, tiny_qwen, folder):
    server = _serve(engine, str(tiny_qwen), folder[0])
    yield server
    server.stop()


@pytest.fixture(scope="module")
def keyed_server(engine, tiny_qwen, folder):
    server = _serve(engine, str(tiny_qwen), folder[0], api_key=KEY)
    yield server
    server.stop()


# ------------------------------------------------------------------------------------------------
# the endpoints, over HTTP


def test_page_and_assets_are_served_from_the_package(open_server):
    page = httpx.get(open_server.url + "/")
    assert page.status_code == 200 and page.headers["content-type"].startswith("text/html")
    policy = page.headers["content-security-policy"]
    assert "script-src 'self'" in policy and "connect-src 'self'" in policy
    assert 'data-api-key="none"' in page.text
    testids = set(re.findall(r'data-testid="([a-z-]+)"', page.text))
    assert testids == {"video-file", "media-list", "question", "task", "method", "ratio", "frames", "point", "submit",
                       "answer", "span", "picture", "tokens", "timings", "cache", "error", "api-key", "key-error",
                       "warmup", "picture-words"}
    # nothing from elsewhere: every src and href is this server's own (or the empty data: icon)
    for ref in re.findall(r'(?:src|href)="([^"]*)"', page.text):
        assert ref.startswith("/page/") or ref == "data:,", ref
    for name, kind in (("page.js", "text/javascript"), ("page.css", "text/css")):
        asset = httpx.get(f"{open_server.url}/page/{name}")
        assert asset.status_code == 200 and asset.headers["content-type"].startswith(kind) and len(asset.text) > 1000
        assert "http://" not in asset.text and "https://" not in asset.text
    missing = httpx.get(open_server.url + "/page/../app.py")
    assert missing.status_code == 404 and "error" in missing.json()


def test_page_says_when_a_key_is_needed_and_the_api_needs_it(keyed_server):
    assert 'data-api-key="required"' in httpx.get(keyed_server.url + "/").text  # the page itself holds no data
    for path in ("/v1/ottvid/info", "/v1/ottvid/media", "/v1/ottvid/media/bikes.mp4"):
        response = httpx.get(keyed_server.url + path)
        assert response.status_code == 401 and response.json()["error"]["code"] == "invalid_api_key", path
    assert httpx.get(keyed_server.url + "/v1/ottvid/info",
                     headers={"Authorization": f"Bearer {KEY}"}).status_code == 200


def test_info_says_what_the_page_offers(open_server, tiny_qwen):
    info = httpx.get(open_server.url + "/v1/ottvid/info").json()
    assert info["model"] == str(tiny_qwen) and info["tasks"] == ["ask", "ground"]
    assert "ottvid" in info["methods"] and "none" in info["methods"]
    assert info["max_upload_bytes"] == int(UPLOAD_MB * (1 << 20)) and info["media_folder"] is True
    assert info["max_tokens"] == {"ask": 64, "ground": 48} and info["frames"] == 32
    deadline = time.monotonic() + 120
    while httpx.get(open_server.url + "/health").status_code != 200:  # the model's warm-up request ran
        assert time.monotonic() < deadline
        time.sleep(0.1)
    # the warm-up's time, for the page's header (it is no request's time)
    assert httpx.get(open_server.url + "/v1/ottvid/info").json()["warmup_ms"] > 0


def test_media_listing_is_confined_to_the_folder(open_server, folder):
    listing = httpx.get(open_server.url + "/v1/ottvid/media").json()
    names = [item["name"] for item in listing["data"]]
    assert names == ["bikes.mp4", "sub/short clip.mp4"] and listing["truncated"] is False
    item = listing["data"][1]
    assert item["bytes"] == (DATA / "realshort.mp4").stat().st_size
    assert item["url"] == (folder[0] / "sub" / "short clip.mp4").as_uri()
    assert str(folder[1]) not in httpx.get(open_server.url + "/v1/ottvid/media").text


def test_media_file_is_the_video_and_nothing_else(open_server, folder):
    url = open_server.url + "/v1/ottvid/media/"
    whole = httpx.get(url + "sub/short%20clip.mp4")
    assert whole.status_code == 200 and whole.content == (DATA / "realshort.mp4").read_bytes()
    assert whole.headers["content-type"] == "video/mp4"
    part = httpx.get(url + "bikes.mp4", headers={"Range": "bytes=0-99"})  # the player seeks with ranges
    assert part.status_code == 206 and part.content == (DATA / "bikes.mp4").read_bytes()[:100]
    for name, status in (("escape.mp4", 403), ("..%2Foutside%2Fsecret.mp4", 403),
                         ("sub/..%2F..%2Foutside/secret.mp4", 403),
                         ("notes.txt", 404), ("notes.mp4", 404), ("nothere.mp4", 400), ("bikes%00.mp4", 400),
                         ("%2Fetc%2Fpasswd.mp4", 403)):
        response = httpx.get(url + name)
        assert response.status_code == status, (name, response.text)
        assert response.json()["error"]["message"] and str(folder[1]) not in response.text


def test_no_media_endpoints_without_a_folder(engine, tiny_qwen):
    server = ThreadServer(create_app(engine, ServeSettings(model_id=str(tiny_qwen))))
    try:
        assert httpx.get(server.url + "/v1/ottvid/info").json()["media_folder"] is False
        for path in ("/v1/ottvid/media", "/v1/ottvid/media/bikes.mp4"):
            response = httpx.get(server.url + path)
            assert response.status_code == 403 and response.json()["error"]["code"] == "media_not_allowed"
    finally:
        server.stop()


def _chat(server, url, ottvid, text="What happens?"):
    return httpx.post(server.url + "/v1/chat/completions", timeout=120, json={
        "model": server.app.state.settings.model_id, "max_tokens": 3,
        "messages": [{"role": "user", "content": [{"type": "video_url", "video_url": {"url": url}},
                                                  {"type": "text", "text": text}]}],
        "ottvid": {"frames": 4, **ottvid}})


def test_picture_is_the_show_picture_as_png(open_server, folder):
    from PIL import Image

    response = _chat(open_server, str(folder[0] / "bikes.mp4"), {"picture": True, "ratio": 0.3})
    assert response.status_code == 200, response.text
    run = response.json()["ottvid"]
    picture = run["picture"]
    assert picture["image"].startswith("data:image/png;base64,")
    image = Image.open(io.BytesIO(base64.b64decode(picture["image"].split(",", 1)[1])))
    assert image.format == "PNG" and image.size == (picture["width"], picture["height"])
    assert picture["groups"] == run["compression"]["T"] and picture["kept"] == run["tokens"]["visual_after"]
    assert picture["method"] == "ottvid" and "path" not in picture
    assert run["timings_ms"]["picture"] > 0
    # not asked for: not drawn; method none: nothing to draw, the answer still comes
    assert "picture" not in _chat(open_server, str(folder[0] / "bikes.mp4"), {}).json()["ottvid"]
    none = _chat(open_server, str(folder[0] / "bikes.mp4"), {"picture": True, "method": "none"})
    assert none.status_code == 200 and none.json()["ottvid"]["picture"] is None


def test_picture_of_an_upload_is_not_titled_with_the_temporary_file(monkeypatch, open_server):
    from ottvid_cli import show

    titles = []
    draw = show.picture
    monkeypatch.setattr(show, "picture", lambda *a, **k: titles.append(k["title"]) or draw(*a, **k))
    upload = "data:video/mp4;base64," + base64.b64encode((DATA / "realshort.mp4").read_bytes()).decode()
    assert _chat(open_server, upload, {"picture": True}).status_code == 200
    assert titles == ["the uploaded video: OTT-Vid at ratio 0.1"]


# ------------------------------------------------------------------------------------------------
# the page, in a browser


def _need(reason: str):
    if IN_CI:
        pytest.fail(f"{reason} (CI must run the browser tests: .ci/run installs chromium)")
    pytest.skip(reason)


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _need("Playwright's Python package is not installed (pip install playwright; no `playwright install`)")
    if not os.path.exists(CHROMIUM):
        _need(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        launched = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS, headless=True)
        yield launched
        launched.close()


class Page:
    """A browser tab on the page, recording what its console and script report."""

    def __init__(self, browser, url: str, width: int = 1280, height: int = 800):
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.context.set_default_timeout(TIMEOUT_MS)
        self.tab = self.context.new_page()
        self.console: list[str] = []  # console errors and uncaught exceptions
        self.tab.on("console", lambda m: m.type == "error" and self.console.append(m.text))
        self.tab.on("pageerror", lambda e: self.console.append(f"uncaught: {e}"))
        self.tab.goto(url + "/")

    def __getitem__(self, testid: str):
        return self.tab.get_by_test_id(testid)

    def unexpected_console(self, *statuses: int) -> list[str]:
        """Console errors other than the browser's own note on an API error this test provoked."""
        allowed = tuple(f"status of {s} " for s in statuses)
        return [m for m in self.console
                if not (m.startswith("Failed to load resource") and any(a in m for a in allowed))]

    def ask(self, question: str, **settings) -> None:
        """Fill the settings and the question, press Enter, wait for the answer to be complete."""
        for name, value in settings.items():
            field = self.tab.locator("#max-tokens") if name == "max_tokens" else self[name]
            if name in ("task", "method"):
                field.select_option(value)
            else:
                field.fill(str(value))
        self["question"].fill(question)
        self.tab.evaluate(STREAM_PROBE)
        self["question"].press("Enter")
        self.tab.wait_for_function("() => document.getElementById('submit').disabled === false && "
                                   "window.__probe.settled")

    def close(self):
        self.context.close()


# Counts how the answer grows while the reply streams in (before the page renders the final object),
# and notes when the question has settled: an answer rendered or an error shown.
STREAM_PROBE = """() => {
  const answer = document.getElementById('answer');
  const probe = window.__probe = {pieces: [], settled: false};
  new MutationObserver(() => {
    if (!answer.classList.contains('done') && answer.textContent) probe.pieces.push(answer.textContent);
  }).observe(answer, {childList: true, characterData: true, subtree: true});
  const settle = () => {
    if (answer.classList.contains('done') || !document.getElementById('error').hidden) probe.settled = true;
  };
  new MutationObserver(settle).observe(document.body, {attributes: true, childList: true, subtree: true});
}"""


def _wait_for_model(page: Page, model: str) -> None:
    """Until the page has connected: the model named, the controls and the folder's list filled."""
    page.tab.wait_for_function("m => document.getElementById('model').textContent === m && "
                               "document.body.dataset.ready === 'true'", arg=model)


def _no_horizontal_scroll(page: Page) -> bool:
    return page.tab.evaluate("() => document.documentElement.scrollWidth <= window.innerWidth")


def test_upload_ask_stream_picture_cache_ground_and_both_sizes(browser, tiny_qwen, folder, tmp_path):
    from ottvid_cli.backbones import load_backbone
    from ottvid_cli.session import Engine

    # its own engine: the first question must find the cache empty
    server = _serve(Engine(load_backbone(str(tiny_qwen), device="cpu")), str(tiny_qwen), folder[0])
    page = Page(browser, server.url)
    try:
        _wait_for_model(page, str(tiny_qwen))
        assert page["api-key"].is_hidden()
        assert page.tab.locator("#player").is_hidden() and page.tab.locator("#placeholder").is_visible()
        page["video-file"].set_input_files(str(DATA / "realshort.mp4"))
        page.tab.wait_for_function("() => document.getElementById('player').readyState >= 2")  # a frame decoded
        assert page.tab.evaluate("() => document.getElementById('player').duration") == pytest.approx(1.2, abs=0.1)
        assert page.tab.locator("#player").is_visible() and page.tab.locator("#placeholder").is_hidden()

        page.ask("What happens in the video?", task="ask", method="ottvid", ratio=0.3, frames=4, max_tokens=12)
        assert page["error"].is_hidden()
        answer = page["answer"].inner_text()
        pieces = page.tab.evaluate("() => window.__probe.pieces")
        assert answer and answer != "(empty answer)"
        assert pieces, "the answer did not stream in"
        # it grew piece by piece into the final answer (the last pieces may come with the final chunk)
        words = [" ".join(p.split()) for p in [*pieces, answer]]
        assert all(later.startswith(earlier) for earlier, later in zip(words, words[1:])), pieces
        picture = page["picture"]
        assert picture.is_visible()
        assert page.tab.evaluate("() => document.querySelector('[data-testid=picture]').naturalWidth") >= 640
        tokens = page["tokens"].inner_text()
        assert re.search(r"visual\s+[\d,]+ → [\d,]+", tokens) and "LLM input" in tokens, tokens
        timings = page["timings"].inner_text()
        assert all(stage in timings for stage in ("decode", "vision", "prefill", "generate", "picture")), timings
        assert page["cache"].get_attribute("data-hit") == "false" and "miss" in page["cache"].inner_text().lower()
        page.tab.screenshot(path=str(tmp_path / "ask-1280x800.png"), full_page=True)

        # the same video again (uploaded again: the cache is keyed by its content)
        page.ask("Who is in it?")
        assert page["cache"].get_attribute("data-hit") == "true" and "hit" in page["cache"].inner_text().lower()
        timings = page["timings"].inner_text()
        assert re.search(r"vision\s+cached", timings) and "picture" not in timings  # the same picture: not drawn again
        assert page["picture"].is_visible()

        # multiple choice: the letter comes back
        page.tab.locator("#choices-box summary").click()
        page.tab.locator("#choices").fill("A. a dog\nB. a cat\nC. a car")
        page.ask("What is shown?")
        assert page["error"].is_hidden() and page["answer"].inner_text()

        # ground: a span on the timeline, or "no span"
        page.tab.locator("#choices").fill("")
        page.ask("someone is in the scene", task="ground", max_tokens=16)
        assert page["error"].is_hidden()
        span = page["span"]
        assert span.is_visible()
        state = span.get_attribute("data-state")
        assert state in ("span", "none")
        if state == "none":
            assert span.inner_text() == "no span"
        else:
            assert re.fullmatch(r"[\d.]+–[\d.]+ s", span.inner_text())
        assert page["picture"].is_visible()
        page.tab.screenshot(path=str(tmp_path / "ground-1280x800.png"), full_page=True)
        assert _no_horizontal_scroll(page)

        # a phone
        page.tab.set_viewport_size({"width": 390, "height": 844})
        page.tab.screenshot(path=str(tmp_path / "ground-390x844.png"), full_page=True)
        page.tab.screenshot(path=str(tmp_path / "top-390x844.png"))
        assert _no_horizontal_scroll(page)
        for testid in ("video-file", "question", "submit", "task", "method", "ratio", "frames"):
            box = page[testid].bounding_box()
            assert box and box["x"] >= 0 and box["x"] + box["width"] <= 390, testid
        page.ask("What happens next?", task="ask", max_tokens=6)  # still works at that size
        assert page["error"].is_hidden() and page["cache"].get_attribute("data-hit") == "true"
        # the picture's words, too small in the picture on a phone, are text under it
        words = page["picture-words"]
        assert words.is_visible() and "kept as they are" in words.inner_text()
        assert "across frames (bars)" in words.inner_text() and "W_t" in words.inner_text()
        assert page.tab.evaluate("() => parseFloat(getComputedStyle(document.querySelector("
                                 "'[data-testid=picture-words] li')).fontSize)") >= 12
        page.tab.screenshot(path=str(tmp_path / "ask-390x844.png"), full_page=True)
        assert page.unexpected_console() == []
    finally:
        page.close()
        server.stop()
    print(f"screenshots in {tmp_path}")


def test_pick_a_server_video_and_seek(browser, open_server, tiny_qwen):
    page = Page(browser, open_server.url)
    try:
        _wait_for_model(page, str(tiny_qwen))
        options = page["media-list"].locator("option").all_inner_texts()
        assert [o.split("  (")[0] for o in options[1:]] == ["bikes.mp4", "sub/short clip.mp4"]
        page["media-list"].select_option("bikes.mp4")
        page.tab.wait_for_function("() => document.getElementById('player').readyState >= 1")
        assert page.tab.evaluate("() => document.getElementById('player').duration") == pytest.approx(10.0, abs=0.2)
        # a click on the timeline seeks there
        box = page.tab.locator("#timeline").bounding_box()
        page.tab.mouse.click(box["x"] + box["width"] * 0.5, box["y"] + box["height"] / 2)
        page.tab.wait_for_function("() => Math.abs(document.getElementById('player').currentTime - 5) < 0.3")
        page.ask("What happens?", frames=4, max_tokens=4)
        assert page["error"].is_hidden() and page["answer"].inner_text()
        assert page["cache"].get_attribute("data-hit") in ("true", "false")
        assert page.unexpected_console() == []
    finally:
        page.close()


def test_bad_upload_shows_the_error_and_the_page_keeps_working(browser, open_server, tiny_qwen, folder, tmp_path):
    page = Page(browser, open_server.url)
    try:
        _wait_for_model(page, str(tiny_qwen))
        # too large: refused before it is sent, with the server's limit
        page["video-file"].set_input_files(str(DATA / "fire2.mp4"))
        assert page["error"].is_visible() and "larger than the server's limit (1.00 MB" in page["error"].inner_text()
        page["question"].fill("What?")
        page["question"].press("Enter")
        assert "choose a video first" in page["error"].inner_text()
        # not a video: the API's own message
        page["video-file"].set_input_files(str(folder[2]))
        page.ask("What happens?", frames=4, max_tokens=4)
        error = page["error"].inner_text()
        assert page["error"].is_visible() and "video" in error.lower() and "Traceback" not in error, error
        assert page["answer"].inner_text() == ""
        page.tab.screenshot(path=str(tmp_path / "error-1280x800.png"))
        # a wrong setting: the API's message names the field
        page["video-file"].set_input_files(str(DATA / "realshort.mp4"))
        page.ask("What happens?", ratio=1.5)
        assert "ratio" in page["error"].inner_text()
        # and the next question is answered
        page.ask("What happens?", ratio=0.2, frames=4, max_tokens=4)
        assert page["error"].is_hidden() and page["answer"].inner_text()
        assert page["picture"].is_visible()
        assert page.unexpected_console(400) == []
    finally:
        page.close()


def test_a_video_moved_out_of_the_folder_is_the_api_s_error(browser, engine, tiny_qwen, tmp_path):
    allowed, outside = tmp_path / "media", tmp_path / "outside"
    allowed.mkdir()
    outside.mkdir()
    shutil.copy(DATA / "realshort.mp4", allowed / "a.mp4")
    shutil.copy(DATA / "realshort.mp4", allowed / "b.mp4")
    shutil.copy(DATA / "yoga.mp4", outside / "private.mp4")
    server = _serve(engine, str(tiny_qwen), allowed)
    page = Page(browser, server.url)
    try:
        _wait_for_model(page, str(tiny_qwen))
        (allowed / "a.mp4").unlink()  # listed, then made a link out of the folder
        (allowed / "a.mp4").symlink_to(outside / "private.mp4")
        page["media-list"].select_option("a.mp4")
        page.ask("What happens?", frames=4, max_tokens=4)
        assert "outside the server's --allowed-media-dir" in page["error"].inner_text()
        assert str(outside) not in page.tab.content()
        page["media-list"].select_option("b.mp4")
        page.ask("What happens?", frames=4, max_tokens=4)
        assert page["error"].is_hidden() and page["answer"].inner_text()
        assert page.unexpected_console(403) == []
    finally:
        page.close()
        server.stop()


def test_with_an_api_key_the_page_asks_for_it(browser, keyed_server, tiny_qwen, tmp_path):
    page = Page(browser, keyed_server.url)
    try:
        assert page["api-key"].is_visible()
        assert page.tab.locator("#media-pick").is_hidden()
        page.tab.screenshot(path=str(tmp_path / "key-1280x800.png"))
        page["api-key"].fill("wrong")
        page["api-key"].press("Enter")
        page.tab.wait_for_function("() => !document.getElementById('key-error').hidden")
        # said under the key, where it is fixed, not under the question
        assert "wrong API key" in page["key-error"].inner_text() and page["api-key"].is_visible()
        assert page["error"].is_hidden()
        page["api-key"].fill(KEY)
        page["api-key"].press("Enter")
        _wait_for_model(page, str(tiny_qwen))
        assert page["api-key"].is_hidden() and page["error"].is_hidden()
        # a server video is fetched with the key, then played
        page["media-list"].select_option("sub/short clip.mp4")
        page.tab.wait_for_function("() => document.getElementById('player').readyState >= 1 && "
                                   "document.getElementById('player').src.startsWith('blob:')")
        page.ask("What happens?", frames=4, max_tokens=4)
        assert page["error"].is_hidden() and page["answer"].inner_text()
        # the key stays in the tab: a reload does not ask again
        page.tab.reload()
        _wait_for_model(page, str(tiny_qwen))
        assert page["api-key"].is_hidden()
        assert page.unexpected_console(401) == []
    finally:
        page.close()


class _Spans:
    """A stand-in engine for the one thing the tiny random model cannot be made to do: name a span.
    It answers `ground` with the span 2.5-5 s of a 10 s video, or with `point` (ottvid.point) the
    moment 4 s as [4, 4], noting each `point` it got (and `ask` with a fixed answer)."""

    backbone = None

    def __init__(self):
        self.points = []

    class Result:
        def __init__(self, task, text, span):
            self.task, self.text, self.span = task, text, span

        def to_dict(self):
            return {"task": self.task, "answer": self.text, "span": self.span, "cache_hit": False, "method": "ottvid",
                    "ratio": 0.1, "tokens": {"visual_before": 100, "visual_after": 10, "llm_input": 30, "generated": 5},
                    "frames": {"count": 4, "duration": 10.0}, "timings_ms": {"generate": 1.0}}

    def ground(self, video, query, request=None, on_token=None, on_step=None, **kwargs):
        self.points.append(request.point)
        if request.point:
            on_token("At 4.0 seconds.")
            return self.Result("ground", "At 4.0 seconds.", [4.0, 4.0])
        on_token("From 2.5 to 5.0 seconds.")
        return self.Result("ground", "From 2.5 to 5.0 seconds.", [2.5, 5.0])

    def ask(self, video, question, on_token=None, on_step=None, **kwargs):
        on_token("A bike.")
        return self.Result("ask", "A bike.", None)


def _stand_in_page(browser, engine, model: str, folder) -> tuple[ThreadServer, Page]:
    """A real server on a stand-in `engine` (served as `model`) and a tab on its page, connected."""
    server = ThreadServer(create_app(engine, ServeSettings(model_id=model, allowed_media_dir=str(folder))))
    page = Page(browser, server.url)
    try:
        _wait_for_model(page, model)
    except BaseException:
        page.close()
        server.stop()
        raise
    return server, page


def test_ground_span_is_drawn_on_the_timeline_and_click_seeks(browser, folder, tmp_path):
    server, page = _stand_in_page(browser, _Spans(), "spans", folder[0])
    try:
        page["media-list"].select_option("bikes.mp4")
        page.tab.wait_for_function("() => document.getElementById('player').readyState >= 1")
        page.ask("someone rides a bike", task="ground")
        span = page["span"]
        assert span.is_visible() and span.get_attribute("data-state") == "span"
        assert span.inner_text() == "2.5–5.0 s"
        timeline, bar = page.tab.locator("#timeline").bounding_box(), span.bounding_box()
        assert (bar["x"] - timeline["x"]) / timeline["width"] == pytest.approx(0.25, abs=0.02)
        assert bar["width"] / timeline["width"] == pytest.approx(0.25, abs=0.02)
        span.click()
        page.tab.wait_for_function("() => Math.abs(document.getElementById('player').currentTime - 2.5) < 0.05")
        page.tab.screenshot(path=str(tmp_path / "span-1280x800.png"))
        assert page["picture"].is_hidden()  # the stand-in has no picture
        page.ask("what is it?", task="ask")  # an ask answer clears the span
        assert span.is_hidden()
        assert page.unexpected_console() == []
    finally:
        page.close()
        server.stop()


def test_ground_a_moment_sends_point_and_draws_one_time(browser, folder):
    engine = _Spans()
    server, page = _stand_in_page(browser, engine, "spans", folder[0])
    try:
        page["media-list"].select_option("bikes.mp4")
        page.tab.wait_for_function("() => document.getElementById('player').readyState >= 1")
        assert page["point"].is_hidden()  # ask has no moments
        page["task"].select_option("ground")
        assert page["point"].is_visible() and not page["point"].is_checked()
        page["point"].check()
        page.ask("the bike passes the tree")
        span = page["span"]
        assert span.get_attribute("data-state") == "span" and span.inner_text() == "4.0 s"
        assert span.get_attribute("data-start") == span.get_attribute("data-end") == "4"
        timeline, bar = page.tab.locator("#timeline").bounding_box(), span.bounding_box()
        assert (bar["x"] - timeline["x"]) / timeline["width"] == pytest.approx(0.4, abs=0.02)
        span.click()
        page.tab.wait_for_function("() => Math.abs(document.getElementById('player').currentTime - 4) < 0.05")
        page["point"].uncheck()
        page.ask("someone rides a bike")
        assert span.inner_text() == "2.5–5.0 s"
        assert engine.points == [True, False]  # ottvid.point reached the engine only when checked
        page["task"].select_option("ask")
        assert page["point"].is_hidden()
        assert page.unexpected_console() == []
    finally:
        page.close()
        server.stop()


class _Slow(SlowEngine):
    """test_serve's stand-in engine that works until `gate` is set, answering "done." as the page expects."""

    backbone = None

    def reply(self, question):
        return "done."

    def result(self, question):
        return _Spans.Result("ask", "done.", None)


def test_stop_cancels_the_question_on_the_server(browser, folder):
    engine = _Slow()
    server, page = _stand_in_page(browser, engine, "slow", folder[0])
    try:
        page["video-file"].set_input_files(str(DATA / "realshort.mp4"))
        page.tab.wait_for_function("() => document.getElementById('player').readyState >= 1")
        page["question"].fill("first")
        page["question"].press("Enter")
        page.tab.wait_for_function("() => !document.getElementById('stop').hidden")
        assert page["submit"].is_disabled()
        deadline = time.monotonic() + 10
        while not httpx.get(server.url + "/health").json()["busy"]:
            assert time.monotonic() < deadline
            time.sleep(0.02)
        page.tab.locator("#stop").click()
        page.tab.wait_for_function("() => document.getElementById('answer').classList.contains('done')")
        # the person's own Stop is a note where the answer would be, not a red error
        assert page["error"].is_hidden() and page["submit"].is_enabled()
        stopped = page.tab.locator("#answer .item.stopped")
        assert stopped.locator(".k").inner_text() == "stopped" and "you pressed Stop" in stopped.inner_text()
        deadline = time.monotonic() + 5
        while httpx.get(server.url + "/health").json()["busy"]:  # the server stopped the work
            assert time.monotonic() < deadline
            time.sleep(0.02)
        assert engine.started == ["first"] and engine.finished == []
        engine.gate.set()
        page.ask("second")
        assert page["error"].is_hidden() and page["answer"].inner_text() == "done."
        assert page.unexpected_console() == []
    finally:
        engine.gate.set()
        page.close()
        server.stop()


class _Reports(_Spans):
    """A stand-in engine whose replies carry what the page must report: the server's start-up load
    and warm-up among the timings, a 79.5 s video, a multiple-choice answer with or without a letter,
    a ground answer without a span and the reason."""

    class Result(_Spans.Result):
        def __init__(self, task, text, span, extra=None):
            super().__init__(task, text, span)
            self.extra = extra or {}

        def to_dict(self):
            data = super().to_dict()
            data["frames"] = {"count": 4, "duration": 79.5}
            data["timings_ms"] = {"load": 2000.0, "warmup": 800.0, "decode": 10.0, "vision": 20.0, "generate": 5.0}
            return {**data, **self.extra}

    def ask(self, video, question, request=None, on_token=None, on_step=None, **kwargs):
        on_token("B. a cat" if question == "letter" else "I cannot tell.")
        letter = {"letter": "B"} if question == "letter" else {"letter": None}
        return self.Result("ask", "B. a cat" if question == "letter" else "I cannot tell.", None, letter)

    def ground(self, video, query, request=None, on_token=None, on_step=None, **kwargs):
        on_token("At 7 seconds.")
        note = "the reply holds one time, 7 s, not a start and an end"
        return self.Result("ground", "At 7 seconds.", None, {"span_note": note})


def test_the_page_reports_what_the_reply_says(browser, folder, tmp_path):
    """The total added the server's start-up warm-up to every request; a video the browser
    cannot play kept the last video's length (or none); a multiple-choice reply showed no letter, nor
    that none could be read; a ground reply without a span did not say why."""
    server, page = _stand_in_page(browser, _Reports(), "reports", folder[0])
    try:
        page["video-file"].set_input_files(str(DATA / "realshort.mp4"))
        page.tab.wait_for_function("() => document.getElementById('t-end').textContent === '0:01.2'")
        page["video-file"].set_input_files(str(folder[2]))  # no video this browser can play (as an AVI)
        page.tab.wait_for_function("() => document.getElementById('video-name').textContent.includes('cannot play')")
        assert page.tab.locator("#t-end").inner_text() == ""
        page.ask("what?")
        assert page.tab.locator("#t-end").inner_text() == "1:19.5"  # the server's duration
        timings = page["timings"].inner_text()
        assert "warmup" not in timings and "load" not in timings
        assert re.search(r"total\s+35\b", timings), timings

        page.tab.locator("#choices-box summary").click()
        page.tab.locator("#choices").fill("A. a dog\nB. a cat")
        choice = page.tab.locator("#answer .item.letter")
        page.ask("letter")
        assert (choice.locator(".k").inner_text(), choice.locator(".v").inner_text()) == ("choice", "B")
        page.ask("what?")
        assert choice.locator(".v").inner_text() == "no option letter could be read from the reply"
        page.tab.locator("#choices").fill("")
        page.ask("someone rides", task="ground")
        assert page["span"].inner_text() == "no span"
        why = page.tab.locator("#answer .item.nospan")
        assert why.locator(".k").inner_text() == "no time span"
        assert why.locator(".v").inner_text() == "the reply holds one time, 7 s, not a start and an end"
        assert page["span"].get_attribute("title").endswith("not a start and an end")
        assert page.unexpected_console() == []
    finally:
        page.close()
        server.stop()


class _WarmingUp(_Spans):
    """A stand-in engine whose start-up warm-up runs until `gate` is set, then says it took 1234 ms."""

    def __init__(self):
        super().__init__()
        self.gate = threading.Event()

    def warm_up(self) -> float:
        self.gate.wait(60)
        return 1234.0


def test_a_page_opened_while_the_server_warms_up_says_so_then_shows_the_note(browser, folder):
    """The warm-up note was shown only to a page that connected after the warm-up had
    finished; one opened meanwhile said nothing, even once it had."""
    engine = _WarmingUp()
    server, page = _stand_in_page(browser, engine, "warming", folder[0])
    try:
        assert httpx.get(server.url + "/v1/ottvid/info").json()["ready"] is False
        assert page["warmup"].inner_text() == "warming up…"
        engine.gate.set()
        page.tab.wait_for_function("() => document.getElementById('warmup').textContent === "
                                   "'warmed up at start in 1234 ms'")
        info = httpx.get(server.url + "/v1/ottvid/info").json()
        assert info["ready"] is True and info["warmup_ms"] == 1234.0
        assert page.unexpected_console() == []
    finally:
        engine.gate.set()
        page.close()
        server.stop()
