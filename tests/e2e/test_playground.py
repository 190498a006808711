"""The web playground at `/` (server/playground/), in a real browser: Debian's headless Chromium
driven by selenium through Debian's chromedriver (scripts/setup.sh installs both).

One chat streams into the page with parameters changed in the form, and the request the page sent
(caught by wrapping window.fetch) carries them; token probabilities show on hover; the metrics
charts move. With API keys the page loads, asks for a key and works with it, while the API stays
401 without one. With http.playground off, `/` is the 404 it always was. Screenshots (wide and
narrow) go to $FATHOM_BUILD/test-artefacts/ and their paths are printed.
"""
import json
import re
import shutil
import time

import pytest
import requests

from server_fixture import ServerProcess

KEY = "pg-test-key"
WAIT_S = 30  # a bound for waits that normally end in well under a second


@pytest.fixture(scope="module")
def open_server(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path) as s:
        yield s
    assert s.returncode == 0, s.stderr


@pytest.fixture(scope="module")
def keyed_server(fathom_bin, smollm2_path):
    with ServerProcess(fathom_bin, smollm2_path, extra_args=["--api-key", KEY]) as s:
        yield s
    assert s.returncode == 0, s.stderr


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    chromium, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not (chromium and driver):
        pytest.fail("chromium and chromium-driver (Debian packages) are needed: run make setup", pytrace=False)
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                "--window-size=1360,900", "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    d = webdriver.Chrome(service=Service(driver), options=options)
    d.set_script_timeout(WAIT_S)
    yield d
    d.quit()


@pytest.fixture(scope="module")
def artefacts(build_dir):
    d = build_dir / "test-artefacts"
    d.mkdir(parents=True, exist_ok=True)
    return d


def wait_for(predicate, what, timeout=WAIT_S):
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


def by_id(d, element_id):
    return d.find_element("id", element_id)


def set_field(d, element_id, value):
    field = by_id(d, element_id)
    field.clear()
    field.send_keys(value)


# Wraps window.fetch so the test sees every request body and header the page sends.
RECORD_FETCH = """
window.__sent = [];
const real = window.fetch;
window.fetch = (url, init) => {
  window.__sent.push({url: String(url), method: (init && init.method) || "GET",
                      headers: (init && init.headers) || {}, body: init && init.body});
  return real(url, init);
};
"""

# Records the answer's text each time the DOM under #log changes: several growing snapshots
# mean the text arrived in pieces (streamed), not in one response at the end.
WATCH_LOG = """
window.__snapshots = [];
new MutationObserver(() => {
  const t = document.querySelector('.msg.assistant .choice .text');
  if (t) window.__snapshots.push(t.textContent.length);
}).observe(document.getElementById('log'), {childList: true, subtree: true, characterData: true});
"""


def severe_console_errors(d):
    # CSP violations and script errors land here; favicon and the like are not expected either.
    return [e for e in d.get_log("browser") if e["level"] == "SEVERE"]


def no_horizontal_overflow(d):
    return d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")


def chat_posts(d):
    return [s for s in d.execute_script("return window.__sent") if s["url"].endswith("/v1/chat/completions")]


