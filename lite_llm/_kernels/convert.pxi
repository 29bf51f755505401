# Load-time conversions (ggml blocks -> fp32, fp32 -> bf16, rows -> packed panels), parallel
# over blocks/panels: the start-up budget is a couple of seconds for the whole model.

def dequantize(const unsigned char[::1] raw, str type_name, float[::1] out, int num_threads=1):
    """ggml blocks `raw` of `type_name` -> out (fp32, one element per dequantized value)."""
    cdef int wtype = WTYPES.get(type_name, -1)
    if wtype < 0 or not ll_wtype_is_quant(wtype):
        raise ValueError(f"dequantize: unsupported block type {type_name}")
    cdef Py_ssize_t per = ll_qblock(wtype), nbytes = ll_ggml_block_bytes(wtype), num_blocks, tid
    cdef Py_ssize_t nt = max(num_threads, 1)
    if raw.shape[0] % nbytes or out.shape[0] != raw.shape[0] // nbytes * per:
        raise ValueError(f"dequantize: {raw.shape[0]} bytes of {type_name} do not make {out.shape[0]} values")
    num_blocks = raw.shape[0] // nbytes
    if num_blocks == 0:
        return
    for tid in prange(nt, nogil=True, schedule="static", num_threads=nt):
        ll_dequant_ggml(&raw[0], wtype, &out[0], tid * num_blocks // nt, (tid + 1) * num_blocks // nt)


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


def qpack_into(const unsigned char[:, ::1] raw, dst, str type_name, Py_ssize_t k, int num_threads=1):
    """Raw ggml rows raw [rows, row bytes] of `type_name` -> dst uint8 [ceil(rows / 16), panel
    bytes], the interleaved panels of src/kernels/qgemm.h (allocated by the caller)."""
    cdef int wtype = WTYPES.get(type_name, -1)
    if wtype < 0 or not ll_wtype_is_quant(wtype):
        raise ValueError(f"qpack_into: {type_name} is not a block-quantized format")
    cdef Py_ssize_t rows = raw.shape[0], panels = (rows + 15) // 16, tid, nt = max(num_threads, 1)
    if k % ll_qblock(wtype) or raw.shape[1] != k // ll_qblock(wtype) * ll_ggml_block_bytes(wtype):
        raise ValueError(f"qpack_into: rows of {raw.shape[1]} bytes are not {k} values of {type_name}")
    if (dst.dtype != np.uint8 or not dst.flags.c_contiguous
            or dst.shape != (panels, ll_qpanel_bytes(wtype, k))):
        raise ValueError(f"qpack_into: dst {dst.shape} {dst.dtype} is not uint8 [{panels}, {ll_qpanel_bytes(wtype, k)}]")
    cdef uint8_t *dp = <uint8_t *>_ptr(dst)
    if panels == 0:
        return
    if nt > panels:
        nt = panels
    for tid in prange(nt, nogil=True, schedule="static", num_threads=nt):
        ll_qpack_panels(&raw[0, 0], rows, k, wtype, dp, tid * panels // nt, (tid + 1) * panels // nt)


def qpanel_bytes(str type_name, Py_ssize_t k):
    """Bytes of one packed 16-row panel of rows of k values in ggml block type `type_name`."""
    return ll_qpanel_bytes(WTYPES[type_name], k)


def qdequantize_packed(packed, str type_name, Py_ssize_t n, Py_ssize_t k):
    """The [n, k] float32 values of panels packed by qpack_into (embedding rows, tests)."""
    cdef int wtype = WTYPES[type_name]
    cdef Py_ssize_t r, pb = ll_qpanel_bytes(wtype, k)
    if packed.dtype != np.uint8 or packed.shape != ((n + 15) // 16, pb):
        raise ValueError(f"qdequantize_packed: {packed.shape} does not fit n={n}, k={k}, {type_name}")
    out = np.empty((n, k), np.float32)
    cdef float[:, ::1] ov = out
    cdef const uint8_t *wp = <const uint8_t *>_ptr(packed)
    for r in range(n):
        ll_qdequant_lane(wp + (r // 16) * pb, wtype, k, <int>(r % 16), &ov[r, 0])
    return out


def quantize_ggml(const float[:, ::1] x, str type_name, int num_threads=1):
    """fp32 rows x [N, K] (K a multiple of 32) -> ggml blocks uint8 [N, bytes per row] of
    type_name (Q8_0 or Q4_0), as ggml's reference quantizers make them."""
    cdef int wtype = WTYPES.get(type_name, -1)
    if wtype not in (LL_W_Q8_0, LL_W_Q4_0):
        raise ValueError(f"quantize_ggml: quantizing to {type_name} is not supported (Q8_0, Q4_0)")
    cdef Py_ssize_t n = x.shape[0], k = x.shape[1], row_bytes = k // 32 * ll_ggml_block_bytes(wtype), r
    if k % 32:
        raise ValueError(f"quantize_ggml: rows of {k} values are not whole 32-value blocks")
    out = np.empty((n, row_bytes), np.uint8)
    cdef uint8_t[:, ::1] ov = out
    if n and k:
        for r in prange(n, nogil=True, schedule="static", num_threads=max(num_threads, 1)):
            ll_quantize_row_ggml(&x[r, 0], k, wtype, &ov[r, 0])
    return out


# ---- stored rows -> packed panels in one pass (the loader) ------------------------------------

STORED_FLOATS = {"F32": LL_W_F32, "BF16": LL_W_BF16, "F16": LL_W_F16}


cdef struct LoadSeg:
    const uint8_t *base       # the part's first row as stored
    Py_ssize_t rows, row_bytes
    Py_ssize_t perm           # > 0: llama.cpp's q/k order, pairs interleaved within heads of perm rows


cdef inline const uint8_t *_seg_row(const LoadSeg *segs, int nseg, Py_ssize_t r) noexcept nogil:
    """Stored row of logical row r of the stacked parts (HF order: gguf._unpermute's spec)."""
    cdef int s
    cdef Py_ssize_t j, half
    for s in range(nseg):
        if r < segs[s].rows:
            if segs[s].perm:
                half = segs[s].perm // 2
                j = r % segs[s].perm
                r = r - j + (j % half) * 2 + j // half
            return segs[s].base + r * segs[s].row_bytes
        r -= segs[s].rows
    return NULL


cdef void _load_range(const LoadSeg *segs, int nseg, Py_ssize_t n, Py_ssize_t k, int stype, int wtype,
                      uint8_t *dst, Py_ssize_t panel_bytes, Py_ssize_t p0, Py_ssize_t p1) noexcept nogil:
    """Panels p0..p1: their stored rows brought in (one batch per part), then packed."""
    cdef const uint8_t *rows[16]
    cdef Py_ssize_t p, r0 = p0 * 16, r1 = min(p1 * 16, n), start = 0, a, b
    cdef int s, r, nrows
    for s in range(nseg):      # the stored bytes of rows r0..r1 (whole heads where permuted)
        a, b = max(r0 - start, 0), min(r1 - start, segs[s].rows)
        if a < b:
            if segs[s].perm:
                a, b = a - a % segs[s].perm, min(b + (-b) % segs[s].perm, segs[s].rows)
            ll_populate_read(segs[s].base + a * segs[s].row_bytes, (b - a) * segs[s].row_bytes)
        start += segs[s].rows
    for p in range(p0, p1):
        nrows = <int>min(16, n - p * 16)
        for r in range(nrows):
            rows[r] = _seg_row(segs, nseg, p * 16 + r)
        if ll_wtype_is_quant(wtype):
            ll_qpack_panel(rows, nrows, k, wtype, dst + p * panel_bytes)
        else:
            ll_pack_panel_rows(<const void **>rows, nrows, stype | LL_STORED_LE, k, wtype, dst + p * panel_bytes)


def load_panels(list segments, dst, str dst_type, Py_ssize_t k, int num_threads=1):
    """The parts of an [N, K] weight, as they lie in the checkpoint (a mapped file), straight into
    packed panels: one pass, parallel over panels, no intermediate copy. Equals packing the rows
    read, un-permuted and converted first (layout.pack / qpack_into), byte for byte.

    segments  [(data, rows, stored type, perm)] in row order: data a uint8 view of the part's
              rows [rows * row bytes]; stored type "F32" / "F16" / "BF16" or a ggml block type;
              perm > 0 for llama.cpp's q/k rows (see gguf._unpermute) in heads of perm rows
    dst_type  "float32" / "bfloat16" / "float16": float parts (all of one stored type) converted
              with rounding to nearest even; or the ggml block type every part is stored in
    dst       the packed layout, C-contiguous"""
    cdef int wtype = WTYPES.get(dst_type, -1), stype = -1, nseg = len(segments), i, tid, nt
    if wtype < 0:
        raise ValueError(f"load_panels: unknown packed type {dst_type!r}")
    cdef bint quant = ll_wtype_is_quant(wtype)
    cdef Py_ssize_t n = 0, row_bytes, panels, panel_bytes
    cdef uint8_t *dp
    cdef const uint8_t[::1] data
    segs = <LoadSeg *>calloc(max(nseg, 1), sizeof(LoadSeg))
    keep = []
    try:
        for i, (arr, rows, stored, perm) in enumerate(segments):
            if quant:
                if stored != dst_type:
                    raise ValueError(f"load_panels: a {stored} part cannot be packed as {dst_type}")
                if k % ll_qblock(wtype):
                    raise ValueError(f"load_panels: {k} values are not whole {dst_type} blocks")
                row_bytes = k // ll_qblock(wtype) * ll_ggml_block_bytes(wtype)
            else:
                if stored not in STORED_FLOATS or (stype >= 0 and STORED_FLOATS[stored] != stype):
                    raise ValueError(f"load_panels: parts stored as {[s[2] for s in segments]} cannot be packed "
                                     f"as {dst_type} (float parts of one type)")
                stype = STORED_FLOATS[stored]
                row_bytes = k * (4 if stype == LL_W_F32 else 2)
            data = arr
            keep.append(data)
            if data.shape[0] != rows * row_bytes:
                raise ValueError(f"load_panels: part {i} has {data.shape[0]} bytes, {rows} rows of {k} "
                                 f"{stored} values take {rows * row_bytes}")
            if perm and (perm % 2 or rows % perm):
                raise ValueError(f"load_panels: {rows} rows are not whole heads of {perm}")
            segs[i].base = &data[0] if rows else NULL
            segs[i].rows, segs[i].row_bytes, segs[i].perm = rows, row_bytes, perm
            n += rows
        panels = (n + 15) // 16
        if quant:
            panel_bytes = ll_qpanel_bytes(wtype, k)
        else:
            panel_bytes = 16 * (((k + 1) // 2) * 2 if wtype == LL_W_BF16 else k) * (4 if wtype == LL_W_F32 else 2)
        if not dst.flags.c_contiguous or dst.nbytes != panels * panel_bytes:
            raise ValueError(f"load_panels: dst of {dst.nbytes} bytes is not {panels} panels of {panel_bytes}")
        if panels == 0:
            return
        dp = <uint8_t *>_ptr(dst)
        nt = <int>min(max(num_threads, 1), panels)
        with nogil, parallel(num_threads=nt):
            tid = openmp.omp_get_thread_num()
            _load_range(segs, nseg, n, k, stype, wtype, dp, panel_bytes, tid * panels // nt, (tid + 1) * panels // nt)
    finally:
        free(segs)
