# cython: language_level=3
"""CPU feature probing and OpenMP thread binding, built once with baseline flags (so it
imports on any CPU of the architecture, before a variant is chosen)."""
from cython.parallel cimport parallel, prange
cimport openmp

cdef extern from "cpu_features.h" nogil:
    int ll_cpu_has(const char *name)

cdef extern from "omp_util.h" nogil:
    int ll_pin_self(int cpu)
    int ll_current_cpu()
    int ll_gettid()
    double ll_monotonic_seconds()
    unsigned long long ll_busy_until(double deadline)
    unsigned long long ll_stream_sum(const unsigned long long *p, Py_ssize_t n)


def has(str feature) -> bool:
    """True if the CPU has `feature` and the OS saves its registers (e.g. "avx512bf16")."""
    r = ll_cpu_has(feature.encode())
    if r < 0:
        raise ValueError(f"unknown CPU feature name {feature!r}")
    return r == 1


def bind_threads(cpus) -> list:
    """Pin OpenMP thread i of the calling thread's pool to cpus[i] (thread 0 is the caller),
    and return the CPU each thread then runs on (-1 where pinning failed).

    libgomp keeps one pool per calling thread and reuses it, so the binding lasts for every
    later parallel region started from this same thread with at most len(cpus) threads."""
    cdef int n = len(cpus)
    cdef int[::1] want = memoryview(bytearray(4 * max(n, 1))).cast("i")
    cdef int[::1] got = memoryview(bytearray(4 * max(n, 1))).cast("i")
    cdef int i, tid = 0      # firstprivate in the region below: set on every path
    for i in range(n):
        want[i] = cpus[i]
        got[i] = -2  # a thread that never ran stays at -2
    with nogil, parallel(num_threads=n):
        tid = openmp.omp_get_thread_num()
        if tid < n:
            got[tid] = ll_current_cpu() if ll_pin_self(want[tid]) == 0 else -1
    return [got[i] for i in range(n)]


cdef list _each_thread(int num_threads, bint want_tid):
    """One parallel region of num_threads: per thread, sched_getcpu() or (want_tid) gettid();
    -2 for a thread that never ran."""
    cdef int n = max(num_threads, 1)
    cdef int[::1] got = memoryview(bytearray(4 * n)).cast("i")
    cdef int tid = 0      # firstprivate in the region below: set on every path
    for tid in range(n):
        got[tid] = -2
    with nogil, parallel(num_threads=n):
        tid = openmp.omp_get_thread_num()
        if tid < n:
            got[tid] = ll_gettid() if want_tid else ll_current_cpu()
    return [got[i] for i in range(n)]


def thread_cpus(int num_threads) -> list:
    """The CPU each of num_threads OpenMP threads runs on right now (sched_getcpu)."""
    return _each_thread(num_threads, False)


def thread_ids(int num_threads) -> list:
    """The kernel thread id (gettid) of each of num_threads OpenMP threads of the calling
    thread's pool; libgomp reuses the pool, so later regions of this size run on these."""
    return _each_thread(num_threads, True)


def omp_max_threads() -> int:
    """The team size OpenMP uses when no num_threads is given (OMP_NUM_THREADS, else the
    number of CPUs in the affinity mask)."""
    return openmp.omp_get_max_threads()


def spin(int num_threads, double seconds) -> list:
    """Keep num_threads OpenMP threads (OpenMP's default team when num_threads <= 0) busy for
    `seconds` without the GIL; return (gettid, sched_getcpu at the end) per team thread.

    For tests and diagnostics: run it from the thread that bound the pool and read
    /proc/self/task/<tid>/stat meanwhile to see where each worker really runs."""
    cdef int n = num_threads if num_threads > 0 else openmp.omp_get_max_threads()
    cdef int[::1] tids = memoryview(bytearray(4 * n)).cast("i")
    cdef int[::1] cpus = memoryview(bytearray(4 * n)).cast("i")
    cdef int tid = 0, team = 0      # tid: firstprivate in the regions below, set on every path
    cdef double deadline = ll_monotonic_seconds() + seconds
    for tid in range(n):
        tids[tid] = -2
        cpus[tid] = -2
    if num_threads > 0:
        with nogil, parallel(num_threads=n):
            tid = openmp.omp_get_thread_num()
            if tid < n:
                ll_busy_until(deadline)
                tids[tid] = ll_gettid()
                cpus[tid] = ll_current_cpu()
    else:
        with nogil, parallel():
            tid = openmp.omp_get_thread_num()
            if tid < n:
                ll_busy_until(deadline)
                tids[tid] = ll_gettid()
                cpus[tid] = ll_current_cpu()
    return [(tids[i], cpus[i]) for i in range(n) if tids[i] != -2]


def stream_read(const unsigned long long[::1] words, int num_threads) -> int:
    """Read `words` once with num_threads OpenMP threads, a contiguous slice each (the access
    pattern of a decode step); returns their sum. Time it to measure read bandwidth."""
    cdef Py_ssize_t n = words.shape[0], tid, nt = max(num_threads, 1)
    cdef unsigned long long total = 0
    if n == 0:
        return 0
    for tid in prange(nt, nogil=True, schedule="static", num_threads=nt):
        total += ll_stream_sum(&words[n * tid // nt], n * (tid + 1) // nt - n * tid // nt)
    return total
