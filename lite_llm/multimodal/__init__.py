"""Images in, text out: what a vision-language model adds around the text engine.

    front end (HTTP thread, LLM.generate)         engine thread (runner)
    images -> Processor.process(prompt ids) ----> VisionRunner.step_inputs(step)
      preprocess, expand each image placeholder     encode the step's images not cached yet
      to the encoder's output length, M-RoPE        (by image hash), -> mm_embeds [M, E],
      positions, an image hash -> MMPrompt          embed_src [T], rope_pos [T, 3] for the
                                                    step's ONE forward call

The scheduler never ends a prefill chunk inside an image's tokens (whole_images) and prefix-cache
block hashes include the hashes of the images a block holds (MMPrompt.block_key), so two
different images never share cached blocks. For a model whose image tokens attend to each other
in both directions (Gemma 3), step_inputs also gives each image token its image's last position
as the last key it attends to (attn_pos [T]): the whole image is in the step.

Supported: Qwen2.5-VL (qwen2_5_vl.py); LLaVA-1.5 (llava.py: an HF directory, or a GGUF language
model with its llama.cpp mmproj file); Gemma 3 (gemma3.py: an HF directory, or a GGUF language
model with its llama.cpp mmproj file). Model-specific code lives in its
module; this one is the model-neutral plumbing.
"""
from __future__ import annotations

import dataclasses
import json
import os
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np

from lite_llm.multimodal import gemma3, llava, qwen2_5_vl
from lite_llm.multimodal.media import (DEFAULT_PIXELS_PER_REQUEST, MediaConfig, MediaError, check_image,  # noqa: F401
                                       load_image_url)

try:
    from _blake2 import blake2b
except ImportError:
    from hashlib import blake2b

# Patches of one tower call: a step's images go together up to this many (an image larger alone).
# Two 1024-patch Qwen2.5-VL-3B images took 5-10 % longer in one call than in two (BENCHMARKS.md:
# the activations of 2048 rows stream past L2 once per panel group), while small images gain
# from filling the GEMM tiles together.
MAX_PATCHES_PER_CALL = 1024

VISION_ARCHITECTURES = ("Qwen2_5_VLForConditionalGeneration", "LlavaForConditionalGeneration",
                       "Gemma3ForConditionalGeneration")


@dataclass(frozen=True)
class MMItem:
    """One image of a prompt: its placeholder tokens [offset, offset + length) and its input."""
    offset: int
    length: int
    hash: bytes                     # of the preprocessed pixels and grid: the encoder cache key
    pixel_values: np.ndarray        # float32 [patches, K]
    grid: tuple[int, int, int]


@dataclass(frozen=True)
class MMPrompt:
    """The images of one prompt and, for multimodal RoPE, every prompt token's positions."""
    items: tuple[MMItem, ...]
    rope_pos: np.ndarray | None     # int32 [num_prompt_tokens, 3]; None: positions are 1-D
    delta: int = 0                  # past the prompt, position p turns as p + delta

    @property
    def ranges(self) -> tuple[tuple[int, int], ...]:
        return tuple((it.offset, it.length) for it in self.items)

    def block_key(self, start: int, end: int) -> bytes:
        """Hashes of the images with tokens in [start, end), for that block's prefix-cache hash."""
        return b"".join(it.hash for it in self.items if it.offset < end and start < it.offset + it.length)


def check_images_fit(mm: MMPrompt, max_num_batched_tokens: int) -> None:
    """ValueError naming the first image whose tokens cannot fit one step (a chunk holds an image
    whole)."""
    for k, item in enumerate(mm.items):
        if item.length > max_num_batched_tokens:
            raise ValueError(f"image {k} takes {item.length} tokens, more than max_num_batched_tokens "
                             f"{max_num_batched_tokens}: send a smaller image or lower max_pixels")


def takes_images(loaded) -> bool:
    """Whether a loaded checkpoint (model.loader.LoadedModel) has an image encoder: an mmproj
    file beside it, or a vision-language architecture."""
    return getattr(loaded, "mmproj", None) is not None or (
        loaded.config.architecture in VISION_ARCHITECTURES and not loaded.is_gguf)


def whole_images(request, start: int, num_new: int) -> int:
    """num_new cut back so tokens [start, start + num_new) do not end inside an image; 0 when the
    chunk would start inside one it cannot finish (it waits for a step with room)."""
    mm = getattr(request, "mm", None)
    if mm is None or not mm.items:
        return num_new
    end = start + num_new
    for off, n in mm.ranges:
        if off < end < off + n:
            return off - start if off > start else 0
    return num_new


