"""Hugging Face int4 / int8 checkpoints (AWQ, GPTQ) read as ggml blocks, so they run on the
same block-quantized kernels as GGUF files.

A quantized linear `X` is stored as X.qweight (int32, 4- or 8-bit values packed), X.qzeros
(int32, packed zero points), X.scales (fp16) with one scale and zero per group of
`group_size` input features:  W[o, i] = (q[i, o] - z[i // group, o]) * s[i // group, o].

    AWQ  (quant_method "awq", version "gemm", 4-bit): qweight [K, N/8], values packed along
         the output features in the order 0 2 4 6 1 3 5 7; qzeros [K/group, N/8] alike.
    GPTQ (quant_method "gptq", 4- or 8-bit, desc_act false): qweight [K*bits/32, N], values
         packed along the input features, low bits first; qzeros [K/group, N*bits/32] packed
         along the outputs, stored minus one (checkpoint_format "gptq"; "gptq_v2" stores them
         as they are).

    W8A8 (quant_method "compressed-tensors", format "int-quantized", 8-bit symmetric weights
         per output channel): X.weight int8 [N, K], X.weight_scale [N, 1]; activations are
         quantized dynamically (per token there; per 32-value block here, finer).

    FP8  (quant_method "fp8", DeepSeek-V3 / Qwen3-FP8: X.weight float8_e4m3fn [N, K] and
         X.weight_scale_inv [ceil(N/bn), ceil(K/bk)], one scale per weight_block_size [bn, bk]
         block, or X.weight_scale [] / [1] without a block size; quant_method
         "compressed-tensors" with float 8-bit weights, strategy "channel" (X.weight_scale
         [N, 1]), "tensor" ([] / [1]) or "block"): W[n, k] = e4m3(q[n, k]) * scale of (n, k).
         Kept as stored, one byte a weight ("F8_E4M3" panels, src/kernels/gemm.h): each row
         carries its scale for every 128 columns, so a block's columns must be whole
         multiples of 128 (bn is free). Activations stay in floating point (no input
         quantization: "activation_scheme" is not used).

Every 32-value block of a row lies in one group, so it becomes one ggml block exactly: Q4_0
(d = s) where the zero point is 8, else Q4_1 (d = s, m = -z s rounded to fp16: 2^-11 of
the zero's offset); 8-bit with the zero point 128 becomes Q8_0 (d = s), and so does W8A8
(d = the channel's scale rounded to fp16: 2^-11 relative). 8-bit with other
zero points, desc_act (activation-order groups) and groups that do not divide into 32-value
blocks are refused with a ModelLoadError that says so.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from lite_llm.model.files import ModelLoadError
from lite_llm.model.gguf import TENSOR_TYPES, dequantize
from lite_llm.model.weights import convert

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)      # output column of each packed nibble, per 8


@dataclass(frozen=True)
class QuantSpec:
    method: str          # "awq" | "gptq" | "w8a8"
    bits: int
    group_size: int      # -1 for AWQ/GPTQ "one group per column" is taken as K
    zeros_plus_one: bool  # GPTQ v1 stores zero points minus one
    block: tuple[int, int] | None = None   # FP8: [bn, bk] of block scales; None: per tensor / channel


def quant_spec(raw: dict, where: str) -> QuantSpec | None:
    """The quantization of config.json's quantization_config, or None for a float checkpoint."""
    qc = raw.get("quantization_config")
    if not qc:
        return None
    method = str(qc.get("quant_method", "")).lower()
    if method == "compressed-tensors":
        return _w8a8_spec(qc, where)
    if method == "fp8":
        return _fp8_spec(qc.get("weight_block_size"), where)
    if method not in ("awq", "gptq"):
        raise ModelLoadError(f"{where}: quantization method {method!r} is not supported "
                             "(supported: awq, gptq, fp8, compressed-tensors W8A8 / FP8; or a GGUF file)")
    bits = int(qc.get("bits", qc.get("w_bit", 4)))
    group = int(qc.get("group_size", qc.get("q_group_size", 128)))
    if method == "awq":
        version = str(qc.get("version", "gemm")).lower()
        if version != "gemm" or bits != 4:
            raise ModelLoadError(f"{where}: AWQ {version!r} with {bits} bits is not supported (4-bit GEMM layout)")
        return QuantSpec("awq", 4, group, False)
    if qc.get("desc_act"):
        raise ModelLoadError(f"{where}: GPTQ with desc_act=true (activation-order groups) is not supported; "
                             "use a checkpoint quantized with desc_act=false")
    if bits not in (4, 8):
        raise ModelLoadError(f"{where}: GPTQ with {bits} bits is not supported (4 or 8)")
    return QuantSpec("gptq", bits, group, str(qc.get("checkpoint_format", "gptq")).lower() != "gptq_v2")


