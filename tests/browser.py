"""A real headless Chromium driven over the DevTools protocol (for the report's browser tests).

Debian's ``chromium`` is the browser (``ensure_chromium`` installs it with apt when it is missing;
nothing here downloads a browser or a driver of its own).  The protocol goes over a websocket with
``websocket-client`` (the ``test`` extra).  The browser's own endpoint is read from the
``DevToolsActivePort`` file it writes into its profile directory; one page target is attached in
flat session mode, and every event of that session is kept so tests can look at console messages,
exceptions and network requests.

Also a tiny command line, used to make the README's picture of the report:
``python tests/browser.py results/report.html docs/img/report_first_screen.png [WIDTH HEIGHT]``.
"""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

BROWSERS = ("chromium", "chromium-browser")


class BrowserError(RuntimeError):
    pass


def find_chromium() -> str | None:
    for name in BROWSERS:
        path = shutil.which(name)
        if path:
            return path
    return None


def ensure_chromium() -> str:
    """The chromium binary; installs Debian's ``chromium`` package with apt when it is missing."""
    path = find_chromium()
    if path:
        return path
    if shutil.which("apt-get") is None:
        raise BrowserError("chromium is not installed and there is no apt-get to install it")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for cmd in (["apt-get", "update"], ["apt-get", "install", "-y", "chromium"]):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
        if proc.returncode != 0:
            raise BrowserError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    path = find_chromium()
    if not path:
        raise BrowserError("apt-get installed chromium, but no chromium binary is on PATH")
    return path


