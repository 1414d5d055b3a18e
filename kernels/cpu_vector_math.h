/* Math shared by the native kernels (included by cpu_decode.c, cpu_elementwise.c,
   cpu_layers.c, cpu_quant_dot.c, cpu_amx_q4.c and cpu_prefill_amx.c; part of the library's build hash,
   kernels/native_library.py). */

#ifndef BP_CPU_VECTOR_MATH_H
#define BP_CPU_VECTOR_MATH_H

#include <stdint.h>
#include <string.h>
#if defined(__F16C__)
#include <immintrin.h>
#endif

/* How far ahead of the weights a GEMV is multiplying (bytes) it asks the cache for them:
   each weight row, at every step of its loop. A thread's share of a projection is one
   contiguous run of rows, so this reaches into its next rows too. The hardware prefetcher
   alone kept a 1-row SmolLM2 step (Q4_1 blocks) at about half the bandwidth one core
   streams: 10.1 ms, 7.2 with this (2 rows 11.8 -> 8.2 ms); 2 KB ahead gave 7.6, 8 KB 7.1,
   a prefetch every fourth block (80 bytes) 9.0. A prefetch past the weights never faults. */
#define WEIGHT_PREFETCH_BYTES 4096

/* exp(x) for x <= 0, as in Cephes expf (range reduction by ln 2, degree-5 polynomial):
   within 2 ulp of expf; written branch-free so that the loops over a tile vectorise. */
static inline float exp_nonpos(float x) {
    x = x < -87.0f ? -87.0f : x; /* keeps 2^n normal; exp(-87) ~ 1.6e-38, negligible */
    const float shifter = 12582912.0f; /* 1.5 * 2^23: adding it rounds to an integer */
    float n = (x * 1.44269504088896341f + shifter) - shifter;
    float r = x - n * 0.693359375f + n * 2.12194440e-4f;
    float z = r * r;
    float y = 1.9875691500e-4f;
    y = y * r + 1.3981999507e-3f;
    y = y * r + 8.3334519073e-3f;
    y = y * r + 4.1665795894e-2f;
    y = y * r + 1.6666665459e-1f;
    y = y * r + 5.0000001201e-1f;
    y = y * z + r + 1.0f;
    int32_t bits = ((int32_t)n + 127) << 23;
    float scale;
    memcpy(&scale, &bits, sizeof scale);
    return y * scale;
}

#if defined(__AVX512F__)
#include <immintrin.h>

/* exp(x) for 16 lanes x <= 0: exp_nonpos's range reduction and polynomial, vectorised */
static inline __m512 exp16_nonpos(__m512 x) {
    x = _mm512_max_ps(x, _mm512_set1_ps(-87.0f));
    const __m512 shifter = _mm512_set1_ps(12582912.0f);
    const __m512 n = _mm512_sub_ps(
        _mm512_fmadd_ps(x, _mm512_set1_ps(1.44269504088896341f), shifter), shifter);
    const __m512 r = _mm512_fmadd_ps(n, _mm512_set1_ps(2.12194440e-4f),
                                     _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x));
    const __m512 z = _mm512_mul_ps(r, r);
    __m512 y = _mm512_set1_ps(1.9875691500e-4f);
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.3981999507e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(8.3334519073e-3f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(4.1665795894e-2f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(1.6666665459e-1f));
    y = _mm512_fmadd_ps(y, r, _mm512_set1_ps(5.0000001201e-1f));
    y = _mm512_fmadd_ps(y, z, _mm512_add_ps(r, _mm512_set1_ps(1.0f)));
    const __m512i bits = _mm512_slli_epi32(
        _mm512_add_epi32(_mm512_cvtps_epi32(n), _mm512_set1_epi32(127)), 23);
    return _mm512_mul_ps(y, _mm512_castsi512_ps(bits));
}
#endif

typedef union {
    float f;
    uint32_t u;
} bits32;

/* silu(g) = g * sigmoid(g) = g / (1 + exp(-g)), computed from e = exp(-|g|) (never
   overflows): sigmoid = 1 / (1 + e) for g >= 0, e / (1 + e) below. Past |g| = 87, e is
   taken as 0 (the true value is below 1.7e-38, so silu is off by at most |g| * 1.7e-38,
   and exactly 0 for huge negative g, as float64 gives). A NaN stays NaN. The selects are
   on the bit patterns (as unsigned ints, -a orders like a for a >= 0): they vectorise. */
static inline float silu(float g) {
    const bits32 in = {.f = g}, one = {.f = 1.0f};
    const uint32_t neg_abs = in.u | 0x80000000u; /* -|g| */
    const uint32_t far = neg_abs > 0xC2AE0000u ? ~0u : 0u; /* -|g| < -87 (or a NaN) */
    const bits32 minus_abs = {.u = neg_abs};
    const bits32 exp_clamped = {.f = exp_nonpos(minus_abs.f)}; /* a NaN in: masked below */
    const bits32 e = {.u = exp_clamped.u & ~far};
    const uint32_t negative = (uint32_t)((int32_t)in.u >> 31); /* all ones where g < 0 */
    const bits32 numerator = {.u = (one.u & ~negative) | (e.u & negative)};
    return g * (numerator.f / (1.0f + e.f));
}

