"""``BrowserTransform``: a headless-browser tool for the model: navigate, read the page text, click, type.

The model calls the tool ``browser`` with the call syntax of :mod:`llmrl_core.tools.tool_calls` and
TorchRL's argument shape, e.g.::

    <tool_call>{"name": "browser", "arguments": {"action": "navigate", "url": "http://127.0.0.1:8000/"}}</tool_call>
    <tool name="browser">{"action": "click", "text": "Next page"}</tool>

Actions: ``navigate`` (``url``), ``read`` / ``extract`` (optional ``selector``), ``click`` (``selector`` or
the visible ``text`` of a link/button), ``type`` (``selector``, ``text``). Each call adds one ``tool``
message, "Tool browser executed successfully:\\n<url, title, page text>" or "Tool browser failed:\\n<why>".

Where the browser may go is an allow-list of domains, loopback only by default; a refused URL is
reported to the model. Enforcement (request interception plus a dead proxy for every other host) is in
:mod:`llmrl_core.tools.browser_cdp`. One Chromium process serves the transform, with one tab per env slot;
a slot's reset closes its tab (a fresh page, no history; other slots' pages stay), and a crashed browser is
restarted. It is TorchRL's tool transform (a :class:`~llmrl_core.envs.transforms.tool_calls.ToolTransformBase`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from tensordict import TensorDictBase

from llmrl_core.envs.transforms.tool_calls import ToolTransformBase
from llmrl_core.tools.browser_cdp import LOOPBACK_HOSTS, BrowserError, ChromiumBrowser, host_allowed
from llmrl_core.tools.tool_calls import ToolCall, ToolCallFormat, parse_tool_calls

_PAGE_SUMMARY = "({url: location.href, title: document.title, text: document.body ? document.body.innerText : ''})"
_CLICK = """(() => {
  const sel = %s, txt = %s;
  let el = null;
  if (sel) { el = document.querySelector(sel); }
  else {
    const all = Array.from(document.querySelectorAll(
      'a, button, input[type=submit], input[type=button], [role=button], [onclick]'));
    const label = c => (c.innerText || c.value || '').trim();
    el = all.find(c => label(c) === txt) || all.find(c => label(c).includes(txt)) || null;
  }
  if (!el) return {found: false};
  el.scrollIntoView();
  el.click();
  return {found: true, tag: el.tagName.toLowerCase(), label: (el.innerText || el.value || '').trim().slice(0, 80)};
})()"""
_TYPE = """(() => {
  const el = document.querySelector(%s);
  if (!el) return false;
  el.focus(); el.value = %s;
  el.dispatchEvent(new Event('input', {bubbles: true})); el.dispatchEvent(new Event('change', {bubbles: true}));
  return true;
})()"""
_READ_SELECTOR = "(() => { const el = document.querySelector(%s); return el ? el.innerText : null; })()"


class ToolFailure(Exception):
    """A browser action that could not be done (the message is shown to the model)."""


class BrowserTransform(ToolTransformBase):
    """Run ``browser`` tool calls from the assistant's message in headless Chromium; append the results.

    The first five arguments are TorchRL's, in its order; the others are llmrl's (keyword-only).

    Args:
        allowed_domains: hosts the browser may load (and their subdomains). ``None`` (the default, as in
            TorchRL) means loopback only (``127.0.0.1``, ``localhost``, ``::1``), unlike TorchRL where it allows
            every domain: model-written browsing must not reach the internet unless hosts are named. An empty
            list raises ``ValueError``.
        headless: must be True (TorchRL's default): llmrl only runs Chromium headless; False raises ``ValueError``.
        timeout: seconds per action (page loads included).
        tokenizer: accepted and stored as in TorchRL (which does not use it either).
        tool_name: role of the result messages (TorchRL's name for it); ``tool_role`` overrides it.
        max_chars: page text kept per result. tool_call_format: ``"auto"``, ``"json"`` or ``"xml"``.
        binary: the Chromium executable (found on PATH by default).

    The model calls the tool by the name in ``browser_tool_name`` (``"browser"``).
    """

    use_step = True
    browser_tool_name = "browser"

    def __init__(
        self,
        allowed_domains: Sequence[str] | None = None,
        headless: bool = True,
        timeout: float = 30.0,
        tokenizer: Any = None,
        tool_name: str = "tool",
        *,
        max_chars: int = 4000,
        tool_role: str | None = None,
        tool_call_format: ToolCallFormat = "auto",
        binary: str | None = None,
    ) -> None:
        super().__init__()
        if allowed_domains is None:
            allowed_domains = LOOPBACK_HOSTS
        if not allowed_domains:
            raise ValueError("allowed_domains must name at least one host (None: loopback only)")
        if not headless:
            raise ValueError("BrowserTransform: headless=False is not supported; llmrl runs Chromium headless only")
        self.allowed_domains = tuple(allowed_domains)
        self.headless = headless
        self.timeout = timeout
        self.tokenizer = tokenizer
        self.max_chars = max_chars
        self.tool_role = tool_role if tool_role is not None else tool_name
        self.tool_call_format: ToolCallFormat = tool_call_format
        self.binary = binary
        self._browser: ChromiumBrowser | None = None
        self._pages: dict[int, str] = {}

    @property
    def tool_name(self) -> str:
        """TorchRL's name for the role of the result messages (the same as ``tool_role``)."""
        return self.tool_role

    # --- browser and pages -----------------------------------------------------------------------
    def _ensure_browser(self) -> ChromiumBrowser:
        if self._browser is None or not self._browser.alive:
            self._drop_browser()
            self._browser = ChromiumBrowser(self.allowed_domains, binary=self.binary, start_timeout=self.timeout)
        return self._browser

    def _page(self, slot_index: int) -> tuple[ChromiumBrowser, str]:
        browser = self._ensure_browser()
        if slot_index not in self._pages:
            self._pages[slot_index] = browser.new_page()
        return browser, self._pages[slot_index]

    def _drop_browser(self) -> None:
        if self._browser is not None:
            self._browser.close()
        self._browser, self._pages = None, {}

    def _reset(self, tensordict: TensorDictBase, tensordict_reset: TensorDictBase) -> TensorDictBase:
        """Close the tabs of the slots starting new episodes (every row, or those TorchRL's ``"_reset"`` entry
        marks): each episode starts on a blank page; other slots keep theirs."""
        for slot in self._reset_slots(tensordict, tensordict_reset):
            session = self._pages.pop(slot, None)
            if session is not None and self._browser is not None:
                self._browser.close_page(session)
        return tensordict_reset

    def close(self) -> None:
        """Stop Chromium."""
        self._drop_browser()

    def __del__(self) -> None:
        try:
            self.close()
        except Exception:  # noqa: BLE001 (interpreter shutdown)
            pass

    # --- actions ---------------------------------------------------------------------------------
    def _eval(self, browser: ChromiumBrowser, session: str, expression: str) -> Any:
        reply = browser.send(
            "Runtime.evaluate", {"expression": expression, "returnByValue": True}, session, timeout=self.timeout
        )
        if "exceptionDetails" in reply:
            raise ToolFailure(f"page script error: {reply['exceptionDetails'].get('text', 'exception')}")
        return reply.get("result", {}).get("value")

    def _summary(self, browser: ChromiumBrowser, session: str, prefix: str = "") -> str:
        page = self._eval(browser, session, _PAGE_SUMMARY) or {}
        text = str(page.get("text", ""))
        if len(text) > self.max_chars:
            text = text[: self.max_chars] + f"\n[page text truncated: {len(text)} characters in all]"
        return f"{prefix}URL: {page.get('url', '')}\nTitle: {page.get('title', '')}\n\n{text}"

    def _wait_load(self, browser: ChromiumBrowser, session: str, marker: int) -> None:
        if browser.wait_event("Page.loadEventFired", session, self.timeout, since=marker) is None:
            raise ToolFailure(f"the page did not finish loading within {self.timeout:g} s")

    def _blocked_since(self, browser: ChromiumBrowser, start: int) -> str:
        blocked = browser.blocked[start:]
        return f"refused by the domain allow-list: {', '.join(blocked[:3])}" if blocked else ""

    def _navigate(self, browser: ChromiumBrowser, session: str, args: dict[str, Any]) -> str:
        url = args.get("url")
        if not isinstance(url, str) or not url:
            raise ToolFailure("navigate needs a 'url' string")
        if not host_allowed(url, self.allowed_domains):
            raise ToolFailure(f"refused: {url!r} is not in the allowed domains {list(self.allowed_domains)}")
        marker, blocked = browser.event_count, len(browser.blocked)
        reply = browser.send("Page.navigate", {"url": url}, session, timeout=self.timeout)
        if reply.get("errorText"):
            note = self._blocked_since(browser, blocked)
            raise ToolFailure(f"could not load {url}: {reply['errorText']}" + (f" ({note})" if note else ""))
        self._wait_load(browser, session, marker)
        return self._summary(browser, session)

    def _click(self, browser: ChromiumBrowser, session: str, args: dict[str, Any]) -> str:
        selector, text = args.get("selector"), args.get("text")
        if not selector and not text:
            raise ToolFailure("click needs a 'selector' or the 'text' of a link or button")
        marker, blocked = browser.event_count, len(browser.blocked)
        found = self._eval(browser, session, _CLICK % (json.dumps(selector or ""), json.dumps(text or "")))
        if not found or not found.get("found"):
            raise ToolFailure(f"nothing to click matches {selector or text!r}")
        started = browser.wait_event("Page.frameStartedLoading", session, 0.5, since=marker)
        if started is not None:
            self._wait_load(browser, session, marker)
        note = self._blocked_since(browser, blocked)
        if note:
            raise ToolFailure(f"clicked {found.get('label')!r}, but the page it leads to was {note}")
        return self._summary(browser, session, prefix=f"Clicked <{found.get('tag')}> {found.get('label')!r}.\n")

    def _read(self, browser: ChromiumBrowser, session: str, args: dict[str, Any]) -> str:
        selector = args.get("selector")
        if not selector:
            return self._summary(browser, session)
        text = self._eval(browser, session, _READ_SELECTOR % json.dumps(selector))
        if text is None:
            raise ToolFailure(f"no element matches {selector!r}")
        return str(text)[: self.max_chars]

    def _type(self, browser: ChromiumBrowser, session: str, args: dict[str, Any]) -> str:
        selector, text = args.get("selector"), args.get("text")
        if not selector or not isinstance(text, str):
            raise ToolFailure("type needs a 'selector' and a 'text'")
        if not self._eval(browser, session, _TYPE % (json.dumps(selector), json.dumps(text))):
            raise ToolFailure(f"no element matches {selector!r}")
        return f"Typed {len(text)} characters into {selector!r}."

    def run_action(self, slot_index: int, args: dict[str, Any]) -> tuple[bool, str]:
        """Do one browser action for a slot; returns (ok, text). Never raises."""
        actions = {"navigate": self._navigate, "click": self._click, "read": self._read, "extract": self._read}
        actions["type"] = self._type
        action = args.get("action")
        if action not in actions:
            return False, f"unknown action {action!r}; use one of {sorted(actions)}"
        try:
            browser, session = self._page(slot_index)
            return True, actions[action](browser, session, args)
        except ToolFailure as exc:
            return False, str(exc)
        except BrowserError as exc:
            self._drop_browser()
            return False, f"the browser failed ({exc}); it will be restarted"

    def _browser_calls(self, text: str) -> list[ToolCall]:
        calls = []
        for call in parse_tool_calls(text, self.tool_call_format):
            if call.tool == self.browser_tool_name:
                calls.append(call)
            elif call.tool.startswith(self.browser_tool_name + "."):  # browser.navigate {"url": ...}
                call.args = {"action": call.tool.split(".", 1)[1], **call.args}
                calls.append(call)
        return calls

    def _process_batch_item(self, content: str, index: int) -> list[str] | None:
        """Run the browser calls of one row's answer, in order, in its slot's tab: one message per call."""
        messages = []
        for call in self._browser_calls(content):
            ok, text = (False, call.error) if call.error else self.run_action(self._slot_of(index), call.args)
            verdict = "executed successfully" if ok else "failed"
            message = f"Tool {self.browser_tool_name} {verdict}:\n{text}"
            messages.append(message)
            self._record_call(index, self.browser_tool_name, call.args, message, not ok)
        return messages or None

    def __repr__(self) -> str:
        return f"BrowserTransform(allowed_domains={list(self.allowed_domains)})"
