"""Which inner-product path each GEMM takes on this machine: measured once, cached per machine.

One kernel build runs on CPUs whose instructions issue at different rates: vdpbf16ps is the
fastest bf16 path on AMD Zen 4 but issues at about half the fp32 FMA rate on Intel Emerald
Rapids (84 vs 41 GMAC/s per core). So the first start on a machine times, on one core, in a
few milliseconds, what the chosen kernel variant can run:

  bf16   bf16 weights in steps of several tokens (prefill, batches): vdpbf16ps on bf16 pairs
         ("dpbf16") or the weights widened to fp32 in registers and FMA on fp32 rows ("fma"),
         each as its real GEMM tile over weights in cache (ops.pxi gemm_tile_rate); the faster
         wins. Decode (one token) streams with vdpbf16ps wherever the build has it whatever
         the choice: it is bound by memory bandwidth, not by the instruction.
  int8   int8-block weights (GGUF / AWQ / GPTQ formats): the build's one dot product
         ("vpdpbusd", "vpmaddubsw" or "scalar"); both instructions are timed where the build
         has both, and a note says if the other one would issue faster.

and the peak of each instruction (GMAC/s per core, src/kernels/peak.h) for `info` and the
benchmarks' percentage of peak. The result is cached in <user cache dir>/gemm_paths.json,
keyed by CPU model, microcode and flags; a file that does not parse, belongs to another machine
or cannot be read is ignored and rewritten. LITE_LLM_GEMM_PATH forces paths
(config.gemm_path_override). AMX is only detected and reported (no AMX kernels yet).

What lives elsewhere: the tiles (src/kernels/gemm.h, matmul.h), the timed loops (ops.pxi),
environment variables (config.py).
"""
from __future__ import annotations

import contextlib
import json
import logging
import os
import platform
import tempfile
import zlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Iterator

from lite_llm import config
from lite_llm._kernels import _cpu

log = logging.getLogger(__name__)

CACHE_FILE = "gemm_paths.json"
CACHE_FORMAT = 1        # bump when a tile changes what its measured rate means
OPS = ("bf16", "int8")
# the instruction whose peak bounds each path
PATH_INSTRUCTION = {"dpbf16": "dpbf16", "fma": "fma", "vpdpbusd": "vpdpbusd", "vpmaddubsw": "vpmaddubsw",
                    "usdot": "usdot", "sdot": "sdot", "smull": "smull", "vxe": "vxe"}


@dataclass(frozen=True)
class GemmPaths:
    variant: str                      # kernel build these figures belong to
    chosen: dict[str, str]            # operation ("bf16", "int8") -> path
    peaks: dict[str, float]           # instruction -> GMAC/s on one core (peak.h)
    tile_rates: dict[str, float]      # bf16 path -> GMAC/s of its GEMM tile in cache, one core
    source: str                       # "measured" or "cache"
    forced: tuple[str, ...] = ()      # operations LITE_LLM_GEMM_PATH forced
    notes: tuple[str, ...] = field(default=())

    def peak(self, op: str) -> float | None:
        """GMAC/s per core of the instruction the chosen path of `op` runs (None: not measured)."""
        return self.peaks.get(PATH_INSTRUCTION.get(self.chosen.get(op, ""), ""))

    def describe(self) -> list[str]:
        """One line per operation: the chosen path and why, then the measured peaks."""
        lines = []
        for op in OPS:
            path = self.chosen[op]
            why = "forced by LITE_LLM_GEMM_PATH" if op in self.forced else (
                "measured" if self.source == "measured" else "measured earlier, cached")
            if op == "bf16":
                rates = ", ".join(f"{p} {r:.1f}" for p, r in self.tile_rates.items())
                detail = f"GEMM tile GMAC/s per core: {rates}; " if rates else ""
                lines.append(f"bf16 prefill/batch GEMM: {path} ({detail}{why}); "
                             f"decode: {'dpbf16' if 'dpbf16' in self.tile_rates else 'fma'} stream")
            else:
                lines.append(f"int8-block GEMM: {path} (the {self.variant} kernels' dot product; {why})")
        peaks = ", ".join(f"{name} {gmacs:.1f}" for name, gmacs in self.peaks.items())
        lines.append(f"instruction peaks, GMAC/s per core: {peaks or 'not measured'}")
        lines += [f"note: {n}" for n in self.notes]
        return lines

    def as_dict(self) -> dict:
        return {"variant": self.variant, "chosen": dict(self.chosen), "peaks": dict(self.peaks),
                "tile_rates": dict(self.tile_rates), "source": self.source, "forced": list(self.forced),
                "notes": list(self.notes)}


