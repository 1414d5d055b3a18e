/* The prefill attention kernel's body, written against tile operations (TILE_ZERO,
   TILE_LOAD, TILE_DP, TILE_STORE; TILES_FENCE, TILES_BEGIN, TILES_END) that the including
   unit maps: cpu_prefill_amx.c to AMX, cpu_prefill_bf16.c to AVX-512-BF16
   (cpu_tiles_avx512.h). Also set by the unit: TILES_TWO_PASS_D64, 1 where head_dim 64 takes
   item_d64 (cpu_prefill_amx_d64.h: two passes, which pay on AMX, where a tile product is
   cheap beside the softmax; with AVX-512 products the one-pass item is ~10% faster), and
   TILES_COSTLIEST_FIRST, 1 where the items go out in reverse order (below).
   The algorithm, layouts and precision: cpu_prefill_amx.c's header. Part of the library's
   build hash (kernels/native_library.py). */

#ifndef BP_CPU_PREFILL_TILES_H
#define BP_CPU_PREFILL_TILES_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "cpu_vector_math.h" /* exp_nonpos, exp16_nonpos, store_out_row */

#define KT 64 /* keys a tile: 4 C tiles of scores, 2 A tiles of weights */
#define MAX_D 128

#include "cpu_prefill_amx_pack.h" /* kv_view, pack_context */

/* S[16][16 ng] (float32, row stride KT) = qa (16 x d bf16) x keys [k0, k0 + 16 ng)^T,
   ng (1..4) groups of 16 keys: past the last row's keys a tile's groups are not computed. */
static void tile_scores(const uint16_t *qa, const uint32_t *kp, int64_t k0, int64_t d,
                        int ng, float *s) {
    const int64_t d32 = d / 32;
    const uint32_t *g = kp + (k0 / 16) * d32 * 256; /* the tile's first 16-key group */
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
    for (int64_t dc = 0; dc < d32; ++dc) {
        TILE_LOAD(4, qa + dc * 32, d * 2);
        TILE_LOAD(5, g + (0 * d32 + dc) * 256, 64);
        TILE_DP(0, 4, 5);
        if (ng > 1) { TILE_LOAD(6, g + (1 * d32 + dc) * 256, 64); TILE_DP(1, 4, 6); }
        if (ng > 2) { TILE_LOAD(7, g + (2 * d32 + dc) * 256, 64); TILE_DP(2, 4, 7); }
        if (ng > 3) { TILE_LOAD(5, g + (3 * d32 + dc) * 256, 64); TILE_DP(3, 4, 5); }
    }
    TILE_STORE(0, s, KT * 4);
    TILE_STORE(1, s + 16, KT * 4);
    TILE_STORE(2, s + 32, KT * 4);
    TILE_STORE(3, s + 48, KT * 4);
    TILES_FENCE();
}

/* One row's online softmax over its `visible` (1..KT) first scores of s: updates *m, *l,
   writes the weights as bf16 to pa (zero past visible); returns exp(m_old - m_new). */
static float row_softmax(const float *s, int64_t visible, float *m, float *l, uint16_t *pa) {
    __m512 x[4];
    __mmask16 keep[4];
    __m512 mx = _mm512_set1_ps(-3.0e38f);
    for (int z = 0; z < 4; ++z) {
        const int64_t n = visible - 16 * z;
        keep[z] = n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
        x[z] = _mm512_loadu_ps(s + 16 * z);
        mx = _mm512_mask_max_ps(mx, keep[z], mx, x[z]);
    }
    const float tile_max = _mm512_reduce_max_ps(mx);
    const float m_new = tile_max > *m ? tile_max : *m;
    const float corr = exp_nonpos(*m - m_new);
    const __m512 mv = _mm512_set1_ps(m_new);
    __m512 sum = _mm512_setzero_ps();
    for (int z = 0; z < 4; ++z) {
        x[z] = keep[z] ? _mm512_maskz_mov_ps(keep[z], exp16_nonpos(_mm512_sub_ps(x[z], mv)))
                       : _mm512_setzero_ps(); /* (and the scores never computed there) */
        sum = _mm512_add_ps(sum, x[z]);
    }
    *l = *l * corr + _mm512_reduce_add_ps(sum);
    *m = m_new;
    _mm512_storeu_si512(pa, (__m512i)_mm512_cvtne2ps_pbh(x[1], x[0]));
    _mm512_storeu_si512(pa + 32, (__m512i)_mm512_cvtne2ps_pbh(x[3], x[2]));
    return corr;
}

/* part[16][d] (float32, row stride d) = pa (16 x KT bf16) x V of keys [k0, k0 + KT);
   `halves` 1 when only the first 32 keys have weights */
