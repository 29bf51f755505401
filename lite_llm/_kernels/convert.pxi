# Load-time conversions (ggml blocks -> fp32, fp32 -> bf16, rows -> packed panels), parallel
# over blocks/panels: the start-up budget is a couple of seconds for the whole model.

# ggml type name -> (elements per block, bytes per block, C function index)
QUANT_BLOCKS = {"Q8_0": (32, 34, 0), "Q4_0": (32, 18, 1), "Q4_1": (32, 20, 2),
                "Q4_K": (256, 144, 3), "Q6_K": (256, 210, 4)}


def dequantize(const unsigned char[::1] raw, str type_name, float[::1] out, int num_threads=1):
    """ggml blocks `raw` of `type_name` -> out (fp32, one element per dequantized value)."""
    if type_name not in QUANT_BLOCKS:
        raise ValueError(f"dequantize: unsupported block type {type_name}")
    cdef Py_ssize_t per, nbytes, fn, num_blocks, tid, nt = max(num_threads, 1)
    per, nbytes, fn = QUANT_BLOCKS[type_name]
    if raw.shape[0] % nbytes or out.shape[0] != raw.shape[0] // nbytes * per:
        raise ValueError(f"dequantize: {raw.shape[0]} bytes of {type_name} do not make {out.shape[0]} values")
    num_blocks = raw.shape[0] // nbytes
    if num_blocks == 0:
        return
    for tid in prange(nt, nogil=True, schedule="static", num_threads=nt):
        if fn == 0:
            ll_dequant_q8_0(&raw[0], &out[0], tid * num_blocks // nt, (tid + 1) * num_blocks // nt)
        elif fn == 1:
            ll_dequant_q4_0(&raw[0], &out[0], tid * num_blocks // nt, (tid + 1) * num_blocks // nt)
        elif fn == 2:
            ll_dequant_q4_1(&raw[0], &out[0], tid * num_blocks // nt, (tid + 1) * num_blocks // nt)
        elif fn == 3:
            ll_dequant_q4_k(&raw[0], &out[0], tid * num_blocks // nt, (tid + 1) * num_blocks // nt)
        else:
            ll_dequant_q6_k(&raw[0], &out[0], tid * num_blocks // nt, (tid + 1) * num_blocks // nt)


def f32_to_bf16(const float[::1] src, uint16_t[::1] dst, int num_threads=1):
    """Round to nearest even, NaNs kept quiet."""
    cdef Py_ssize_t n = src.shape[0], tid, nt = max(num_threads, 1)
    if dst.shape[0] != n:
        raise ValueError("f32_to_bf16: length mismatch")
    if n == 0:
        return
    for tid in prange(nt, nogil=True, schedule="static", num_threads=nt):
        ll_f32_to_bf16_n(&src[0], &dst[0], tid * n // nt, (tid + 1) * n // nt)


def pack_into(src, dst, str dtype, int num_threads=1):
    """src [N, K] (C-contiguous; fp32, fp16, or bf16 bits as uint16) -> dst, the packed
    layout of layout.pack (allocated by the caller)."""
    cdef int wtype = WTYPES[dtype]
    if src.ndim != 2 or not src.flags.c_contiguous or not dst.flags.c_contiguous:
        raise ValueError("pack_into: src must be a C-contiguous 2-D array")
    if src.dtype.itemsize != (4 if wtype == LL_W_F32 else 2) or dst.dtype.itemsize != src.dtype.itemsize:
        raise ValueError(f"pack_into: {src.dtype} / {dst.dtype} do not fit {dtype}")
    cdef Py_ssize_t n = src.shape[0], k = src.shape[1], panels = (n + 15) // 16, tid, nt = max(num_threads, 1)
    cdef Py_ssize_t need = panels * 16 * (((k + 1) // 2) * 2 if wtype == LL_W_BF16 else k)
    if dst.size != need:
        raise ValueError(f"pack_into: dst has {dst.size} elements, the layout needs {need}")
    cdef const void *sp = _ptr(src)
    cdef void *dp = <void *>_ptr(dst)
    if nt > panels:
        nt = panels
    if panels == 0:
        return
    for tid in prange(nt, nogil=True, schedule="static", num_threads=nt):
        ll_pack_panels(sp, dp, n, k, wtype, tid * panels // nt, (tid + 1) * panels // nt)
