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

/* Burn CPU in the calling thread until `deadline` (ll_monotonic_seconds); returns a value
 * that depends on the work so the loop cannot be optimised away. */
static inline unsigned long long ll_busy_until(double deadline) {
    volatile unsigned long long acc = 0;
    while (ll_monotonic_seconds() < deadline)
        for (int i = 0; i < 4096; i++) acc += (unsigned long long)i * 2654435761ull;
    return acc;
}
#endif
