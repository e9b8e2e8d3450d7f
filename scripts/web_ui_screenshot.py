"""A run's page in the Temporal Web UI, as a headless Chromium shows it, saved as a PNG.

    python scripts/web_ui_screenshot.py RUN_ID [--ui http://localhost:8233] [--namespace default]
                                               [--tab timeline] [--wait-for TEXT] [--out docs/web-ui-run.png]

It drives Chromium (Debian: `apt-get install chromium`; or CHROMIUM=/path/to/chrome) over the DevTools
protocol on a pipe, with the standard library only: it opens the run's page (the UI goes to its latest
execution), then that execution's TAB (default: Timeline, the run's main page, where each evaluation's row is
labelled with the run's progress; user-metadata: the run's summary and live details), waits until the page
shows TEXT (default: the budget left in those labels), and captures it.
Exit status 1 with one line when Chromium is missing or the page never shows the text.
"""

from __future__ import annotations

import argparse
import base64
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path


#: the page's address and text, with the text of its frames (the Web UI renders a run's details in one)
PAGE_TEXT = ("location.href + '\\n' + (document.body ? document.body.innerText : '') + '\\n' + "
             "Array.from(document.querySelectorAll('iframe')).map(f => f.contentDocument && f.contentDocument.body "
             "? f.contentDocument.body.innerText : '').join('\\n')")


class Browser:
    """Chromium with --remote-debugging-pipe: commands on fd 3, answers and events on fd 4, NUL-separated."""

    def __init__(self, binary: str, width: int, height: int) -> None:
        self.profile = tempfile.TemporaryDirectory(prefix="web-ui-shot-")
        to_browser_r, self.to_browser = os.pipe()
        self.from_browser, from_browser_w = os.pipe()
        # the child's fds 3 and 4 become the pipe's ends (dup2 in the child, before exec); the pipe's own fds
        # are not inheritable, so with close_fds off only these two pass
        def wire():
            a, b = os.dup(to_browser_r), os.dup(from_browser_w)  # neither is 3 or 4 unless it may be
            os.dup2(a, 3)
            os.dup2(b, 4)
            os.set_inheritable(3, True)
            os.set_inheritable(4, True)
        self.proc = subprocess.Popen(
            [binary, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
             "--remote-debugging-pipe", f"--user-data-dir={self.profile.name}", f"--window-size={width},{height}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, close_fds=False, preexec_fn=wire)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self.next_id, self.buffer = 0, b""

    def call(self, method: str, params: dict | None = None, session: str | None = None,
             timeout: float = 30) -> dict:
        self.next_id += 1
        msg = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            msg["sessionId"] = session
        os.write(self.to_browser, json.dumps(msg).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            while b"\0" in self.buffer:
                raw, self.buffer = self.buffer.split(b"\0", 1)
                answer = json.loads(raw)
                if answer.get("id") == self.next_id:
                    if "error" in answer:
                        raise RuntimeError(f"{method}: {answer['error'].get('message')}")
                    return answer.get("result", {})
            chunk = os.read(self.from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError("Chromium closed its DevTools pipe")
            self.buffer += chunk
        raise RuntimeError(f"{method}: no answer within {timeout:g} s")

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (RuntimeError, OSError):
            pass
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        os.close(self.to_browser)
        os.close(self.from_browser)
        self.profile.cleanup()


def screenshot(url: str, wait_for: str, out: Path, width: int = 1400, height: int = 1100,
               timeout: float = 60, binary: str | None = None, tab: str | None = None) -> None:
    binary = binary or os.environ.get("CHROMIUM") or shutil.which("chromium") or shutil.which("chromium-browser") \
        or shutil.which("google-chrome")
    if not binary:
        raise SystemExit("web_ui_screenshot: error: no Chromium found: apt-get install chromium, or set CHROMIUM")
    b = Browser(binary, width, height)
    try:
        target = b.call("Target.createTarget", {"url": url})["targetId"]
        session = b.call("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        b.call("Emulation.setDeviceMetricsOverride", {"width": width, "height": height, "deviceScaleFactor": 1,
                                                      "mobile": False}, session)
        deadline = time.monotonic() + timeout

        def page(expression: str) -> str:
            res = b.call("Runtime.evaluate", {"expression": expression, "returnByValue": True}, session)
            return res.get("result", {}).get("value") or ""

        def until(pred, what: str) -> str:
            while not pred(value := page(PAGE_TEXT)):
                if time.monotonic() > deadline:
                    raise SystemExit(f"web_ui_screenshot: error: {url} did not show {what} within {timeout:g} s")
                time.sleep(0.5)
            return value

        if tab:  # the UI redirects a run's page to its latest execution: .../workflows/ID/RUN_ID/timeline
            href = until(lambda v: v.split("\n", 1)[0].rstrip("/").split("?")[0].endswith("/timeline"),
                         "the run's latest execution").split("\n", 1)[0]
            b.call("Page.navigate", {"url": href.split("?")[0].rsplit("/", 1)[0] + "/" + tab}, session)
        until(lambda v: wait_for in v, repr(wait_for))
        time.sleep(1.0)  # the last fetches render
        png = b.call("Page.captureScreenshot", {"format": "png"}, session)["data"]
    finally:
        b.close()
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_bytes(base64.b64decode(png))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("run_id")
    p.add_argument("--ui", default="http://localhost:8233", help="the Web UI's address")
    p.add_argument("--namespace", default="default")
    p.add_argument("--tab", default="timeline", help="the execution's tab: timeline, user-metadata, history, ...")
    p.add_argument("--wait-for", default="| left ",
                   help="text the page must show before the capture (default: the budget left in the evaluations' "
                        "labels; for user-metadata, e.g. Leaderboard)")
    p.add_argument("--out", default="docs/web-ui-run.png")
    p.add_argument("--timeout", type=float, default=60, help="seconds to wait for the text")
    p.add_argument("--width", type=int, default=1400)
    p.add_argument("--height", type=int, default=1100)
    a = p.parse_args(argv)
    url = f"{a.ui.rstrip('/')}/namespaces/{a.namespace}/workflows/{a.run_id}"
    screenshot(url, a.wait_for, Path(a.out), a.width, a.height, a.timeout, tab=a.tab)
    print(f"{a.out}: {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
