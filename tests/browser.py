"""Headless Chromium driven over the DevTools protocol (a websocket, websocket-client): open a page, click, read the
DOM, collect console errors, take screenshots. For tests/test_pipeline_e2e.py's check of Snakemake's HTML report.

Chromium runs as /work/.library's machine notes say for root in a sandbox: --headless --no-sandbox --disable-gpu
--disable-quic --no-first-run --disable-background-networking --disable-component-update --disable-sync and a new
empty --user-data-dir (the background-networking flags keep it from dialling out of a closed network)."""

from __future__ import annotations

import base64
import itertools
import json
import shutil
import subprocess
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync"]  # fmt: skip
ERROR_CONSOLE = {"error", "assert"}


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


class Browser:
    """One Chromium with one page; `errors` gathers every uncaught exception, console error and error log entry."""

    def __init__(self, timeout_s: float = 60) -> None:
        import websocket

        exe = chromium()
        if exe is None:
            raise RuntimeError("chromium is not installed (bash envs/setup.sh test installs Debian's package)")
        self.profile = Path(tempfile.mkdtemp(prefix="pp-chromium-"))
        self.proc = subprocess.Popen([exe, *FLAGS, f"--user-data-dir={self.profile}", "--remote-debugging-port=0",
                                      "--window-size=1400,1000", "about:blank"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
        port_file, deadline = self.profile / "DevToolsActivePort", time.monotonic() + timeout_s
        while not (port_file.is_file() and port_file.read_text().strip()):
            if time.monotonic() > deadline or self.proc.poll() is not None:
                self.close()
                raise RuntimeError(f"chromium did not open its DevTools port (exit {self.proc.poll()})")
            time.sleep(0.1)
        port = port_file.read_text().split()[0]
        targets = json.load(urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10))
        page = next(t for t in targets if t["type"] == "page")
        self.ws = websocket.create_connection(page["webSocketDebuggerUrl"], timeout=timeout_s)
        self.ids = itertools.count(1)
        self.events: list[dict[str, Any]] = []
        for domain in ("Page", "Runtime", "Log"):
            self.call(f"{domain}.enable")
        self.call("Browser.setDownloadBehavior", behavior="deny")  # a CSV's "view" is a download: none written

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        i = next(self.ids)
        self.ws.send(json.dumps({"id": i, "method": method, "params": params}))
        while True:
            msg = json.loads(self.ws.recv())
            if msg.get("id") == i:
                if "error" in msg:
                    raise RuntimeError(f"{method}: {msg['error']}")
                return msg.get("result", {})
            self.events.append(msg)

    def js(self, expression: str) -> Any:
        """The value of a JavaScript expression (a promise is awaited); a thrown error raises here."""
        r = self.call("Runtime.evaluate", expression=expression, awaitPromise=True, returnByValue=True)
        if "exceptionDetails" in r:
            raise RuntimeError(f"{expression[:80]}...: {r['exceptionDetails'].get('exception', r['exceptionDetails'])}")
        return r["result"].get("value")

    def wait(self, expression: str, timeout_s: float = 20) -> Any:
        """Poll a JavaScript expression until it is truthy."""
        deadline = time.monotonic() + timeout_s
        while True:
            value = self.js(expression)
            if value or time.monotonic() > deadline:
                return value
            time.sleep(0.1)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.wait("document.readyState === 'complete'")

    def screenshot(self, path: Path) -> Path:
        data = self.call("Page.captureScreenshot", format="png")["data"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(base64.b64decode(data))
        return path

    @property
    def errors(self) -> list[str]:
        """Uncaught exceptions, console.error / console.assert calls and error log entries, as text."""
        out = []
        for e in self.events:
            p = e.get("params", {})
            if e["method"] == "Runtime.exceptionThrown":
                d = p["exceptionDetails"]
                out.append(f"exception: {d.get('exception', {}).get('description') or d.get('text')}")
            elif e["method"] == "Runtime.consoleAPICalled" and p.get("type") in ERROR_CONSOLE:
                out.append(f"console.{p['type']}: " + " ".join(str(a.get("value", a.get("description"))) for a in
                                                              p.get("args", [])))  # fmt: skip
            elif e["method"] == "Log.entryAdded" and p["entry"].get("level") == "error":
                out.append(f"log: {p['entry'].get('text')} {p['entry'].get('url', '')}".strip())
        return out

    def close(self) -> None:
        try:
            if getattr(self, "ws", None):
                self.ws.close()
        finally:
            if self.proc.poll() is None:
                self.proc.terminate()
                try:
                    self.proc.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    self.proc.kill()
            shutil.rmtree(self.profile, ignore_errors=True)


# ------------------------------------------------------------------------------- Snakemake's report, read like a user

CLICK_TEXT = (
    "(t => { const a = [...document.querySelectorAll('a')].find(e => e.innerText.trim() === t); "
    "if (a) a.click(); return !!a; })"
)
ROW = "[...document.querySelectorAll('tr')].find(r => r.cells[0] && r.cells[0].innerText.trim() === {path})"
# the image's pixels: how many are coloured (bars, dots, heat-map cells), not white, grey or black (axes, text)
PIXELS = """(async name => {{
  const img = [...document.images].find(i => i.src.includes('filename=' + name + ';'));
  if (!img) return null;
  try {{ await img.decode(); }} catch (e) {{ return {{broken: String(e)}}; }}
  const c = document.createElement('canvas'); c.width = img.naturalWidth; c.height = img.naturalHeight;
  const ctx = c.getContext('2d'); ctx.drawImage(img, 0, 0);
  const d = ctx.getImageData(0, 0, c.width, c.height).data; let coloured = 0;
  for (let i = 0; i < d.length; i += 4)
    if (Math.max(d[i], d[i+1], d[i+2]) - Math.min(d[i], d[i+1], d[i+2]) > 60) coloured++;
  return {{width: img.naturalWidth, height: img.naturalHeight, coloured: coloured}};
}})({name})"""


# the details of an entry: the <li> after a header <li> ("Path", "Description")
DETAIL = (
    "(h => {{ const li = [...document.querySelectorAll('li')].find(e => e.innerText.trim().toLowerCase() === h); "
    "return li && li.nextElementSibling ? li.nextElementSibling.innerText.trim() : null; }})({header})"
)


def _category(b: Browser, cat: str) -> list[str]:
    """Show a category's list (the sidebar entry, or the breadcrumb once inside); its entries' paths."""
    if not b.js(f"{CLICK_TEXT}({json.dumps(cat)})"):
        return []
    b.wait("document.querySelectorAll('tr').length > 1")
    return b.js("[...document.querySelectorAll('tr')].slice(1).map(r => r.cells[0].innerText.trim())")


def read_report(html: Path, shots: Path) -> dict[str, Any]:
    """Open Snakemake's HTML report, go through every category of results, and per entry: show it (a figure: its
    decoded size and coloured pixels, and a screenshot) and its details (the description the page shows). Returns
    {"categories": {name: [paths]}, "figures": {path: pixels}, "captions": {path: text}, "errors": [...]}."""
    b = Browser()
    try:
        b.open(html.resolve().as_uri())
        b.wait("document.body.innerText.includes('RESULTS')")
        b.screenshot(shots / "home.png")
        names = b.js("[...document.querySelectorAll('a')].map(a => a.innerText.trim())"
                     ".filter((t, i, all) => t && all.indexOf(t) === i)")  # fmt: skip
        cats = names[names.index("About") + 1 :] if "About" in names else names
        categories: dict[str, list[str]] = {}
        figures: dict[str, Any] = {}
        captions: dict[str, str | None] = {}
        for cat in cats:
            b.open(html.resolve().as_uri())  # back to the start page, where the sidebar lists the categories
            b.wait("document.body.innerText.includes('RESULTS')")
            paths = _category(b, cat)
            categories[cat] = paths
            for path in paths:
                row = ROW.format(path=json.dumps(path))
                name = path.rsplit("/", 1)[-1]
                if name.endswith(".png"):
                    b.js(f"{row}.querySelector('a[iconname=eye]').click()")
                    figures[path] = b.wait(PIXELS.format(name=json.dumps(name)))
                    b.screenshot(shots / f"{path.replace('/', '_')}")
                b.js(f"(() => {{ const a = {row}.querySelectorAll('a'); a[a.length - 1].click(); }})()")
                b.wait(f"{DETAIL.format(header=json.dumps('path'))} === {json.dumps(path)}")
                captions[path] = b.js(DETAIL.format(header=json.dumps("description")))
                _category(b, cat)
        return {"categories": categories, "figures": figures, "captions": captions, "errors": b.errors}
    finally:
        b.close()
