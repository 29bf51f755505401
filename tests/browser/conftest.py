"""Browser fixtures: Debian's chromium driven by Python playwright (never `playwright install`,
which downloads a browser), and `python -m lite_llm serve` on the default model in a subprocess.

Without chromium or playwright the browser tests skip, except under CI=true, where a missing
browser fails the run (.ci/run installs both)."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
import threading
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest
from conftest import wait_until_serving

ROOT = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("LITE_LLM_TEST_CHROMIUM", "/usr/bin/chromium")
SCREENSHOTS = os.environ.get("LITE_LLM_TEST_SCREENSHOTS")    # a directory: PNGs of the pages under load


def _missing(why: str) -> None:
    if os.environ.get("CI") == "true":
        pytest.fail(f"{why}: CI must run the browser tests (.ci/run installs chromium and playwright)")
    pytest.skip(why)


@pytest.fixture(scope="package")    # not session: playwright's sync API keeps an event loop
def browser():                       # running in the main thread until it stops, and later tests use asyncio.run
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("python playwright is not installed (pip install -e '.[test]')")
    if not os.access(CHROMIUM, os.X_OK):
        _missing(f"no chromium at {CHROMIUM} (apt-get install chromium)")
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM)
        yield b
        b.close()


@pytest.fixture()
def page(browser):
    ctx = browser.new_context(viewport={"width": 1200, "height": 1300})
    pg = ctx.new_page()
    pg.errors = []
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    ctx.close()
    assert not pg.errors, pg.errors       # a script error fails the test that caused it


class Server:
    def __init__(self, *args: str):
        self.proc = subprocess.Popen([sys.executable, "-m", "lite_llm", "serve", "--port", "0",
                                      "--max-model-len", "1024", "--kv-cache-space", "0.1",
                                      "--disable-log-requests", *args],
                                     cwd=ROOT, stderr=subprocess.PIPE, text=True)
        self.url, lines = wait_until_serving(self.proc)
        self.log = "".join(lines)
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()   # keep the pipe drained
        self.pid = self.proc.pid

    def get(self, path: str, key: str | None = None) -> bytes:
        req = urllib.request.Request(self.url + path,
                                     headers={"Authorization": f"Bearer {key}"} if key else {})
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.read()

    def stop(self) -> None:
        self.proc.terminate()
        assert self.proc.wait(timeout=60) == 0


@pytest.fixture(scope="module")
def server():
    s = Server()
    yield s
    s.stop()


@contextmanager
def load(url: str, concurrency: int = 16, max_tokens: int = 48, key: str | None = None):
    """`concurrency` clients, each sending one chat request after another until the block ends."""
    done = threading.Event()
    errors: list[BaseException] = []

    def client(i: int) -> None:
        headers = {"Content-Type": "application/json", **({"Authorization": f"Bearer {key}"} if key else {})}
        rng = random.Random(i)
        while not done.is_set():
            # lengths differ, so requests finish and start at different steps, not in waves
            body = json.dumps({"messages": [{"role": "user", "content": f"Story number {i}: tell me about a cat."}],
                               "max_tokens": rng.randint(max_tokens // 2, max_tokens * 3 // 2),
                               "ignore_eos": True, "temperature": 0.8}).encode()
            try:
                req = urllib.request.Request(url + "/v1/chat/completions", body, headers)
                urllib.request.urlopen(req, timeout=300).read()
            except BaseException as e:  # noqa: BLE001 - reported after the block
                errors.append(e)
                return

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        done.set()
        for t in threads:
            t.join(timeout=300)
    assert not errors, errors[:3]


def screenshot(page, name: str) -> None:
    if SCREENSHOTS:
        os.makedirs(SCREENSHOTS, exist_ok=True)
        page.screenshot(path=os.path.join(SCREENSHOTS, name), full_page=True)
