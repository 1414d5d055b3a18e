/* The work between a decoder layer's projections, fused, for the steps the native decode
   layers do not take (prefills, mixed steps, large decode batches) when they run on the
   bf16 weight copies: the projections stay torch's (oneDNN, AMX), and each stretch
   between two of them is one call here instead of 4-8 torch ops, each a full pass over a
   [T, D] or [T, I] tensor (built with cpu_decode.c by kernels/native_library.py, driven by
   engine/models/fused_layers.py; the same arithmetic as engine/models/llama.py).

   Element types: "act" tensors are float32 (is_bf16 = 0) or bfloat16 (uint16 bit
   patterns, is_bf16 = 1, rounded to nearest even as torch's .to(bfloat16)). Rows are
   contiguous, row-major; the rows of a call run in parallel (num_threads; 1: none).

   NOTE: every inner loop is a plain loop over floats with no branch and no call, so that
   -O3 -march=native vectorises it (16 lanes on AVX-512): a row is widened into a float
   buffer once, computed on, and narrowed once. The first version of this file loaded and
   rounded element by element behind a type branch, with libm's expf, and lost to torch's
   vectorised ops on a prefill (0.85x). */

#pragma GCC target("prefer-vector-width=512") /* 16 lanes: the silu math is ALU-bound */

#include <math.h>
#include <stdint.h>
#include <string.h>

#include "cpu_vector_math.h"

#define ROW_MAX 16384 /* widest row a call takes (D, I or (nh + 2 kvh) * d): 64 KiB of stack */

/* x[t] += delta[t] (delta NULL: nothing added), then, with w, h[t] = x[t] * rsqrt(mean
   (x[t]^2) + eps) * w in h's type. x float [T, D]; delta act [T, D]; w float [D].
   Returns -1 (nothing done) when D > ROW_MAX. */
int bp_add_rmsnorm(float *x, const void *delta, int64_t delta_bf16, const float *w, float eps,
                   void *h, int64_t h_bf16, int64_t T, int64_t D, int64_t num_threads) {
    if (D > ROW_MAX) return -1;
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t t = 0; t < T; ++t) {
        float buf[ROW_MAX];
        float *restrict xt = x + t * D;
        if (delta) {
            const size_t size = delta_bf16 ? sizeof(uint16_t) : sizeof(float);
            widen((const char *)delta + (size_t)(t * D) * size, (int)delta_bf16, D, buf);
            for (int64_t i = 0; i < D; ++i) xt[i] += buf[i];
        }
        if (!w) continue;
        float ss = 0.0f;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < D; ++i) ss += xt[i] * xt[i];
        const float r = 1.0f / sqrtf(ss / (float)D + eps);
        for (int64_t i = 0; i < D; ++i) buf[i] = xt[i] * r * w[i];
        const size_t out_size = h_bf16 ? sizeof(uint16_t) : sizeof(float);
        narrow(buf, (char *)h + (size_t)(t * D) * out_size, (int)h_bf16, D);
    }
    return 0;
}

/* out[t, i] = silu(gu[t, i]) * gu[t, I + i]: gu act [T, 2I], out act [T, I]. Returns -1
   (nothing done) when 3I > ROW_MAX (a row's buffer holds gate, up and the product). */
int bp_silu_mul(const void *gu, int64_t gu_bf16, void *out, int64_t out_bf16, int64_t T,
                int64_t I, int64_t num_threads) {
    if (3 * I > ROW_MAX) return -1;
    const size_t in_size = gu_bf16 ? sizeof(uint16_t) : sizeof(float);
    const size_t out_size = out_bf16 ? sizeof(uint16_t) : sizeof(float);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t t = 0; t < T; ++t) {
        float buf[ROW_MAX];
        widen((const char *)gu + (size_t)(t * 2 * I) * in_size, (int)gu_bf16, 2 * I, buf);
        float *restrict prod = buf + 2 * I;
        silu_mul_row(buf, buf + I, I, prod);
        narrow(prod, (char *)out + (size_t)(t * I) * out_size, (int)out_bf16, I);
    }
    return 0;
}

/* RoPE and the KV write of one layer: qkv act [T, (nh + 2 kvh) d] -> q float [T, nh, d]
   rotated; k rotated and v stored at slots[t] of the caches ([.., kvh, d], float32 or
   bfloat16 by cache_bf16, rounded as torch's .to(bfloat16); slots checked by the caller); cos, ssin float [T, d] (ssin: sin with its first half negated).
   Returns -1 (nothing written) when d is odd or a row is wider than ROW_MAX. */
int bp_rope_store(const void *qkv, int64_t qkv_bf16, float *q, void *k_cache, void *v_cache,
                  int64_t cache_bf16, const int64_t *slots, const float *cos,
                  const float *ssin, int64_t T, int64_t nh, int64_t kvh, int64_t d,
                  int64_t num_threads) {
    const int64_t width = (nh + 2 * kvh) * d, half = d / 2;
    if (d % 2 != 0 || width > ROW_MAX) return -1;
    const size_t in_size = qkv_bf16 ? sizeof(uint16_t) : sizeof(float);
    const size_t cache_size = cache_bf16 ? sizeof(uint16_t) : sizeof(float);
#pragma omp parallel for schedule(static) num_threads(num_threads) if (num_threads > 1)
    for (int64_t t = 0; t < T; ++t) {
        float buf[ROW_MAX];
        widen((const char *)qkv + (size_t)(t * width) * in_size, (int)qkv_bf16, width, buf);
        const float *c = cos + t * d, *sn = ssin + t * d;
        for (int64_t j = 0; j < nh; ++j)
            rotate_head(buf + j * d, c, sn, half, q + (t * nh + j) * d);
        float k[ROW_MAX / 2]; /* kvh * d <= width / 2 */
        for (int64_t j = 0; j < kvh; ++j)
            rotate_head(buf + (nh + j) * d, c, sn, half, k + j * d);
        const size_t at = (size_t)(slots[t] * kvh * d) * cache_size;
        narrow(k, (char *)k_cache + at, (int)cache_bf16, kvh * d);
        narrow(buf + (nh + kvh) * d, (char *)v_cache + at, (int)cache_bf16, kvh * d);
    }
    return 0;
}
