/* Optimisation level of the kernels. A kernel module is compiled at the module's level (-O2:
 * most of its C is Cython's glue, where -O3 only costs build time), and the kernel headers
 * raise their own code to -O3 between LL_HOT_BEGIN and LL_HOT_END: the register tiles need
 * -O3's complete unrolling and vectoriser (prefill halves without it). Options are kept per
 * function, link-time optimisation included. gcc only; clang vectorises at -O2 and ignores
 * gcc's optimize pragmas. System headers stay outside the regions. LL_HOT_OFF compiles the
 * kernels at the module's level too (the emulated tier's cross builds: one level throughout). */
#ifndef LL_HOT_H
#define LL_HOT_H
#if defined(__GNUC__) && !defined(__clang__) && !defined(LL_HOT_OFF)
#define LL_HOT_BEGIN _Pragma("GCC push_options") _Pragma("GCC optimize(\"O3\")")
#define LL_HOT_END _Pragma("GCC pop_options")
#else
#define LL_HOT_BEGIN
#define LL_HOT_END
#endif
#endif
