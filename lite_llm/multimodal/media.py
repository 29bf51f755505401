"""Image inputs from requests: data: URLs, http(s) URLs of allowed hosts, PIL images; decoded
with Pillow (the optional `lite-llm[vision]` extra). Every refusal is a MediaError naming what
is wrong, which the server turns into a 400.

Remote URLs are fetched only from hosts in --allowed-media-domains (none by default: the
server must not fetch arbitrary addresses for its clients); each redirect is checked against
the same list; the body is read up to max_image_bytes within fetch_timeout seconds in total.

A few KB of PNG can stand for 50 million pixels (a decompression bomb: 150 MB once decoded,
seconds of CPU), so the pixels an image would decode to are read from its header and counted
against max_pixels_per_request, summed over every image of the request, before anything is
decoded; only common web formats are opened.
"""
from __future__ import annotations

import base64
import binascii
import io
import time
import urllib.parse
from dataclasses import dataclass, field


class MediaError(ValueError):
    """A request's image cannot be used; the message says which and why."""


DEFAULT_PIXELS_PER_REQUEST = 1 << 25
FORMATS = ("PNG", "JPEG", "WEBP", "GIF", "BMP")     # what Image.open may try: no exotic decoders


@dataclass(frozen=True)
class MediaConfig:
    allowed_domains: tuple[str, ...] = ()   # hosts whose http(s) URLs may be fetched; (): none
    max_image_bytes: int = 20 * 2**20       # encoded size of one image (data: or fetched)
    fetch_timeout: float = 10.0             # seconds for one remote image, redirects included
    max_redirects: int = 3
    limit_per_prompt: dict = field(default_factory=lambda: {"image": 4})   # --limit-mm-per-prompt
    max_pixels: int | None = 50_000_000     # decoded width x height of one image at most
    # decoded pixels of all a request's images together (--max-image-pixels-per-request): 32 Mi,
    # e.g. two 12-megapixel photos or four 2896x2896 images, about 100 MB as RGB; None: no cap
    max_pixels_per_request: int | None = DEFAULT_PIXELS_PER_REQUEST
    processor_kwargs: dict = field(default_factory=dict)

    @property
    def max_images(self) -> int:
        return int(self.limit_per_prompt.get("image", 4))


def _pil():
    try:
        from PIL import Image
    except ImportError:
        raise MediaError("image inputs need Pillow: pip install 'lite-llm[vision]'") from None
    return Image


def decode_image(data: bytes, what: str, cfg: MediaConfig, used_pixels: int = 0):
    """Encoded bytes -> a loaded RGB PIL image; corrupt or too large: MediaError. used_pixels:
    what the request's images decoded before this one hold. Image.open reads only the header:
    the size is checked before the pixels are decoded."""
    if len(data) > cfg.max_image_bytes:
        raise MediaError(f"{what} is {len(data)} bytes, more than the {cfg.max_image_bytes} allowed")
    Image = _pil()
    try:
        with Image.open(io.BytesIO(data), formats=FORMATS) as im:
            width, height = im.size
            _check_pixels(width, height, what, cfg, used_pixels)
            im.load()
            return im.convert("RGB")
    except MediaError:
        raise
    except Image.DecompressionBombError:     # Pillow's own bound (Image.MAX_IMAGE_PIXELS), met first
        raise MediaError(f"{what} has more pixels than Pillow decodes "
                         f"({2 * (Image.MAX_IMAGE_PIXELS or 0)})") from None
    except Image.UnidentifiedImageError:
        raise MediaError(f"{what} is not a readable image (the formats taken are {', '.join(FORMATS)})") from None
    except Exception as e:   # Pillow raises several types for a bad file
        raise MediaError(f"{what} is not a readable image ({type(e).__name__}: {e})") from None


def _check_pixels(width: int, height: int, what: str, cfg: MediaConfig, used_pixels: int | None = None) -> None:
    """width x height within max_pixels and, given the pixels of the request's images decoded
    before (used_pixels), within max_pixels_per_request together with them."""
    if cfg.max_pixels is not None and width * height > cfg.max_pixels:
        raise MediaError(f"{what} is {width}x{height} = {width * height} pixels, more than max_pixels "
                         f"{cfg.max_pixels}")
    limit = cfg.max_pixels_per_request
    if used_pixels is not None and limit is not None and used_pixels + width * height > limit:
        together = f": with the request's images before it, {used_pixels + width * height}," if used_pixels else ""
        raise MediaError(f"{what} is {width}x{height} = {width * height} pixels{together} more than the limit "
                         f"of {limit} decoded pixels per request (--max-image-pixels-per-request)")


