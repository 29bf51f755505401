/* Bring a range of a mapped file into the page tables before it is read: one madvise
 * (MADV_POPULATE_READ, Linux 5.14+) maps its cached pages in a batch, where a first touch of
 * each 4 KB page would take one fault apiece. Only a hint: without it, or where it fails,
 * the pages fault in as they are read. */
#ifndef LL_POPULATE_H
#define LL_POPULATE_H
#include <stddef.h>
#include <stdint.h>
#if defined(__unix__) || defined(__APPLE__)
#include <sys/mman.h>
#include <unistd.h>
#endif

static inline void ll_populate_read(const void *p, size_t len) {
#if defined(__linux__)
#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
    if (len == 0) return;
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    const uintptr_t a = (uintptr_t)p & ~(page - 1), b = (uintptr_t)p + len;
    (void)madvise((void *)a, (size_t)(b - a), MADV_POPULATE_READ);
#else
    (void)p; (void)len;
#endif
}
#endif