def encoder_cut(request, start: int, num_new: int, room: int, encoded, step_images: set) -> tuple[int, int, list]:
    """The step's encoder budget (vLLM's: an image's encoder tokens count against
    max_num_batched_tokens beside the step's tokens), for chunk [start, start + num_new) of a
    request with images. Each image of the chunk that is neither in `encoded` (the encoder cache,
    by hash) nor already encoded this step (step_images) costs its length in tokens; room is the
    step's budget left. Returns (num_new, encoder tokens, their image hashes): the chunk cut back
    before the first image whose cost would pass room (0: the request waits for a step with room)
    and its text after the images to what room leaves. The first image a step encodes always
    fits (an image of more than half the budget could otherwise never run: check_images_fit
    guarantees only that its tokens fit one step), as does an image the chunk resumes inside."""
    enc, hashes, kept_end = 0, [], start
    for it in request.mm.items:
        if it.offset + it.length <= start or it.offset >= start + num_new:
            continue
        if it.hash in step_images or it.hash in hashes or (encoded is not None and it.hash in encoded):
            continue
        first = not step_images and not hashes
        if it.offset >= start and not first and (it.offset + it.length - start) + enc + it.length > room:
            return it.offset - start, enc, hashes
        enc += it.length
        hashes.append(it.hash)
        kept_end = it.offset + it.length
    if hashes and num_new + enc > room:     # the text after them: what room leaves, never inside an image
        num_new = max(whole_images(request, start, max(room - enc, 0)), kept_end - start)
    return num_new, enc, hashes


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path, encoding="utf-8") as fh:
        return json.load(fh)


def tower(source: str, raw: dict, mmproj: str | None, with_tensors: bool) -> tuple[object, object, dict | None]:
    """The one place the vision towers are told apart: (model module, its tower config, the
    tower's tensors when with_tensors, else None) of the checkpoint at source (raw: its
    config.json, {} for a GGUF file) with its llama.cpp mmproj file if any. Gemma 3 and LLaVA
    come from an HF directory or an mmproj (its projector type says which); Qwen2.5-VL from an
    HF directory."""
    arch = (raw.get("architectures") or [None])[0]
    projector = llava.mmproj_projector(mmproj) if mmproj is not None else None
    if projector == "gemma3" or arch in gemma3.HF_ARCHITECTURES:
        if projector == "gemma3":
            cfg, tensors = gemma3.read_mmproj(mmproj, source, with_tensors=with_tensors)
        else:
            cfg = gemma3.config(source, raw)
            tensors = gemma3.read_hf(source, cfg) if with_tensors else None
        return gemma3, cfg, tensors
    if mmproj is not None or arch in llava.HF_ARCHITECTURES:
        if mmproj is not None:
            cfg, tensors = llava.read_mmproj(mmproj, with_tensors=with_tensors)
        else:
            cfg = llava.hf_config(source, raw)
            tensors = llava.read_hf(source, cfg) if with_tensors else None
        return llava, cfg, tensors
    cfg = qwen2_5_vl.VisionConfig.from_hf(raw, _read_json(os.path.join(source, "preprocessor_config.json")))
    return qwen2_5_vl, cfg, qwen2_5_vl.read_hf(source) if with_tensors else None