static void tile_values(const uint16_t *pa, const uint32_t *vp, int64_t k0, int64_t d,
                        int halves, float *part) {
    const int64_t d16 = d / 16;
    for (int64_t c0 = 0; c0 < d16; c0 += 4) { /* 64 output columns at a time */
        TILE_ZERO(0);
        TILE_ZERO(1);
        TILE_ZERO(2);
        TILE_ZERO(3);
        for (int kb = 0; kb < halves; ++kb) {
            const uint32_t *g = vp + ((k0 / 32 + kb) * d16 + c0) * 256;
            TILE_LOAD(4, pa + kb * 32, KT * 2);
            TILE_LOAD(5, g, 64);
            TILE_DP(0, 4, 5);
            TILE_LOAD(6, g + 256, 64);
            TILE_DP(1, 4, 6);
            TILE_LOAD(7, g + 512, 64);
            TILE_DP(2, 4, 7);
            TILE_LOAD(5, g + 768, 64);
            TILE_DP(3, 4, 5);
        }
        TILE_STORE(0, part + c0 * 16, d * 4);
        TILE_STORE(1, part + c0 * 16 + 16, d * 4);
        TILE_STORE(2, part + c0 * 16 + 32, d * 4);
        TILE_STORE(3, part + c0 * 16 + 48, d * 4);
    }
    TILES_FENCE();
}

/* Pass 2: rows j0 .. j0 + nr - 1 (nr <= 16) of a chunk at position p0 whose first row is
   out's row0, query head i; kp, vp its KV head's packed context. The calling thread has
   run TILES_BEGIN. */
static void item(const float *q, int64_t q_stride, const uint32_t *kp, const uint32_t *vp,
                 int64_t d, int64_t p0, int64_t row0, int64_t j0, int64_t nr, int64_t i,
                 int64_t nh, float scale, void *out, int out_bf16) {
    uint16_t qa[16 * MAX_D] __attribute__((aligned(64)));
    uint16_t pa[16 * KT] __attribute__((aligned(64)));
    float s[16 * KT] __attribute__((aligned(64)));
    float part[16 * MAX_D] __attribute__((aligned(64)));
    float acc[16 * MAX_D] __attribute__((aligned(64)));
    float m[16], l[16], corr[16];
    for (int64_t r = 0; r < 16; ++r) {
        if (r < nr) {
            const float *src = q + (row0 + j0 + r) * q_stride + i * d;
            for (int64_t x = 0; x < d; x += 16) /* rounded to nearest even, as narrow() */
                _mm256_storeu_si256((__m256i *)(qa + r * d + x), (__m256i)_mm512_cvtneps_pbh(
                    _mm512_mul_ps(_mm512_loadu_ps(src + x), _mm512_set1_ps(scale))));
        } else {
            memset(qa + r * d, 0, (size_t)d * sizeof(uint16_t));
        }
        m[r] = -3.0e38f;
        l[r] = 0.0f;
    }
    memset(pa, 0, sizeof pa); /* rows past nr stay zero */
    memset(acc, 0, (size_t)(16 * d) * sizeof(float));
    TILES_FENCE();
    const int64_t keys = p0 + j0 + nr; /* the last row sees keys 0 .. keys - 1 */
    for (int64_t k0 = 0; k0 < keys; k0 += KT) {
        const int64_t here = keys - k0 < KT ? keys - k0 : KT; /* keys any row sees here */
        tile_scores(qa, kp, k0, d, (int)((here + 15) / 16), s);
        for (int64_t r = 0; r < nr; ++r) {
            int64_t visible = p0 + j0 + r + 1 - k0;
            visible = visible > KT ? KT : visible;
            if (visible <= 0) { /* this row sees none of these keys */
                memset(pa + r * KT, 0, KT * sizeof(uint16_t));
                corr[r] = 1.0f;
                continue;
            }
            corr[r] = row_softmax(s + r * KT, visible, m + r, l + r, pa + r * KT);
        }
        TILES_FENCE();
        tile_values(pa, vp, k0, d, here > 32 ? 2 : 1, part);
        for (int64_t r = 0; r < nr; ++r) {
            const __m512 c = _mm512_set1_ps(corr[r]);
            for (int64_t x = 0; x < d; x += 16)
                _mm512_storeu_ps(acc + r * d + x,
                                 _mm512_fmadd_ps(_mm512_loadu_ps(acc + r * d + x), c,
                                                 _mm512_loadu_ps(part + r * d + x)));
        }
    }
    for (int64_t r = 0; r < nr; ++r) {
        const __m512 inv = _mm512_set1_ps(1.0f / l[r]);
        float row[128];
        for (int64_t x = 0; x < d; x += 16)
            _mm512_storeu_ps(row + x, _mm512_mul_ps(_mm512_loadu_ps(acc + r * d + x), inv));
        store_out_row(row, out, out_bf16, ((row0 + j0 + r) * nh + i) * d, d);
    }
}