FP8_CHUNK = 128    # columns per scale of a packed FP8 row (LL_FP8_CHUNK, src/kernels/gemm.h)


def _fp8_spec(block, where: str) -> QuantSpec:
    if block is not None:
        try:
            bn, bk = (int(v) for v in block)
        except (TypeError, ValueError):
            raise ModelLoadError(f"{where}: FP8 weight_block_size {block!r} is not [rows, columns]") from None
        if bn <= 0 or bk <= 0 or bk % FP8_CHUNK:
            raise ModelLoadError(f"{where}: FP8 blocks of {bn} x {bk} are not supported: a block's columns "
                                 f"must be a multiple of {FP8_CHUNK}")
        block = (bn, bk)
    return QuantSpec("fp8", 8, -1, False, block)


def _w8a8_spec(qc: dict, where: str) -> QuantSpec:
    fmt = str(qc.get("format", "")).lower()
    groups = list((qc.get("config_groups") or {}).values())
    weights = [g.get("weights") or {} for g in groups]
    if fmt == "float-quantized" and weights and all(
            w.get("type") == "float" for w in weights):
        strategies = {w.get("strategy", "tensor") for w in weights}
        if not all(w.get("num_bits") == 8 and w.get("symmetric", True) for w in weights) \
                or not strategies <= {"channel", "tensor", "block"} or len(strategies) != 1:
            raise ModelLoadError(f"{where}: compressed-tensors format {fmt!r} with weights {weights} is not "
                                 "supported (supported: 8-bit float weights per channel, tensor or block)")
        blocks = {tuple(w.get("block_structure") or ()) for w in weights}
        if strategies == {"block"}:
            if len(blocks) != 1:
                raise ModelLoadError(f"{where}: compressed-tensors FP8 groups with different block structures")
            return _fp8_spec(list(blocks.pop()), where)
        return _fp8_spec(None, where)
    ok = fmt in ("int-quantized", "") and weights and all(
        w.get("num_bits") == 8 and w.get("type", "int") == "int" and w.get("symmetric", True)
        and w.get("strategy", "channel") in ("channel", "tensor") for w in weights)
    if not ok:
        raise ModelLoadError(f"{where}: compressed-tensors format {fmt!r} with weights {weights} is not supported "
                             "(supported: int-quantized, 8-bit symmetric int weights per channel or tensor)")
    return QuantSpec("w8a8", 8, -1, False)


def _unpack(packed: np.ndarray, bits: int, axis: int) -> np.ndarray:
    """int32 words -> their 32 / bits values (low bits first), laid out along `axis`."""
    per = 32 // bits
    words = packed.astype(np.uint32)
    vals = (words[..., None] >> (np.arange(per, dtype=np.uint32) * bits)) & np.uint32((1 << bits) - 1)
    vals = vals.astype(np.uint8)                                    # [..., words, per]
    if axis == 1:
        return vals.reshape(packed.shape[0], -1)
    return np.moveaxis(vals, -1, 1).reshape(-1, packed.shape[1])    # values along rows


