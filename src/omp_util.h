/* Small OpenMP / scheduling helpers used from Cython. */
#ifndef LL_OMP_UTIL_H
#define LL_OMP_UTIL_H
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <pthread.h>
#include <sched.h>

/* A barrier callable from inside a Cython `with parallel():` block. */
static inline void ll_omp_barrier(void) {
#pragma omp barrier
}

/* Pin the calling thread to one CPU; 0 on success, an errno value otherwise. */
static inline int ll_pin_self(int cpu) {
    cpu_set_t set;
    CPU_ZERO(&set);
    CPU_SET(cpu, &set);
    return pthread_setaffinity_np(pthread_self(), sizeof(set), &set);
}

static inline int ll_current_cpu(void) { return sched_getcpu(); }
#endif
