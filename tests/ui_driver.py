"""A small page driver over llmrl's own headless-Chromium CDP client, for tests of the web UIs.

It waits on conditions evaluated in the page (never on fixed sleeps alone), clicks elements found by
their visible text, types like a user (focus + ``Input.insertText``), and takes screenshots.
"""

from __future__ import annotations

import base64
import json
import time
from pathlib import Path
from typing import Any

from llmrl_core.tools.browser_cdp import ChromiumBrowser


class PageDriver:
    """One tab of a :class:`ChromiumBrowser`, driven by JavaScript conditions and clicks."""

    def __init__(self, browser: ChromiumBrowser, width: int = 1400, height: int = 1000) -> None:
        self.browser = browser
        self.session = browser.new_page()
        browser.send("Runtime.enable", session=self.session)
        browser.send(
            "Emulation.setDeviceMetricsOverride",
            {"width": width, "height": height, "deviceScaleFactor": 1, "mobile": False},
            session=self.session,
        )

    def goto(self, url: str) -> None:
        """Navigate and wait for the load event."""
        since = self.browser.event_count
        self.browser.send("Page.navigate", {"url": url}, session=self.session)
        self.browser.wait_event("Page.loadEventFired", self.session, timeout=60, since=since)

    def eval(self, expression: str) -> Any:
        """The value of a JavaScript expression in the page (promises awaited)."""
        reply = self.browser.send(
            "Runtime.evaluate",
            {"expression": expression, "returnByValue": True, "awaitPromise": True},
            session=self.session,
        )
        if "exceptionDetails" in reply:
            raise AssertionError(f"page script failed: {reply['exceptionDetails'].get('text')} in {expression[:200]}")
        return reply.get("result", {}).get("value")

    def text(self) -> str:
        """The visible text of the page."""
        return self.eval("document.body ? document.body.innerText : ''") or ""

    def wait_for(self, expression: str, timeout_s: float = 60.0, what: str = "") -> Any:
        """Wait until ``expression`` is truthy in the page; fail with the page text when it never is.

        The value crosses over as JSON: write ``!!el`` for an element (an element arrives as an empty dict)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            value = self.eval(expression)
            if value:
                return value
            self.browser.pump(0.5)
        raise AssertionError(
            f"timed out after {timeout_s:.0f} s waiting for {what or expression}; page:\n{self.text()[:3000]}"
        )

    def wait_text(self, needle: str, timeout_s: float = 60.0) -> None:
        """Wait until ``needle`` is in the visible text."""
        self.wait_for(
            f"document.body && document.body.innerText.includes({json.dumps(needle)})", timeout_s, repr(needle)
        )

    def click_text(self, label: str, selector: str = "button, a, [role=button], [role=tab], [role=menuitem]") -> None:
        """Click the first (innermost) visible element matching ``selector`` whose text is ``label`` (trimmed)."""
        script = f"""(() => {{
            const want = {json.dumps(label)};
            const hits = [...document.querySelectorAll({json.dumps(selector)})].filter(
                e => e.innerText && e.innerText.trim() === want && e.offsetParent !== null);
            const found = hits.find(e => !hits.some(h => h !== e && e.contains(h)));  // the innermost
            if (!found) return false;
            found.scrollIntoView({{block: 'center'}});
            found.click();
            return true;
        }})()"""
        self.wait_for(script, 30, f"a clickable {label!r}")

    def type_into(self, selector: str, text: str) -> None:
        """Replace the value of the input found by ``selector`` as a user would (select all, type)."""
        self.wait_for(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)}); if (!e) return false; "
            "e.scrollIntoView({block: 'center'}); e.focus(); e.select && e.select(); return true; })()",
            30,
            f"input {selector}",
        )
        self.browser.send("Input.insertText", {"text": text}, session=self.session)

    def set_field(self, label: str, value: str) -> None:
        """Type ``value`` into the Prefect run-form field whose label starts with ``label`` (e.g. "iterations")."""
        mark = f"field-{abs(hash(label))}"
        self.wait_for(
            f"""(() => {{
                const prop = [...document.querySelectorAll('.schema-form-property')].find(p => {{
                    const l = p.querySelector('.schema-form-property__label');
                    return l && l.innerText.trim().split(' ')[0] === {json.dumps(label)}; }});
                const input = prop && prop.querySelector('input, textarea');
                if (!input) return false;
                input.setAttribute('data-llmrl-field', {json.dumps(mark)});
                return true; }})()""",
            30,
            f"the form field {label!r}",
        )
        got = None
        for _ in range(3):  # a long form re-renders while it settles: a keystroke can land before the focus does
            self.type_into(f"[data-llmrl-field={mark}]", value)
            got = self.eval(f"document.querySelector('[data-llmrl-field={mark}]').value")
            if str(got) == value:
                return
            time.sleep(1)
        raise AssertionError(f"field {label!r} holds {got!r} after typing {value!r}")

    def screenshot(self, path: Path) -> Path:
        """Save a PNG of the viewport."""
        data = self.browser.send("Page.captureScreenshot", {"format": "png"}, session=self.session)["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path