def test_page_streams_a_chat_with_the_settings_and_charts_the_metrics(open_server, browser, artefacts, capsys):
    d = browser
    d.set_window_size(1360, 900)
    d.get(open_server.base_url + "/")
    wait_for(lambda: not by_id(d, "send").get_attribute("disabled"), "the page to find the model")
    assert "smollm2" in by_id(d, "model").text
    assert not by_id(d, "key-form").is_displayed()  # no keys on this server: no key field
    d.execute_script(RECORD_FETCH + WATCH_LOG)

    set_field(d, "system", "You are a poet.")
    set_field(d, "temperature", "0.7")
    set_field(d, "max_tokens", "160")  # a second or so of tokens: many network chunks, even when starved
    set_field(d, "seed", "11")
    set_field(d, "stop", "zebra")
    by_id(d, "prompt").send_keys("Write a haiku about the sea.")
    by_id(d, "send").click()

    stats = wait_for(lambda: "finish:" in by_id(d, "log").text and by_id(d, "cancel").get_attribute("disabled")
                     and d.find_element("css selector", ".msg.assistant .stats").text, "the answer to finish")
    answer = d.find_element("css selector", ".msg.assistant .choice .text").get_attribute("textContent")
    assert answer.strip(), stats
    snapshots = d.execute_script("return window.__snapshots")
    growing = sorted(set(n for n in snapshots if n > 0))
    assert len(growing) >= 3, f"the text did not arrive in pieces: {snapshots}"

    # The request the page sent carries what the form said.
    posts = chat_posts(d)
    assert len(posts) == 1 and posts[0]["method"] == "POST"
    sent = json.loads(posts[0]["body"])
    assert sent["temperature"] == 0.7 and sent["max_tokens"] == 160 and sent["seed"] == 11, sent
    assert sent["stop"] == ["zebra"] and sent["stream"] is True and sent["logprobs"] is True, sent
    assert sent["messages"] == [{"role": "system", "content": "You are a poet."},
                                {"role": "user", "content": "Write a haiku about the sea."}], sent
    assert json.loads(by_id(d, "last-request").get_attribute("textContent")) == sent
    # max_tokens held: 160 tokens cut by the limit, or fewer when the model ended on its own.
    count = int(re.search(r"(\d+) tokens", stats).group(1))
    assert (count == 160 and "finish: length" in stats) or (count < 160 and "finish: stop" in stats), stats

    # Each token carries its probability: pointing at one shows the tooltip with alternatives.
    from selenium.webdriver.common.action_chains import ActionChains
    tokens = d.find_elements("css selector", ".msg.assistant .tok")
    assert len(tokens) >= 10, len(tokens)
    ActionChains(d).move_to_element(tokens[2]).perform()
    tip = wait_for(lambda: by_id(d, "tip").is_displayed() and by_id(d, "tip"), "the token tooltip")
    assert "p =" in tip.text and "%" in tip.text, tip.text
    assert len(tip.find_elements("css selector", "tr")) >= 2, tip.text  # the top_logprobs alternatives

    # From the keyboard: an answer takes focus and the arrow keys walk its tokens, announced.
    from selenium.webdriver.common.keys import Keys
    d.find_element("css selector", ".msg.assistant .choice .text").send_keys(Keys.ARROW_RIGHT, Keys.ARROW_RIGHT)
    assert "probability" in wait_for(lambda: by_id(d, "announce").get_attribute("textContent"), "the announcement")

    # A second turn: two choices, a JSON schema and an attention policy; the history goes along.
    set_field(d, "n", "2")
    from selenium.webdriver.support.ui import Select
    Select(by_id(d, "attention")).select_by_value("dense")
    Select(by_id(d, "speculative")).select_by_value("ngram")
    set_field(d, "kv_read_ratio", "0.5")
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}}, "required": ["color"]}
    set_field(d, "schema", json.dumps(schema))
    by_id(d, "prompt").send_keys("Pick a color.")
    by_id(d, "send").click()
    wait_for(lambda: len(d.find_elements("css selector", ".msg.assistant .stats")) == 2
             and "finish:" in d.find_elements("css selector", ".msg.assistant .stats")[1].text, "the second answer")
    second = json.loads(chat_posts(d)[1]["body"])
    assert second["n"] == 2 and second["fathom"] == {"attention": "dense", "kv_read_ratio": 0.5,
                                                  "speculative": "ngram"}, second
    assert second["response_format"]["json_schema"]["schema"] == schema, second
    assert [m["role"] for m in second["messages"]] == ["system", "user", "assistant", "user"], second
    assert second["messages"][2]["content"] == answer, second["messages"][2]
    choices = d.find_elements("css selector", ".msg.assistant")[1].find_elements("css selector", ".choice .text")
    assert len(choices) == 2
    for c in choices:
        assert json.loads(c.get_attribute("textContent"))["color"] in ("red", "green", "blue"), c.text

    # The tokens/s chart shows the generation (a point above the baseline), polled from /metrics.
    def generated_line_rose():
        points = d.find_element("css selector", ".card polyline.s0").get_attribute("points").split()
        return any(float(p.split(",")[1]) < 46.5 for p in points)
    wait_for(generated_line_rose, "the tokens/s chart to show the generation", timeout=5)
    assert "Updated" in by_id(d, "metrics-status").text
    assert "generated:" in d.find_element("css selector", ".card .legend").text

    wide = artefacts / "playground-wide.png"
    d.save_screenshot(str(wide))
    d.set_window_size(390, 900)
    wait_for(lambda: no_horizontal_overflow(d), "the narrow layout to fit 390 px", timeout=5)
    narrow = artefacts / "playground-narrow.png"
    d.save_screenshot(str(narrow))
    d.set_window_size(1360, 900)
    with capsys.disabled():
        print(f"\nplayground screenshots: {wide} {narrow}")
    assert severe_console_errors(d) == []


