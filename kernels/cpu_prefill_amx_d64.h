/* The prefill item for head_dim 64 on AMX (pass 2 of cpu_prefill_amx.c; included by
   cpu_prefill_tiles.h, whose TILE_* macros it uses, and taken only where the unit sets
   TILES_TWO_PASS_D64; part of the library's build hash, kernels/native_library.py).

   Why a second item: cpu_prefill_amx.c's item runs the tile's steps one after another (S
   on AMX, stored; the softmax in AVX-512 with an online max, per row two horizontal
   reductions and a scalar exp; P stored and loaded; P V on AMX, stored; the accumulator
   rescaled in AVX-512), so AMX and the vector units wait for each other, and perf put a
   fifth of its samples on the P V product waiting. For d = 64 the output fits 4 C tiles,
   so here:
   - two passes over the keys: the rows' maxima first, then the weights with the final
     maximum, so the output needs no rescaling and stays in C tiles 0-3 over all the keys;
   - 32 keys a step (C tiles 4, 5 for the scores, A tile 6, B tile 7), and the scores of
     step t + 1 are issued to AMX before the vector work of step t, which hides them;
   - per-row maxima and sums kept as 16-lane vectors, reduced once a row at the end;
   - a shorter exp (exp16_weights), since the weights are rounded to bf16.
   On the offline workload's prefill steps (SmolLM2, 2 threads) this kernel's time per run
   went from 180 to 123 ms.
   Each row's scores are computed twice (cheap on AMX: 4 tile products for 16 x 32). The
   result differs from the online softmax only in rounding: P = exp(s - m) is rounded to
   bf16 with the row's final maximum instead of a running one. */

#ifndef BP_CPU_PREFILL_AMX_D64_H
#define BP_CPU_PREFILL_AMX_D64_H

#define PK 32 /* keys a step */

/* exp(x) for 16 lanes x <= 0, for weights rounded to bf16 next: 2^(x log2 e) split into
   2^n (VSCALEFPS) and 2^f, |f| <= 1/2, by a degree-5 polynomial: relative error under 6e-6
   (checked over [-87, 0]), far below bf16's 2^-9, in 10 operations where exp16_nonpos
   takes 17 (the whole item 6% faster); x is clamped at -87 as exp16_nonpos clamps it */
