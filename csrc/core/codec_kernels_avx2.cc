// The codec kernels compiled for AVX2 (x86-64 with GCC); codec_kernels.cc picks them at run time.
#include "codec_kernels.h"

#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define CGX_HAVE_AVX2_KERNELS 1
#include <immintrin.h>  // its functions carry their own target attributes
#pragma GCC push_options
#pragma GCC target("avx2")
#define CGX_KERNEL_NS avx2
#define CGX_KERNEL_AVX2 1
#include "codec_kernels.inc"
#undef CGX_KERNEL_AVX2
#undef CGX_KERNEL_NS
#pragma GCC pop_options
#endif
