/* Small OpenMP / scheduling helpers used from Cython. */
#ifndef LL_OMP_UTIL_H
#define LL_OMP_UTIL_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

/* A barrier callable from inside a Cython `with parallel():` block. */
static inline void ll_omp_barrier(void) {
#pragma omp barrier
}

/* Hand out work items: returns the counter's value before the increment. */
static inline int ll_atomic_next(int *counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }

/* Pin the calling thread to one CPU; 0 on success, an errno value otherwise. */
static inline int ll_pin_self(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static inline int ll_current_cpu(void) { return sched_getcpu(); }

/* The kernel's id of the calling thread (the name of its /proc/self/task/<tid> entry). */
static inline int ll_gettid(void) { return (int)syscall(SYS_gettid); }

static inline double ll_monotonic_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

/* Read n 64-bit words once, start to end, as a decode step reads its weights (prefetching
 * 4 KB ahead as the block-quantized GEMV does); returns their sum so the reads cannot be
 * optimised away (a memory-bandwidth probe). */
static inline unsigned long long ll_stream_sum(const unsigned long long *p, ptrdiff_t n) {
    unsigned long long a = 0, b = 0, c = 0, d = 0;
    ptrdiff_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __builtin_prefetch(p + i + 512, 0, 0);
        a += p[i] + p[i + 4]; b += p[i + 1] + p[i + 5]; c += p[i + 2] + p[i + 6]; d += p[i + 3] + p[i + 7];
    }
    for (; i < n; i++) a += p[i];
    return a + b + c + d;
}

/* Burn CPU in the calling thread until `deadline` (ll_monotonic_seconds); returns a value
 * that depends on the work so the loop cannot be optimised away. */
static inline unsigned long long ll_busy_until(double deadline) {
    volatile unsigned long long acc = 0;
    while (ll_monotonic_seconds() < deadline)
        for (int i = 0; i < 4096; i++) acc += (unsigned long long)i * 2654435761ull;
    return acc;
}
#endif