static inline __m512 exp16_weights(__m512 x) {
    const __m512 t = _mm512_mul_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.0f)),
                                   _mm512_set1_ps(1.44269504088896341f));
    const __m512 n = _mm512_roundscale_ps(t, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    const __m512 f = _mm512_sub_ps(t, n);
    __m512 p = _mm512_set1_ps(1.3333558146e-3f);
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(9.6181291076e-3f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(5.5504108665e-2f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(2.4022650696e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(6.9314718056e-1f));
    p = _mm512_fmadd_ps(p, f, _mm512_set1_ps(1.0f));
    return _mm512_scalef_ps(p, n);
}

/* C tiles 4, 5 = qa (16 x 64 bf16) x keys [k0, k0 + 16), [k0 + 16, k0 + 32) ^T, from the
   packed K tiles (16-key groups of two 32-column slices, 256 dwords each) */
static inline void issue_scores_d64(const uint16_t *qa, const uint32_t *kp, int64_t k0) {
    const uint32_t *g = kp + (k0 / 16) * 512;
    TILE_ZERO(4);
    TILE_ZERO(5);
    TILE_LOAD(6, qa, 128);
    TILE_LOAD(7, g, 64);
    TILE_DP(4, 6, 7);
    TILE_LOAD(7, g + 512, 64);
    TILE_DP(5, 6, 7);
    TILE_LOAD(6, qa + 32, 128);
    TILE_LOAD(7, g + 256, 64);
    TILE_DP(4, 6, 7);
    TILE_LOAD(7, g + 768, 64);
    TILE_DP(5, 6, 7);
}

/* C tiles 0-3 (output columns 0-15 .. 48-63) += pa (16 x 32 bf16) x V of keys
   [k0, k0 + 32) (one 32-key group: four 16-column slices, 256 dwords each) */
static inline void issue_values_d64(const uint16_t *pa, const uint32_t *vp, int64_t k0) {
    const uint32_t *g = vp + (k0 / 32) * 1024;
    TILE_LOAD(6, pa, 64);
    TILE_LOAD(7, g, 64);
    TILE_DP(0, 6, 7);
    TILE_LOAD(7, g + 256, 64);
    TILE_DP(1, 6, 7);
    TILE_LOAD(7, g + 512, 64);
    TILE_DP(2, 6, 7);
    TILE_LOAD(7, g + 768, 64);
    TILE_DP(3, 6, 7);
}

static inline void store_scores_d64(float *s) {
    TILE_STORE(4, s, PK * 4);
    TILE_STORE(5, s + 16, PK * 4);
    TILES_FENCE();
}

/* lanes of the two 16-key halves of a step that row r sees: keys k0 .. last (inclusive) */
static inline void visible_d64(int64_t last, int64_t k0, __mmask16 *lo, __mmask16 *hi) {
    const int64_t n = last + 1 - k0; /* keys of this step the row sees, if under 32 */
    *lo = n >= 16 ? (__mmask16)0xFFFF : n <= 0 ? 0 : (__mmask16)((1u << n) - 1);
    *hi = n >= 32 ? (__mmask16)0xFFFF : n <= 16 ? 0 : (__mmask16)((1u << (n - 16)) - 1);
}

/* Pass 1: vmax[r] = row r's scores' maximum (r < nr) in every lane. Row r sees keys
   0 .. last0 + r; steps of PK keys; s two score buffers. */
static void rows_max_d64(const uint16_t *qa, const uint32_t *kp, int64_t last0, int64_t nr,
                         int64_t steps, float (*s)[16 * PK], __m512 *vmax) {
    issue_scores_d64(qa, kp, 0);
    store_scores_d64(s[0]);
    for (int64_t t = 0; t < steps; ++t) {
        if (t + 1 < steps) issue_scores_d64(qa, kp, (t + 1) * PK); /* AMX, while we max */
        const float *st = s[t & 1];
        for (int64_t r = 0; r < nr; ++r) {
            __mmask16 lo, hi;
            visible_d64(last0 + r, t * PK, &lo, &hi);
            vmax[r] = _mm512_mask_max_ps(vmax[r], lo, vmax[r], _mm512_load_ps(st + r * PK));
            vmax[r] = _mm512_mask_max_ps(vmax[r], hi, vmax[r], _mm512_load_ps(st + r * PK + 16));
        }
        if (t + 1 < steps) store_scores_d64(s[(t + 1) & 1]);
    }
    for (int64_t r = 0; r < nr; ++r) vmax[r] = _mm512_set1_ps(_mm512_reduce_max_ps(vmax[r]));
}

/* Pass 2: C tiles 0-3 = P V with P = exp(score - vmax[r]) (rounded to bf16 in pa), vsum[r]
   += P's lanes; arguments as rows_max_d64's, vp the packed V, pa rows past nr zero. */
static void rows_values_d64(const uint16_t *qa, const uint32_t *kp, const uint32_t *vp,
                            int64_t last0, int64_t nr, int64_t steps, float (*s)[16 * PK],
                            uint16_t *pa, const __m512 *vmax, __m512 *vsum) {
    TILE_ZERO(0);
    TILE_ZERO(1);
    TILE_ZERO(2);
    TILE_ZERO(3);
    issue_scores_d64(qa, kp, 0);
    store_scores_d64(s[0]);
    for (int64_t t = 0; t < steps; ++t) {
        if (t + 1 < steps) issue_scores_d64(qa, kp, (t + 1) * PK); /* AMX, while we exp */
        const float *st = s[t & 1];
        for (int64_t r = 0; r < nr; ++r) {
            __mmask16 lo, hi;
            visible_d64(last0 + r, t * PK, &lo, &hi);
            const __m512 a = _mm512_maskz_mov_ps(
                lo, exp16_weights(_mm512_sub_ps(_mm512_load_ps(st + r * PK), vmax[r])));
            const __m512 b = _mm512_maskz_mov_ps(
                hi, exp16_weights(_mm512_sub_ps(_mm512_load_ps(st + r * PK + 16), vmax[r])));
            vsum[r] = _mm512_add_ps(vsum[r], _mm512_add_ps(a, b));
            _mm512_store_si512(pa + r * PK, (__m512i)_mm512_cvtne2ps_pbh(b, a));
        }
        TILES_FENCE();
        issue_values_d64(pa, vp, t * PK);
        if (t + 1 < steps) store_scores_d64(s[(t + 1) & 1]);
    }
}

/* Rows j0 .. j0 + nr - 1 of a chunk at position p0, query head i, as cpu_prefill_amx.c's
   item with d = 64 (same arguments, same result within rounding). */
static void item_d64(const float *q, int64_t q_stride, const uint32_t *kp, const uint32_t *vp,
                     int64_t p0, int64_t row0, int64_t j0, int64_t nr, int64_t i, int64_t nh,
                     float scale, void *out, int out_bf16) {
    uint16_t qa[16 * 64] __attribute__((aligned(64)));
    uint16_t pa[16 * PK] __attribute__((aligned(64)));
    float s[2][16 * PK] __attribute__((aligned(64)));
    float o[16 * 64] __attribute__((aligned(64)));
    __m512 vmax[16], vsum[16];
    const __m512 scale_v = _mm512_set1_ps(scale);
    for (int64_t r = 0; r < 16; ++r) {
        const float *src = q + (row0 + j0 + r) * q_stride + i * 64;
        for (int64_t x = 0; x < 64; x += 16) /* rounded to nearest even, as narrow() */
            _mm256_storeu_si256((__m256i *)(qa + r * 64 + x), r < nr ? (__m256i)_mm512_cvtneps_pbh(
                _mm512_mul_ps(_mm512_loadu_ps(src + x), scale_v)) : _mm256_setzero_si256());
        vmax[r] = _mm512_set1_ps(-3.0e38f);
        vsum[r] = _mm512_setzero_ps();
    }
    memset(pa, 0, sizeof pa); /* rows past nr stay zero */
    TILES_FENCE();
    const int64_t last0 = p0 + j0; /* row r sees keys 0 .. last0 + r */
    const int64_t steps = (last0 + nr + PK - 1) / PK;
    rows_max_d64(qa, kp, last0, nr, steps, s, vmax);
    rows_values_d64(qa, kp, vp, last0, nr, steps, s, pa, vmax, vsum);
    TILE_STORE(0, o, 256);
    TILE_STORE(1, o + 16, 256);
    TILE_STORE(2, o + 32, 256);
    TILE_STORE(3, o + 48, 256);
    TILES_FENCE();
    for (int64_t r = 0; r < nr; ++r) {
        const __m512 inv = _mm512_set1_ps(1.0f / _mm512_reduce_add_ps(vsum[r]));
        float row[64];
        for (int64_t x = 0; x < 64; x += 16)
            _mm512_storeu_ps(row + x, _mm512_mul_ps(_mm512_load_ps(o + r * 64 + x), inv));
        store_out_row(row, out, out_bf16, ((row0 + j0 + r) * nh + i) * 64, 64);
    }
}

#endif
