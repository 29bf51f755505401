# cython: language_level=3
"""CPU feature probing and OpenMP thread binding, built once with baseline flags (so it
imports on any CPU of the architecture, before a variant is chosen)."""
from cython.parallel cimport parallel
cimport openmp

cdef extern from "cpu_features.h" nogil:
    int ll_cpu_has(const char *name)

cdef extern from "omp_util.h" nogil:
    int ll_pin_self(int cpu)
    int ll_current_cpu()


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
    cdef int i, tid
    for i in range(n):
        want[i] = cpus[i]
        got[i] = -2  # a thread that never ran stays at -2
    with nogil, parallel(num_threads=n):
        tid = openmp.omp_get_thread_num()
        if tid < n:
            got[tid] = ll_current_cpu() if ll_pin_self(want[tid]) == 0 else -1
    return [got[i] for i in range(n)]


def thread_cpus(int num_threads) -> list:
    """The CPU each of num_threads OpenMP threads runs on right now (sched_getcpu)."""
    cdef int n = max(num_threads, 1)
    cdef int[::1] got = memoryview(bytearray(4 * n)).cast("i")
    cdef int tid
    for tid in range(n):
        got[tid] = -2
    with nogil, parallel(num_threads=n):
        tid = openmp.omp_get_thread_num()
        if tid < n:
            got[tid] = ll_current_cpu()
    return [got[i] for i in range(n)]
