# A vision transformer over one or more images in ONE nogil call (Qwen2.5-VL's tower: RMSNorm, 2-D
# rotary, window / full bidirectional attention, SwiGLU, the 2x2 patch merger), on the same
# packed-weight GEMMs as the language model. What an image's rows mean (preprocessing, window
# order, rotary angles) is Python's: lite_llm/multimodal/qwen2_5_vl.py; the plain reference of
# this forward is VisionEncoder.encode_reference there.

# ---- the towers' attention on the language model's attention tiles ----------------------------
# Each layer's K and V rows go into a bf16 (fp32 for an fp32 tower) cache of 16-key blocks in
# the paged layout (attention.h), blocks in order; then every (query tile, head) is one
# ll_paged_attention_tile call, as the language model's prefill runs: up to 8 patches of one
# window (or of one image in a full-attention layer) against the keys of that window,
# bidirectional (a tile's rows all see keys up to the window's last; its first key is the
# window's first). Heads whose size is not a multiple of 16 (SigLIP's 72) keep the plain fp32
# loop of each tower.

cdef struct TowerAttn:
    void *k                     # [blocks][H][16 D] the layer's K, paged layout of kv_type
    void *v                     # [blocks][H][16 D] its V
    const int32_t *table        # [blocks] block i at i
    const int32_t *last_win     # [N] each patch's window's last patch
    const int32_t *last_full    # [N] each patch's image's last patch
    const int32_t *tiles_win    # [n_win][3] first patch, patches (<= 8), window length
    const int32_t *tiles_full   # [n_full][3] first patch, patches (<= 8), image length
    Py_ssize_t n_win, n_full, ld_scratch
    float *scratch              # [threads][ld_scratch]
    int kv_type, path


cdef class _TowerAttnBufs:
    """The arrays of a TowerAttn for n rows of one or more images (img_bounds, None: one image; a
    full-attention layer attends within each image), windows win_bounds (None: the images); a.ok:
    the tiles can run this head size."""
    cdef TowerAttn a
    cdef readonly bint ok
    cdef list keep

    def __init__(self, Py_ssize_t n, Py_ssize_t H, Py_ssize_t D, bint bf16, bint fma, win_bounds, int num_threads,
                 img_bounds=None):
        self.ok = D % 16 == 0 and D <= LL_MAX_HEAD_DIM
        if not self.ok:
            return
        nblk = (n + 15) // 16
        kv = aligned_zeros((2, nblk * H * 16 * D), np.uint16 if bf16 else np.float32)
        table = np.arange(nblk, dtype=np.int32)
        images = np.asarray(img_bounds if img_bounds is not None else (0, n), np.int64)
        tiles_win, last_win = _tower_tiles(np.asarray(win_bounds, np.int64) if win_bounds is not None else images, n)
        tiles_full, last_full = _tower_tiles(images, n)
        scratch = aligned_zeros((max(num_threads, 1), ll_attention_scratch(D, 1)), np.float32)
        self.keep = [kv, table, last_win, tiles_win, tiles_full, last_full, scratch]
        self.a.k = <void *>_ptr(kv)
        cdef Py_ssize_t half = kv.shape[1] * kv.itemsize
        self.a.v = <void *>(<const char *>_ptr(kv) + half)
        self.a.table = <const int32_t *>_ptr(table)
        self.a.last_win, self.a.last_full = <const int32_t *>_ptr(last_win), <const int32_t *>_ptr(last_full)
        self.a.tiles_win, self.a.tiles_full = <const int32_t *>_ptr(tiles_win), <const int32_t *>_ptr(tiles_full)
        self.a.n_win, self.a.n_full, self.a.ld_scratch = tiles_win.shape[0], tiles_full.shape[0], scratch.shape[1]
        self.a.scratch = <float *>_ptr(scratch)
        self.a.kv_type = KV_DTYPES.index("bfloat16" if bf16 else "float32")
        self.a.path = attention_path(None, fma)


def _tower_tiles(bounds, Py_ssize_t n):
    """(tiles [.][3]: first patch, patches (<= 8), span length; last [n]: each patch's span's last
    patch) of the spans [bounds[i], bounds[i + 1]) of n patches: a tile never crosses a span."""
    last = np.empty(n, np.int32)
    tiles = []
    for a, b in zip(bounds[:len(bounds) - 1], bounds[1:]):
        last[a:b] = b - 1
        tiles += [(s, min(LL_ATTN_QTILE, b - s), b - a) for s in range(a, b, LL_ATTN_QTILE)]
    return np.ascontiguousarray(tiles, np.int32), last