# ----------------------------------------------------------------------------- machine key

def machine_key() -> dict[str, str]:
    """What makes measurements valid: CPU model, microcode and feature flags (as the kernel
    sees them), and the cache format."""
    text = ""
    try:
        with open("/proc/cpuinfo") as fh:
            text = fh.read().split("\n\n", 1)[0]
    except OSError:
        pass
    fields = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    flags = fields.get("flags") or fields.get("Features") or ""
    return {"cpu_model": fields.get("model name") or platform.processor() or platform.machine(),
            "microcode": fields.get("microcode", ""),
            "flags": f"{zlib.crc32(' '.join(sorted(flags.split())).encode()):08x}",   # hashlib would load OpenSSL
            "format": str(CACHE_FORMAT)}


# ----------------------------------------------------------------------------- measuring

def _rate(value: float) -> float:
    """Three significant digits: a slow core's rate (an emulated one: under 0.005 GMAC/s) must
    not round to 0, which the cache would take for a malformed entry and measure again."""
    return float(f"{value:.3g}")


def measure(kernels: ModuleType) -> dict:
    """Time every path and instruction of this kernel build on the calling core (a few ms)."""
    tile_rates = {path: _rate(kernels.gemm_tile_rate(path)) for path in kernels.BF16_PATHS}
    if len(tile_rates) > 1:   # again, in the other order: a frequency ramp must not favour one
        for path in reversed(kernels.BF16_PATHS):
            tile_rates[path] = max(tile_rates[path], _rate(kernels.gemm_tile_rate(path)))
    peaks = {name: _rate(kernels.instruction_peak(name)) for name in kernels.PEAK_KINDS}
    return {"tile_rates": tile_rates, "peaks": peaks}


def _pick(kernels: ModuleType, figures: dict) -> dict[str, str]:
    rates = figures["tile_rates"]
    return {"bf16": max(kernels.BF16_PATHS, key=lambda p: rates.get(p, 0.0)), "int8": kernels.INT8_PATH}


def valid_entry(kernels: ModuleType, entry: object) -> bool:
    """Whether a cache entry holds a tile rate for each of kernels' bf16 paths and each of its
    peaks, all positive numbers (anything else is measured again)."""
    if not isinstance(entry, dict):
        return False
    rates, peaks = entry.get("tile_rates"), entry.get("peaks")
    return (isinstance(rates, dict) and set(rates) == set(kernels.BF16_PATHS)
            and all(isinstance(v, (int, float)) and v > 0 for v in rates.values())
            and isinstance(peaks, dict) and set(peaks) == set(kernels.PEAK_KINDS)
            and all(isinstance(v, (int, float)) and v > 0 for v in peaks.values()))


# ----------------------------------------------------------------------------- the cache

def _read_cache(path: str, key: dict) -> dict:
    """{variant: figures} of the cache file if it is readable and of this machine, else {}."""
    try:
        with open(path, encoding="utf-8") as fh:
            data = json.load(fh)
    except FileNotFoundError:
        return {}
    except (OSError, ValueError, UnicodeDecodeError) as e:
        log.info("GEMM path cache %s ignored (%s): measuring again", path, e)
        return {}
    if not isinstance(data, dict) or data.get("machine") != key or not isinstance(data.get("variants"), dict):
        log.info("GEMM path cache %s is not of this machine or malformed: measuring again", path)
        return {}
    return data["variants"]


