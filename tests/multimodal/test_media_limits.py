"""The decoding layer the server calls for every image_url part: the pixels of all a request's
images are bounded together, from each image's header before anything is decoded, whatever
Pillow's own bomb limit says; only common web formats are opened."""
from __future__ import annotations

import base64
import io
import resource

import pytest

PIL = pytest.importorskip("PIL")
from PIL import Image  # noqa: E402

from lite_llm.multimodal import DEFAULT_PIXELS_PER_REQUEST, MediaConfig, MediaError, image_of_part, media_config  # noqa: E402
from lite_llm.multimodal.media import decode_image  # noqa: E402
from vl_checkpoint import flat_png  # noqa: E402


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024     # bytes (Linux: KiB)


@pytest.fixture(scope="module")
def bomb() -> bytes:
    return flat_png(7070, 7070)       # 146 KB of file, 150 MB of RGB once decoded


def test_a_pixel_bomb_is_refused_from_its_header(bomb):
    cfg = MediaConfig()
    assert len(bomb) < cfg.max_image_bytes and 7070 * 7070 <= cfg.max_pixels    # within the per-image bounds
    peak = _peak_rss()
    with pytest.raises(MediaError) as err:
        decode_image(bomb, "image 0", cfg)
    message = str(err.value)
    assert f"limit of {DEFAULT_PIXELS_PER_REQUEST}" in message and "--max-image-pixels-per-request" in message
    assert _peak_rss() - peak < 50 << 20      # never decoded: the process's peak did not move by 150 MB


def test_the_bound_is_over_the_request_not_the_image():
    cfg = MediaConfig(max_pixels_per_request=3 * 100 * 50)
    small = flat_png(100, 50, channels=1)
    assert decode_image(small, "image 0", cfg, used_pixels=2 * 100 * 50).size == (100, 50)   # exactly at it
    with pytest.raises(MediaError, match=f"before it, {3 * 100 * 50 + 1}, more than the limit of 15000"):
        decode_image(small, "image 3", cfg, used_pixels=2 * 100 * 50 + 1)
    part = {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(small).decode()}}
    with pytest.raises(MediaError, match="limit of 15000"):
        image_of_part(part, "image 1", cfg, used_pixels=15000)


def test_pillows_own_bomb_limit_off_changes_nothing(bomb, monkeypatch):
    monkeypatch.setattr(Image, "MAX_IMAGE_PIXELS", None)       # some libraries turn it off process-wide
    with pytest.raises(MediaError, match="--max-image-pixels-per-request"):
        decode_image(bomb, "image 0", MediaConfig(max_pixels=None))


def test_no_cap_when_asked_for_and_flag_values_checked():
    assert media_config().max_pixels_per_request == DEFAULT_PIXELS_PER_REQUEST
    assert media_config(max_image_pixels_per_request=0).max_pixels_per_request is None
    with pytest.raises(ValueError, match="--max-image-pixels-per-request"):
        media_config(max_image_pixels_per_request=-1)
    cfg = MediaConfig(max_pixels_per_request=None)
    assert decode_image(flat_png(100, 50), "image 0", cfg, used_pixels=10 ** 12).size == (100, 50)


def test_formats_outside_the_web_ones_are_not_opened():
    buf = io.BytesIO()
    Image.new("RGB", (8, 8)).save(buf, format="TIFF")
    with pytest.raises(MediaError, match="not a readable image"):
        decode_image(buf.getvalue(), "image 0", MediaConfig())
    for fmt in ("PNG", "JPEG", "WEBP", "GIF", "BMP"):
        buf = io.BytesIO()
        Image.new("RGB", (8, 8)).save(buf, format=fmt)
        assert decode_image(buf.getvalue(), "image 0", MediaConfig()).size == (8, 8)