cdef void _tower_attention(const TowerAttn *ta, const float *qkv, Py_ssize_t n, Py_ssize_t C, Py_ssize_t H,
                           Py_ssize_t D, bint full, float *attn, int nt) noexcept nogil:
    """attn [n, C] = softmax(q k^T / sqrt(D)) v per head over qkv [n, 3C] rows (q, k, v), within
    each row's window (full: within its image)."""
    cdef Py_ssize_t t, item, tl, head
    cdef const int32_t *tiles = ta.tiles_full if full else ta.tiles_win
    cdef const int32_t *last = ta.last_full if full else ta.last_win
    cdef Py_ssize_t ntiles = ta.n_full if full else ta.n_win
    cdef float scale = 1.0 / sqrt(<double>D)
    for t in prange(n, schedule="static", num_threads=nt):
        ll_write_kv_row(qkv + t * 3 * C + C, ta.k, ta.kv_type, t, 16, H, D, 1)
        ll_write_kv_row(qkv + t * 3 * C + 2 * C, ta.v, ta.kv_type, t, 16, H, D, 0)
    # dynamic: windows at an image's edges are smaller
    for item in prange(ntiles * H, schedule="dynamic", num_threads=nt):
        tl = item // H
        head = item % H
        t = tiles[3 * tl]
        ll_paged_attention_tile(qkv + t * 3 * C, 3 * C, attn + t * C, C, tiles[3 * tl + 1], 1, head, last + t,
                                last + t, tiles[3 * tl + 2], ta.k, ta.v, ta.kv_type, ta.table, 16, head, H, D,
                                scale, 0.0, NULL, ta.scratch + openmp.omp_get_thread_num() * ta.ld_scratch, 0, 1, NULL,
                                ta.path)


cdef struct VisionBlockW:
    const float *norm1_w          # [C]
    const float *norm2_w          # [C]
    Mat qkv                       # [3C, C] with bias
    Mat proj                      # [C, C] with bias
    Mat gate                      # [I, C] with bias
    Mat up                        # [I, C] with bias
    Mat down                      # [C, I] with bias


