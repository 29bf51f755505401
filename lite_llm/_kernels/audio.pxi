# Audio in ONE nogil call each: Whisper's log-mel features over 30-s windows, and Whisper's
# encoder over their features, on the same packed-weight GEMMs as the language model. What the
# numbers mean (window, filters, 30-s padding, checkpoint names) is Python's:
# lite_llm/multimodal/audio.py (log_mel_reference, the NumPy spec of log_mel_forward) and
# lite_llm/multimodal/whisper.py (WhisperEncoder.encode_reference, the spec of
# whisper_encoder_forward).

from libc.math cimport log10f

# ---- log-mel features ---------------------------------------------------------------------------
# Each frame is 400 samples of the window, reflected at its ends (the extractor's center=True);
# the real DFT is one GEMM of the frames against [cos; -sin] rows with the Hann window folded in
# (a [402, 400] matrix: a 3000-frame window is 0.5 GFLOP, tens of ms on one core, the mel filters
# another GEMM), then |X|^2, log10 clamped at 1e-10, floored at the window's max - 8, (x + 4) / 4.

cdef class LogMelModel:
    """The packed float32 matrices of log_mel_forward, a PackedModel (packed.py): matrices "dft"
    [2 (n_fft / 2 + 1), n_fft] (the windowed cos rows, then the windowed -sin rows) and "mel"
    [n_mels, n_fft / 2 + 1], float32 panels (layout.pack)."""
    cdef Mat dft, mel
    cdef readonly int n_fft, n_bins, n_mels, hop
    cdef list keep

    def __init__(self, packed, int hop):
        self.keep = []
        m = packed.matrices["dft"]
        n, k = m.shape
        self.dft = _make_mat(m.data, _parts_of(m.data, "float32", n, k), n, k, None, self.keep)
        self.n_fft, self.n_bins, self.hop = k, n // 2, hop
        m = packed.matrices["mel"]
        n, k = m.shape
        if k != self.n_bins:
            raise ValueError(f"mel filters take {k} bins, the DFT gives {self.n_bins}")
        self.mel = _make_mat(m.data, _parts_of(m.data, "float32", n, k), n, k, None, self.keep)
        self.n_mels = n


