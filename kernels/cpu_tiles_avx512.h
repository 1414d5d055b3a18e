/* AMX's bf16 tile operations in AVX-512-BF16 (VDPBF16PS), for CPUs that have the one and
   not the other (AMD Zen 4 and 5, Intel Cooper Lake). The prefill kernel's body
   (cpu_prefill_tiles.h) is written against TILE_* macros; cpu_prefill_amx.c maps them to the
   AMX intrinsics and cpu_prefill_bf16.c to the functions here, so both run the same
   algorithm, packing and rounding, and give the same results within float32 summation
   order (tests/kernels/test_cpu_prefill_amx.py runs both).

   The tiles are the AMX palette the kernels configure: 8 tiles of 16 rows x 64 bytes.
   - A and B tiles are never copied: TILE_LOAD records the source's address and row stride,
     and the product reads the rows from there. Valid because every kernel writes a tile's
     source before loading it and leaves it untouched until the product that reads it (the
     AMX code needs the same order, since its loads happen where they are issued).
   - C tiles (float32 16 x 16) live in this thread's scratch; a product loads the 16 rows,
     adds, and stores them back.
   A product C += A B: C[m][n] += sum over p < 16 of A[m][2p] B[p][2n] + A[m][2p + 1]
   B[p][2n + 1], in float32, i.e. per (m, p) one VDPBF16PS of A's bf16 pair (m, p),
   broadcast, with B's row p: 256 of them per tile product (AMX's TDPBF16PS does the same
   16 x 16 x 32 multiply-adds as one instruction), 16 accumulators held in registers. */

#ifndef BP_CPU_TILES_AVX512_H
#define BP_CPU_TILES_AVX512_H

#include <immintrin.h>
#include <stdint.h>
#include <string.h>

typedef struct {
    const char *src[8]; /* A/B tiles: the first row's address */
    int64_t stride[8];  /* bytes between rows */
    float c[8][256] __attribute__((aligned(64))); /* C tiles: 16 rows of 16 float32 */
} sw_tiles;

static __thread sw_tiles bp_sw_tiles;

static inline void sw_tile_zero(int t) {
    memset(bp_sw_tiles.c[t], 0, sizeof bp_sw_tiles.c[t]);
}

static inline void sw_tile_load(int t, const void *base, int64_t stride) {
    bp_sw_tiles.src[t] = (const char *)base;
    bp_sw_tiles.stride[t] = stride;
}

static inline void sw_tile_store(int t, void *base, int64_t stride) {
    for (int m = 0; m < 16; ++m)
        _mm512_storeu_ps((char *)base + m * stride, _mm512_load_ps(bp_sw_tiles.c[t] + 16 * m));
}

/* C tile c += A tile a x B tile b (layouts above) */
static inline void sw_tile_dp(int c, int a, int b) {
    sw_tiles *tl = &bp_sw_tiles;
    float *cm = tl->c[c];
    const char *am = tl->src[a], *bm = tl->src[b];
    const int64_t sa = tl->stride[a], sb = tl->stride[b];
    __m512 acc[16];
    for (int m = 0; m < 16; ++m) acc[m] = _mm512_load_ps(cm + 16 * m);
    for (int p = 0; p < 16; ++p) {
        const __m512bh row = (__m512bh)_mm512_loadu_si512(bm + p * sb);
        for (int m = 0; m < 16; ++m) {
            int32_t pair;
            memcpy(&pair, am + m * sa + 4 * p, sizeof pair);
            acc[m] = _mm512_dpbf16_ps(acc[m], (__m512bh)_mm512_set1_epi32(pair), row);
        }
    }
    for (int m = 0; m < 16; ++m) _mm512_store_ps(cm + 16 * m, acc[m]);
}

#endif
