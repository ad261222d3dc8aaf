"""A headless Chromium driven over the DevTools protocol through a pipe (``--remote-debugging-pipe``: the
browser reads commands on fd 3 and writes replies and events on fd 4, NUL-separated JSON), so a test can
open a page from disk, see every request and script error, run a line of script and take a screenshot
with nothing beyond the standard library."""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

BINARIES = ("chromium", "chromium-browser", "google-chrome")


def find() -> str | None:
    return next((path for path in map(shutil.which, BINARIES) if path), None)


class Browser:
    def __init__(self, binary: str, width: int = 1400, height: int = 1000):
        self._profile = tempfile.mkdtemp(prefix="specbench-chromium-")
        self._log = open(Path(self._profile) / "stderr.log", "wb")  # why it stopped, if it does
        to_browser, self._commands = os.pipe()
        self._replies, from_browser = os.pipe()

        def wire():  # in the child: the protocol's fds 3 and 4
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        self.process = subprocess.Popen(
            [binary, "--headless=new", "--remote-debugging-pipe", "--no-sandbox", "--disable-gpu",
             "--no-first-run", "--disable-extensions", "--disable-background-networking",
             "--disable-component-update", "--disable-sync", f"--user-data-dir={self._profile}",
             "about:blank"],
            preexec_fn=wire, close_fds=False, stdout=subprocess.DEVNULL, stderr=self._log,
        )  # fmt: skip
        os.close(to_browser)
        os.close(from_browser)
        self._buffer = b""
        self._next = 0
        self.events: list[dict] = []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)
        self.call("Emulation.setDeviceMetricsOverride", session=True, width=width, height=height,
                  deviceScaleFactor=1, mobile=False)  # fmt: skip

    def _read(self, timeout: float = 30.0) -> dict:
        deadline = time.monotonic() + timeout
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline or self.process.poll() is not None:
                raise RuntimeError(f"chromium stopped answering: {self.last_words()}")
            chunk = os.read(self._replies, 1 << 16)
            if not chunk:
                raise RuntimeError(f"chromium closed its pipe: {self.last_words()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def call(self, method: str, session: bool = False, **params) -> dict:
        self._next += 1
        message = {"id": self._next, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        try:
            os.write(self._commands, json.dumps(message).encode() + b"\0")
        except BrokenPipeError:
            raise RuntimeError(f"chromium is gone: {self.last_words()}") from None
        while True:
            reply = self._read()
            if reply.get("id") == self._next:
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})
            self.events.append(reply)

    def last_words(self) -> str:
        """The last lines chromium wrote to stderr."""
        try:
            return " | ".join(
                (Path(self._profile) / "stderr.log").read_text(errors="replace").splitlines()[-3:]
            )
        except OSError:
            return "no log"

    def wait_for(self, method: str, timeout: float = 30.0) -> dict:
        for event in self.events:
            if event.get("method") == method:
                return event
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            event = self._read(timeout)
            self.events.append(event)
            if event.get("method") == method:
                return event
        raise RuntimeError(f"no {method} within {timeout} s")

    def open(self, path: Path) -> None:
        self.events.clear()
        self.call("Page.navigate", session=True, url=Path(path).resolve().as_uri())
        self.wait_for("Page.loadEventFired")

    def evaluate(self, expression: str):
        result = self.call("Runtime.evaluate", session=True, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"script error: {result['exceptionDetails']}")
        return result["result"].get("value")

    def requested(self) -> list[str]:
        return [
            e["params"]["request"]["url"]
            for e in self.events
            if e.get("method") == "Network.requestWillBeSent"
        ]

    def errors(self) -> list[str]:
        found = [json.dumps(e["params"]) for e in self.events if e.get("method") == "Runtime.exceptionThrown"]
        found += [
            e["params"]["entry"]["text"]
            for e in self.events
            if e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"
        ]
        return found

    def screenshot(self, out: Path, max_height: int = 6000) -> Path:
        size = self.call("Page.getLayoutMetrics", session=True)["cssContentSize"]
        clip = {"x": 0, "y": 0, "width": size["width"], "height": min(size["height"], max_height), "scale": 1}
        data = self.call("Page.captureScreenshot", session=True, format="png", clip=clip,
                         captureBeyondViewport=True)["data"]  # fmt: skip
        Path(out).write_bytes(base64.b64decode(data))
        return Path(out)

    def close(self) -> None:
        try:
            self.call("Browser.close")
        except RuntimeError:
            pass
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
        os.close(self._commands)
        os.close(self._replies)
        self._log.close()
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Browser:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