def log_mel_forward(LogMelModel lm,
                    const float[:, ::1] samples,     # IN [B, S] B windows of S samples (zero-padded to S)
                    float[:, :, ::1] out,            # OUT [B, n_mels, S / hop] each window's log-mel features
                    int num_threads):
    """Whisper's log-mel features of B windows: frames 0 .. S / hop - 1 (the extractor's last one
    dropped), each window floored at its own max - 8."""
    cdef Py_ssize_t B = samples.shape[0], S = samples.shape[1], NF = S // lm.hop, rows, M = lm.n_mels
    if B == 0 or S <= lm.n_fft // 2 or S % lm.hop:
        raise ValueError(f"log_mel_forward: samples {tuple(samples.shape)}: windows of more than {lm.n_fft // 2} "
                         f"samples, a multiple of {lm.hop}")
    if out.shape[0] != B or out.shape[1] != M or out.shape[2] != NF:
        raise ValueError(f"log_mel_forward: out must be [{B}, {M}, {NF}]")
    rows = B * NF
    cdef Py_ssize_t ldp = (lm.n_bins + 15) // 16 * 16
    frames = np.empty((rows, lm.n_fft), np.float32)
    spec = np.empty((rows, 2 * lm.n_bins), np.float32)
    power = np.zeros((rows, ldp), np.float32)
    mel = np.empty((rows, M), np.float32)
    xb = np.empty((rows, lm.n_fft // 2 + 2), np.uint32)
    cdef _QBufs qb = _QBufs(1, lm.n_fft)        # float32 weights take float32 rows: never used
    cdef float[:, ::1] fv = frames, sv = spec, pv = power, mv = mel
    cdef uint32_t[:, ::1] xbv = xb
    with nogil:
        _log_mel(lm, &samples[0, 0], B, S, &fv[0, 0], &sv[0, 0], &pv[0, 0], ldp, &mv[0, 0], &xbv[0, 0], &qb.a,
                 &out[0, 0, 0], num_threads)


cdef void _log_mel(LogMelModel lm, const float *samples, Py_ssize_t B, Py_ssize_t S, float *frames, float *spec,
                   float *power, Py_ssize_t ldp, float *mel, uint32_t *xb, const ll_qact *xq, float *out,
                   int nt) noexcept nogil:
    cdef Py_ssize_t NF = S // lm.hop, rows = B * NF, K = lm.n_fft, NB = lm.n_bins, M = lm.n_mels
    cdef Py_ssize_t r, b, f, i, j, half = K // 2
    cdef const float *src
    cdef float re, im, top, v
    for r in prange(rows, schedule="static", num_threads=nt):     # frames, reflected at the window's ends
        src = samples + (r // NF) * S
        f = r % NF
        for j in range(K):
            i = f * lm.hop + j - half
            if i < 0:
                i = -i
            elif i >= S:
                i = 2 * (S - 1) - i
            frames[r * K + j] = src[i]
    _gemm(frames, K, xb, xq, rows, &lm.dft, spec, 2 * NB, 0, nt)
    for r in prange(rows, schedule="static", num_threads=nt):
        for j in range(NB):
            re = spec[r * 2 * NB + j]
            im = spec[r * 2 * NB + NB + j]
            power[r * ldp + j] = re * re + im * im
    _gemm(power, ldp, xb, xq, rows, &lm.mel, mel, M, 0, nt)
    for r in prange(rows, schedule="static", num_threads=nt):
        for j in range(M):
            v = mel[r * M + j]
            mel[r * M + j] = log10f(v if v > 1e-10 else 1e-10)
    for b in range(B):
        top = -1e30
        for i in range(NF * M):     # 384 K compares: not worth a parallel reduction
            if mel[b * NF * M + i] > top:
                top = mel[b * NF * M + i]
        top = top - 8.0
        for f in prange(NF, schedule="static", num_threads=nt):
            for j in range(M):
                v = mel[(b * NF + f) * M + j]
                out[(b * M + j) * NF + f] = ((v if v > top else top) + 4.0) / 4.0


# ---- Whisper's encoder ------------------------------------------------------------------------
# conv1 (kernel 3, padding 1) and GELU, conv2 (kernel 3, stride 2, padding 1) and GELU, each a
# GEMM over rows of 3 adjacent input frames (im2col: column c * 3 + tap, the order of a conv1d
# weight [C, C_in, 3] flattened), positions added, then the ViT's pre-norm blocks (vision.pxi's
# ClipBlockW: q, k, v as one matrix, k's bias zero) and the final LayerNorm; B windows one after
# the other, attention within each.

cdef class WhisperEncoderModel:
    """Packed weights of Whisper's encoder, a PackedModel (packed.py): matrices "conv1"
    [C, 3 n_mels], "conv2" [C, 3 C] and "blk.{i}.qkv", ".o", ".up", ".down", each in the format
    its parts name (`dtype`: the activations' and attention's), each with its bias; vectors "pos" [P, C], "blk.{i}.ln1.w" / ".b", ".ln2.w" / ".b", "ln.w" / "ln.b".
    act: an ACTIVATIONS name (Whisper's: gelu)."""
    cdef ClipBlockW *blocks
    cdef Mat conv1, conv2
    cdef const float *pos
    cdef const float *ln_w
    cdef const float *ln_b
    cdef readonly int depth, dim, inter, num_heads, head_dim, n_mels, num_pos, act
    cdef readonly bint bf16, fma
    cdef readonly float eps
    cdef list keep

    def __cinit__(self):
        self.blocks = NULL

    def __init__(self, packed, str dtype, int depth, int num_heads, float eps, str act="gelu",
                 str bf16_path=None):
        cdef int i
        cdef bint fma = _bf16_fma(bf16_path)
        cdef dict tensors = packed.vectors
        if act not in ACTIVATIONS:
            raise ValueError(f"encoder activation {act!r}: expected one of {', '.join(ACTIVATIONS)}")
        self.keep = []
        self.depth, self.num_heads, self.eps, self.act = depth, num_heads, eps, ACTIVATIONS[act]
        self.bf16, self.fma = dtype == "bfloat16", fma
        self.conv1 = self._mat(packed, "conv1", dtype, fma)
        self.dim = self.conv1.n
        if self.conv1.k % 3:
            raise ValueError("conv1: expected [C, 3 n_mels]")
        self.n_mels = self.conv1.k // 3
        self.conv2 = self._mat(packed, "conv2", dtype, fma)
        if self.conv2.n != self.dim or self.conv2.k != 3 * self.dim:
            raise ValueError(f"conv2: expected [{self.dim}, {3 * self.dim}]")
        if self.dim % num_heads:
            raise ValueError(f"encoder width {self.dim} is not {num_heads} heads")
        self.head_dim = self.dim // num_heads
        pos = np.ascontiguousarray(tensors["pos"], np.float32)
        if pos.ndim != 2 or pos.shape[1] != self.dim:
            raise ValueError(f"pos: expected [P, {self.dim}]")
        self.keep.append(pos)
        self.pos, self.num_pos = <const float *>_ptr(pos), pos.shape[0]
        self.ln_w, self.ln_b = self._vec(tensors, "ln.w", self.dim), self._vec(tensors, "ln.b", self.dim)
        self.blocks = <ClipBlockW *>calloc(max(depth, 1), sizeof(ClipBlockW))
        if self.blocks == NULL:
            raise MemoryError()
        for i in range(depth):
            p = f"blk.{i}."
            self.blocks[i].ln1_w, self.blocks[i].ln1_b = self._vec(tensors, p + "ln1.w", self.dim), \
                self._vec(tensors, p + "ln1.b", self.dim)
            self.blocks[i].ln2_w, self.blocks[i].ln2_b = self._vec(tensors, p + "ln2.w", self.dim), \
                self._vec(tensors, p + "ln2.b", self.dim)
            self.blocks[i].qkv = self._mat(packed, p + "qkv", dtype, fma)
            self.blocks[i].o = self._mat(packed, p + "o", dtype, fma)
            self.blocks[i].up = self._mat(packed, p + "up", dtype, fma)
            self.blocks[i].down = self._mat(packed, p + "down", dtype, fma)
            if (self.blocks[i].qkv.n != 3 * self.dim or self.blocks[i].qkv.k != self.dim
                    or self.blocks[i].o.n != self.dim or self.blocks[i].o.k != self.dim
                    or self.blocks[i].up.k != self.dim or self.blocks[i].down.k != self.blocks[i].up.n
                    or self.blocks[i].down.n != self.dim):
                raise ValueError(f"encoder block {i}: matrix shapes do not fit width {self.dim}")
        self.inter = self.blocks[0].up.n if depth else 0

    cdef Mat _mat(self, object packed, str name, str dtype, bint fma) except *:
        m = packed.matrices[name]
        n, k = m.shape
        if m.bias is None or m.bias.shape != (n,):
            raise ValueError(f"{name}: expected a bias [{n}]")
        bias = np.ascontiguousarray(m.bias, np.float32)
        # each matrix in its own stored format (a whisper.cpp file: F16 convolutions beside Q5_0 blocks)
        parts = _parts_of(m.data, m.parts[0].format, n, k) if len(m.parts) == 1 else list(m.parts)
        return _make_mat(m.data, parts, n, k, bias, self.keep, fma)

    cdef const float *_vec(self, dict tensors, str name, int n) except NULL:
        a = np.ascontiguousarray(tensors[name], np.float32)
        if a.shape != (n,):
            raise ValueError(f"{name}: expected [{n}]")
        self.keep.append(a)
        return <const float *>_ptr(a)

    def __dealloc__(self):
        free(self.blocks)


def whisper_encoder_forward(WhisperEncoderModel wm,
                            const float[:, :, ::1] features,   # IN [B, n_mels, 2 T] each window's log-mel features
                            float[:, ::1] out,                 # OUT [B T, C] each window's encoder rows
                            int num_threads):
    """Whisper's encoder over B windows of 2 T feature frames (T <= the positions it has)."""
    x = np.empty((out.shape[0], out.shape[1]), np.float32)
    whisper_encoder_layers(wm, features, x, out, 0, wm.depth, num_threads)


def whisper_encoder_layers(WhisperEncoderModel wm,
                           const float[:, :, ::1] features,   # IN [B, n_mels, 2 T] (read when first == 0)
                           float[:, ::1] x,                   # IN/OUT [B T, C] the residual rows between slices
                           float[:, ::1] out,                 # OUT [B T, C] the encoder rows (when last == depth)
                           int first, int last, int num_threads):
    """Layers first .. last - 1 of Whisper's encoder over B windows: the stem (features -> x)
    before them when first == 0, the final LayerNorm (x -> out) after them when last == depth. A
    pass run as slices (0, a), (a, b), .., (z, depth) over one x gives the bits of one call (0,
    depth), whisper_encoder_forward: the same ops on the same rows, in the same order."""
    cdef Py_ssize_t B = features.shape[0], M = wm.n_mels, T2 = features.shape[2], T = T2 // 2, C = wm.dim
    if B == 0 or features.shape[1] != M or T2 % 2 or T == 0 or T > wm.num_pos:
        raise ValueError(f"whisper_encoder_forward: features {tuple(features.shape)}: expected [B, {M}, 2 T], "
                         f"T <= {wm.num_pos}")
    if out.shape[0] != B * T or out.shape[1] != C or x.shape[0] != B * T or x.shape[1] != C:
        raise ValueError(f"whisper_encoder_forward: x and out must be [{B * T}, {C}]")
    if not 0 <= first < last <= wm.depth and not (first == 0 and last == wm.depth):
        raise ValueError(f"whisper_encoder_layers: layers {first} .. {last - 1} of {wm.depth}")
    # activations, sized for these windows (an encoder pass is large work: allocation is not its cost);
    # the stem's own (col, h1: 2 T rows a window) only for the slice that runs it
    cdef Py_ssize_t max_k = max(3 * M, 3 * C, wm.inter), stem = B * T2 if first == 0 else 1
    col = np.empty((stem, max(3 * M, 3 * C)), np.float32)
    h1 = np.empty((stem, C), np.float32)
    h = np.empty((B * T, C), np.float32)
    qkv = np.empty((B * T, 3 * C), np.float32)
    attn = np.empty((B * T, C), np.float32)
    g = np.empty((B * T, max(wm.inter, 1)), np.float32)
    xb = np.empty((B * T2, max_k // 2 + 2), np.uint32)
    scores = np.empty((num_threads, T), np.float32)
    cdef _QBufs qb = _QBufs(B * T2, max_k)
    cdef float[:, ::1] cv = col, h1v = h1, hv = h, qv = qkv, av = attn, gv = g, sv = scores
    cdef uint32_t[:, ::1] xbv = xb
    cdef _TowerAttnBufs ta = _TowerAttnBufs(B * T, wm.num_heads, wm.head_dim, wm.bf16, wm.fma, None, num_threads,
                                            np.arange(B + 1) * T)
    with nogil:
        _whisper_encoder(wm, &features[0, 0, 0], B, T, first, last, &cv[0, 0], cv.shape[1], &h1v[0, 0], &x[0, 0],
                         &hv[0, 0], &qv[0, 0], &av[0, 0], &gv[0, 0], gv.shape[1], &xbv[0, 0], &qb.a, &sv[0, 0],
                         &out[0, 0], &ta.a if ta.ok else NULL, num_threads)


cdef inline void _egemm(const float *x, Py_ssize_t ldx, uint32_t *xb, const ll_qact *xq, Py_ssize_t num_tokens,
                        const Mat *m, float *out, Py_ssize_t ldo, int accumulate, int nt) noexcept nogil:
    """_gemm with int8 activation rows of this matrix's width (_qact_ld: the encoder's matrices
    differ in k, one buffer sized for the widest)."""
    cdef ll_qact a = _qact_ld(xq, m.k)
    _gemm(x, ldx, xb, &a, num_tokens, m, out, ldo, accumulate, nt)


cdef void _whisper_encoder(WhisperEncoderModel wm, const float *feat, Py_ssize_t nwin, Py_ssize_t T, int first,
                           int last, float *col, Py_ssize_t ldc, float *h1, float *x, float *h, float *qkv,
                           float *attn, float *g, Py_ssize_t ldg, uint32_t *xb, const ll_qact *xq, float *scores,
                           float *out, const TowerAttn *ta, int nt) noexcept nogil:
    cdef Py_ssize_t C = wm.dim, D = wm.head_dim, H = wm.num_heads, M = wm.n_mels, F = wm.inter, T2 = 2 * T
    cdef Py_ssize_t rows = nwin * T, t, s, c, tap, item, head, j, l, r0
    cdef float scale = 1.0 / sqrt(<double>D), m, total
    cdef const ClipBlockW *B
    cdef const float *src
    cdef float *sc
    cdef float *o
    cdef const float *q
    if first == 0:
        for item in prange(nwin * T2, schedule="static", num_threads=nt):     # conv1's rows: 3 frames of M bins
            src = feat + (item // T2) * M * T2
            t = item % T2
            for c in range(M):
                for tap in range(3):
                    s = t + tap - 1
                    col[item * ldc + c * 3 + tap] = src[c * T2 + s] if 0 <= s < T2 else 0.0
        _egemm(col, ldc, xb, xq, nwin * T2, &wm.conv1, h1, C, 0, nt)
        for item in prange(nwin * T2, schedule="static", num_threads=nt):
            ll_act_mul_f32(h1 + item * C, NULL, h1 + item * C, C, wm.act)
        for item in prange(rows, schedule="static", num_threads=nt):          # conv2's rows: frames 2t - 1 .. 2t + 1
            t = item % T
            for tap in range(3):
                s = 2 * t + tap - 1
                for c in range(C):
                    col[item * ldc + c * 3 + tap] = h1[((item // T) * T2 + s) * C + c] if 0 <= s < T2 else 0.0
        _egemm(col, ldc, xb, xq, rows, &wm.conv2, x, C, 0, nt)
        for item in prange(rows, schedule="static", num_threads=nt):
            ll_act_mul_f32(x + item * C, NULL, x + item * C, C, wm.act)
            ll_axpy_f32(1.0, wm.pos + (item % T) * C, x + item * C, C)
    for l in range(first, last):
        B = &wm.blocks[l]
        for t in prange(rows, schedule="static", num_threads=nt):
            ll_layernorm_f32(x + t * C, B.ln1_w, B.ln1_b, h + t * C, C, wm.eps)
        _egemm(h, C, xb, xq, rows, &B.qkv, qkv, 3 * C, 0, nt)
        # bidirectional attention over each window's T rows, one (row, head) per item
        if ta != NULL:
            _tower_attention(ta, qkv, rows, C, H, D, 1, attn, nt)
        for item in prange(rows * H if ta == NULL else 0, schedule="static", num_threads=nt):
            t = item // H
            head = item % H
            r0 = (t // T) * T
            sc = scores + openmp.omp_get_thread_num() * T
            q = qkv + t * 3 * C + head * D
            m = -1e30
            for j in range(T):
                sc[j] = ll_dot_f32(q, qkv + (r0 + j) * 3 * C + C + head * D, D) * scale
                if sc[j] > m:
                    m = sc[j]
            total = 0
            for j in range(T):
                sc[j] = expf(sc[j] - m)
                total = total + sc[j]
            o = attn + t * C + head * D
            for j in range(D):
                o[j] = 0
            for j in range(T):
                ll_axpy_f32(sc[j] / total, qkv + (r0 + j) * 3 * C + 2 * C + head * D, o, D)
        _egemm(attn, C, xb, xq, rows, &B.o, x, C, 1, nt)                     # x += out_proj(attn)
        for t in prange(rows, schedule="static", num_threads=nt):
            ll_layernorm_f32(x + t * C, B.ln2_w, B.ln2_b, h + t * C, C, wm.eps)
        _egemm(h, C, xb, xq, rows, &B.up, g, ldg, 0, nt)
        for t in prange(rows, schedule="static", num_threads=nt):
            ll_act_mul_f32(g + t * ldg, NULL, g + t * ldg, F, wm.act)
        _egemm(g, ldg, xb, xq, rows, &B.down, x, C, 1, nt)                   # x += fc2(act(fc1(ln2(x))))
    if last == wm.depth:
        for t in prange(rows, schedule="static", num_threads=nt):
            ll_layernorm_f32(x + t * C, wm.ln_w, wm.ln_b, out + t * C, C, wm.eps)


# ---- Whisper's decoder: one step ------------------------------------------------------------------
# WhisperDecoder.step's forward (lite_llm/multimodal/whisper_decoder.py: the caches, block tables
# and embeddings are Python's; _reference_step is the NumPy spec) in ONE nogil call: per layer
# LayerNorm, q/k/v, the new K/V rows into the self-attention blocks, paged causal attention,
# out_proj; LayerNorm, cross q, paged attention over the request's encoder K/V blocks (written
# once by WhisperDecoder.start), out_proj; LayerNorm, fc1, GELU, fc2; then the final LayerNorm
# and the output projection of each sequence's last token. Each phase is the op the single-op
# entry points run (gemm, write_kv, paged_attention, layernorm, act_mul), batch-invariant as the
# language model's deterministic mode runs it: bf16 weights in one input form through the tiles
# for every step shape, no attention key splits. A sequence's logits are thus the same bits
# whatever else the step holds (the transcription engine batches requests and promises that).

cdef struct WhisperDecBlockW:
    const float *ln1_w            # [C] before self-attention
    const float *ln1_b
    const float *ln2_w            # [C] before cross-attention
    const float *ln2_b
    const float *ln3_w            # [C] before the MLP
    const float *ln3_b
    Mat qkv                       # [3C, C] q | k | v with bias (k's zero)
    Mat o                         # [C, C] self-attention out_proj
    Mat cq                        # [C, C] cross-attention q
    Mat co                        # [C, C] cross-attention out_proj
    Mat up                        # [F, C] fc1
    Mat down                      # [C, F] fc2
    void *k_self                  # this layer's self-attention K / V blocks (kv_layout's layouts)
    void *v_self
    void *k_cross                 # ... and its cross-attention K / V blocks
    void *v_cross


cdef class WhisperDecoderModel:
    """The decoder's packed matrices and caches for whisper_decoder_step. mats: name ->
    (packed, n, bias, format) as WhisperDecoder packs them ("blk.{i}.qkv", ".o", ".cq", ".co",
    ".up", ".down", and "embed" [V, C]); vectors: "blk.{i}.ln1.w" / ".b", ".ln2.*", ".ln3.*",
    "ln.w" / "ln.b"; caches: per layer (k_self, v_self, k_cross, v_cross), one KV dtype. act: an
    ACTIVATIONS name."""
    cdef WhisperDecBlockW *blocks
    cdef Mat head                 # [V, C] the output projection (the token embeddings), no bias
    cdef const float *ln_w        # [C] the final LayerNorm
    cdef const float *ln_b
    cdef readonly int depth, dim, inter, num_heads, head_dim, act, kv_type, path, vocab_size
    cdef readonly Py_ssize_t block_size, self_slots, cross_slots
    cdef readonly float eps
    cdef list keep

    def __cinit__(self):
        self.blocks = NULL

    def __init__(self, dict mats, dict vectors, list caches, int depth, int dim, int inter, int num_heads,
                 float eps, str act="gelu"):
        cdef int i
        cdef WhisperDecBlockW *B
        if act not in ACTIVATIONS:
            raise ValueError(f"decoder activation {act!r}: expected one of {', '.join(ACTIVATIONS)}")
        if depth < 1 or len(caches) != depth or dim % num_heads:
            raise ValueError(f"decoder: {depth} layers with {len(caches)} caches, width {dim} of {num_heads} heads")
        self.keep = []
        self.depth, self.dim, self.inter, self.num_heads, self.eps = depth, dim, inter, num_heads, eps
        self.head_dim, self.act = dim // num_heads, ACTIVATIONS[act]
        self.path = attention_path(None, _bf16_fma(None))
        self.blocks = <WhisperDecBlockW *>calloc(depth, sizeof(WhisperDecBlockW))
        if self.blocks == NULL:
            raise MemoryError()
        self.kv_type = kv_type(caches[0][0], None)
        geometry = kv_geometry(caches[0][0], "k")
        self.block_size = geometry[2]
        self.self_slots = geometry[0] * self.block_size
        self.cross_slots = kv_geometry(caches[0][2], "k")[0] * self.block_size
        for i in range(depth):
            p = f"blk.{i}."
            B = &self.blocks[i]
            B.ln1_w, B.ln1_b = self._vec(vectors, p + "ln1.w"), self._vec(vectors, p + "ln1.b")
            B.ln2_w, B.ln2_b = self._vec(vectors, p + "ln2.w"), self._vec(vectors, p + "ln2.b")
            B.ln3_w, B.ln3_b = self._vec(vectors, p + "ln3.w"), self._vec(vectors, p + "ln3.b")
            B.qkv = self._mat(mats, p + "qkv", 3 * dim, dim)
            B.o = self._mat(mats, p + "o", dim, dim)
            B.cq = self._mat(mats, p + "cq", dim, dim)
            B.co = self._mat(mats, p + "co", dim, dim)
            B.up = self._mat(mats, p + "up", inter, dim)
            B.down = self._mat(mats, p + "down", dim, inter)
            k_self, v_self, k_cross, v_cross = caches[i]
            for c, which in ((k_self, "k"), (v_self, "v"), (k_cross, "k"), (v_cross, "v")):
                g = kv_geometry(c, which)
                if kv_type(c, None) != self.kv_type or g[1] != num_heads or g[2] != self.block_size \
                        or g[3] != self.head_dim:
                    raise ValueError(f"decoder layer {i}: caches of one KV dtype, {num_heads} heads of "
                                     f"{self.head_dim}, blocks of {self.block_size} expected")
            if kv_geometry(k_self, "k")[0] * self.block_size != self.self_slots \
                    or kv_geometry(k_cross, "k")[0] * self.block_size != self.cross_slots:
                raise ValueError(f"decoder layer {i}: its caches differ in size from layer 0's")
            self.keep += [k_self, v_self, k_cross, v_cross]
            B.k_self, B.v_self = <void *>_ptr(k_self), <void *>_ptr(v_self)
            B.k_cross, B.v_cross = <void *>_ptr(k_cross), <void *>_ptr(v_cross)
        self.vocab_size = mats["embed"][1]
        self.head = self._mat(mats, "embed", self.vocab_size, dim)
        self.ln_w, self.ln_b = self._vec(vectors, "ln.w"), self._vec(vectors, "ln.b")
        if self.head_dim % 16 or self.head_dim > LL_MAX_HEAD_DIM or self.block_size % 16:
            raise ValueError("decoder: head size and block size must be multiples of 16")

    cdef Mat _mat(self, dict mats, str name, Py_ssize_t n, Py_ssize_t k) except *:
        packed, rows, bias, fmt = mats[name]
        if rows != n:
            raise ValueError(f"{name}: {rows} rows, expected {n}")
        if bias is not None and (bias.dtype.name != "float32" or bias.shape != (n,)):
            raise ValueError(f"{name}: bias must be float32 [{n}]")
        # batch-invariant: bf16 pairs in for every step shape (fma off), one token through the tiles
        return _make_mat(packed, _parts_of(packed, fmt, n, k), n, k, bias, self.keep, False, False)

    cdef const float *_vec(self, dict vectors, str name) except NULL:
        a = np.ascontiguousarray(vectors[name], np.float32)
        if a.shape != (self.dim,):
            raise ValueError(f"{name}: expected [{self.dim}]")
        self.keep.append(a)
        return <const float *>_ptr(a)

    def __dealloc__(self):
        free(self.blocks)


def whisper_decoder_step(WhisperDecoderModel dm,
                         float[:, ::1] x,                     # IN/OUT [N, C] token + position embeddings
                                                              #   -> the last layer's residual rows
                         const int64_t[::1] slots,            # IN [N] each token's self-attention slot
                         const int32_t[:, ::1] self_tables,   # IN [S, max self blocks] block tables
                         const int32_t[:, ::1] cross_tables,  # IN [S, max cross blocks]
                         const int32_t[::1] tok_seq,          # IN [N] sequence of each token
                         const int32_t[::1] positions,        # IN [N] position of each token
                         const int32_t[::1] cross_last,       # IN [N] its sequence's last encoder row
                         const int64_t[::1] last_rows,        # IN [S] row of x of each sequence's last token
                         float[:, ::1] logits,                # OUT [S, V] the next-token logits after them
                         int num_threads,
                         const int32_t[::1] capture_layers=None,  # IN [L]: where layer l's cross q rows go
                                                                  #   in capture (-1: nowhere)
                         float[:, :, ::1] capture=None):      # OUT [captured layers, N, C] cross q rows
    """The decoder over N new tokens of S sequences: each token's K / V written to its slot, x
    advanced through every layer, the logits of each sequence's last token. ONE parallel region
    of num_threads for the whole step, a barrier between dependent phases (the caller picks 1
    for a step too small to share: WhisperDecoder._threads). Every value is computed by one
    thread whatever the team's size (a GEMM's panels, an attention's heads without key splits,
    a LayerNorm's rows), so the logits are the same bits on any number of threads. capture: the
    cross-attention's query rows (bias added, before the scaling) of the layers capture_layers
    names, for word alignment (lite_llm/multimodal/word_timing.py)."""
    cdef Py_ssize_t N = x.shape[0], C = dm.dim, F = dm.inter, H = dm.num_heads, D = dm.head_dim
    cdef Py_ssize_t bs = dm.block_size, t
    cdef int nth = max(num_threads, 1)
    if N == 0 or x.shape[1] != C or slots.shape[0] != N or tok_seq.shape[0] != N or positions.shape[0] != N \
            or cross_last.shape[0] != N or self_tables.shape[0] != cross_tables.shape[0] \
            or last_rows.shape[0] != self_tables.shape[0] or last_rows.shape[0] > N \
            or logits.shape[0] != last_rows.shape[0] or logits.shape[1] != dm.vocab_size:
        raise ValueError(f"whisper_decoder_step: x [N, {C}] and N slots, sequences, positions, cross rows; "
                         f"one block table of each kind, last row and logits row [{dm.vocab_size}] per sequence")
    for t in range(last_rows.shape[0]):
        if not 0 <= last_rows[t] < N:
            raise ValueError("whisper_decoder_step: a last row beyond x")
    for t in range(N):
        if slots[t] < 0 or slots[t] >= dm.self_slots or tok_seq[t] < 0 or tok_seq[t] >= self_tables.shape[0] \
                or positions[t] < 0 or positions[t] // bs >= self_tables.shape[1] or cross_last[t] < 0 \
                or cross_last[t] // bs >= cross_tables.shape[1]:
            raise ValueError("whisper_decoder_step: a slot, sequence or position beyond the caches or tables")
    for t in range(self_tables.shape[0] * self_tables.shape[1]):
        if not 0 <= (&self_tables[0, 0])[t] < dm.self_slots // bs:
            raise ValueError("whisper_decoder_step: a self-attention block beyond the cache")
    for t in range(cross_tables.shape[0] * cross_tables.shape[1]):
        if not 0 <= (&cross_tables[0, 0])[t] < dm.cross_slots // bs:
            raise ValueError("whisper_decoder_step: a cross-attention block beyond the cache")
    if (capture_layers is None) != (capture is None) or capture_layers is not None and (
            capture_layers.shape[0] != dm.depth or capture.shape[1] != N or capture.shape[2] != C):
        raise ValueError(f"whisper_decoder_step: capture_layers [{dm.depth}] with capture [layers, N, {C}]")
    if capture_layers is not None:
        for t in range(dm.depth):
            if not -1 <= capture_layers[t] < capture.shape[0]:
                raise ValueError("whisper_decoder_step: a captured layer beyond capture")
    cdef Py_ssize_t max_k = max(C, F)
    h = np.empty((N, C), np.float32)
    qkv = np.empty((N, 3 * C), np.float32)
    q = np.empty((N, C), np.float32)
    attn = np.empty((N, C), np.float32)
    g = np.empty((N, F), np.float32)
    xb = np.empty((N, max_k // 2 + 2), np.uint32)
    cdef _QBufs qb = _QBufs(N, max_k)
    scratch = np.empty((nth, ll_attention_scratch(D, 1)), np.float32)
    tiles = np.empty(N + 1, np.int32)
    partials = np.empty((_max_split_items(nth), _partial_stride(1, D)), np.float32)
    sync = np.zeros(40, np.int64)     # the team's work counter, then its barrier's two words: a cache line each
    cdef float[:, ::1] hv = h, qkvv = qkv, qv = q, av = attn, gv = g, sc = scratch, pv = partials
    cdef uint32_t[:, ::1] xbv = xb
    cdef int32_t[::1] tv = tiles
    cdef int64_t[::1] syncv = sync
    cdef long long *counter = <long long *>&syncv[0]
    cdef int *bar = <int *>&syncv[8]
    cdef AttnC sa, ca
    cdef DecStepC st
    # self-attention: q inside the qkv rows, causal over the sequence's own positions
    sa.q, sa.ldq, sa.out, sa.ldo, sa.tiles = &qkvv[0, 0], 3 * C, &av[0, 0], C, &tv[0]
    sa.h, sa.hkv, sa.d, sa.bs, sa.max_blocks = H, H, D, bs, self_tables.shape[1]
    sa.kv_type, sa.path, sa.window, sa.scale, sa.softcap, sa.sinks = dm.kv_type, dm.path, 0, 1.0 / sqrt(<double>D), \
        0.0, NULL
    sa.block_tables, sa.tok_seq, sa.positions, sa.last = &self_tables[0, 0], &tok_seq[0], &positions[0], &positions[0]
    sa.scratch, sa.scratch_len, sa.partials = &sc[0, 0], sc.shape[1], &pv[0, 0]
    # out's rows in fp32 only (_dec_attention converts them): a head of D values is not whole int8
    # blocks at every Whisper shape, as the attention's own conversion needs (_attn_to_input)
    sa.form, sa.xb, sa.xq, sa.xqd, sa.xqs, sa.xqn, sa.prefetch = LL_IN_F32, NULL, NULL, NULL, NULL, NULL, NULL
    # cross-attention: every query reads all of its request's encoder rows (position = last key)
    ca = sa
    ca.q, ca.ldq, ca.max_blocks = &qv[0, 0], C, cross_tables.shape[1]
    ca.block_tables, ca.positions, ca.last = &cross_tables[0, 0], &cross_last[0], &cross_last[0]
    st.x, st.N, st.S, st.h, st.qkv, st.q, st.attn, st.g = &x[0, 0], N, last_rows.shape[0], &hv[0, 0], &qkvv[0, 0], \
        &qv[0, 0], &av[0, 0], &gv[0, 0]
    st.xb, st.xq, st.slots, st.sa, st.ca, st.last_rows, st.logits = &xbv[0, 0], &qb.a, &slots[0], &sa, &ca, \
        &last_rows[0], &logits[0, 0]
    st.capture_layers, st.capture = NULL, NULL
    if capture_layers is not None:
        st.capture_layers, st.capture = &capture_layers[0], &capture[0, 0, 0]
    with nogil:
        sa.num_tiles = ca.num_tiles = _build_tiles(&tok_seq[0], N, &tv[0])
        sa.max_keys = ca.max_keys = 0               # no key splits (_num_splits): batch-invariant
        ll_barrier_reset(bar, bar + 32)
        with parallel(num_threads=nth):
            _whisper_decoder_thread(dm, &st, counter, bar, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())


cdef struct DecStepC:
    # One decoder step's rows and scratch (whisper_decoder_step's arrays).
    float *x                     # [N, C] residual rows
    Py_ssize_t N, S              # tokens, sequences
    float *h                     # [max(N, S), C] a LayerNorm's output
    float *qkv                   # [N, 3C] self-attention q | k | v
    float *q                     # [N, C] cross-attention q
    float *attn                  # [N, C] an attention's output
    float *g                     # [N, F] MLP features
    uint32_t *xb                 # the next GEMM's input rows as bf16 pairs, or
    const ll_qact *xq            #   as int8 blocks (its ld: that matrix's k)
    const int64_t *slots         # [N] the self-attention slot of each token
    AttnC *sa                    # the two attention phases (each layer's caches set by thread 0)
    AttnC *ca
    const int64_t *last_rows     # [S] the row of each sequence's last token
    float *logits                # [S, V]
    const int32_t *capture_layers   # [layers] where a layer's cross q rows go in capture (-1: nowhere), or NULL
    float *capture               # [captured, N, C]


cdef inline void _dec_input(const DecStepC *st, const float *x, Py_ssize_t ldx, Py_ssize_t t0, Py_ssize_t t1,
                            const Mat *m, Py_ssize_t rows) noexcept nogil:
    """Rows t0..t1 of x in the input form a GEMM of `rows` rows through m takes."""
    cdef ll_qact a = _qact_ld(st.xq, m.k)
    _to_input(ll_mat_form(m, rows), x, ldx, t0, t1, m.k, st.xb, &a)


cdef inline void _dec_gemm(const DecStepC *st, const float *x, Py_ssize_t ldx, Py_ssize_t rows, const Mat *m,
                           float *out, Py_ssize_t ldo, int accumulate, ll_team *tm) noexcept nogil:
    """out (+)= x @ W.T + bias with x's rows already in m's input form (_dec_input): this
    thread's panels, then the barrier that ends the phase."""
    cdef ll_qact a = _qact_ld(st.xq, m.k)
    _gemm_phase(x, ldx, st.xb, &a, rows, m, out, ldo, accumulate, _gemm_mode(rows), tm)
    ll_omp_barrier()


cdef inline void _dec_norm(const DecStepC *st, const float *w, const float *b, float eps, Py_ssize_t C,
                           const Mat *m, ll_team *tm) noexcept nogil:
    """h = LayerNorm(x), this thread's rows, in m's input form; then the barrier."""
    cdef Py_ssize_t t, t0, t1
    _row_share(tm, st.N, &t0, &t1)
    for t in range(t0, t1):
        ll_layernorm_f32(st.x + t * C, w, b, st.h + t * C, C, eps)
    _dec_input(st, st.h, C, t0, t1, m, st.N)
    ll_omp_barrier()


cdef inline void _dec_attention(const DecStepC *st, AttnC *a, const Mat *o, ll_team *tm) noexcept nogil:
    """An attention phase (it ends at a barrier), then its rows in o's input form."""
    cdef Py_ssize_t t0, t1
    _attention_phase(a, tm)
    _row_share(tm, st.N, &t0, &t1)
    _dec_input(st, st.attn, o.k, t0, t1, o, st.N)
    ll_omp_barrier()


cdef void _whisper_decoder_thread(WhisperDecoderModel dm, DecStepC *st, long long *counter, int *bar, int tid,
                                  int nth) noexcept nogil:
    """One thread's part of every phase of a decoder step (whisper_decoder_step)."""
    cdef Py_ssize_t C = dm.dim, F = dm.inter, H = dm.num_heads, D = dm.head_dim, N = st.N, t, t0, t1, l
    cdef const WhisperDecBlockW *B
    cdef ll_team team = ll_team_make(counter, tid, nth)
    cdef ll_team *tm = &team
    ll_barrier_enter(bar, bar + 32, nth)
    for l in range(dm.depth):
        B = &dm.blocks[l]
        _dec_norm(st, B.ln1_w, B.ln1_b, dm.eps, C, &B.qkv, tm)
        _dec_gemm(st, st.h, C, N, &B.qkv, st.qkv, 3 * C, 0, tm)
        _row_share(tm, N, &t0, &t1)
        for t in range(t0, t1):
            ll_write_kv_row(st.qkv + t * 3 * C + C, B.k_self, dm.kv_type, st.slots[t], dm.block_size, H, D, 1)
            ll_write_kv_row(st.qkv + t * 3 * C + 2 * C, B.v_self, dm.kv_type, st.slots[t], dm.block_size, H, D, 0)
        if tid == 0:    # this layer's caches, read by every thread after the barrier
            st.sa.k_cache, st.sa.v_cache = B.k_self, B.v_self
            st.ca.k_cache, st.ca.v_cache = B.k_cross, B.v_cross
        ll_omp_barrier()
        _dec_attention(st, st.sa, &B.o, tm)
        _dec_gemm(st, st.attn, C, N, &B.o, st.x, C, 1, tm)                  # x += out_proj(attn)
        _dec_norm(st, B.ln2_w, B.ln2_b, dm.eps, C, &B.cq, tm)
        _dec_gemm(st, st.h, C, N, &B.cq, st.q, C, 0, tm)
        if st.capture_layers != NULL and st.capture_layers[l] >= 0:     # q is read-only until the next layer's
            _row_share(tm, N, &t0, &t1)
            memcpy(st.capture + st.capture_layers[l] * N * C + t0 * C, st.q + t0 * C, (t1 - t0) * C * sizeof(float))
        _dec_attention(st, st.ca, &B.co, tm)
        _dec_gemm(st, st.attn, C, N, &B.co, st.x, C, 1, tm)                 # x += cross out_proj(attn)
        _dec_norm(st, B.ln3_w, B.ln3_b, dm.eps, C, &B.up, tm)
        _dec_gemm(st, st.h, C, N, &B.up, st.g, F, 0, tm)
        _row_share(tm, N, &t0, &t1)
        for t in range(t0, t1):
            ll_act_mul_f32(st.g + t * F, NULL, st.g + t * F, F, dm.act)
        _dec_input(st, st.g, F, t0, t1, &B.down, N)
        ll_omp_barrier()
        _dec_gemm(st, st.g, F, N, &B.down, st.x, C, 1, tm)                  # x += fc2(act(fc1))
    # the head: logits [S, V] = LayerNorm(x[last_rows]) @ embed.T
    _row_share(tm, st.S, &t0, &t1)
    for t in range(t0, t1):
        ll_layernorm_f32(st.x + st.last_rows[t] * C, dm.ln_w, dm.ln_b, st.h + t * C, C, dm.eps)
    _dec_input(st, st.h, C, t0, t1, &dm.head, st.S)
    ll_omp_barrier()
    _dec_gemm(st, st.h, C, st.S, &dm.head, st.logits, dm.vocab_size, 0, tm)
    ll_barrier_leave()


# ---- Word alignment: dynamic time warping --------------------------------------------------------

def whisper_dtw(const double[:, ::1] x):
    """The monotonic path of least total cost through x [N tokens, M frames] from (0, 0) to
    (N - 1, M - 1), each move one token, one frame or both, as (token indices, frame indices)
    [path length] int64 (openai-whisper's timing.dtw, which transformers' _dynamic_time_warping
    restates: float32 running costs, ties going to a frame move, then a token move)."""
    cdef Py_ssize_t N = x.shape[0], M = x.shape[1], i, j, k = 0
    if N == 0 or M == 0:
        raise ValueError("whisper_dtw: an empty cost matrix")
    cost = np.full((N + 1, M + 1), np.inf, np.float32)
    trace = np.full((N + 1, M + 1), -1, np.int8)
    path = np.empty((2, N + M), np.int64)
    cdef float[:, ::1] cv = cost
    cdef int8_t[:, ::1] tv = trace
    cdef int64_t[:, ::1] pv = path
    cdef float c0, c1, c2, c
    cdef int8_t step
    with nogil:
        cv[0, 0] = 0
        for j in range(1, M + 1):
            for i in range(1, N + 1):
                c0, c1, c2 = cv[i - 1, j - 1], cv[i - 1, j], cv[i, j - 1]
                if c0 < c1 and c0 < c2:
                    c, step = c0, 0
                elif c1 < c0 and c1 < c2:
                    c, step = c1, 1
                else:
                    c, step = c2, 2
                cv[i, j] = <float>(x[i - 1, j - 1] + <double>c)
                tv[i, j] = step
        for j in range(M + 1):
            tv[0, j] = 2
        for i in range(N + 1):
            tv[i, 0] = 1
        i, j = N, M
        while i > 0 or j > 0:
            pv[0, k], pv[1, k] = i - 1, j - 1
            k += 1
            if tv[i, j] == 0:
                i -= 1
                j -= 1
            elif tv[i, j] == 1:
                i -= 1
            else:
                j -= 1
    return np.ascontiguousarray(path[0, k - 1::-1]), np.ascontiguousarray(path[1, k - 1::-1])


cdef enum:
    _MEDIAN_MAX = 63             # the widest median filter (its values sorted in a stack array)
MEDIAN_MAX_WIDTH = _MEDIAN_MAX


cdef inline void _median_row(const float *x, float *out, Py_ssize_t n, int width, Py_ssize_t j0,
                             Py_ssize_t j1) noexcept nogil:
    """out[j] = the median of x[j - width // 2 .. j + width // 2] for j0 <= j < j1, indices past
    an end of the row of n reflected."""
    cdef float buf[_MEDIAN_MAX]
    cdef Py_ssize_t j, i, k, pad = width // 2
    cdef float v
    for j in range(j0, j1):
        for i in range(width):
            k = j + i - pad
            if k < 0:
                k = -k
            elif k >= n:
                k = 2 * (n - 1) - k
            v = x[k]
            k = i - 1               # insertion into the sorted prefix
            while k >= 0 and buf[k] > v:
                buf[k + 1] = buf[k]
                k -= 1
            buf[k + 1] = v
        out[j] = buf[pad]


cdef inline void _median7_row(const float *x, float *out, Py_ssize_t n) noexcept nogil:
    """_median_row of width 7: the values of the row's middle through a sorting network of 16
    compare-exchanges (min / max, vectorizable across j), its 3 values at each end as _median_row."""
    cdef Py_ssize_t j
    cdef float a0, a1, a2, a3, a4, a5, a6, t
    _median_row(x, out, n, 7, 0, min(3, n))
    _median_row(x, out, n, 7, max(n - 3, 3), n)
    for j in range(3, n - 3):
        a0, a1, a2, a3, a4, a5, a6 = x[j - 3], x[j - 2], x[j - 1], x[j], x[j + 1], x[j + 2], x[j + 3]
        t = a0 if a0 < a6 else a6; a6 = a6 if a0 < a6 else a0; a0 = t
        t = a2 if a2 < a3 else a3; a3 = a3 if a2 < a3 else a2; a2 = t
        t = a4 if a4 < a5 else a5; a5 = a5 if a4 < a5 else a4; a4 = t
        t = a0 if a0 < a2 else a2; a2 = a2 if a0 < a2 else a0; a0 = t
        t = a1 if a1 < a4 else a4; a4 = a4 if a1 < a4 else a1; a1 = t
        t = a3 if a3 < a6 else a6; a6 = a6 if a3 < a6 else a3; a3 = t
        t = a0 if a0 < a1 else a1; a1 = a1 if a0 < a1 else a0; a0 = t
        t = a2 if a2 < a5 else a5; a5 = a5 if a2 < a5 else a2; a2 = t
        t = a3 if a3 < a4 else a4; a4 = a4 if a3 < a4 else a3; a3 = t
        t = a1 if a1 < a2 else a2; a2 = a2 if a1 < a2 else a1; a1 = t
        t = a4 if a4 < a6 else a6; a6 = a6 if a4 < a6 else a4; a4 = t
        t = a2 if a2 < a3 else a3; a3 = a3 if a2 < a3 else a2; a2 = t
        t = a4 if a4 < a5 else a5; a5 = a5 if a4 < a5 else a4; a4 = t
        t = a1 if a1 < a2 else a2; a2 = a2 if a1 < a2 else a1; a1 = t
        t = a3 if a3 < a4 else a4; a4 = a4 if a3 < a4 else a3; a3 = t
        out[j] = a3


def median_filter_rows(const float[:, ::1] x, int width, float[:, ::1] out, int num_threads=1):
    """Each row of x [R, n] median-filtered (word_timing.median_filter: width values centred on
    each, the row's ends reflected; an odd width up to MEDIAN_MAX_WIDTH, a row longer than
    width // 2) into out [R, n]; rows split over num_threads."""
    cdef Py_ssize_t R = x.shape[0], n = x.shape[1], r
    if width < 1 or width % 2 == 0 or width > _MEDIAN_MAX or n <= width // 2 or out.shape[0] != R \
            or out.shape[1] != n:
        raise ValueError(f"median_filter_rows: an odd width up to {MEDIAN_MAX_WIDTH} over rows longer than "
                         "half of it, out shaped as x")
    with nogil:
        for r in prange(R, schedule="static", num_threads=max(num_threads, 1)):
            if width == 7:
                _median7_row(&x[r, 0], &out[r, 0], n)
            else:
                _median_row(&x[r, 0], &out[r, 0], n, width, 0, n)
