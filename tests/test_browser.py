"""BrowserTransform with Debian's headless Chromium on a page served from 127.0.0.1."""

from __future__ import annotations

import functools
import http.server
import threading

import pytest

from llmrl_core.envs.chat_env import ChatEnv
from llmrl_core.tools.browser import BrowserTransform
from llmrl_core.tools.browser_cdp import find_chromium, host_allowed

INDEX = """<html><head><title>Home</title></head><body>
<h1>Welcome</h1><p id="msg">The secret number is 17.</p>
<a href="/next.html">Next page</a>
<a href="http://example.com/">Outside</a>
<button onclick="document.getElementById('msg').innerText = 'Button pressed'">Press</button>
<img src="http://198.51.100.7/pixel.png">
</body></html>"""
NEXT = "<html><head><title>Next</title></head><body><p>You reached page two.</p></body></html>"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "index.html").write_text(INDEX)
    (root / "next.html").write_text(NEXT)

    class QuietHandler(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(QuietHandler, directory=root))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


@pytest.fixture(scope="module")
def browser_env():
    if find_chromium() is None:
        pytest.fail("Chromium is missing: apt-get update && apt-get install -y chromium")
    transform = BrowserTransform(timeout=30)
    env = ChatEnv(batch_size=1, system_prompt="Browse.")
    env.append_transform(transform)
    yield env, transform
    transform.close()


def call(action: dict) -> str:
    import json

    return f"<tool_call>{json.dumps({'name': 'browser', 'arguments': action})}</tool_call>"


def last_tool(out) -> str:
    message = out["history", "prompt"][0][-1]
    assert message.role == "tool"
    return message.content


def test_host_allow_list():
    loop = ("127.0.0.1", "localhost", "::1")
    assert host_allowed("http://127.0.0.1:8000/x", loop) and host_allowed("http://[::1]:80/", loop)
    assert host_allowed("http://localhost/", loop) and host_allowed("about:blank", loop)
    assert not host_allowed("http://127.0.0.1.evil.com/", loop)
    assert not host_allowed("http://example.com/", loop) and not host_allowed("file:///etc/passwd", loop)
    assert host_allowed("https://docs.example.com/a", ("example.com",))
    assert not host_allowed("https://notexample.com/", ("example.com",))


def test_round_trip_navigate_read_click(browser_env, site):
    env, transform = browser_env
    env.reset(["look at the site"])
    out = env.step([call({"action": "navigate", "url": site + "/"})])
    text = last_tool(out)
    assert text.startswith("Tool browser executed successfully:\nURL: " + site + "/")
    assert "Title: Home" in text and "The secret number is 17." in text
    out = env.step([call({"action": "click", "text": "Press"})])
    assert "Button pressed" in last_tool(out)
    out = env.step([call({"action": "read", "selector": "#msg"})])
    assert last_tool(out) == "Tool browser executed successfully:\nButton pressed"
    out = env.step(['<tool name="browser">{"action": "click", "selector": "a[href=\\"/next.html\\"]"}</tool>'])
    assert "URL: " + site + "/next.html" in last_tool(out) and "You reached page two." in last_tool(out)
    assert out["info"][0]["num_tool_calls"] == 4
    assert any("198.51.100.7" in url for url in transform._browser.blocked)  # the image of another host


def test_disallowed_domains_are_refused(browser_env, site):
    env, transform = browser_env
    env.reset(["try to leave"])
    out = env.step([call({"action": "navigate", "url": "http://example.com/"})])
    assert last_tool(out).startswith("Tool browser failed:\nrefused: 'http://example.com/'")
    out = env.step([call({"action": "navigate", "url": "file:///etc/passwd"})])
    assert "refused" in last_tool(out)
    env.step([call({"action": "navigate", "url": site + "/"})])
    out = env.step([call({"action": "click", "text": "Outside"})])
    assert last_tool(out).startswith("Tool browser failed:") and "example.com" in last_tool(out)
    assert "allow-list" in last_tool(out)
    out = env.step([call({"action": "fly"})])
    assert "unknown action 'fly'" in last_tool(out)


def test_a_partial_reset_blanks_only_the_reset_slots_page(site):
    """One tab per env slot: resetting slot 0 alone leaves slot 1 where it was; the list calls' rows map to their
    slots (slot 0 ended, so slot 1 is row 0 of the step's data)."""
    from llmrl_core.envs.transforms.tools import ToolTransformBase

    transform = BrowserTransform(timeout=30)
    try:
        assert isinstance(transform, ToolTransformBase)
        env = ChatEnv(batch_size=2).append_transform(transform)
        env.reset(["one", "two"])
        out = env.step([call({"action": "navigate", "url": site + "/next.html"})] * 2)
        assert [c["name"] for c in out["info"][1]["tool_calls"]] == ["browser"]
        env.reset_slots([0], ["again"])
        out = env.step([call({"action": "read"})] * 2)
        texts = [out["history", "prompt"][i][-1].content for i in range(out.batch_size[0])]
        assert "URL: about:blank" in texts[0] and "You reached page two." in texts[1]
        env.slots[0].terminate()
        out = env.step([None, call({"action": "read"})])
        assert "You reached page two." in out["history", "prompt"][1][-1].content
    finally:
        transform.close()


def test_reset_gives_a_blank_page(browser_env, site):
    env, _ = browser_env
    env.reset(["one"])
    env.step([call({"action": "navigate", "url": site + "/next.html"})])
    env.reset(["two"])
    out = env.step([call({"action": "read"})])
    assert "URL: about:blank" in last_tool(out)


def test_dead_proxy_blocks_traffic_that_interception_does_not_see():
    """Second layer: a tab without request interception still cannot reach a host off the allow-list."""
    from llmrl_core.tools.browser_cdp import ChromiumBrowser

    browser = ChromiumBrowser()
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for url in ("http://example.com/", "http://198.51.100.7/"):
            reply = browser.send("Page.navigate", {"url": url}, session)
            assert reply.get("errorText") == "net::ERR_PROXY_CONNECTION_FAILED", (url, reply)
    finally:
        browser.close()


def test_torchrl_arguments_and_the_loopback_default():
    # TorchRL: (allowed_domains, headless, timeout, tokenizer, tool_name); building starts no browser
    transform = BrowserTransform(None, True, 12.0, "tok", "observation")
    assert transform.allowed_domains == ("127.0.0.1", "localhost", "::1")  # None: loopback only (not "all")
    assert transform.headless and transform.timeout == 12.0 and transform.tokenizer == "tok"
    assert transform.tool_role == transform.tool_name == "observation"
    assert BrowserTransform(["example.org"], tool_role="tool").allowed_domains == ("example.org",)
    with pytest.raises(ValueError, match="headless=False is not supported"):
        BrowserTransform(None, False)
    with pytest.raises(ValueError, match="at least one host"):
        BrowserTransform([])
