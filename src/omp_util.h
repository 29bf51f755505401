/* Small OpenMP helpers used from Cython: the step barrier, pinning, clocks (work hand-out: work.h). */
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

/* One busy-wait iteration: the CPU's spin-loop hint where it has one. */
static inline void ll_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* The step's barrier. forward()'s one parallel region separates its phases with ~8 barriers
 * per layer. libgomp's barrier spins GOMP_SPINCOUNT iterations, then sleeps on a futex: when a
 * partner thread has been preempted (a shared machine, more runnable threads than cores), the
 * spinner holds a core the partner needs, and each sleep adds a wake-up's latency. This one
 * spins ll_barrier_spins iterations (tens of microseconds: a balanced phase's stragglers), then calls
 * sched_yield() between checks: a waiter whose partner is not running gives its core away,
 * and on an idle core the yield returns at once, so a quiet machine keeps spinning and never
 * pays a wake-up. Sense-reversing: count and sense live in the caller's memory (two ints on
 * their own cache lines), set up by ll_barrier_enter in every thread of the region.
 * ll_barrier_spins < 0 selects libgomp's barrier instead (LITE_LLM_BARRIER_SPINS=-1). */
static int ll_barrier_spins = 2000;
static __thread int *ll_bar_count = 0, *ll_bar_sense = 0;
static __thread int ll_bar_local = 0, ll_bar_nth = 1;

static inline void ll_set_barrier_spins(int spins) { ll_barrier_spins = spins; }

/* Before the region: both words zero (one thread). */
static inline void ll_barrier_reset(int *count, int *sense) {
    __atomic_store_n(count, 0, __ATOMIC_RELAXED);
    __atomic_store_n(sense, 0, __ATOMIC_RELAXED);
}

/* In every thread of the region, before its first ll_omp_barrier(); ll_barrier_leave() after the last. */
static inline void ll_barrier_enter(int *count, int *sense, int nth) {
    ll_bar_count = ll_barrier_spins >= 0 ? count : 0;
    ll_bar_sense = sense;
    ll_bar_local = 0;
    ll_bar_nth = nth;
}

static inline void ll_barrier_leave(void) { ll_bar_count = 0; }

/* A barrier callable from inside a Cython `with parallel():` block: the step's own between
 * ll_barrier_enter and ll_barrier_leave, libgomp's elsewhere. */
static inline void ll_omp_barrier(void) {
    if (ll_bar_count == 0) {
#pragma omp barrier
        return;
    }
    if (ll_bar_nth <= 1) return;
    int s = !ll_bar_local;
    ll_bar_local = s;
    if (__atomic_add_fetch(ll_bar_count, 1, __ATOMIC_ACQ_REL) == ll_bar_nth) {
        /* the last to arrive: nobody touches count again before they see the new sense */
        __atomic_store_n(ll_bar_count, 0, __ATOMIC_RELAXED);
        __atomic_store_n(ll_bar_sense, s, __ATOMIC_RELEASE);
        return;
    }
    int spins = 0;
    while (__atomic_load_n(ll_bar_sense, __ATOMIC_ACQUIRE) != s) {
        if (spins < ll_barrier_spins) {
            spins++;
            ll_cpu_relax();
        } else {
            sched_yield();
        }
    }
}

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
