/* The work dispenser: how every parallel phase hands its units (weight panels, feature
 * panels, attention items, rows) to the threads of a team. forward()'s one parallel region
 * and every kernel wrapper the tests call (ops.pxi) hand out work through it, so the tests
 * run the scheduling the engine runs. Here: the split arithmetic and the shared counter;
 * not here: what a unit is (the caller's loop body) or which mode a phase wants (the caller).
 *
 *   ll_team  one per thread of a parallel region: its id, the team size, the team's shared
 *            counter and this thread's view of where the counter's current phase begins.
 *   ll_work  one phase: `units` units in chunks of `chunk`, handed out
 *              LL_WORK_STATIC   each thread one contiguous run of whole chunks, the same run
 *                               every time for the same (units, chunk, team size): a thread
 *                               can prefetch its own panels before the phase (the o
 *                               projection during attention) and row loops stay even;
 *              LL_WORK_DYNAMIC  chunks from the shared counter, first come first served:
 *                               unequal work (attention over unequal contexts) and streams
 *                               of unequal speed (decode's weight streaming) stay balanced.
 *            ll_work_take(&w, &lo, &hi) gives the next range [lo, hi) of units, 0 when none
 *            is left for this thread.
 *
 * Generations instead of resets: in a dynamic phase every thread takes until it gets 0, and
 * each such run takes exactly one index past the end in every thread, so the counter ends the
 * phase at (its start + chunks + team size) in every thread's arithmetic. Each thread adds
 * that to its own `base` when it gets its 0: the next dynamic phase starts there, with no
 * thread resetting the counter and no barrier to order a reset. The counter is zeroed once,
 * before the region. Rules: every thread of the team runs every dynamic phase to its 0 (no
 * early exit), and two dynamic phases on one counter are separated by a barrier (a thread's
 * first take of the next phase must not overtake another's last take of this one); forward()'s
 * phases are, since each reads what the one before wrote. */
#ifndef LL_WORK_H
#define LL_WORK_H
#include <stddef.h>

enum { LL_WORK_STATIC = 0, LL_WORK_DYNAMIC = 1 };

typedef struct {
    long long *counter;   /* shared by the team, on its own cache line; NULL: static phases only */
    long long base;       /* the counter's value where this thread's next dynamic phase begins */
    int tid, nth;
} ll_team;

typedef struct {
    ll_team *team;
    ptrdiff_t units, chunk, num_chunks;
    ptrdiff_t next, end;  /* static: what is left of this thread's run */
    int mode;
} ll_work;

/* Thread tid of nth; counter: the team's shared counter, zero before the region (or NULL). */
static inline ll_team ll_team_make(long long *counter, int tid, int nth) {
    ll_team tm;
    tm.counter = counter;
    tm.base = 0;
    tm.tid = tid;
    tm.nth = nth > 0 ? nth : 1;
    return tm;
}

/* First chunk of thread tid's static run: chunks split as evenly as integers allow. */
static inline ptrdiff_t ll_work_split(ptrdiff_t num_chunks, int tid, int nth) {
    return num_chunks * tid / nth;
}

/* A phase of `units` units in chunks of `chunk` (< 1: 1), handed out by `mode`. */
static inline ll_work ll_work_begin(ll_team *tm, int mode, ptrdiff_t units, ptrdiff_t chunk) {
    ll_work w;
    w.team = tm;
    w.mode = mode;
    w.units = units > 0 ? units : 0;
    w.chunk = chunk > 0 ? chunk : 1;
    w.num_chunks = (w.units + w.chunk - 1) / w.chunk;
    w.next = w.end = 0;
    if (mode == LL_WORK_STATIC) {
        w.next = ll_work_split(w.num_chunks, tm->tid, tm->nth) * w.chunk;
        w.end = ll_work_split(w.num_chunks, tm->tid + 1, tm->nth) * w.chunk;
        if (w.end > w.units) w.end = w.units;
    }
    return w;
}

/* The next range [*lo, *hi) of the phase's units for this thread; 0 once there is none. */
static inline int ll_work_take(ll_work *w, ptrdiff_t *lo, ptrdiff_t *hi) {
    if (w->mode == LL_WORK_STATIC) {   /* the whole run at once: the caller streams it in order */
        if (w->next >= w->end) return 0;
        *lo = w->next;
        *hi = w->end;
        w->next = w->end;
        return 1;
    }
    ll_team *tm = w->team;
    /* relaxed: the barriers around the phase order the data; the counter only hands out indices */
    long long i = __atomic_fetch_add(tm->counter, 1, __ATOMIC_RELAXED) - tm->base;
    if (i >= w->num_chunks) {
        tm->base += w->num_chunks + tm->nth;   /* every thread's one index past the end: see the top */
        return 0;
    }
    *lo = (ptrdiff_t)i * w->chunk;
    *hi = *lo + w->chunk < w->units ? *lo + w->chunk : w->units;
    return 1;
}

/* This thread's static run of `units` in chunks of `chunk` (possibly empty): a row loop's share. */
static inline void ll_work_static(ll_team *tm, ptrdiff_t units, ptrdiff_t chunk, ptrdiff_t *lo, ptrdiff_t *hi) {
    ll_work w = ll_work_begin(tm, LL_WORK_STATIC, units, chunk);
    *lo = w.next;
    *hi = w.end > w.next ? w.end : w.next;
}
#endif