def _write_cache(path: str, key: dict, variants: dict) -> None:
    """Atomically (a reader never sees half a file); a failure is logged, never raised."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".gemm_paths.", dir=os.path.dirname(path))
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump({"machine": key, "variants": variants}, fh, indent=1, sort_keys=True)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("could not write the GEMM path cache %s: %s", path, e)


# (module, cache) -> the paths chosen in this process
_MEMO: dict[tuple[str, str], GemmPaths] = {}


def forget() -> None:
    """Forget the paths chosen so far in this process: the next choose() reads its cache file
    (or measures) again."""
    _MEMO.clear()


@contextlib.contextmanager
def chosen_aside() -> Iterator[None]:
    """The paths this process chose set aside while the block runs (it starts with none) and
    restored after it, so what is chosen from another cache file inside is forgotten."""
    saved = dict(_MEMO)
    _MEMO.clear()
    try:
        yield
    finally:
        _MEMO.clear()
        _MEMO.update(saved)


def choose(kernels: ModuleType, cache_dir: str | None = None, override: dict[str, str] | None = None,
           remeasure: bool = False) -> GemmPaths:
    """The paths of kernel module `kernels` on this machine: forced ones (override, default
    LITE_LLM_GEMM_PATH), the rest from the cache, measured (and cached) when the cache has
    nothing valid for this machine and variant. Deterministic given the cache file."""
    override = config.gemm_path_override() if override is None else override
    variant = kernels.ISA
    for op, path in override.items():
        valid = kernels.BF16_PATHS if op == "bf16" else (kernels.INT8_PATH,)
        if path not in valid:
            raise ValueError(f"LITE_LLM_GEMM_PATH: {op} path {path!r} cannot run in the {variant} kernels, which "
                             f"run {' or '.join(valid)}" + (" (another kernel variant, LITE_LLM_ISA=..., runs "
                                                            "the other int8 path)" if op == "int8" else ""))
    cache_dir = cache_dir or config.user_cache_dir()
    path = os.path.join(cache_dir, CACHE_FILE)
    memo_key = (variant, path)
    base = None if remeasure else _MEMO.get(memo_key)
    if base is None:
        key = machine_key()
        variants = _read_cache(path, key)
        entry = variants.get(variant)
        if not remeasure and valid_entry(kernels, entry):
            figures, source = entry, "cache"
        else:
            if entry is not None and not remeasure:
                log.info("GEMM path cache entry for %s is malformed: measuring again", variant)
            figures, source = measure(kernels), "measured"
            variants = {**variants, variant: figures}
            _write_cache(path, key, variants)
        notes = []
        peaks = figures["peaks"]
        if "vpdpbusd" in peaks and "vpmaddubsw" in peaks and peaks["vpmaddubsw"] > peaks["vpdpbusd"]:
            notes.append("vpmaddubsw issues faster than vpdpbusd here; the int8 kernels of this build "
                         "use vpdpbusd (LITE_LLM_ISA=avx512 runs vpmaddubsw)")
        base = GemmPaths(variant, _pick(kernels, figures), dict(peaks), dict(figures["tile_rates"]), source,
                         notes=tuple(notes))
        _MEMO[memo_key] = base
    if not override:
        return base
    return GemmPaths(variant, {**base.chosen, **override}, base.peaks, base.tile_rates, base.source,
                     forced=tuple(sorted(override)), notes=base.notes)


def amx() -> dict[str, bool]:
    """AMX units the CPU has and the OS enabled (reported only: no AMX kernels yet)."""
    return {f: bool(_cpu.has(f)) for f in ("amx_tile", "amx_bf16", "amx_int8")}