cdef class VisionModel:
    """Packed weights of a Qwen2.5-VL vision tower, a PackedModel (packed.py): matrices
    "patch_embed", "blocks.{i}.qkv", ".proj", ".gate", ".up", ".down", "merger.0", "merger.2" in
    `dtype`, each with its bias (not patch_embed); vectors "blocks.{i}.norm1" / ".norm2" and
    "merger.ln_q"."""
    cdef VisionBlockW *blocks
    cdef Mat patch, m0, m2
    cdef const float *ln_q
    cdef readonly int depth, dim, inter, num_heads, head_dim, out_dim, patch_k, unit
    cdef readonly bint bf16, fma     # bf16 weights (attention in bf16 too); the bf16 GEMM path is FMA
    cdef list keep

    def __cinit__(self):
        self.blocks = NULL

    def __init__(self, packed, str dtype, int depth, int num_heads, int unit, str bf16_path=None):
        cdef int i
        cdef bint fma = _bf16_fma(bf16_path)
        cdef dict tensors = packed.vectors
        self.keep = []
        self.depth, self.num_heads, self.unit = depth, num_heads, unit
        self.bf16, self.fma = dtype == "bfloat16", fma
        self.patch = self._mat(packed, "patch_embed", dtype, fma, False)
        self.dim, self.patch_k = self.patch.n, self.patch.k
        if self.dim % num_heads or (self.dim // num_heads) % 2:
            raise ValueError(f"vision width {self.dim} is not num_heads {num_heads} heads of an even size")
        self.head_dim = self.dim // num_heads
        self.blocks = <VisionBlockW *>calloc(depth, sizeof(VisionBlockW))
        if self.blocks == NULL:
            raise MemoryError()
        for i in range(depth):
            p = f"blocks.{i}."
            self.blocks[i].norm1_w = self._vec(tensors, p + "norm1", self.dim)
            self.blocks[i].norm2_w = self._vec(tensors, p + "norm2", self.dim)
            self.blocks[i].qkv = self._mat(packed, p + "qkv", dtype, fma, True)
            self.blocks[i].proj = self._mat(packed, p + "proj", dtype, fma, True)
            self.blocks[i].gate = self._mat(packed, p + "gate", dtype, fma, True)
            self.blocks[i].up = self._mat(packed, p + "up", dtype, fma, True)
            self.blocks[i].down = self._mat(packed, p + "down", dtype, fma, True)
            if (self.blocks[i].qkv.n != 3 * self.dim or self.blocks[i].qkv.k != self.dim
                    or self.blocks[i].proj.n != self.dim or self.blocks[i].gate.k != self.dim
                    or self.blocks[i].up.n != self.blocks[i].gate.n or self.blocks[i].down.k != self.blocks[i].gate.n
                    or self.blocks[i].down.n != self.dim):
                raise ValueError(f"vision block {i}: matrix shapes do not fit width {self.dim}")
        self.inter = self.blocks[0].gate.n if depth else 0
        self.ln_q = self._vec(tensors, "merger.ln_q", self.dim)
        self.m0 = self._mat(packed, "merger.0", dtype, fma, True)
        self.m2 = self._mat(packed, "merger.2", dtype, fma, True)
        if self.m0.k != unit * self.dim or self.m2.k != self.m0.n:
            raise ValueError("vision merger: matrix shapes do not fit the merge unit")
        self.out_dim = self.m2.n

    cdef Mat _mat(self, object packed, str name, str dtype, bint fma, bint has_bias) except *:
        m = packed.matrices[name]
        n, k = m.shape
        bias = None
        if has_bias:
            if m.bias is None or m.bias.shape != (n,):
                raise ValueError(f"{name}: expected a bias [{n}]")
            bias = np.ascontiguousarray(m.bias, np.float32)
        return _make_mat(m.data, _parts_of(m.data, dtype, n, k), n, k, bias, self.keep, fma)

    cdef const float *_vec(self, dict tensors, str name, int n) except NULL:
        a = np.ascontiguousarray(tensors[name], np.float32)
        if a.shape != (n,):
            raise ValueError(f"{name}: expected [{n}]")
        self.keep.append(a)
        return <const float *>_ptr(a)

    def __dealloc__(self):
        free(self.blocks)


def vision_forward(VisionModel vm,
                   const float[:, ::1] pixels,       # IN [N, K] patches in window order
                   const float[:, ::1] cos,          # IN [N, D / 2] rotary angles of each patch (h, then w)
                   const float[:, ::1] sin,          # IN [N, D / 2]
                   const int32_t[::1] win_bounds,    # IN [W + 1] window boundaries (patches), 0 .. N
                   const uint8_t[::1] full_layer,    # IN [depth] 1: the block attends over each whole image
                   float[:, ::1] out,                # OUT [N / unit, E] merged rows, in window order
                   int num_threads,
                   img_bounds=None):                 # IN int32 [B + 1] image boundaries (patches), 0 .. N;
                                                     #    None: one image
    """The vision tower over the N patches of one image, or of B images one after the other (rows
    of each merge unit adjacent, each image's windows inside it): attention never crosses images."""
    cdef Py_ssize_t N = pixels.shape[0], C = vm.dim, I = vm.inter, D = vm.head_dim, U = vm.unit
    cdef Py_ssize_t W = win_bounds.shape[0] - 1, t
    if pixels.shape[1] != vm.patch_k or N % U or N == 0:
        raise ValueError(f"vision_forward: pixels {tuple(pixels.shape)}: expected [N, {vm.patch_k}], N a multiple of {U}")
    if cos.shape[0] != N or cos.shape[1] != D // 2 or sin.shape[0] != N or sin.shape[1] != D // 2:
        raise ValueError(f"vision_forward: cos / sin must be [{N}, {D // 2}]")
    if out.shape[0] != N // U or out.shape[1] != vm.out_dim or full_layer.shape[0] != vm.depth:
        raise ValueError("vision_forward: out must be [N / unit, E] and full_layer [depth]")
    if W < 1 or win_bounds[0] != 0 or win_bounds[W] != N:
        raise ValueError("vision_forward: window bounds must run from 0 to N")
    for t in range(W):
        if win_bounds[t + 1] <= win_bounds[t]:
            raise ValueError("vision_forward: window bounds must increase")
    images = np.ascontiguousarray(img_bounds if img_bounds is not None else (0, N), np.int32)
    if (images.ndim != 1 or images.shape[0] < 2 or images[0] != 0 or images[images.shape[0] - 1] != N
            or np.any(np.diff(images) <= 0) or np.any(images % U)
            or not np.all(np.isin(images, np.asarray(win_bounds)))):
        raise ValueError("vision_forward: image bounds must increase from 0 to N in whole merge units, "
                         "each one a window boundary")
    # activations, sized for this image (an image is large work: allocation is not its cost)
    cdef Py_ssize_t max_k = max(vm.patch_k, 3 * C, I, U * C, vm.m0.n)
    x = np.empty((N, C), np.float32)
    h = np.empty((N, max(C, I)), np.float32)
    qkv = np.empty((N, 3 * C), np.float32)
    attn = np.empty((N, C), np.float32)
    g = np.empty((N, max(I, vm.m0.n)), np.float32)
    xb = np.empty((N, max_k // 2 + 2), np.uint32)
    seg = np.empty((N, 2), np.int32)             # each patch's window [start, end)
    fseg = np.empty((N, 2), np.int32)            # each patch's image [start, end)
    scores = np.empty((num_threads, N), np.float32)
    cdef _QBufs qb = _QBufs(N, max_k)
    cdef float[:, ::1] xv = x, hv = h, qv = qkv, av = attn, gv = g, sv = scores
    cdef uint32_t[:, ::1] xbv = xb
    cdef int32_t[:, ::1] segv = seg, fsegv = fseg
    cdef Py_ssize_t w0
    for w0 in range(W):
        seg[win_bounds[w0]:win_bounds[w0 + 1], 0] = win_bounds[w0]
        seg[win_bounds[w0]:win_bounds[w0 + 1], 1] = win_bounds[w0 + 1]
    for w0 in range(images.shape[0] - 1):
        fseg[images[w0]:images[w0 + 1], 0] = images[w0]
        fseg[images[w0]:images[w0 + 1], 1] = images[w0 + 1]
    cdef _TowerAttnBufs ta = _TowerAttnBufs(N, vm.num_heads, D, vm.bf16, vm.fma, np.asarray(win_bounds), num_threads,
                                            images)
    with nogil:
        _vision(vm, &pixels[0, 0], N, &cos[0, 0], &sin[0, 0], &segv[0, 0], &fsegv[0, 0], &full_layer[0], &xv[0, 0],
                &hv[0, 0], hv.shape[1], &qv[0, 0], &av[0, 0], &gv[0, 0], gv.shape[1], &xbv[0, 0], &qb.a, &sv[0, 0],
                &out[0, 0], &ta.a if ta.ok else NULL, num_threads)


cdef void _vision(VisionModel vm, const float *pixels, Py_ssize_t N, const float *cos, const float *sin,
                  const int32_t *seg, const int32_t *fseg, const uint8_t *full_layer, float *x, float *h,
                  Py_ssize_t ldh,
                  float *qkv, float *attn, float *g, Py_ssize_t ldg, uint32_t *xb, const ll_qact *xq,
                  float *scores, float *out, const TowerAttn *ta, int nt) noexcept nogil:
    cdef Py_ssize_t C = vm.dim, I = vm.inter, D = vm.head_dim, H = vm.num_heads, U = vm.unit
    cdef Py_ssize_t t, item, head, j, s0, s1, l
    cdef float scale = 1.0 / sqrt(<double>D), m, total
    cdef const VisionBlockW *B
    cdef float *sc
    cdef float *o
    cdef const float *q
    _gemm(pixels, vm.patch_k, xb, xq, N, &vm.patch, x, C, 0, nt)           # patch embedding
    for l in range(vm.depth):
        B = &vm.blocks[l]
        for t in prange(N, schedule="static", num_threads=nt):
            ll_rmsnorm_f32(x + t * C, B.norm1_w, h + t * C, C, 1e-6)
        _gemm(h, C, xb, xq, N, &B.qkv, qkv, 3 * C, 0, nt)
        for t in prange(N, schedule="static", num_threads=nt):           # rotary on q and k heads
            for head in range(2 * H):
                ll_rope_neox_f32(qkv + t * 3 * C + head * D, cos + t * (D // 2), sin + t * (D // 2), D)
        # bidirectional attention within each patch's window (or its whole image); dynamic:
        # windows at an image's edges are smaller
        if ta != NULL:
            _tower_attention(ta, qkv, N, C, H, D, full_layer[l], attn, nt)
        for item in prange(N * H if ta == NULL else 0, schedule="dynamic", num_threads=nt):
            t = item // H
            head = item % H
            s0 = fseg[2 * t] if full_layer[l] else seg[2 * t]
            s1 = fseg[2 * t + 1] if full_layer[l] else seg[2 * t + 1]
            sc = scores + openmp.omp_get_thread_num() * N
            q = qkv + t * 3 * C + head * D
            m = -1e30
            for j in range(s0, s1):
                sc[j] = ll_dot_f32(q, qkv + j * 3 * C + C + head * D, D) * scale
                if sc[j] > m:
                    m = sc[j]
            total = 0
            for j in range(s0, s1):
                sc[j] = expf(sc[j] - m)
                total = total + sc[j]
            o = attn + t * C + head * D
            for j in range(D):
                o[j] = 0
            for j in range(s0, s1):
                ll_axpy_f32(sc[j] / total, qkv + j * 3 * C + 2 * C + head * D, o, D)
        _gemm(attn, C, xb, xq, N, &B.proj, x, C, 1, nt)                    # x += proj(attn)
        for t in prange(N, schedule="static", num_threads=nt):
            ll_rmsnorm_f32(x + t * C, B.norm2_w, h + t * C, C, 1e-6)
        _gemm(h, C, xb, xq, N, &B.gate, g, ldg, 0, nt)
        _gemm(h, C, xb, xq, N, &B.up, qkv, 3 * C, 0, nt)                   # qkv is free: up's rows there
        for t in prange(N, schedule="static", num_threads=nt):
            ll_act_mul_f32(g + t * ldg, qkv + t * 3 * C, h + t * ldh, I, LL_ACT_SILU)
        _gemm(h, ldh, xb, xq, N, &B.down, x, C, 1, nt)                     # x += down(silu(gate) * up)
    # merger: RMSNorm per patch, each merge unit's U rows as one row of U C, Linear, GELU, Linear
    for t in prange(N, schedule="static", num_threads=nt):
        ll_rmsnorm_f32(x + t * C, vm.ln_q, attn + t * C, C, 1e-6)
    _gemm(attn, U * C, xb, xq, N // U, &vm.m0, g, ldg, 0, nt)
    for t in prange(N // U, schedule="static", num_threads=nt):
        ll_act_mul_f32(g + t * ldg, NULL, g + t * ldg, vm.m0.n, LL_ACT_GELU)
    _gemm(g, ldg, xb, xq, N // U, &vm.m2, out, vm.out_dim, 0, nt)


# ---- CLIP / SigLIP ViT + projector (LLaVA-1.5: lite_llm/multimodal/llava.py; Gemma 3:
# lite_llm/multimodal/gemma3.py) ------------------------------------------------------------------
# patch embedding (SigLIP: with bias), CLIP's class row, position embeddings, CLIP's pre-LayerNorm,
# L pre-norm blocks of full bidirectional attention and fc1 / act / fc2, SigLIP's post-LayerNorm,
# then the projector: LLaVA's (Linear, GELU, Linear over the patch rows, and the class row under
# keep_class) or Gemma 3's (the patch grid average-pooled pool x pool, RMSNorm, Linear); over B
# images of the tower's one size one after the other, attention and pooling within each. The
# NumPy references (one image) are ClipEncoder.encode_reference and SiglipEncoder.encode_reference.

cdef struct ClipBlockW:
    const float *ln1_w            # [C]
    const float *ln1_b            # [C]
    const float *ln2_w            # [C]
    const float *ln2_b            # [C]
    Mat qkv                       # [3C, C] with bias
    Mat o                         # [C, C] with bias
    Mat up                        # [F, C] with bias (fc1)
    Mat down                      # [C, F] with bias (fc2)


cdef class ClipModel:
    """Packed weights of a CLIP or SigLIP vision tower and its projector, a PackedModel
    (packed.py): matrices "patch" (its bias optional), "blk.{i}.qkv", ".o", ".up", ".down" in
    `dtype` with biases; vectors "pos" [N (+ 1), C], "blk.{i}.ln1.w" / ".b", ".ln2.w" / ".b";
    optional vectors "class" [C] (CLIP), "pre_ln.w" / ".b" (CLIP), "post_ln.w" / ".b" (SigLIP).
    Projector: pool 0: matrices "mm0", "mm2" with biases (LLaVA's MLP); pool k > 0: matrix
    "proj" [E, C] without bias and vector "proj_norm" [C], the RMSNorm's weight with Gemma's + 1
    already added. act: an ACTIVATIONS name (quick_gelu, gelu, gelu_tanh)."""
    cdef ClipBlockW *blocks
    cdef Mat patch, m0, m2
    cdef const float *cls
    cdef const float *pos
    cdef const float *pre_w
    cdef const float *pre_b
    cdef const float *post_w
    cdef const float *post_b
    cdef const float *proj_norm
    cdef readonly int depth, dim, inter, num_heads, head_dim, out_dim, patch_k, num_pos, act, pool
    cdef readonly bint keep_class, has_class, bf16, fma
    cdef readonly float eps
    cdef list keep

    def __cinit__(self):
        self.blocks = NULL

    def __init__(self, packed, str dtype, int depth, int num_heads, float eps, str act,
                 bint keep_class, str bf16_path=None, int pool=0):
        cdef int i
        cdef bint fma = _bf16_fma(bf16_path)
        cdef dict tensors = packed.vectors
        if act not in ACTIVATIONS:
            raise ValueError(f"vision activation {act!r}: expected one of {', '.join(ACTIVATIONS)}")
        self.keep = []
        self.depth, self.num_heads, self.eps, self.keep_class = depth, num_heads, eps, keep_class
        self.act, self.pool, self.has_class = ACTIVATIONS[act], pool, "class" in tensors
        self.bf16, self.fma = dtype == "bfloat16", fma
        if keep_class and not self.has_class:
            raise ValueError("keep_class: the tower has no class row")
        if pool > 0 and self.has_class:
            raise ValueError("a pooling projector takes the patch grid alone, not a class row")
        self.patch = self._mat(packed, "patch", dtype, fma, packed.matrices["patch"].bias is not None)
        self.dim, self.patch_k = self.patch.n, self.patch.k
        if self.dim % num_heads:
            raise ValueError(f"vision width {self.dim} is not {num_heads} heads")
        self.head_dim = self.dim // num_heads
        pos = np.ascontiguousarray(tensors["pos"], np.float32)
        if pos.ndim != 2 or pos.shape[1] != self.dim:
            raise ValueError(f"pos: expected [N (+ 1), {self.dim}]")
        self.keep.append(pos)
        self.pos, self.num_pos = <const float *>_ptr(pos), pos.shape[0]
        self.cls = self._vec(tensors, "class", self.dim) if self.has_class else NULL
        self.pre_w = self.pre_b = self.post_w = self.post_b = self.proj_norm = NULL
        if "pre_ln.w" in tensors:
            self.pre_w, self.pre_b = self._vec(tensors, "pre_ln.w", self.dim), self._vec(tensors, "pre_ln.b", self.dim)
        if "post_ln.w" in tensors:
            self.post_w, self.post_b = self._vec(tensors, "post_ln.w", self.dim), \
                self._vec(tensors, "post_ln.b", self.dim)
        self.blocks = <ClipBlockW *>calloc(max(depth, 1), sizeof(ClipBlockW))
        if self.blocks == NULL:
            raise MemoryError()
        for i in range(depth):
            p = f"blk.{i}."
            self.blocks[i].ln1_w, self.blocks[i].ln1_b = self._vec(tensors, p + "ln1.w", self.dim), \
                self._vec(tensors, p + "ln1.b", self.dim)
            self.blocks[i].ln2_w, self.blocks[i].ln2_b = self._vec(tensors, p + "ln2.w", self.dim), \
                self._vec(tensors, p + "ln2.b", self.dim)
            self.blocks[i].qkv = self._mat(packed, p + "qkv", dtype, fma, True)
            self.blocks[i].o = self._mat(packed, p + "o", dtype, fma, True)
            self.blocks[i].up = self._mat(packed, p + "up", dtype, fma, True)
            self.blocks[i].down = self._mat(packed, p + "down", dtype, fma, True)
            if (self.blocks[i].qkv.n != 3 * self.dim or self.blocks[i].qkv.k != self.dim
                    or self.blocks[i].o.n != self.dim or self.blocks[i].o.k != self.dim
                    or self.blocks[i].up.k != self.dim or self.blocks[i].down.k != self.blocks[i].up.n
                    or self.blocks[i].down.n != self.dim):
                raise ValueError(f"vision block {i}: matrix shapes do not fit width {self.dim}")
        self.inter = self.blocks[0].up.n if depth else 0
        if pool > 0:
            self.proj_norm = self._vec(tensors, "proj_norm", self.dim)
            self.m0 = self._mat(packed, "proj", dtype, fma, False)
            if self.m0.k != self.dim:
                raise ValueError("projector: matrix shapes do not fit the vision width")
            self.out_dim = self.m0.n
        else:
            self.m0 = self._mat(packed, "mm0", dtype, fma, True)
            self.m2 = self._mat(packed, "mm2", dtype, fma, True)
            if self.m0.k != self.dim or self.m2.k != self.m0.n:
                raise ValueError("projector: matrix shapes do not fit the vision width")
            self.out_dim = self.m2.n

    cdef Mat _mat(self, object packed, str name, str dtype, bint fma, bint has_bias) except *:
        m = packed.matrices[name]
        n, k = m.shape
        bias = None
        if has_bias:
            if m.bias is None or m.bias.shape != (n,):
                raise ValueError(f"{name}: expected a bias [{n}]")
            bias = np.ascontiguousarray(m.bias, np.float32)
        return _make_mat(m.data, _parts_of(m.data, dtype, n, k), n, k, bias, self.keep, fma)

    cdef const float *_vec(self, dict tensors, str name, int n) except NULL:
        a = np.ascontiguousarray(tensors[name], np.float32)
        if a.shape != (n,):
            raise ValueError(f"{name}: expected [{n}]")
        self.keep.append(a)
        return <const float *>_ptr(a)

    def out_rows(self, Py_ssize_t num_patches):
        """Rows of the projector's output for an image of num_patches patches."""
        if self.pool > 0:
            side = <Py_ssize_t>(sqrt(<double>num_patches) + 0.5)
            return (side // self.pool) ** 2
        return num_patches + (1 if self.keep_class else 0)

    def __dealloc__(self):
        free(self.blocks)


def clip_forward(ClipModel cm,
                 const float[:, ::1] pixels,       # IN [B N, 3 P P] each image's patches, row-major grid
                 float[:, ::1] out,                # OUT [B out_rows(N), E] each image's projected rows
                 int num_threads):
    """The CLIP / SigLIP tower and projector over B images of N patches each, one after the
    other: attention and the projector's pooling within each image."""
    cdef Py_ssize_t N = cm.num_pos - cm.has_class, C = cm.dim, n = cm.num_pos, side = 0, B
    if pixels.shape[1] != cm.patch_k or pixels.shape[0] == 0 or pixels.shape[0] % N:
        raise ValueError(f"clip_forward: pixels {tuple(pixels.shape)}: expected [B {N}, {cm.patch_k}]")
    B = pixels.shape[0] // N
    if cm.pool > 0:
        side = <Py_ssize_t>(sqrt(<double>N) + 0.5)
        if side * side != N or side % cm.pool:
            raise ValueError(f"clip_forward: {N} patches are not a square grid whose side divides by {cm.pool}")
    if out.shape[0] != B * cm.out_rows(N) or out.shape[1] != cm.out_dim:
        raise ValueError(f"clip_forward: out must be [{B} x {cm.out_rows(N)}, {cm.out_dim}]")
    # activations, sized for these images (an image is large work: allocation is not its cost)
    cdef Py_ssize_t max_k = max(cm.patch_k, C, cm.inter, cm.m0.n)
    x = np.empty((B * n, C), np.float32)
    h = np.empty((B * n, C), np.float32)
    qkv = np.empty((B * n, 3 * C), np.float32)
    attn = np.empty((B * n, C), np.float32)
    g = np.empty((B * n, max(cm.inter, cm.m0.n)), np.float32)
    xb = np.empty((B * n, max_k // 2 + 2), np.uint32)
    scores = np.empty((num_threads, n), np.float32)
    cdef _QBufs qb = _QBufs(B * n, max_k)
    cdef float[:, ::1] xv = x, hv = h, qv = qkv, av = attn, gv = g, sv = scores
    cdef uint32_t[:, ::1] xbv = xb
    cdef _TowerAttnBufs ta = _TowerAttnBufs(B * n, cm.num_heads, cm.head_dim, cm.bf16, cm.fma, None, num_threads,
                                            np.arange(B + 1) * n)
    with nogil:
        _clip(cm, &pixels[0, 0], B, N, side, &xv[0, 0], &hv[0, 0], &qv[0, 0], &av[0, 0], &gv[0, 0], gv.shape[1],
              &xbv[0, 0], &qb.a, &sv[0, 0], &out[0, 0], &ta.a if ta.ok else NULL, num_threads)


cdef void _clip(ClipModel cm, const float *pixels, Py_ssize_t nimg, Py_ssize_t N, Py_ssize_t side, float *x,
                float *h, float *qkv, float *attn, float *g, Py_ssize_t ldg, uint32_t *xb, const ll_qact *xq,
                float *scores, float *out, const TowerAttn *ta, int nt) noexcept nogil:
    cdef Py_ssize_t C = cm.dim, D = cm.head_dim, H = cm.num_heads, c0 = cm.has_class, n = N + c0, F = cm.inter
    cdef Py_ssize_t first = 0 if cm.keep_class else c0, rows = nimg * n
    cdef Py_ssize_t t, item, head, j, l, k = cm.pool, ps = side // k if k > 0 else 0, a, b, img, r0
    cdef float scale = 1.0 / sqrt(<double>D), m, total
    cdef const ClipBlockW *B
    cdef float *sc
    cdef float *o
    cdef const float *q
    for img in range(nimg):     # patch embedding: rows c0.. of each image (its class row first)
        _gemm(pixels + img * N * cm.patch_k, cm.patch_k, xb, xq, N, &cm.patch, x + (img * n + c0) * C, C, 0, nt)
    for t in prange(rows, schedule="static", num_threads=nt):              # class row, positions, pre_ln
        if c0 and t % n == 0:
            for j in range(C):
                x[t * C + j] = cm.cls[j]
        ll_axpy_f32(1.0, cm.pos + (t % n) * C, x + t * C, C)
        if cm.pre_w != NULL:
            ll_layernorm_f32(x + t * C, cm.pre_w, cm.pre_b, x + t * C, C, cm.eps)
    for l in range(cm.depth):
        B = &cm.blocks[l]
        for t in prange(rows, schedule="static", num_threads=nt):
            ll_layernorm_f32(x + t * C, B.ln1_w, B.ln1_b, h + t * C, C, cm.eps)
        _gemm(h, C, xb, xq, rows, &B.qkv, qkv, 3 * C, 0, nt)
        # bidirectional attention over each image's n rows, one (row, head) per item
        if ta != NULL:
            _tower_attention(ta, qkv, rows, C, H, D, 1, attn, nt)
        for item in prange(rows * H if ta == NULL else 0, schedule="static", num_threads=nt):
            t = item // H
            head = item % H
            r0 = (t // n) * n
            sc = scores + openmp.omp_get_thread_num() * n
            q = qkv + t * 3 * C + head * D
            m = -1e30
            for j in range(n):
                sc[j] = ll_dot_f32(q, qkv + (r0 + j) * 3 * C + C + head * D, D) * scale
                if sc[j] > m:
                    m = sc[j]
            total = 0
            for j in range(n):
                sc[j] = expf(sc[j] - m)
                total = total + sc[j]
            o = attn + t * C + head * D
            for j in range(D):
                o[j] = 0
            for j in range(n):
                ll_axpy_f32(sc[j] / total, qkv + (r0 + j) * 3 * C + 2 * C + head * D, o, D)
        _gemm(attn, C, xb, xq, rows, &B.o, x, C, 1, nt)                    # x += out_proj(attn)
        for t in prange(rows, schedule="static", num_threads=nt):
            ll_layernorm_f32(x + t * C, B.ln2_w, B.ln2_b, h + t * C, C, cm.eps)
        _gemm(h, C, xb, xq, rows, &B.up, g, ldg, 0, nt)
        for t in prange(rows, schedule="static", num_threads=nt):
            ll_act_mul_f32(g + t * ldg, NULL, g + t * ldg, F, cm.act)
        _gemm(g, ldg, xb, xq, rows, &B.down, x, C, 1, nt)                  # x += fc2(act(fc1(ln2(x))))
    if cm.post_w != NULL:
        for t in prange(rows, schedule="static", num_threads=nt):
            ll_layernorm_f32(x + t * C, cm.post_w, cm.post_b, x + t * C, C, cm.eps)
    if k > 0:   # Gemma 3: each k x k square of an image's side x side grid averaged, RMSNorm (1 + w), Linear
        for item in prange(nimg * ps * ps, schedule="static", num_threads=nt):
            img = item // (ps * ps)
            t = item % (ps * ps)
            o = h + item * C
            for j in range(C):
                o[j] = 0
            for a in range(k):
                for b in range(k):
                    ll_axpy_f32(1.0, x + (img * n + ((t // ps) * k + a) * side + (t % ps) * k + b) * C, o, C)
            for j in range(C):
                o[j] = o[j] / (k * k)
            ll_rmsnorm_f32(o, cm.proj_norm, o, C, cm.eps)
        _gemm(h, C, xb, xq, nimg * ps * ps, &cm.m0, out, cm.out_dim, 0, nt)
        return
    # LLaVA: Linear, GELU, Linear over each image's patch rows (the class row too under keep_class)
    if first == 0:
        _gemm(x, C, xb, xq, rows, &cm.m0, g, ldg, 0, nt)
    else:
        for img in range(nimg):
            _gemm(x + (img * n + first) * C, C, xb, xq, n - first, &cm.m0, g + img * (n - first) * ldg, ldg, 0, nt)
    for t in prange(nimg * (n - first), schedule="static", num_threads=nt):
        ll_act_mul_f32(g + t * ldg, NULL, g + t * ldg, cm.m0.n, LL_ACT_GELU)
    _gemm(g, ldg, xb, xq, nimg * (n - first), &cm.m2, out, cm.out_dim, 0, nt)