def mxfp4_blocks(blocks: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """MXFP4 weights as Hugging Face stores them (gpt-oss: X_blocks uint8 [..., G, 16], two e2m1
    codes a byte, element 2i in the low nibble of byte i and 2i + 1 in the high one; X_scales
    uint8 [..., G], e8m0 exponents, value = e2m1 * 2^(e - 127)) -> the same values as ggml
    MXFP4 blocks, uint8 [..., G * 17] (e, then byte j = element j | element j + 16 << 4; ggml's
    values are doubled and its scale halved: the same e). Rows of these run as stored on the
    block kernels (layout.pack_blocks with type "MXFP4")."""
    blocks, scales = np.asarray(blocks, np.uint8), np.asarray(scales, np.uint8)
    if blocks.shape[-1] != 16 or blocks.shape[:-1] != scales.shape:
        raise ValueError(f"MXFP4 blocks {blocks.shape} and scales {scales.shape}: want [..., G, 16] and [..., G]")
    codes = np.stack([blocks & 15, blocks >> 4], axis=-1).reshape(*blocks.shape[:-1], 32)   # element order
    out = np.empty((*scales.shape, 17), np.uint8)
    out[..., 0] = scales
    out[..., 1:] = codes[..., :16] | (codes[..., 16:] << 4)
    return out.reshape(*scales.shape[:-1], scales.shape[-1] * 17)


def _e4m3_values() -> np.ndarray:
    """float32 [256]: the value of each float8_e4m3fn byte (bias 7, subnormals m 2^-9; the two
    NaN codes, never a weight, read as +-480 here). As the kernels widen it: the byte's sign,
    exponent and mantissa moved into an IEEE half (bias 15) is the value times 2^-8."""
    b = np.arange(256, dtype=np.uint16)
    return (((b & 0x80) << 8) | ((b & 0x7F) << 7)).astype(np.uint16).view(np.float16).astype(np.float32) * 256


E4M3_VALUES = _e4m3_values()


def unread(spec: QuantSpec | None) -> tuple[tuple[str, str], ...]:
    """Tensors of a checkpoint quantized as `spec` that no recipe reads, as (pattern, reason)
    pairs for arch.unread_tensors."""
    if spec is not None and spec.method in ("fp8", "w8a8"):
        return ((r".+\.input_scale", "a static activation scale: activations stay in floating point here (FP8) or "
                                     "are quantized per 32-value block as they come (W8A8)"),)
    return ()


def is_quantized_linear(ckpt, prefix: str) -> bool:
    """Whether `prefix` is stored quantized in checkpoint ckpt (of quantization ckpt.quant)."""
    if ckpt.quant is None:
        return False
    if ckpt.quant.method == "w8a8":
        return f"{prefix}.weight_scale" in ckpt
    if ckpt.quant.method == "fp8":
        if f"{prefix}.weight" not in ckpt:
            return False
        stype = ckpt.entry(f"{prefix}.weight").stype
        if stype != "F8_E4M3" and any(f"{prefix}.{s}" in ckpt for s in ("weight_scale", "weight_scale_inv")):
            raise ModelLoadError(f"{ckpt.path}: {prefix}.weight is {stype} beside an FP8 scale: only "
                                 "float8_e4m3fn weights are supported")
        return stype == "F8_E4M3"
    return f"{prefix}.weight" not in ckpt and f"{prefix}.qweight" in ckpt


class QuantLinear:
    """One quantized linear `prefix` of a checkpoint: its shape and its rows as ggml blocks."""

    def __init__(self, ckpt, prefix: str, spec: QuantSpec, shape: tuple[int, int]):
        self.ckpt, self.prefix, self.spec = ckpt, prefix, spec
        n, k = shape
        self.shape = shape
        self._rows: np.ndarray | None = None
        if spec.method == "fp8":
            self._fp8_init()
            return
        if spec.method == "w8a8":
            ckpt.entry(f"{prefix}.weight", shape)
            if ckpt.entry(f"{prefix}.weight").dtype != np.int8:
                raise ModelLoadError(f"{ckpt.path}: {prefix}.weight is not int8 in a W8A8 checkpoint")
            if k % 32:
                raise ModelLoadError(f"{ckpt.path}: {prefix}: {k} input features are not whole 32-value blocks")
            if int(np.prod(ckpt.entry(f"{prefix}.weight_scale").shape)) not in (1, n):
                raise ModelLoadError(f"{ckpt.path}: {prefix}.weight_scale has shape "
                                     f"{list(ckpt.entry(f'{prefix}.weight_scale').shape)}, expected [{n}, 1] or [1]")
            self.type_name = "Q8_0"
            return
        group = k if spec.group_size in (-1, 0) else spec.group_size
        if group % 32 or k % group:
            raise ModelLoadError(f"{ckpt.path}: {prefix}: group size {group} does not split {k} input features "
                                 "into whole 32-value blocks")
        self.group = group
        bits, per = spec.bits, 32 // spec.bits
        if spec.method == "awq":
            want = {"qweight": (k, n // per), "qzeros": (k // group, n // per), "scales": (k // group, n)}
        else:
            want = {"qweight": (k // per, n), "qzeros": (k // group, n // per), "scales": (k // group, n)}
        for part, wshape in want.items():
            name = f"{prefix}.{part}"
            if name not in ckpt:
                raise ModelLoadError(f"{ckpt.path}: {spec.method.upper()} tensor {name!r} is missing")
            got = ckpt.entry(name).shape
            if got != wshape:
                raise ModelLoadError(f"{ckpt.path}: {name!r} has shape {list(got)}, expected {list(wshape)} for a "
                                     f"[{n}, {k}] weight with {bits}-bit values in groups of {group} "
                                     "(is group_size right?)")
        self.type_name = ""
        zeros = self._zeros()
        center = 1 << (bits - 1)
        values = not ckpt.names_only    # the loader's walk of the names reads zeros: no value to check
        if values and bits == 8 and not (zeros == center).all():
            raise ModelLoadError(f"{ckpt.path}: {prefix}: 8-bit GPTQ with zero points other than 128 "
                                 "(asymmetric) is not supported")
        self.type_name = "Q8_0" if bits == 8 else "Q4_0" if (zeros == center).all() else "Q4_1"
        if f"{prefix}.g_idx" in ckpt:   # GPTQ's group of each input feature: in order unless desc_act
            g_idx = ckpt.read(f"{prefix}.g_idx", (k,))
            if values and not np.array_equal(g_idx, np.arange(k) // group):
                raise ModelLoadError(f"{ckpt.path}: {prefix}.g_idx puts input features in groups out of order "
                                     "(activation-order groups, desc_act) which is not supported")

    def _fp8_init(self) -> None:
        ckpt, prefix, (n, k) = self.ckpt, self.prefix, self.shape
        ckpt.entry(f"{prefix}.weight", self.shape)
        name = next((f"{prefix}.{s}" for s in ("weight_scale_inv", "weight_scale") if f"{prefix}.{s}" in ckpt), None)
        if name is None:
            raise ModelLoadError(f"{ckpt.path}: FP8 weight {prefix}.weight has no weight_scale_inv or weight_scale")
        got = tuple(ckpt.entry(name).shape)
        block = self.spec.block
        if block is None and int(np.prod(got, dtype=np.int64)) == 1:
            block = (n, k)                                       # one scale for the tensor
        elif block is None and got in ((n, 1), (n,)):
            block = (1, k)                                       # one scale per output channel
        elif block is None or got != (-(-n // block[0]), -(-k // block[1])):
            want = f"[{-(-n // block[0])}, {-(-k // block[1])}]" if block else f"[{n}, 1] or [1]"
            raise ModelLoadError(f"{ckpt.path}: {name} has shape {list(got)}, expected {want} for a [{n}, {k}] "
                                 "FP8 weight")
        if block[1] % FP8_CHUNK and block[1] < k:
            raise ModelLoadError(f"{ckpt.path}: {name}: scales per {block[1]} columns are not supported "
                                 f"(a multiple of {FP8_CHUNK})")
        self.scale_name, self.block = name, block
        self.type_name = "F8_E4M3"

    def fp8_scales(self, r0: int, r1: int) -> np.ndarray:
        """float32 [r1 - r0, ceil(K / 128)]: each row's scale for each 128 columns."""
        n, k = self.shape
        bn, bk = self.block
        s = convert(np.asarray(self.ckpt.read(self.scale_name)), "float32").reshape(-(-n // bn), -(-k // bk))
        rows = np.arange(r0, r1) // bn
        cols = np.minimum(np.arange(0, k, FP8_CHUNK) // bk, s.shape[1] - 1)
        return np.ascontiguousarray(s[rows][:, cols])

    def _fp8_blocks(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1 as packed FP8 rows take them (layout.pack_fp8): uint8 [r1 - r0, 4 C + K],
        each row's C = ceil(K / 128) scales (little-endian float32), then its K e4m3 bytes."""
        k = self.shape[1]
        scales = self.fp8_scales(r0, r1).astype("<f4")
        out = np.empty((r1 - r0, scales.shape[1] * 4 + k), np.uint8)
        out[:, :scales.shape[1] * 4] = scales.view(np.uint8)
        out[:, scales.shape[1] * 4:] = self.ckpt.read_rows(f"{self.prefix}.weight", r0, r1).view(np.uint8)
        return out

    def _zeros(self) -> np.ndarray:
        """Zero points z [K / group, N]."""
        spec = self.spec
        z = _unpack(self.ckpt.read(f"{self.prefix}.qzeros"), spec.bits, axis=1)
        if spec.method == "awq":
            z = z.reshape(z.shape[0], -1, 8)[:, :, np.argsort(AWQ_ORDER)].reshape(z.shape[0], -1)
        elif spec.zeros_plus_one:
            z = (z.astype(np.int16) + 1).astype(np.int16)
        return z.astype(np.int16)

    def _values(self) -> np.ndarray:
        """Quantized values q [N, K] (rows are output features)."""
        spec = self.spec
        packed = self.ckpt.read(f"{self.prefix}.qweight")
        if spec.method == "awq":
            q = _unpack(packed, 4, axis=1)                                  # [K, N] in AWQ order
            q = q.reshape(q.shape[0], -1, 8)[:, :, np.argsort(AWQ_ORDER)].reshape(q.shape[0], -1)
        else:
            q = _unpack(packed, spec.bits, axis=0)                          # [K, N]
        return np.ascontiguousarray(q.T)

    def blocks(self) -> np.ndarray:
        """All rows as ggml blocks: uint8 [N, K / 32 * block bytes] (built once, then kept)."""
        if self._rows is None and self.spec.method == "w8a8":
            n, k = self.shape
            scale = convert(np.asarray(self.ckpt.read(f"{self.prefix}.weight_scale")), "float32").reshape(-1)
            out = np.empty((n, k // 32, 34), np.uint8)
            out[..., 0:2] = np.broadcast_to(scale, (n,)).astype("<f2")[:, None, None].view(np.uint8)
            out[..., 2:] = self.ckpt.read(f"{self.prefix}.weight").reshape(n, k // 32, 32).view(np.uint8)
            self._rows = out.reshape(n, -1)
        if self._rows is None:
            n, k = self.shape
            q = self._values().reshape(n, k // 32, 32)                       # [N, blocks, 32]
            g = np.arange(k // 32) * 32 // self.group                       # group of each block
            s = self.ckpt.read(f"{self.prefix}.scales")                      # fp16 [K / group, N]
            s = np.asarray(s).view(np.float16) if s.dtype != np.float16 else s
            d = s.T[:, g]                                                    # [N, blocks] fp16
            if self.type_name == "Q8_0":
                out = np.empty((n, k // 32, 34), np.uint8)
                out[..., 0:2] = d.astype("<f2")[..., None].view(np.uint8)
                out[..., 2:] = (q.astype(np.int16) - 128).astype(np.int8).view(np.uint8)
            else:
                head = 2 if self.type_name == "Q4_0" else 4
                out = np.empty((n, k // 32, head + 16), np.uint8)
                out[..., 0:2] = d.astype("<f2")[..., None].view(np.uint8)
                if self.type_name == "Q4_1":
                    z = self._zeros().T[:, g].astype(np.float32)                 # [N, blocks]
                    m = (-z * d.astype(np.float32)).astype("<f2")
                    out[..., 2:4] = m[..., None].view(np.uint8)
                out[..., head:] = q[..., :16] | (q[..., 16:] << 4)
            self._rows = out.reshape(n, -1)
        return self._rows

    def read_blocks(self, r0: int, r1: int) -> np.ndarray:
        if self.spec.method == "fp8":
            return self._fp8_blocks(r0, r1)
        return self.blocks()[r0:r1].copy()

    def read_rows(self, r0: int, r1: int) -> np.ndarray:
        """Rows r0..r1 dequantized to float32 (for a weight that cannot stay in blocks)."""
        if self.spec.method == "fp8":
            k = self.shape[1]
            w = E4M3_VALUES[self.ckpt.read_rows(f"{self.prefix}.weight", r0, r1).view(np.uint8)]
            return w * np.repeat(self.fp8_scales(r0, r1), FP8_CHUNK, axis=1)[:, :k]
        type_id = next(i for i, t in TENSOR_TYPES.items() if t[0] == self.type_name)
        raw = self.read_blocks(r0, r1)
        return dequantize(raw.reshape(-1), type_id, (r1 - r0, self.shape[1]))
