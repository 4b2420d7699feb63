// Kernels compiled twice, for AVX2 and a baseline, one chosen at load time: the same arithmetic
// in the same order (no FMA: the build sets -ffp-contract=off), so every machine writes the same
// bits. The ThreadSanitizer build has one copy: its runtime is not up yet when the loader runs
// the resolver that picks a clone, and the instrumented resolver crashes.
#pragma once

#if defined(__SANITIZE_THREAD__)
#define CGX_CLONES
#else
#define CGX_CLONES __attribute__((target_clones("avx2", "default")))
#endif