class Processor:
    """A vision model's front-end half: images + prompt ids -> expanded ids and an MMPrompt."""

    def __init__(self, source: str, raw: dict, mmproj: str | None = None):
        self.module, self.vision, _ = tower(source, raw, mmproj, with_tensors=False)
        if self.module is gemma3:
            self.placeholder = "<start_of_image>"   # Gemma 3's chat template writes it for an image
            self.placeholder_id = self.vision.boi_token_id
        elif self.module is llava:
            if mmproj is not None and os.path.isfile(source):
                # <image>, or llama.cpp's media marker where the vocabulary lacks it
                self.placeholder, self.placeholder_id, fill = llava.gguf_placeholder_of(source)
            elif mmproj is not None:
                fill = int(raw.get("image_token_id", raw.get("image_token_index", -1)))
                self.placeholder, self.placeholder_id = "<image>", fill
            else:
                self.placeholder, self.placeholder_id, fill = "<image>", self.vision.image_token_id, None
            if fill is not None:
                self.vision = dataclasses.replace(self.vision, image_token_id=fill)
        else:
            self.placeholder = "<|vision_start|><|image_pad|><|vision_end|>"   # one image in a prompt's text
            self.placeholder_id = self.vision.image_token_id

    @classmethod
    def for_model(cls, source: str, mmproj: str | None = None) -> "Processor | None":
        """The processor of the checkpoint at source (with its mmproj file beside a GGUF
        language model), None when it takes no images."""
        if mmproj is not None:
            return cls(source, _read_json(os.path.join(source, "config.json")) if os.path.isdir(source) else {},
                       mmproj)
        if not os.path.isdir(source):
            return None
        raw = _read_json(os.path.join(source, "config.json"))
        if (raw.get("architectures") or [None])[0] not in VISION_ARCHITECTURES:
            return None
        return cls(source, raw)

    def process(self, prompt_token_ids: list[int], images: list, cfg: MediaConfig) -> tuple[list[int], MMPrompt]:
        """Each image placeholder token of the prompt (placeholder_id) becomes the image's output
        length of image tokens (vision.image_token_id)."""
        vc = self.vision
        if len(images) > cfg.max_images:
            raise MediaError(f"{len(images)} images in one prompt, more than the limit of {cfg.max_images} "
                             "(--limit-mm-per-prompt)")
        if self.module is gemma3:       # <start_of_image> -> the full image sequence; a fixed square
            placeholders = prompt_token_ids.count(vc.boi_token_id)
            if placeholders != len(images):
                raise MediaError(f"the prompt has {placeholders} image placeholders (<start_of_image>) for "
                                 f"{len(images)} images")
            prompt_token_ids, images = gemma3.with_crops(prompt_token_ids, images, vc)   # pan-and-scan
            ids, offsets = gemma3.expand(prompt_token_ids, vc)
            side = vc.side
            return ids, MMPrompt(tuple(_item(off, vc.num_image_tokens, gemma3.preprocess(image, vc), (1, side, side))
                                       for off, image in zip(offsets, images)), None, 0)
        at = [i for i, t in enumerate(prompt_token_ids) if t == self.placeholder_id]
        if len(at) != len(images):
            raise MediaError(f"the prompt has {len(at)} image placeholders for {len(images)} images")
        max_pixels, min_pixels = cfg.processor_kwargs.get("max_pixels"), cfg.processor_kwargs.get("min_pixels")
        ids: list[int] = []
        items = []
        prev = 0
        for k, (pos, image) in enumerate(zip(at, images)):
            if self.module is llava:      # a fixed square: max_pixels / min_pixels do not apply
                pixels = llava.preprocess(image, vc)
                side = vc.image_size // vc.patch_size
                grid, n = (1, side, side), vc.num_image_tokens
            else:
                pixels, grid = self.module.preprocess(image, vc, max_pixels=max_pixels, min_pixels=min_pixels)
                n = self.module.num_image_tokens(grid, vc)
            ids.extend(prompt_token_ids[prev:pos])
            items.append(_item(len(ids), n, pixels, grid))
            ids.extend([vc.image_token_id] * n)
            prev = pos + 1
        ids.extend(prompt_token_ids[prev:])
        if self.module is llava:          # 1-D positions: image rows count like tokens
            return ids, MMPrompt(tuple(items), None, 0)
        rope_pos, delta = self.module.mrope_positions(ids, [it.grid for it in items], vc)
        return ids, MMPrompt(tuple(items), rope_pos, delta)


def _item(offset: int, length: int, pixels: np.ndarray, grid: tuple[int, int, int]) -> MMItem:
    """The MMItem of an image whose tokens are [offset, offset + length), hashed on its pixels."""
    h = blake2b(digest_size=16)
    h.update(np.asarray(grid, np.int64).tobytes())
    h.update(pixels.tobytes())
    return MMItem(offset, length, h.digest(), pixels, grid)