class Chromium:
    """``with Chromium() as page: page.navigate(url); page.evaluate("1 + 1")``."""

    def __init__(self, binary: str | None = None, *, width: int = 1280, height: int = 900,
                 timeout: float = 60.0):
        self.binary = binary or ensure_chromium()
        self.width, self.height, self.timeout = width, height, timeout
        self.events: list[dict[str, Any]] = []
        self._ids = itertools.count(1)
        self._proc: subprocess.Popen | None = None
        self._profile: str | None = None
        self._ws = None
        self.session: str | None = None

    # --- lifecycle ---
    def __enter__(self) -> "Chromium":
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def start(self) -> None:
        import websocket  # websocket-client

        self._profile = tempfile.mkdtemp(prefix="longca-chromium-")
        args = [self.binary, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--disable-component-update",
                "--hide-scrollbars", "--mute-audio", "--remote-debugging-port=0",
                f"--user-data-dir={self._profile}", f"--window-size={self.width},{self.height}", "about:blank"]
        self._log = open(Path(self._profile) / "chromium.log", "w+")
        self._proc = subprocess.Popen(args, stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        port_file = Path(self._profile) / "DevToolsActivePort"
        deadline = time.monotonic() + self.timeout
        while not (port_file.exists() and len(port_file.read_text().splitlines()) >= 2):
            if self._proc.poll() is not None:
                raise BrowserError(f"chromium exited with {self._proc.returncode}: {self._tail()}")
            if time.monotonic() > deadline:
                raise BrowserError(f"chromium wrote no DevToolsActivePort in {self.timeout} s: {self._tail()}")
            time.sleep(0.05)
        port, path = port_file.read_text().splitlines()[:2]
        self._ws = websocket.create_connection(f"ws://127.0.0.1:{port}{path}", timeout=self.timeout,
                                               suppress_origin=True)
        target = self.send("Target.createTarget", {"url": "about:blank"}, session=None)["targetId"]
        self.session = self.send("Target.attachToTarget", {"targetId": target, "flatten": True},
                                 session=None)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.send(f"{domain}.enable")
        self.send("Emulation.setDeviceMetricsOverride",
                  {"width": self.width, "height": self.height, "deviceScaleFactor": 1, "mobile": False})

    def close(self) -> None:
        if self._ws is not None:
            try:
                self.send("Browser.close", session=None, wait=False)
            except Exception:  # noqa: BLE001 — closing anyway
                pass
            self._ws.close()
            self._ws = None
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()  # the browser this object started, by its own handle
                self._proc.wait(timeout=10)
            self._proc = None
        if self._profile:
            self._log.close()
            shutil.rmtree(self._profile, ignore_errors=True)
            self._profile = None

    def _tail(self) -> str:
        self._log.flush()
        self._log.seek(0)
        return self._log.read()[-2000:]

    # --- protocol ---
    def send(self, method: str, params: dict | None = None, *, session: str | None | bool = True,
             wait: bool = True) -> dict:
        """Call ``method`` (on the page's session unless ``session=None``) and return its result."""
        msg_id = next(self._ids)
        msg = {"id": msg_id, "method": method, "params": params or {}}
        sid = self.session if session is True else session
        if sid:
            msg["sessionId"] = sid
        self._ws.send(json.dumps(msg))
        if not wait:
            return {}
        deadline = time.monotonic() + self.timeout
        while True:
            reply = self._receive(deadline, f"a reply to {method}")
            if reply.get("id") == msg_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def _receive(self, deadline: float, what: str) -> dict:
        if time.monotonic() > deadline:
            raise BrowserError(f"no {what} within {self.timeout} s")
        raw = self._ws.recv()
        msg = json.loads(raw)
        if "method" in msg:
            self.events.append(msg)
        return msg

    def wait_for(self, method: str, *, since: int = 0, timeout: float | None = None) -> dict:
        """The first event named ``method`` at index ``since`` or later, waiting for it if need be."""
        deadline = time.monotonic() + (timeout or self.timeout)
        while True:
            for event in self.events[since:]:
                if event["method"] == method:
                    return event
            since = len(self.events)
            self._receive(deadline, f"{method} event")

    # --- page helpers ---
    def navigate(self, url: str) -> None:
        """Load ``url`` and wait for its load event; the events kept are this page load's from here on."""
        self.events.clear()
        result = self.send("Page.navigate", {"url": url})
        if result.get("errorText"):
            raise BrowserError(f"navigating to {url}: {result['errorText']}")
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str, *, await_promise: bool = False) -> Any:
        result = self.send("Runtime.evaluate", {"expression": expression, "returnByValue": True,
                                                "awaitPromise": await_promise})
        if "exceptionDetails" in result:
            raise BrowserError(f"{expression!r} threw: {result['exceptionDetails']}")
        return result["result"].get("value")

    def click(self, selector: str) -> None:
        """A real mouse click (pressed + released) at the centre of the element."""
        box = self.evaluate(
            f"(function () {{ var e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); var r = e.getBoundingClientRect();"
            " return [r.left + r.width / 2, r.top + r.height / 2]; }())")
        for kind in ("mousePressed", "mouseReleased"):
            self.send("Input.dispatchMouseEvent", {"type": kind, "x": box[0], "y": box[1], "button": "left",
                                                   "clickCount": 1})

    def screenshot(self, *, full_page: bool = False) -> bytes:
        params: dict[str, Any] = {"format": "png"}
        if full_page:
            params["captureBeyondViewport"] = True
        return base64.b64decode(self.send("Page.captureScreenshot", params)["data"])

    # --- what went wrong on the page ---
    def console_errors(self) -> list[str]:
        errors = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ("error", "assert"):
                errors.append("console: " + " ".join(str(a.get("value", a.get("description"))) for a in p["args"]))
            elif e["method"] == "Runtime.exceptionThrown":
                errors.append("exception: " + json.dumps(p.get("exceptionDetails", {}))[:500])
            elif e["method"] == "Log.entryAdded" and p.get("entry", {}).get("level") == "error":
                errors.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}")
        return errors

    def requested_urls(self) -> list[str]:
        return [e["params"]["request"]["url"] for e in self.events if e["method"] == "Network.requestWillBeSent"]


@pytest.fixture(scope="session")
def chromium() -> str:
    """The chromium binary, installed with apt when missing (``from browser import chromium`` in a test
    module).  Failing to get it fails the tests rather than skipping them: they run in CI."""
    return ensure_chromium()


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 4):
        print(__doc__, file=sys.stderr)
        return 2
    width, height = (int(argv[2]), int(argv[3])) if len(argv) == 4 else (1280, 900)
    with Chromium(width=width, height=height) as page:
        page.navigate(Path(argv[0]).resolve().as_uri())
        Path(argv[1]).write_bytes(page.screenshot())
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
