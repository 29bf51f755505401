/* Run-time CPU feature probing: what the CPU has AND the OS saves the registers of.
 * x86: cpuid + xgetbv. Other machines: getauxval(AT_HWCAP) (no __builtin_cpu_supports there). */
#ifndef LL_CPU_FEATURES_H
#define LL_CPU_FEATURES_H
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>

static inline unsigned long long ll_xgetbv0(void) {
    unsigned int eax, edx;
    __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
    return ((unsigned long long)edx << 32) | eax;
}

/* 1 if `name` is usable, 0 if not, -1 if the name is unknown. */
static inline int ll_cpu_has(const char *name) {
    unsigned int a, b, c, d, b7 = 0, c7 = 0, d7 = 0, a71 = 0;
    if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
    unsigned int c1 = c;
    int osxsave = (c1 >> 27) & 1;
    unsigned long long xcr0 = osxsave ? ll_xgetbv0() : 0;
    int os_avx = (xcr0 & 0x6) == 0x6;               /* XMM + YMM state */
    int os_avx512 = os_avx && (xcr0 & 0xe0) == 0xe0; /* opmask + ZMM state */
    if (__get_cpuid_max(0, 0) >= 7) {
        __cpuid_count(7, 0, a, b7, c7, d7);
        __cpuid_count(7, 1, a71, b, c, d);
    }
    if (!strcmp(name, "sse4_2")) return (c1 >> 20) & 1;
    if (!strcmp(name, "fma")) return os_avx && ((c1 >> 12) & 1);
    if (!strcmp(name, "f16c")) return os_avx && ((c1 >> 29) & 1);
    if (!strcmp(name, "avx")) return os_avx && ((c1 >> 28) & 1);
    if (!strcmp(name, "avx2")) return os_avx && ((b7 >> 5) & 1);
    if (!strcmp(name, "avx512f")) return os_avx512 && ((b7 >> 16) & 1);
    if (!strcmp(name, "avx512dq")) return os_avx512 && ((b7 >> 17) & 1);
    if (!strcmp(name, "avx512bw")) return os_avx512 && ((b7 >> 30) & 1);
    if (!strcmp(name, "avx512vl")) return os_avx512 && ((b7 >> 31) & 1);
    if (!strcmp(name, "avx512vnni")) return os_avx512 && ((c7 >> 11) & 1);
    if (!strcmp(name, "avx512vbmi")) return os_avx512 && ((c7 >> 1) & 1);
    if (!strcmp(name, "avx512bitalg")) return os_avx512 && ((c7 >> 12) & 1);
    if (!strcmp(name, "avx512bf16")) return os_avx512 && ((a71 >> 5) & 1);
    /* AMX: the CPU's bit and the OS's tile state (XCR0 bits 17, 18); a process must still ask
     * Linux for the tile data permission before using it. Reported only: no AMX kernels yet. */
    int os_amx = (xcr0 & 0x60000) == 0x60000;
    if (!strcmp(name, "amx_bf16")) return os_amx && ((d7 >> 22) & 1);
    if (!strcmp(name, "amx_tile")) return os_amx && ((d7 >> 24) & 1);
    if (!strcmp(name, "amx_int8")) return os_amx && ((d7 >> 25) & 1);
    return -1;
}

#elif defined(__aarch64__) && defined(__APPLE__)
#include <sys/sysctl.h>
static inline int ll_sysctl_flag(const char *key) {
    int v = 0; size_t n = sizeof v;
    return sysctlbyname(key, &v, &n, NULL, 0) == 0 && v;
}
static inline int ll_cpu_has(const char *name) {
    if (!strcmp(name, "neon") || !strcmp(name, "asimd")) return 1;
    if (!strcmp(name, "asimdhp")) return ll_sysctl_flag("hw.optional.arm.FEAT_FP16");
    if (!strcmp(name, "dotprod")) return ll_sysctl_flag("hw.optional.arm.FEAT_DotProd");
    if (!strcmp(name, "bf16")) return ll_sysctl_flag("hw.optional.arm.FEAT_BF16");
    if (!strcmp(name, "i8mm")) return ll_sysctl_flag("hw.optional.arm.FEAT_I8MM");
    if (!strcmp(name, "sve")) return 0;
    return -1;
}

#elif defined(__aarch64__)
#include <sys/auxv.h>
static inline int ll_cpu_has(const char *name) {
    unsigned long hw = getauxval(AT_HWCAP), hw2 = getauxval(AT_HWCAP2);
    if (!strcmp(name, "neon") || !strcmp(name, "asimd")) return (hw >> 1) & 1;
    if (!strcmp(name, "asimdhp")) return (hw >> 10) & 1;   /* half-precision arithmetic (FEAT_FP16) */
    if (!strcmp(name, "dotprod")) return (hw >> 20) & 1;
    if (!strcmp(name, "sve")) return (hw >> 22) & 1;
    if (!strcmp(name, "bf16")) return (hw2 >> 14) & 1;
    if (!strcmp(name, "i8mm")) return (hw2 >> 13) & 1;
    return -1;
}

#elif defined(__s390x__)
#include <sys/auxv.h>
static inline int ll_cpu_has(const char *name) {
    unsigned long hw = getauxval(AT_HWCAP);
    if (!strcmp(name, "vx")) return (hw >> 11) & 1;
    if (!strcmp(name, "vxe")) return (hw >> 13) & 1;
    if (!strcmp(name, "vxe2")) return (hw >> 15) & 1;
    return -1;
}

#else
static inline int ll_cpu_has(const char *name) { (void)name; return -1; }
#endif

#endif