def check_image(image, what: str, cfg: MediaConfig):
    """A PIL image given directly (offline multi_modal_data): its size checked like an encoded
    one's (it is decoded already: the per-request bound on decoding does not apply)."""
    Image = _pil()
    if not isinstance(image, Image.Image):
        raise MediaError(f"{what} must be a PIL.Image.Image, not {type(image).__name__}")
    _check_pixels(image.size[0], image.size[1], what, cfg)
    return image


def _host_allowed(url: str, cfg: MediaConfig) -> str:
    parts = urllib.parse.urlsplit(url)
    host = (parts.hostname or "").lower()
    if parts.scheme not in ("http", "https") or not host:
        raise MediaError(f"image URL scheme {parts.scheme!r} is not supported (data:, http, https)")
    if host not in {d.lower() for d in cfg.allowed_domains}:
        raise MediaError(f"image URL host {host!r} is not allowed (--allowed-media-domains "
                         f"{' '.join(cfg.allowed_domains) or 'is empty: remote images are off'})")
    return host


def fetch(url: str, what: str, cfg: MediaConfig) -> bytes:
    """GET an allowed URL without following redirects blindly: each Location is re-checked."""
    import http.client
    deadline = time.monotonic() + cfg.fetch_timeout
    for _ in range(cfg.max_redirects + 1):
        _host_allowed(url, cfg)
        parts = urllib.parse.urlsplit(url)
        left = deadline - time.monotonic()
        if left <= 0:
            raise MediaError(f"{what}: fetching {url} took longer than {cfg.fetch_timeout} s")
        conn_cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
        conn = conn_cls(parts.hostname, parts.port, timeout=left)
        try:
            path = parts.path or "/"
            conn.request("GET", path + (f"?{parts.query}" if parts.query else ""),
                         headers={"User-Agent": "lite-llm", "Accept": "image/*"})
            resp = conn.getresponse()
            if resp.status in (301, 302, 303, 307, 308):
                location = resp.getheader("Location")
                if not location:
                    raise MediaError(f"{what}: {url} redirected without a Location")
                url = urllib.parse.urljoin(url, location)
                continue
            if resp.status != 200:
                raise MediaError(f"{what}: {url} answered HTTP {resp.status}")
            length = resp.getheader("Content-Length")
            if length is not None and length.isdigit() and int(length) > cfg.max_image_bytes:
                raise MediaError(f"{what} is {length} bytes, more than the {cfg.max_image_bytes} allowed")
            data = bytearray()
            while len(data) <= cfg.max_image_bytes:
                if time.monotonic() > deadline:
                    raise MediaError(f"{what}: fetching {url} took longer than {cfg.fetch_timeout} s")
                chunk = resp.read(65536)
                if not chunk:
                    return bytes(data)
                data += chunk
            raise MediaError(f"{what} is more than the {cfg.max_image_bytes} bytes allowed")
        except (OSError, http.client.HTTPException) as e:
            raise MediaError(f"{what}: cannot fetch {url}: {e}") from None
        finally:
            conn.close()
    raise MediaError(f"{what}: more than {cfg.max_redirects} redirects from the image URL")


def load_image_url(url: str, what: str, cfg: MediaConfig, used_pixels: int = 0):
    """An image_url part's url -> PIL image (data: inline, http(s) from allowed hosts);
    used_pixels as decode_image's."""
    if not isinstance(url, str) or not url:
        raise MediaError(f"{what} needs a url string")
    if url.startswith("data:"):
        head, sep, payload = url[5:].partition(",")
        if not sep or not head.endswith(";base64"):
            raise MediaError(f"{what}: a data URL must be data:<type>;base64,<data>")
        if len(payload) * 3 // 4 > cfg.max_image_bytes + 3:
            raise MediaError(f"{what} is about {len(payload) * 3 // 4} bytes, more than the "
                             f"{cfg.max_image_bytes} allowed")
        try:
            data = base64.b64decode(payload, validate=False)
        except (binascii.Error, ValueError):
            raise MediaError(f"{what}: the data URL is not valid base64") from None
        return decode_image(data, what, cfg, used_pixels)
    return decode_image(fetch(url, what, cfg), what, cfg, used_pixels)
