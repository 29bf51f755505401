# Tensor parallel: one rank's handle on the group's shared segment (src/tp_shm.h). forward()
# takes it and runs the all-reduces after the o and down projections inside its one parallel
# region; the processes and the segment's step area are lite_llm/engine/tp.py's.
from libc.stdint cimport uint64_t

cdef extern from "tp_shm.h" nogil:
    int LL_TP_MAX_RANKS, LL_TP_OK, LL_TP_ABORTED, LL_TP_TIMEOUT, LL_TP_PARENT_GONE
    ctypedef struct ll_tp_header:
        pass
    ctypedef struct ll_tp:
        ll_tp_header *hdr
        float *slots
        Py_ssize_t cap
        int rank, size
        uint64_t gen
        double timeout
        int parent
        int failed
    size_t ll_tp_header_bytes()
    float *ll_tp_slot(const ll_tp *tp, uint64_t gen, int rank)
    int ll_tp_arrive_and_wait(ll_tp *tp, uint64_t gen)
    void ll_tp_sum(const ll_tp *tp, uint64_t gen, float *out, Py_ssize_t i0, Py_ssize_t i1)
    int64_t ll_tp_wait_step(ll_tp *tp, uint64_t last, double idle_timeout)
    void ll_tp_publish_step(ll_tp_header *hdr, uint64_t step)
    void ll_tp_set_abort(ll_tp_header *hdr, uint64_t why)


TP_FAILURES = {1: "aborted", 2: "timed out", 3: "rank 0 is gone"}


def tp_segment_bytes(int size, Py_ssize_t cap):
    """(header bytes, slot bytes) of a group of `size` ranks whose slots hold `cap` floats."""
    return ll_tp_header_bytes(), 2 * size * cap * sizeof(float)


cdef class TPComm:
    """Rank `rank` of `size` on a segment: buf is the whole mapping (writable), the header at
    its start and the slots [2][size][cap] at slots_offset. timeout: seconds an all-reduce may
    wait for the other ranks. parent: a worker's rank-0 pid (0 on rank 0)."""
    cdef ll_tp c
    cdef object buf

    def __init__(self, buf, int rank, int size, Py_ssize_t cap, Py_ssize_t slots_offset,
                 double timeout, int parent=0):
        cdef unsigned char[::1] view = buf
        if not 1 <= size <= LL_TP_MAX_RANKS or not 0 <= rank < size:
            raise ValueError(f"tensor parallel rank {rank} of {size}: at most {LL_TP_MAX_RANKS} ranks")
        if slots_offset < <Py_ssize_t>ll_tp_header_bytes() or slots_offset % 64 or \
                slots_offset + 2 * size * cap * <Py_ssize_t>sizeof(float) > view.shape[0]:
            raise ValueError("tensor parallel segment too small for its slots")
        self.buf = buf
        self.c.hdr = <ll_tp_header *>&view[0]
        self.c.slots = <float *>&view[slots_offset]
        self.c.cap, self.c.rank, self.c.size = cap, rank, size
        self.c.gen, self.c.timeout, self.c.parent, self.c.failed = 0, timeout, parent, 0

    @property
    def rank(self):
        return self.c.rank

    @property
    def size(self):
        return self.c.size

    @property
    def failed(self):
        """"" while all is well, else why the last wait gave up (TP_FAILURES)."""
        return TP_FAILURES.get(self.c.failed, "") if self.c.failed else ""

    def wait_step(self, uint64_t last, double idle_timeout=0.0):
        """Worker: the next step number after `last`, or -reason (TP_FAILURES) when the group
        stops; idle_timeout 0 waits as long as rank 0 lives."""
        cdef int64_t r
        with nogil:
            r = ll_tp_wait_step(&self.c, last, idle_timeout)
        return r

    def publish_step(self, uint64_t step):
        """Rank 0: the step's arrays are in place; workers may run it."""
        ll_tp_publish_step(self.c.hdr, step)

    def set_abort(self, uint64_t why):
        ll_tp_set_abort(self.c.hdr, why)

    def allreduce(self, float[::1] x, int num_threads=1):
        """x = the sum of every rank's x (all ranks call it with the same length; tests and the
        all-reduce benchmark). The forward pass does the same without this Python."""
        cdef Py_ssize_t n = x.shape[0]
        cdef uint64_t g
        if n > self.c.cap:
            raise ValueError(f"allreduce of {n} floats: slots hold {self.c.cap}")
        g = self.c.gen + 1
        with nogil, parallel(num_threads=num_threads):
            _allreduce_thread(&self.c, g, &x[0], n, openmp.omp_get_thread_num(), openmp.omp_get_num_threads())
        self.c.gen = g
        if self.c.failed:
            raise RuntimeError(f"tensor parallel all-reduce {TP_FAILURES[self.c.failed]}")


cdef void _allreduce_thread(ll_tp *tp, uint64_t gen, float *x, Py_ssize_t n, int tid, int nth) noexcept nogil:
    """One thread of allreduce's region: its share of x into this rank's slot, then the sum."""
    cdef ll_team tm = ll_team_make(NULL, tid, nth)   # static phases only
    cdef Py_ssize_t i0, i1
    ll_work_static(&tm, n, 1, &i0, &i1)
    memcpy(ll_tp_slot(tp, gen, tp.rank) + i0, x + i0, (i1 - i0) * sizeof(float))
    _tp_reduce(tp, gen, x, n, &tm)


cdef inline void _tp_reduce(ll_tp *tp, uint64_t gen, float *out, Py_ssize_t n, ll_team *tm) noexcept nogil:
    """out[0:n] = the sum over ranks of their slot of all-reduce `gen`, called by every thread of
    the rank's team once its share of this rank's slot is written. After it, out is whole."""
    cdef Py_ssize_t i0, i1
    ll_omp_barrier()
    if tm.tid == 0:
        ll_tp_arrive_and_wait(tp, gen)
    ll_omp_barrier()
    if not tp.failed:   # read after the barrier: every thread sees the same value
        ll_work_static(tm, n, 1, &i0, &i1)
        ll_tp_sum(tp, gen, out, i0, i1)
    ll_omp_barrier()