def test_with_keys_the_page_asks_for_one_and_the_api_stays_closed(keyed_server, browser):
    base = keyed_server.base_url
    assert requests.get(base + "/", timeout=10).status_code == 200  # the page itself is open
    assert requests.get(base + "/v1/models", timeout=10).status_code == 401
    r = requests.post(base + "/v1/chat/completions", timeout=10,
                      json={"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2})
    assert r.status_code == 401 and r.json()["error"]["code"] == "invalid_api_key"
    assert requests.get(base + "/nope", timeout=10).status_code == 401  # unknown routes still need a key

    d = browser
    d.get(base + "/")
    wait_for(lambda: by_id(d, "key-form").is_displayed(), "the page to ask for a key")
    assert "needs an API key" in by_id(d, "status").text
    assert by_id(d, "send").get_attribute("disabled")
    set_field(d, "api-key", "wrong")
    d.find_element("css selector", "#key-form button").click()
    wait_for(lambda: "refused" in by_id(d, "status").text, "the wrong key to be refused")
    set_field(d, "api-key", KEY)
    d.find_element("css selector", "#key-form button").click()
    wait_for(lambda: not by_id(d, "send").get_attribute("disabled"), "the key to be accepted")
    d.execute_script(RECORD_FETCH)
    set_field(d, "max_tokens", "4")
    by_id(d, "prompt").send_keys("Hello")
    by_id(d, "send").click()
    wait_for(lambda: "finish:" in by_id(d, "log").text, "the answer")
    assert "4 tokens" in d.find_element("css selector", ".msg.assistant .stats").text
    post = chat_posts(d)[0]
    assert post["headers"].get("Authorization") == "Bearer " + KEY
    # The browser logs the refused calls (401) as errors; nothing else may be there.
    assert all("401" in e["message"] for e in severe_console_errors(d)), severe_console_errors(d)


def test_files_are_served_with_their_types_and_a_strict_policy(open_server):
    base = open_server.base_url
    page = requests.get(base + "/", timeout=10)
    assert page.status_code == 200 and page.headers["Content-Type"] == "text/html; charset=utf-8"
    csp = page.headers["Content-Security-Policy"]
    assert "default-src 'none'" in csp and "script-src 'self'" in csp and "unsafe" not in csp, csp
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Cache-Control"] == "no-cache"
    assert "<script>" not in page.text and "style=" not in page.text  # nothing inline for the CSP to allow
    total = len(page.content)
    for name, kind in (("app.js", "text/javascript"), ("app.css", "text/css"), ("icon.svg", "image/svg+xml"),
                       ("metrics.js", "text/javascript")):
        r = requests.get(f"{base}/playground/{name}", timeout=10)
        assert r.status_code == 200 and r.headers["Content-Type"].startswith(kind), (name, r.headers)
        assert r.headers["Content-Security-Policy"] == csp
        total += len(r.content)
    assert total < 200_000, total  # a few tens of KB: no framework
    for path in ("/playground/index.html", "/playground/", "/playground/../app.js", "/playground/nope.js", "/index.html"):
        assert requests.get(base + path, timeout=10).status_code == 404, path
    assert requests.post(base + "/", data="x", timeout=10).status_code == 404
    scrape = requests.get(base + "/metrics", timeout=10).text
    assert 'fathom_http_requests_total{route="/",status="200"}' in scrape
    assert 'fathom_http_requests_total{route="/playground/",status="200"}' in scrape


@pytest.mark.parametrize("switch", [{"extra_args": ["--no-playground"]}, {"env": {"FATHOM_HTTP__PLAYGROUND": "false"}}],
                         ids=["flag", "config"])
def test_switched_off_the_root_is_the_404_it_was(fathom_bin, smollm2_path, switch):
    with ServerProcess(fathom_bin, smollm2_path, **switch) as s:
        r = requests.get(s.base_url + "/", timeout=10)
        assert r.status_code == 404, r.text
        assert r.json()["error"]["message"] == "no route GET /" and r.json()["error"]["code"] == "not_found"
        assert requests.get(s.base_url + "/playground/app.js", timeout=10).status_code == 404
    assert s.returncode == 0, s.stderr
