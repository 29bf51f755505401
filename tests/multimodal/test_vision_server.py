"""The OpenAI image inputs over HTTP on a tiny random Qwen2.5-VL (real engine, real kernels):
the official client sends a base64 PNG, streaming and not; a host not allowed (also through a
redirect), a corrupt file, too many images and an oversized image are each a 400 that says
which, and the server keeps serving. A pixel bomb (a small PNG of 50 million pixels) and images
that together pass the per-request pixel bound are refused before they are decoded, while
other clients are served."""
from __future__ import annotations

import base64
import io
import json
import os
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer

import pytest

openai = pytest.importorskip("openai")
pytest.importorskip("PIL")

from lite_llm.multimodal import DEFAULT_PIXELS_PER_REQUEST, MediaConfig  # noqa: E402
from tests.server.conftest import error_of, request  # noqa: E402
from tests.server.watchdog import Watchdog  # noqa: E402
from vl_checkpoint import flat_png, image, qwen2_5_vl_checkpoint  # noqa: E402

MAX_BYTES = 60_000


def _png(img) -> bytes:
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def _data_url(data: bytes) -> str:
    return "data:image/png;base64," + base64.b64encode(data).decode()


class _Images(BaseHTTPRequestHandler):
    """/ok.png: an image; /away: a redirect to the same file under a host name not allowed."""
    png = b""

    def do_GET(self):
        if self.path == "/ok.png":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.send_header("Content-Length", str(len(self.png)))
            self.end_headers()
            self.wfile.write(self.png)
        else:
            self.send_response(302)
            self.send_header("Location", f"http://localhost:{self.server.server_port}/ok.png")
            self.end_headers()

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def image_host():
    _Images.png = _png(image(56, 56, seed=9))
    httpd = HTTPServer(("127.0.0.1", 0), _Images)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_port}"
    httpd.shutdown()


def _vl_server(media: MediaConfig | None):
    from lite_llm.llm import build_async_engine
    from lite_llm.server.app import create_server
    engine, tokenizer, info = build_async_engine(str(qwen2_5_vl_checkpoint()), dtype="float32", block_size=16,
                                              max_num_batched_tokens=64, kv_cache_space=0.01, max_num_seqs=4,
                                              serving=True)
    server = create_server(engine, tokenizer, "tiny-vl", info["max_model_len"], kernel_info=info,
                           model_root=info["model_path"], vocab_size=info["vocab_size"], media=media)
    server.start()
    return server


@pytest.fixture(scope="module")
def client():
    media = MediaConfig(allowed_domains=("127.0.0.1",), max_image_bytes=MAX_BYTES, limit_per_prompt={"image": 2})
    server = _vl_server(media)
    yield openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0)
    server.drain(5.0)


@pytest.fixture(scope="module")
def default_server():
    """The media settings `serve` starts with (20 MiB an image, 4 images, the pixel bound)."""
    server = _vl_server(None)
    yield server
    server.drain(5.0)


def _ask(client, *parts, stream=False):
    content = [{"type": "text", "text": "What is in "}] + [
        {"type": "image_url", "image_url": {"url": u}} for u in parts] + [{"type": "text", "text": "?"}]
    return client.chat.completions.create(model="tiny-vl", messages=[{"role": "user", "content": content}],
                                          max_tokens=6, temperature=0, stream=stream,
                                          extra_body={"ignore_eos": True})


def test_a_base64_png_gets_an_answer_streaming_and_not(client):
    url = _data_url(_png(image(84, 56, seed=1)))
    whole = _ask(client, url)
    assert whole.usage.completion_tokens == 6 and whole.usage.prompt_tokens > 6
    pieces = [c.choices[0].delta.content or "" for c in _ask(client, url, stream=True) if c.choices]
    assert "".join(pieces) == whole.choices[0].message.content
    other = _ask(client, _data_url(_png(image(84, 56, seed=2))))
    assert other.usage.prompt_tokens == whole.usage.prompt_tokens


def test_an_allowed_host_is_fetched(client, image_host):
    assert _ask(client, image_host + "/ok.png").usage.completion_tokens == 6


@pytest.mark.parametrize("case,message", [
    ("host", "host 'example.com' is not allowed"),
    ("redirect", "host 'localhost' is not allowed"),
    ("corrupt", "is not a readable image"),
    ("too_many", "more than 2 images in one request"),
    ("oversized", f"more than the {MAX_BYTES} allowed"),
])
def test_bad_images_are_400s_naming_the_problem_and_serving_goes_on(client, image_host, case, message):
    good = _data_url(_png(image(56, 56, seed=3)))
    urls = {"host": ["http://example.com/cat.png"], "redirect": [image_host + "/away"],
            "corrupt": [_data_url(b"\x89PNG\r\n\x1a\n" + b"garbage" * 20)],
            "too_many": [good, good, good],
            "oversized": [_data_url(bytes(range(256)) * (MAX_BYTES // 256 + 1))]}[case]
    with pytest.raises(openai.BadRequestError) as err:
        _ask(client, *urls)
    assert err.value.status_code == 400 and message in err.value.message
    assert _ask(client, good).usage.completion_tokens == 6


def test_text_only_chats_still_work(client):
    # the tiny VL model takes text-only chats too
    out = client.chat.completions.create(model="tiny-vl", messages=[{"role": "user", "content": "hi"}],
                                         max_tokens=3, temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3


def _rss() -> int:
    with open("/proc/self/statm") as f:       # the server runs in this process
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _chat_with(*urls: str) -> dict:
    return {"model": "tiny-vl", "max_tokens": 2, "messages": [{"role": "user", "content": [
        {"type": "text", "text": "What is in "}, *[{"type": "image_url", "image_url": {"url": u}} for u in urls]]}]}


def test_a_pixel_bomb_costs_no_memory_and_stalls_no_one(default_server):
    bomb = _data_url(flat_png(7070, 7070))            # 146 KB of PNG, 150 MB of RGB once decoded
    good = _data_url(_png(image(56, 56, seed=3)))
    assert request(default_server.port, "POST", "/v1/chat/completions", _chat_with(good))[0] == 200
    before = _rss()
    with Watchdog(default_server.port, "tiny-vl") as dog:
        for _ in range(3):
            status, _, data = request(default_server.port, "POST", "/v1/chat/completions",
                                      _chat_with(bomb, bomb, bomb, bomb))
            err = error_of(data)
            assert status == 400 and err["param"] == "messages[0].content[1]"
            assert f"limit of {DEFAULT_PIXELS_PER_REQUEST}" in err["message"]
    grown = _rss() - before
    print(f"pixel bomb x3: RSS {grown / 2**20:+.1f} MB; watchdog {dog.summary()}")
    dog.check()
    assert grown < 50 << 20
    assert request(default_server.port, "POST", "/v1/chat/completions", _chat_with(good))[0] == 200


def test_images_under_the_bound_alone_are_refused_together(default_server):
    # two 18-megapixel images: each fits the bound, together they pass it; the second is refused
    # from its header, before it is decoded
    big = _data_url(flat_png(4500, 4000, channels=1))
    status, _, data = request(default_server.port, "POST", "/v1/chat/completions", _chat_with(big, big))
    err = error_of(data)
    assert status == 400 and err["param"] == "messages[0].content[2]", json.loads(data)
    assert "before it, 36000000, more than" in err["message"] and "--max-image-pixels-per-request" in err["message"]