class VisionRunner:
    """The engine-thread half: the vision encoder, its output cache, and each step's arrays."""

    def __init__(self, source: str, config, max_cached_rows: int = 1 << 16, kernels=None, dtype: str = "float32",
                 num_threads: int = 1, bf16_path: str | None = None, mmproj: str | None = None):
        self.mrope = bool(config.mrope_section)
        self.dim = config.dim
        self.cache: OrderedDict[bytes, np.ndarray] = OrderedDict()   # image hash -> [n, E], LRU order
        self.cached_rows = 0
        self.max_cached_rows = max_cached_rows
        self.num_encoded = 0            # images run through the encoder (tests, metrics)
        self.step_encoded = 0           # of them, in the last step_inputs call (one step's batch)
        self.encode_seconds = 0.0
        module, self.vision, tensors = tower(source, _read_json(os.path.join(source, "config.json")), mmproj,
                                             with_tensors=True)
        self.bidirectional = module is gemma3       # an image's tokens see it all
        if module is gemma3 or module is llava:
            if self.vision.out_dim != config.dim:
                error = gemma3.Gemma3VisionError if module is gemma3 else llava.LlavaError
                raise error(f"{mmproj or source}: the projector gives rows of {self.vision.out_dim}, the "
                            f"language model takes {config.dim}: the vision tower and the model do not belong together")
            encoder = gemma3.SiglipEncoder if module is gemma3 else llava.ClipEncoder
        else:
            encoder = module.VisionEncoder
        self.encoder = encoder(self.vision, tensors, kernels, dtype, num_threads, bf16_path)
        del tensors

    def _step_embeddings(self, chunks) -> dict[bytes, np.ndarray]:
        """Image hash -> rows [n, E] of every image with tokens in the step's chunks. The ones the
        cache holds are taken first, then the others encoded together (one tower call per
        MAX_PATCHES_PER_CALL patches), then entries evicted down to max_cached_rows, oldest first and
        never the step's own: an image the scheduler counted as cached (encoder_cut) is never
        evicted by one the step encodes, and so never encoded twice, outside the step's budget."""
        rows: dict[bytes, np.ndarray] = {}
        missing: dict[bytes, MMItem] = {}
        for c in chunks:
            mm = getattr(c.request, "mm", None)
            for it in (mm.items if mm is not None else ()):
                if it.hash in rows or it.hash in missing or not (
                        it.offset < c.start + c.num_new_tokens and c.start < it.offset + it.length):
                    continue
                hit = self.cache.get(it.hash)
                if hit is None:
                    missing[it.hash] = it
                else:
                    self.cache.move_to_end(it.hash)
                    rows[it.hash] = hit
        if missing:
            import time
            t0 = time.perf_counter()
            items, encoded, group = list(missing.values()), [], []
            for k, it in enumerate(items):
                group.append((it.pixel_values, it.grid))
                if k + 1 == len(items) or sum(p.shape[0] for p, _ in group) + \
                        items[k + 1].pixel_values.shape[0] > MAX_PATCHES_PER_CALL:
                    encoded += self.encoder.encode_many(group)
                    group = []
            self.encode_seconds += time.perf_counter() - t0
            self.num_encoded += len(items)
            for it, emb in zip(items, encoded):
                rows[it.hash] = emb
                self.cache[it.hash] = emb
                self.cached_rows += emb.shape[0]
            stale = (h for h in list(self.cache) if h not in rows)     # oldest first, the step's kept
            while self.cached_rows > self.max_cached_rows:
                h = next(stale, None)
                if h is None:
                    break
                self.cached_rows -= self.cache.pop(h).shape[0]
        return rows

    def step_inputs(self, chunks, num_tokens: int, positions: np.ndarray):
        """(mm_embeds [M, E] or None, embed_src [T] or None, rope_pos [T, 3] or None, attn_pos [T]
        or None) of a step whose chunks lay their tokens out in order (input_batch.py); attn_pos:
        the last position each token attends to, its image's last for an image token of a
        bidirectional model, else its own."""
        rope_pos = np.repeat(positions[:, None], 3, axis=1).astype(np.int32) if self.mrope else None
        parts, src, attn = [], None, None
        encoded_before = self.num_encoded
        step_rows = self._step_embeddings(chunks)
        num_rows = 0
        offset = 0
        for c in chunks:
            mm = getattr(c.request, "mm", None)
            start, n = c.start, c.num_new_tokens
            if mm is not None:
                if rope_pos is not None and mm.rope_pos is not None:
                    p = np.arange(start, start + n)
                    in_prompt = p < mm.rope_pos.shape[0]
                    rows = rope_pos[offset:offset + n]
                    rows[in_prompt] = mm.rope_pos[p[in_prompt]]
                    rows[~in_prompt] += mm.delta
                for it in mm.items:
                    lo, hi = max(start, it.offset), min(start + n, it.offset + it.length)
                    if lo >= hi:
                        continue
                    emb = step_rows[it.hash]
                    if self.bidirectional:
                        if attn is None:
                            attn = np.array(positions[:num_tokens], np.int32)
                        attn[offset + lo - start:offset + hi - start] = it.offset + it.length - 1
                    if src is None:
                        src = np.full(num_tokens, -1, np.int32)
                    src[offset + lo - start:offset + hi - start] = num_rows + np.arange(lo - it.offset, hi - it.offset)
                    parts.append(emb)
                    num_rows += emb.shape[0]
            offset += n
        mm_embeds = np.ascontiguousarray(np.concatenate(parts), np.float32) if parts else None
        self.step_encoded = self.num_encoded - encoded_before
        return mm_embeds, src, rope_pos, attn


