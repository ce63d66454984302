"""Drive a headless system Chromium over the DevTools protocol (CDP), with a domain allow-list.

No browser is downloaded: this uses Debian's ``chromium`` (``apt-get install chromium``) and the
``websockets`` client that is already a dependency of the stack. One :class:`ChromiumBrowser` is one
Chromium process; :meth:`ChromiumBrowser.new_page` opens a tab (a CDP target, flat session mode).

Where a page may go is enforced twice:

1. every request of every tab pauses in the CDP ``Fetch`` domain and is failed (``BlockedByClient``)
   unless its host is allowed: navigations, redirects, sub-resources, form posts, clicks on links;
2. Chromium itself starts with a dead proxy (``127.0.0.1:9``) for every host except the allowed ones
   (``--proxy-bypass-list``), so traffic from anything CDP does not see (a popup, a service worker)
   fails too. Loopback is never proxied by Chromium, which is why the default allow-list is loopback.

Hosts match exactly or as a subdomain of an entry (``example.com`` allows ``docs.example.com``).
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import subprocess
import tempfile
import time
import weakref
from collections.abc import Sequence
from typing import Any
from urllib.parse import urlsplit

LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "::1")
_LIVE: weakref.WeakSet[ChromiumBrowser] = weakref.WeakSet()


class BrowserError(RuntimeError):
    """Chromium could not be started, or the connection to it broke (the message says which)."""


def find_chromium() -> str | None:
    """The system Chromium binary (``chromium``, ``chromium-browser`` or ``google-chrome``), if any."""
    for name in ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable"):
        path = shutil.which(name)
        if path:
            return path
    return None


def host_allowed(url: str, allowed: Sequence[str]) -> bool:
    """Whether ``url`` is ``about:blank``/``data:`` or http(s) to an allowed host (or a subdomain of one)."""
    if url in ("about:blank",) or url.startswith("data:"):
        return True
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return False
    host = parts.hostname.lower().rstrip(".")
    return any(host == entry or host.endswith("." + entry) for entry in (a.lower().strip("[]") for a in allowed))


class ChromiumBrowser:
    """One headless Chromium process and its CDP connection (use from one thread at a time)."""

    def __init__(
        self,
        allowed_domains: Sequence[str] = LOOPBACK_HOSTS,
        binary: str | None = None,
        start_timeout: float = 30.0,
        extra_args: Sequence[str] = (),
    ) -> None:
        from websockets.sync.client import connect

        self.allowed_domains = tuple(allowed_domains)
        self.binary = binary or find_chromium()
        if self.binary is None:
            raise BrowserError("no Chromium found: install it with `apt-get install -y chromium`")
        self.blocked: list[str] = []
        self._profile = tempfile.mkdtemp(prefix="llmrl-chromium-")
        bypass = ";".join(d for entry in self.allowed_domains for d in (entry, f"*.{entry}"))
        args = [
            self.binary,
            "--headless",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--disable-extensions",
            "--no-first-run",
            "--no-default-browser-check",
            "--mute-audio",
            f"--user-data-dir={self._profile}",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
            "--proxy-server=http://127.0.0.1:9",
            f"--proxy-bypass-list={bypass}",
            *extra_args,
            "about:blank",
        ]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium's own sandbox refuses to run as root
        self._stderr = tempfile.TemporaryFile(prefix="llmrl-chromium-stderr-")
        self._proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=self._stderr, start_new_session=True)
        endpoint = self._wait_for_endpoint(start_timeout)
        self._ws = connect(endpoint, max_size=64 << 20, open_timeout=start_timeout)
        self._next_id = 0
        self._events: list[dict[str, Any]] = []
        _LIVE.add(self)

    def _wait_for_endpoint(self, timeout: float) -> str:
        port_file = os.path.join(self._profile, "DevToolsActivePort")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                self._stderr.seek(0)
                err = self._stderr.read().decode(errors="replace")[-1500:]
                self.close()
                raise BrowserError(f"Chromium exited at start (status {self._proc.returncode}):\n{err}")
            try:
                with open(port_file) as fh:
                    port, path = fh.read().split()
                return f"ws://127.0.0.1:{port}{path}"
            except (OSError, ValueError):
                time.sleep(0.05)
        self.close()
        raise BrowserError(f"Chromium did not open its DevTools port within {timeout:g} s")

    # --- protocol --------------------------------------------------------------------------------
    def _raw_send(self, method: str, params: dict[str, Any] | None, session: str | None) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        try:
            self._ws.send(json.dumps(message))
        except Exception as exc:  # noqa: BLE001 (any transport failure means the browser is gone)
            raise BrowserError(f"lost the connection to Chromium: {exc}") from exc
        return self._next_id

    def _recv(self, timeout: float) -> dict[str, Any] | None:
        try:
            raw = self._ws.recv(timeout=max(timeout, 0.001))
        except TimeoutError:
            return None
        except Exception as exc:  # noqa: BLE001
            raise BrowserError(f"lost the connection to Chromium: {exc}") from exc
        message = json.loads(raw)
        if message.get("method") == "Fetch.requestPaused":
            self._gate_request(message)
            return message
        if "method" in message:
            self._events.append(message)
        return message

    def _gate_request(self, event: dict[str, Any]) -> None:
        params, session = event["params"], event.get("sessionId")
        url = params["request"]["url"]
        if host_allowed(url, self.allowed_domains):
            self._raw_send("Fetch.continueRequest", {"requestId": params["requestId"]}, session)
        else:
            self.blocked.append(url)
            self._raw_send(
                "Fetch.failRequest", {"requestId": params["requestId"], "errorReason": "BlockedByClient"}, session
            )

    def send(
        self, method: str, params: dict[str, Any] | None = None, session: str | None = None, timeout: float = 30.0
    ):
        """Send one CDP command and return its result (raises BrowserError on a protocol error or timeout)."""
        request_id = self._raw_send(method, params, session)
        deadline = time.monotonic() + timeout
        while (left := deadline - time.monotonic()) > 0:
            message = self._recv(left)
            if message is not None and message.get("id") == request_id:
                if "error" in message:
                    raise BrowserError(f"{method}: {message['error'].get('message', message['error'])}")
                return message.get("result", {})
        raise BrowserError(f"{method}: no answer from Chromium within {timeout:g} s")

    def wait_event(self, method: str, session: str | None, timeout: float, since: int = 0) -> dict[str, Any] | None:
        """The first ``method`` event of ``session`` from log index ``since`` on, waiting up to ``timeout``."""
        deadline = time.monotonic() + timeout
        while True:
            for event in self._events[since:]:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            self._recv(min(left, 0.1))

    def pump(self, seconds: float) -> None:
        """Process incoming messages (request gating, events) for ``seconds``."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self._recv(left)

    @property
    def event_count(self) -> int:
        """Number of events seen so far (a marker for :meth:`wait_event`)."""
        return len(self._events)

    # --- pages -----------------------------------------------------------------------------------
    def new_page(self) -> str:
        """Open a blank tab with request gating on; returns its CDP session id."""
        target = self.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        self.send("Page.enable", session=session)
        self.send("Fetch.enable", {"patterns": [{"urlPattern": "*", "requestStage": "Request"}]}, session=session)
        return session

    def close_page(self, session: str) -> None:
        """Close the tab behind ``session``."""
        try:
            info = self.send("Target.getTargetInfo", session=session, timeout=5)
            self.send("Target.closeTarget", {"targetId": info["targetInfo"]["targetId"]}, timeout=5)
        except BrowserError:
            pass

    @property
    def alive(self) -> bool:
        """Whether the Chromium process is running."""
        return self._proc.poll() is None

    def close(self) -> None:
        """Stop Chromium and delete its profile directory."""
        ws = getattr(self, "_ws", None)
        if ws is not None:
            try:
                ws.close()
            except Exception:  # noqa: BLE001 (best effort)
                pass
        _LIVE.discard(self)
        if self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, 9)
            except OSError:
                pass
            self._proc.wait(timeout=10)
        self._stderr.close()
        shutil.rmtree(self._profile, ignore_errors=True)


@atexit.register
def _close_live_browsers() -> None:
    """At interpreter exit, stop Chromium processes nobody closed (they run in their own session)."""
    for browser in list(_LIVE):
        browser.close()
