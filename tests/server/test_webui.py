"""The web UI's routes on the fake model runner's server: which answer without the key, the files and
their headers, --disable-web-ui, /v1/engine/stats behind the key, and the files shipped as
package data. The pages themselves run in a browser in tests/browser."""
from __future__ import annotations

import json
import os
import re
import tomllib
from pathlib import Path

import pytest

from lite_llm.server import webui

from .conftest import request, start_server, stop_server

KEY = "sk-web"
ROOT = Path(__file__).resolve().parents[2]
FILES = sorted(os.listdir(webui.WEB_DIR))


@pytest.fixture(scope="module")
def keyed():
    s = start_server(api_key=KEY)
    yield s
    stop_server(s)


@pytest.fixture(scope="module")
def disabled():
    s = start_server(api_key=KEY, web_ui=False)
    yield s
    stop_server(s)


@pytest.mark.parametrize("path,ctype", [("/", "text/html"), ("/dashboard", "text/html"),
                                        ("/dashboard/", "text/html"), ("/web/style.css", "text/css"),
                                        ("/web/common.js", "text/javascript")])
def test_pages_and_their_files_need_no_key(keyed, path, ctype):
    status, headers, body = request(keyed.port, "GET", path)
    assert status == 200 and headers["content-type"].startswith(ctype)
    assert "script-src 'self'" in headers["content-security-policy"]
    assert "frame-ancestors 'none'" in headers["content-security-policy"]
    assert headers["x-content-type-options"] == "nosniff"
    assert body and KEY.encode() not in body
    assert request(keyed.port, "HEAD", path)[0] == 200


def test_pages_load_nothing_from_elsewhere():
    """No CDN, no inline script or style (the CSP would block them): every reference is /web/.
    Pages are checked as served (their body in the shared shell)."""
    texts = {name: (Path(webui.WEB_DIR) / name).read_text() for name in FILES if not name.endswith(".html")}
    texts.update({route: webui.render_page(route).decode() for route in webui.PAGES})
    for name, text in texts.items():
        assert not re.search(r"https?://", text.replace("http://www.w3.org/2000/svg", "")), name
        if name in webui.PAGES:
            assert "{{" not in text, name      # every placeholder of the shell filled
            assert not re.search(r"<script(?![^>]*\bsrc=)", text) and " style=" not in text, name
            for ref in re.findall(r'(?:src|href)="([^"]+)"', text):
                assert ref in ("/", "/dashboard", "data:,") or (ref.startswith("/web/") and ref[5:] in FILES), ref


def test_each_page_marks_itself_in_the_navigation():
    for route in webui.PAGES:
        nav = re.search(r"<nav[^>]*>(.*?)</nav>", webui.render_page(route).decode()).group(1)
        assert re.findall(r'<a href="([^"]+)" aria-current="page">', nav) == [route]
        assert re.findall(r'<a href="([^"]+)"', nav) == list(webui.PAGES)


@pytest.mark.parametrize("path", ["/web/nope.js", "/web/../app.py", "/web/.hidden.js", "/web/sub/x.js",
                                  "/web/webui.py", "/web/%2e%2e/app.py"])
def test_only_the_shipped_files_are_served(keyed, path):
    status, _, body = request(keyed.port, "GET", path)
    assert status == 404 and json.loads(body)["error"]["code"] == "not_found"


def test_engine_stats_needs_the_key(keyed):
    status, headers, _ = request(keyed.port, "GET", "/v1/engine/stats")
    assert status == 401 and headers["www-authenticate"] == "Bearer"
    status, _, body = request(keyed.port, "GET", "/v1/engine/stats", headers={"Authorization": f"Bearer {KEY}"})
    doc = json.loads(body)
    assert status == 200 and doc["object"] == "engine.stats" and doc["models"] == ["tiny"]
    assert set(doc["latency"]) == {"ttft", "itl", "tpot", "e2e", "queue_time"}
    assert {"running", "waiting"} <= set(doc["requests"]) and "usage" in doc["kv_cache"]


@pytest.mark.parametrize("path", ["/", "/dashboard", "/web/style.css"])
def test_disable_web_ui_turns_the_pages_off(disabled, path):
    assert request(disabled.port, "GET", path)[0] == 401        # no longer an open route
    status, _, _ = request(disabled.port, "GET", path, headers={"Authorization": f"Bearer {KEY}"})
    assert status == 404
    status, _, _ = request(disabled.port, "GET", "/v1/engine/stats", headers={"Authorization": f"Bearer {KEY}"})
    assert status == 200                                          # an API route: stays, behind the key


def test_the_cli_flag():
    import argparse

    from lite_llm.server.app import add_arguments
    p = argparse.ArgumentParser()
    add_arguments(p)
    assert p.parse_args(["--disable-web-ui"]).disable_web_ui and not p.parse_args([]).disable_web_ui


def test_web_files_are_package_data_in_wheel_and_sdist():
    """pyproject's package-data (wheel) and MANIFEST.in (sdist) take every file of web/."""
    from fnmatch import fnmatch
    data = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    patterns = data["lite_llm.server"]
    assert FILES and all(any(fnmatch(f"web/{name}", p) for p in patterns) for name in FILES)
    manifest = (ROOT / "MANIFEST.in").read_text().split("\n")
    line = next(x for x in manifest if x.startswith("recursive-include lite_llm/server/web "))
    assert all(any(fnmatch(name, p) for p in line.split()[2:]) for name in FILES)