#if defined(__AVX512F__) && defined(__AVX512DQ__)
/* silu for 16 lanes, as silu() above except the division: 1 / (1 + e) by VRCP14PS and one
   Newton step (relative error ~1e-7, where VDIVPS cost a third of a prefill's SwiGLU:
   silu_mul over SmolLM2's prefill steps 119 ms a run with the division) */
static inline __m512 silu16(__m512 g) {
    const __m512 minus_abs = _mm512_or_ps(g, _mm512_set1_ps(-0.0f));
    const __mmask16 near = _mm512_cmp_ps_mask(minus_abs, _mm512_set1_ps(-87.0f), _CMP_GE_OQ);
    const __m512 e = _mm512_maskz_mov_ps(near, exp16_nonpos(minus_abs)); /* 0 far or NaN */
    const __mmask16 negative = _mm512_movepi32_mask(_mm512_castps_si512(g)); /* sign bit */
    const __m512 one = _mm512_set1_ps(1.0f);
    const __m512 numerator = _mm512_mask_mov_ps(one, negative, e);
    const __m512 den = _mm512_add_ps(one, e); /* in [1, 2] */
    __m512 r = _mm512_rcp14_ps(den);
    r = _mm512_mul_ps(r, _mm512_fnmadd_ps(den, r, _mm512_set1_ps(2.0f)));
    return _mm512_mul_ps(g, _mm512_mul_ps(numerator, r));
}
#endif

/* out[i] = silu(gate[i]) * up[i], i < n (SwiGLU's product; cpu_elementwise.c, cpu_layers.c) */
static inline void silu_mul_row(const float *restrict gate, const float *restrict up,
                                int64_t n, float *restrict out) {
    int64_t i = 0;
#if defined(__AVX512F__) && defined(__AVX512DQ__)
    for (; i + 16 <= n; i += 16)
        _mm512_storeu_ps(out + i, _mm512_mul_ps(silu16(_mm512_loadu_ps(gate + i)),
                                                _mm512_loadu_ps(up + i)));
#endif
    for (; i < n; ++i) out[i] = silu(gate[i]) * up[i];
}

/* n floats from float32 (is_bf16 0) or bfloat16 bit patterns (1) */
static inline void widen(const void *src, int is_bf16, int64_t n, float *restrict dst) {
    if (!is_bf16) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint16_t *restrict s = src;
    uint32_t *restrict d = (uint32_t *)dst;
    for (int64_t i = 0; i < n; ++i) d[i] = (uint32_t)s[i] << 16;
}

/* RoPE of one head: dst[i] = x[i] * c[i] + x[(i + d/2) % d] * sn[i] (sn: sin with its
   first half negated), in two branch-free halves that vectorise (the modulo kept gcc to
   one scalar FMA a lane). */
static inline void rotate_head(const float *restrict x, const float *restrict c,
                               const float *restrict sn, int64_t half, float *restrict dst) {
    for (int64_t i = 0; i < half; ++i) dst[i] = x[i] * c[i] + x[i + half] * sn[i];
    for (int64_t i = half; i < 2 * half; ++i) dst[i] = x[i] * c[i] + x[i - half] * sn[i];
}

/* n floats to float32 or bfloat16, rounded to nearest even as torch's .to(bfloat16) */
static inline void narrow(const float *restrict src, void *dst, int is_bf16, int64_t n) {
    if (!is_bf16) {
        memcpy(dst, src, (size_t)n * sizeof(float));
        return;
    }
    const uint32_t *restrict s = (const uint32_t *)src;
    uint16_t *restrict d = dst;
    for (int64_t i = 0; i < n; ++i) { /* round to nearest even; a NaN stays a (quiet) NaN */
        const uint32_t b = s[i];
        const uint32_t rounded = (b + 0x7fffu + ((b >> 16) & 1u)) >> 16;
        d[i] = (uint16_t)((b & 0x7fffffffu) > 0x7f800000u ? (b >> 16) | 0x40u : rounded);
    }
}

/* n floats of row into out (float32, or bf16 where out_bf16: narrow's rounding) at element
   `at`: the attention kernels' output rows, bf16 where the next product takes bf16 */
static inline void store_out_row(const float *restrict row, void *out, int out_bf16,
                                 int64_t at, int64_t n) {
    narrow(row, (char *)out + at * (out_bf16 ? 2 : 4), out_bf16, n);
}

/* An fp16 bit pattern (2 bytes at p, little-endian) as float32: every value exactly
   (GGUF block scales) */
static inline float half_to_f32(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, sizeof h);
#if defined(__F16C__)
    return _cvtsh_ss(h);
#else
    const uint32_t sign = (uint32_t)(h & 0x8000) << 16, exp = (h >> 10) & 0x1f;
    uint32_t mant = h & 0x3ff, bits;
    if (exp == 0x1f) {
        bits = sign | 0x7f800000 | (mant << 13);
    } else if (exp != 0) {
        bits = sign | ((exp + 112) << 23) | (mant << 13);
    } else if (mant == 0) {
        bits = sign;
    } else { /* subnormal: normalise */
        int e = 113;
        while (!(mant & 0x400)) { mant <<= 1; --e; }
        bits = sign | ((uint32_t)e << 23) | ((mant & 0x3ff) << 13);
    }
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
#endif
}

#endif
