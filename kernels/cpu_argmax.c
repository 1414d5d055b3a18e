/* Row argmax for the sampler (kernels/cpu_argmax.py, engine/execution/exponential_race.py):
   out[r] = the index of row r's largest value, as torch.argmax(dim=-1): the first of ties,
   the first NaN where a row has one, 0 for a row of -inf.

   Why: torch.max(dim=-1) over a decode step's float32 logits ([64, 49152]) took 1.4 ms
   on 2 threads, 5% of the step; two passes here (the row's max, then its first index)
   read the row from L2 the second time and take ~0.25 ms.

   Shapes: x float32 [rows][n] (rows n apart), out int64 [rows]; rows split over threads. */

#include <stdint.h>

#if defined(__AVX512F__)
#include <immintrin.h>
#endif

/* the first NaN's index, or -1 */
static int64_t first_nan(const float *x, int64_t n) {
    for (int64_t j = 0; j < n; ++j)
        if (x[j] != x[j]) return j;
    return -1;
}

static int64_t argmax_row(const float *x, int64_t n) {
    float best = x[0];
    int unordered = x[0] != x[0];
    int64_t i = 1;
#if defined(__AVX512F__)
    if (n >= 64) {
        __m512 m0 = _mm512_loadu_ps(x), m1 = m0, m2 = m0, m3 = m0;
        __mmask16 nan = 0;
        for (i = 0; i + 64 <= n; i += 64) { /* four chains: VMAXPS's latency hidden */
            const __m512 a = _mm512_loadu_ps(x + i), b = _mm512_loadu_ps(x + i + 16);
            const __m512 c = _mm512_loadu_ps(x + i + 32), d = _mm512_loadu_ps(x + i + 48);
            nan |= _mm512_cmp_ps_mask(a, b, _CMP_UNORD_Q) | _mm512_cmp_ps_mask(c, d, _CMP_UNORD_Q);
            m0 = _mm512_max_ps(m0, a);
            m1 = _mm512_max_ps(m1, b);
            m2 = _mm512_max_ps(m2, c);
            m3 = _mm512_max_ps(m3, d);
        }
        best = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_max_ps(m0, m1), _mm512_max_ps(m2, m3)));
        unordered = nan != 0;
    }
#endif
    for (; i < n; ++i) {
        unordered |= x[i] != x[i];
        if (x[i] > best) best = x[i];
    }
    if (unordered) return first_nan(x, n);
    i = 0;
#if defined(__AVX512F__)
    const __m512 target = _mm512_set1_ps(best);
    for (; i + 16 <= n; i += 16) {
        const __mmask16 hit = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), target, _CMP_EQ_OQ);
        if (hit) return i + __builtin_ctz(hit);
    }
#endif
    for (; i < n; ++i)
        if (x[i] == best) return i;
    return 0; /* not reached: best is one of the row's values */
}

/* 0, or -1 (nothing written) for an empty row */
int bp_row_argmax(const float *x, int64_t rows, int64_t n, int64_t *out, int64_t threads) {
    if (n < 1) return -1;
#pragma omp parallel for num_threads(threads) if (threads > 1 && rows > 1) schedule(static)
    for (int64_t r = 0; r < rows; ++r) out[r] = argmax_row(x + r * n, n);
    return 0;
}