def load_vision(loaded, kernels=None, num_threads: int = 1, bf16_path: str | None = None) -> VisionRunner | None:
    """The VisionRunner of a loaded checkpoint that takes images, else None; its tower runs on
    `kernels` in the checkpoint's engine dtype (float16 weights run as bfloat16)."""
    mmproj = getattr(loaded, "mmproj", None)
    if not takes_images(loaded):
        return None
    dtype = "float32" if loaded.dtype == "float32" else "bfloat16"
    return VisionRunner(loaded.source, loaded.config, kernels=kernels, dtype=dtype, num_threads=num_threads,
                        bf16_path=bf16_path, mmproj=mmproj)


# ---- front-end helpers (LLM.generate / LLM.chat, the server) -----------------------------------


def media_config(limit_mm_per_prompt=None, mm_processor_kwargs=None, allowed_media_domains=None,
                 max_image_pixels_per_request: int | None = DEFAULT_PIXELS_PER_REQUEST) -> MediaConfig:
    """MediaConfig from vLLM-style options: dicts or their JSON text; domains a list or a
    comma/space separated string; max_image_pixels_per_request None or 0: no cap. A bad value
    is a ValueError naming the option."""
    def as_dict(value, name):
        if value is None:
            return {}
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except ValueError:
                raise ValueError(f"{name} must be a JSON object, got {value!r}") from None
        if not isinstance(value, dict):
            raise ValueError(f"{name} must be a JSON object")
        return value
    limits = as_dict(limit_mm_per_prompt, "--limit-mm-per-prompt")
    for key, n in limits.items():
        if key != "image" or not isinstance(n, int) or n < 0:
            raise ValueError(f"--limit-mm-per-prompt: {key!r}: only \"image\" with a count >= 0 is supported")
    kwargs = as_dict(mm_processor_kwargs, "--mm-processor-kwargs")
    for key, n in kwargs.items():
        if key not in ("max_pixels", "min_pixels") or not isinstance(n, int) or n <= 0:
            raise ValueError(f"--mm-processor-kwargs: {key!r}: max_pixels / min_pixels take a positive count")
    if isinstance(allowed_media_domains, str):
        allowed_media_domains = allowed_media_domains.replace(",", " ").split()
    if max_image_pixels_per_request is not None and (not isinstance(max_image_pixels_per_request, int)
                                                     or max_image_pixels_per_request < 0):
        raise ValueError(f"--max-image-pixels-per-request must be a count >= 0, got {max_image_pixels_per_request!r}")
    return MediaConfig(allowed_domains=tuple(allowed_media_domains or ()),
                       limit_per_prompt={"image": limits.get("image", 4)},
                       max_pixels=None, processor_kwargs=kwargs,
                       max_pixels_per_request=max_image_pixels_per_request or None)


def image_of_part(part: dict, what: str, cfg: MediaConfig, used_pixels: int = 0):
    """An OpenAI content part {"type": "image_url", "image_url": {"url": ...}} (or a bare url
    string) -> a PIL image; vLLM's offline {"type": "image_pil", "image_pil": PIL} too.
    used_pixels: the pixels of the request's images decoded before this one (the sum is bounded
    by cfg.max_pixels_per_request, checked from the header before decoding)."""
    kind = part.get("type")
    if kind == "image_pil":
        return check_image(part.get("image_pil"), what, cfg)
    spec = part.get("image_url")
    url = spec.get("url") if isinstance(spec, dict) else spec
    return load_image_url(url, what, cfg, used_pixels)


def flatten_chat(conversation: list[dict], processor: Processor | None, cfg: MediaConfig) -> tuple[list[dict], list]:
    """Messages whose content is a list of parts -> (messages with text content, their images in
    order): each image part becomes the model's placeholder text where it stood."""
    out, images = [], []
    for i, m in enumerate(conversation):
        content = m.get("content")
        if not isinstance(content, list):
            out.append(m)
            continue
        text = []
        for j, part in enumerate(content):
            kind = part.get("type") if isinstance(part, dict) else None
            if kind == "text":
                text.append(part.get("text", ""))
            elif kind in ("image_url", "image_pil"):
                where = f"messages[{i}].content[{j}]"
                if processor is None:
                    raise MediaError(f"'{where}': this model does not take images")
                used = sum(im.width * im.height for im in images)
                images.append(image_of_part(part, f"image {len(images)} ({where})", cfg, used))
                text.append(processor.placeholder)
            else:
                raise MediaError(f"messages[{i}].content[{j}]: content part type {kind!r} is not supported")
        out.append({**m, "content": "".join(text) if any(p.get("type") != "text" for p in content)
                    else "\n".join(text)})
    return out, images
