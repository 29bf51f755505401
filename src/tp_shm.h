/* Tensor-parallel all-reduce over a shared-memory segment (lite_llm/engine/tp.py maps it in
 * every rank's process). No MPI, no sockets: each rank writes its partial sum into its own
 * slot, publishes a generation number on its own cache line, spins until every rank has
 * published the same generation, then every rank sums all slots IN RANK ORDER, so every rank
 * holds bit-identical results (the ranks' residual streams never drift apart).
 *
 *     segment:  ll_tp_header | step area (tp.py) | slots [2][size][cap] float
 *     all-reduce number g uses slots[g % 2]: a rank writes slots[g % 2] again at g + 2 only
 *     after every rank published g + 1, i.e. after every rank finished reading g.
 *
 * Waits never hang: they give up when the header's abort word is set (rank 0's monitor sets
 * it when a worker dies; close() sets it to stop the workers), when rank 0 (a worker's parent)
 * is gone, or after `timeout` seconds. A wait spins (the other ranks are normally a few
 * microseconds behind), then yields its CPU between checks (a rank that is not running,
 * as on an oversubscribed machine, gets it sooner). A rank that gave up marks itself failed and skips every
 * later wait of the step (its results are garbage; the caller raises).
 *
 * What does not live here: the threads' split of a phase (forward.pxi), the step's arrays and
 * the processes (tp.py). */
#ifndef LL_TP_SHM_H
#define LL_TP_SHM_H
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

#include "omp_util.h"
#include "simd/vec.h"
LL_HOT_BEGIN

#define LL_TP_MAX_RANKS 64
#define LL_TP_SPINS_BEFORE_YIELD (1u << 16)   /* ~50-100 us of spinning on one flag */

typedef struct { uint64_t v; char pad[56]; } ll_tp_line;   /* one cache line per writer */

typedef struct {
    ll_tp_line arrive[LL_TP_MAX_RANKS];   /* last all-reduce generation each rank published */
    ll_tp_line step;                      /* step number rank 0 published (after the arrays) */
    ll_tp_line abort;                     /* != 0: every wait returns (LL_TP_* reason) */
} ll_tp_header;

enum { LL_TP_OK = 0, LL_TP_ABORTED = 1, LL_TP_TIMEOUT = 2, LL_TP_PARENT_GONE = 3 };

typedef struct {
    ll_tp_header *hdr;
    float *slots;          /* [2][size][cap] */
    ptrdiff_t cap;         /* floats per slot: max_tokens x dim */
    int rank, size;
    uint64_t gen;          /* all-reduces this rank has done (the same count on every rank) */
    double timeout;        /* seconds one wait may spin */
    int parent;            /* > 0: a worker's rank-0 pid; its death ends a wait */
    int failed;            /* LL_TP_* of the wait that gave up, 0 while all is well */
} ll_tp;

static inline size_t ll_tp_header_bytes(void) { return (sizeof(ll_tp_header) + 4095) / 4096 * 4096; }

/* This rank's slot for all-reduce `gen` ([cap] floats; a GEMM writes its partial here). */
static inline float *ll_tp_slot(const ll_tp *tp, uint64_t gen, int rank) {
    return tp->slots + ((ptrdiff_t)(gen & 1) * tp->size + rank) * tp->cap;
}

/* Why a wait must stop now, or LL_TP_OK; `slow` checks (clock, parent) run every 4096 spins. */
static inline int ll_tp_check(const ll_tp *tp, double deadline, int slow) {
    if (__atomic_load_n(&tp->hdr->abort.v, __ATOMIC_ACQUIRE)) return LL_TP_ABORTED;
    if (!slow) return LL_TP_OK;
    if (tp->parent > 0 && getppid() != tp->parent) return LL_TP_PARENT_GONE;
    if (ll_monotonic_seconds() > deadline) return LL_TP_TIMEOUT;
    return LL_TP_OK;
}

/* Publish all-reduce `gen` for this rank and wait until every rank has (one thread per rank
 * calls it, between barriers). Returns LL_TP_OK, or why it gave up (also left in tp->failed). */
static inline int ll_tp_arrive_and_wait(ll_tp *tp, uint64_t gen) {
    if (tp->failed) return tp->failed;
    __atomic_store_n(&tp->hdr->arrive[tp->rank].v, gen, __ATOMIC_RELEASE);
    double deadline = ll_monotonic_seconds() + tp->timeout;
    for (int r = 0; r < tp->size; r++) {
        unsigned spins = 0;
        while (__atomic_load_n(&tp->hdr->arrive[r].v, __ATOMIC_ACQUIRE) < gen) {
            int why = ll_tp_check(tp, deadline, (++spins & 4095) == 0);
            if (why) { tp->failed = why; return why; }
            /* a rank late by more than ~50 us is not running: on a machine with fewer free
             * cores than ranks' threads, give it this CPU instead of spinning it away */
            if (spins > LL_TP_SPINS_BEFORE_YIELD && (spins & 63) == 0) sched_yield();
        }
    }
    return LL_TP_OK;
}

/* out[i] = sum over ranks r (in order 0..size-1) of slot r of all-reduce `gen`, i in [i0, i1). */
static inline void ll_tp_sum(const ll_tp *tp, uint64_t gen, float *out, ptrdiff_t i0, ptrdiff_t i1) {
    ptrdiff_t i = i0;
    const float *s0 = ll_tp_slot(tp, gen, 0);
    for (; i + LL_VF32_LANES <= i1; i += LL_VF32_LANES) {
        ll_vf32 acc = ll_load(s0 + i);
        for (int r = 1; r < tp->size; r++) acc = ll_add(acc, ll_load(ll_tp_slot(tp, gen, r) + i));
        ll_store(out + i, acc);
    }
    for (; i < i1; i++) {
        float acc = s0[i];
        for (int r = 1; r < tp->size; r++) acc += ll_tp_slot(tp, gen, r)[i];
        out[i] = acc;
    }
}

/* Worker side, between steps: wait until rank 0 publishes a step after `last`; returns the
 * step number, or -(LL_TP_*) when the group stops. Spins briefly, then sleeps 50 us a time:
 * an idle server must not burn its cores. */
static inline int64_t ll_tp_wait_step(ll_tp *tp, uint64_t last, double idle_timeout) {
    double deadline = ll_monotonic_seconds() + idle_timeout;
    unsigned spins = 0;
    struct timespec nap = {0, 50000};
    for (;;) {
        uint64_t s = __atomic_load_n(&tp->hdr->step.v, __ATOMIC_ACQUIRE);
        if (s > last) return (int64_t)s;
        int why = ll_tp_check(tp, idle_timeout > 0 ? deadline : 1e300, (++spins & 255) == 0);
        if (why) return -why;
        if (spins > 20000) nanosleep(&nap, NULL);
    }
}

static inline void ll_tp_publish_step(ll_tp_header *hdr, uint64_t step) {
    __atomic_store_n(&hdr->step.v, step, __ATOMIC_RELEASE);
}

static inline void ll_tp_set_abort(ll_tp_header *hdr, uint64_t why) {
    __atomic_store_n(&hdr->abort.v, why, __ATOMIC_RELEASE);
}
LL_HOT_END
#endif