#include "cpu_prefill_amx_d64.h" /* item_d64 */

/* The whole call (both passes, threads); arguments and result as
   bp_prefill_attention_amx's. */
static int prefill_tiled(const float *q, int64_t q_stride, const uint16_t *k_cache,
                         const uint16_t *v_cache, int64_t num_chunks, const int32_t *chunk_seq,
                         const int32_t *chunk_row, const int32_t *chunk_len,
                         const int32_t *chunk_ctx, int64_t nh, int64_t kvh, int64_t d,
                         int64_t bs, const int32_t *tables, int64_t table_stride, float scale,
                         void *out, int64_t out_bf16, int64_t num_threads) {
    const int64_t g = nh / kvh;
    if ((d != 64 && d != 128) || g * kvh != nh || num_chunks < 1) return -1;
    /* packed[c]: the chunk's kvh contexts, K then V, each padded_keys x d bf16 */
    int64_t *first = malloc((size_t)(2 * num_chunks + 1) * sizeof(int64_t));
    if (first == NULL) return -1;
    int64_t *packed = first + num_chunks + 1, words = 0;
    first[0] = 0;
    for (int64_t c = 0; c < num_chunks; ++c) {
        packed[c] = words;
        words += kvh * 2 * ((chunk_ctx[c] + KT - 1) / KT * KT) * d / 2;
        first[c + 1] = first[c] + nh * ((chunk_len[c] + 15) / 16);
    }
    uint32_t *pack = aligned_alloc(64, (size_t)words * sizeof(uint32_t));
    if (pack == NULL) {
        free(first);
        return -1;
    }
    const int64_t items = first[num_chunks];
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
#pragma omp for schedule(dynamic, 1)
        for (int64_t ch = 0; ch < num_chunks * kvh; ++ch) {
            const int64_t c = ch / kvh, h = ch % kvh, ctx = chunk_ctx[c];
            const int64_t padded = (ctx + KT - 1) / KT * KT, size = padded * d / 2;
            const kv_view kv = {k_cache, v_cache, kvh, d, bs,
                                tables + chunk_seq[c] * table_stride};
            uint32_t *kp = pack + packed[c] + h * 2 * size;
            pack_context(&kv, h, ctx, padded, kp, kp + size);
        }
        TILES_BEGIN();
        /* guided: an item takes ~1 us on SmolLM2's prompts, and fetching each one alone
           (dynamic, 1) spent ~3% of a prefill step on the shared counter's atomic; items
           grow costlier within a chunk, which fixed chunks of them leave unbalanced.
           Prefill steps of the offline workload (6 alternating runs): 718 -> 677 ms a run
           (dynamic, 8: 732; split by an estimate of each item's cost: 685). */
#pragma omp for schedule(guided)
        for (int64_t turn = 0; turn < items; ++turn) {
            /* costliest first: a chunk's later rows see more keys, so backwards the small
               items come last, where guided hands them out one by one and the threads end
               together (software tiles, the offline workload's 2,048-row step: 6.2 -> 5.6
               and 7.1 -> 6.7 ms, 30 alternating runs each; not measured on AMX) */
            const int64_t it = TILES_COSTLIEST_FIRST ? items - 1 - turn : turn;
            int64_t lo = 0, hi = num_chunks - 1; /* the chunk whose items hold `it` */
            while (lo < hi) {
                const int64_t mid = (lo + hi + 1) / 2;
                if (first[mid] <= it) lo = mid; else hi = mid - 1;
            }
            const int64_t c = lo, k = it - first[c], n = chunk_len[c], i = k % nh;
            const int64_t j0 = (k / nh) * 16, ctx = chunk_ctx[c];
            const int64_t size = (ctx + KT - 1) / KT * KT * d / 2;
            const uint32_t *kp = pack + packed[c] + (i / g) * 2 * size;
            const int64_t nr = n - j0 < 16 ? n - j0 : 16;
            if (TILES_TWO_PASS_D64 && d == 64)
                item_d64(q, q_stride, kp, kp + size, ctx - n, chunk_row[c], j0, nr, i, nh,
                         scale, out, (int)out_bf16);
            else
                item(q, q_stride, kp, kp + size, d, ctx - n, chunk_row[c], j0, nr, i, nh,
                     scale, out, (int)out_bf16);
        }
        TILES_END();
    }
    free(pack);
    free(first);
    return 0;
}

#endif
