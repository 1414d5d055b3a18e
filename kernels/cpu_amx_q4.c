/* Projections of decode steps on AMX, reading GGUF Q4_1 or Q8_0 weights in the tiled layouts
   of cpu_amx_tiles.c (built with the other sources by kernels/native_library.py, driven by
   kernels/cpu_amx_q4.py and, inside the native decode layers, kernels/cpu_layers.c).

   Why: a decode step of 2-64 rows through oneDNN reads every projection's bf16 copy (2
   bytes a weight; SmolLM2-135M: 212 MB a step, ~16-24 ms on this VM), while the GGUF's own
   Q4_1 blocks are 4.5 bits a weight (Q8_0, its head: 8.5). The native GEMV (cpu_quant_dot.c)
   reads the blocks but multiplies in float32 FMAs, which costs more than the bytes it saves
   past a row or two. Here each 32 x 16 tile of weights is decoded once into bf16, straight
   into AMX's B-tile layout, and multiplied with up to 64 activation rows by TDPBF16PS.

   Exactness: a Q4_1 weight is d * q + m in float32 (one rounding, as gguf-py decodes it), a
   Q8_0 weight d * q (exact), then rounded to bf16 to nearest even: bit for bit the model's
   bf16 copy of that weight (Projection.weight_bf16). Activations are bf16, sums float32 (as
   oneDNN's bf16 GEMM), the output rounded to bf16 to nearest even: the oneDNN path's result
   in another summation order. */

#include <stdint.h>
#include <string.h>

#include "cpu_vector_math.h" /* half_to_f32 */

#define Q4_TILE_BYTES 320 /* as cpu_amx_tiles.c */
#define Q8_TILE_BYTES 544
#define MAX_GROUPS 4 /* 16-row groups of activations: up to 64 rows a call */

#if defined(__AMX_BF16__) && defined(__AMX_TILE__) && defined(__AVX512BF16__)
#include <immintrin.h>
#include <sys/syscall.h>
#include <unistd.h>

/* gcc 12's AMX intrinsics are asm statements with no memory operands: it does not see
   tileloadd read, tilestored write or ldtilecfg read memory, and may drop or move the plain
   stores and loads around them (a B tile loaded from a buffer never written). A compiler
   barrier before each tile load from, and after each tile store to, ordinary memory. */
#define AMX_MEMORY_FENCE() __asm__ __volatile__("" : : : "memory")

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

typedef struct {
    uint8_t palette, start_row, reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} tile_config;

/* 1 when this process may use AMX tiles (asks the kernel once; oneDNN asks the same). */
int bp_q4_amx_ready(void) {
    static int ready = -1;
    if (ready < 0) ready = syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
    return ready;
}

/* fp32 lanes -> bf16 bit patterns in the low 16 bits, rounded to nearest even */
static inline __m512i round_bf16(__m512 x) {
    const __m512i bits = _mm512_castps_si512(x);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(bits, 16), _mm512_set1_epi32(1));
    return _mm512_srli_epi32(
        _mm512_add_epi32(bits, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
}

/* A tile's 16 per-row values v (a scale, a minimum) spread to B-tile lanes of bf16 pairs:
   *lo = rows 0-7, *hi = rows 8-15, each twice (the lanes of its pair) */
static inline void spread_to_pairs(__m512 v, __m512 *lo, __m512 *hi) {
    *lo = _mm512_permutexvar_ps(_mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0),
                                v);
    *hi = _mm512_permutexvar_ps(
        _mm512_set_epi32(15, 15, 14, 14, 13, 13, 12, 12, 11, 11, 10, 10, 9, 9, 8, 8), v);
}

/* One tile's 16 B-tile rows (64 bytes each: row p = columns 2p, 2p + 1 of the 16 weight
   rows, as bf16 pairs) into b. Row p's low nibbles are rows 0-7's pairs in that order, its
   high nibbles rows 8-15's (cpu_amx_tiles.c), so with each lane's scale and minimum
   spread to its pair once a tile, VCVTNE2PS2BF16 (rounding to nearest even, as round_bf16
   and torch's .to(bfloat16) do for finite values) leaves them in place: no word permute a
   row (one of its ~10 ops, on the shuffle port; without it a tile took 38 instead of 50 ns
   a thread at one 16-row group, 72 instead of 80-88 at four). */
static inline void decode_tile(const uint8_t *tile, uint32_t *b) {
    __m512 d_lo, d_hi, m_lo, m_hi;
    spread_to_pairs(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile)), &d_lo, &d_hi);
    spread_to_pairs(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32))), &m_lo,
                    &m_hi);
    const __m512i nib = _mm512_set1_epi32(15);
    for (int p = 0; p < 16; ++p) {
        const __m128i bytes = _mm_loadu_si128((const __m128i *)(tile + 64 + 16 * p));
        const __m512i q = _mm512_cvtepu8_epi32(bytes);
        const __m512 lo = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, nib)), d_lo, m_lo);
        const __m512 hi = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d_hi, m_hi);
        _mm512_store_si512((__m512i *)(b + 16 * p), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* decode_tile for a Q8_0 tile: B-tile row p's 32 int8 (pairs of 16 rows, cpu_amx_tiles.c)
   times their row's scale, exact in float32, then rounded to bf16 in that order */
static inline void decode_tile_q8(const uint8_t *tile, uint32_t *b) {
    __m512 d_lo, d_hi;
    spread_to_pairs(_mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile)), &d_lo, &d_hi);
    for (int p = 0; p < 16; ++p) {
        const uint8_t *q = tile + 32 + 32 * p;
        const __m512 lo = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)q))), d_lo);
        const __m512 hi = _mm512_mul_ps(
            _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(_mm_loadu_si128((const __m128i *)(q + 16)))),
            d_hi);
        _mm512_store_si512((__m512i *)(b + 16 * p), (__m512i)_mm512_cvtne2ps_pbh(hi, lo));
    }
}

/* C tiles 0 .. G-1 (16 rows each) += A group g x B (tile 7); G a constant. A load into a
   tile a product still reads waits for that product, so A groups take tiles 4, 5, 6, 4 (at
   4 groups through one A tile the kernel ran 2.2x slower); B's reload waits for the last
   product of the previous tile, which decoding the next tile (in between) hides. */
#define MULTIPLY_GROUPS(G)                                                                 \
    do {                                                                                   \
        _tile_loadd(7, b, 64);                                                             \
        _tile_loadd(4, a + kb * 32, a_stride);                                             \
        _tile_dpbf16ps(0, 4, 7);                                                           \
        if (G > 1) { _tile_loadd(5, a + 16 * K + kb * 32, a_stride); _tile_dpbf16ps(1, 5, 7); } \
        if (G > 2) { _tile_loadd(6, a + 32 * K + kb * 32, a_stride); _tile_dpbf16ps(2, 6, 7); } \
        if (G > 3) { _tile_loadd(4, a + 48 * K + kb * 32, a_stride); _tile_dpbf16ps(3, 4, 7); } \
    } while (0)

/* Output columns 16 nb .. 16 nb + 15 of rows 0 .. M - 1: c's float32 tiles rounded to bf16,
   written as bf16 rows (out_f32 0) or widened back to float32 rows (out_f32 1: what
   .float() of the bf16 rows gives, without a pass of its own) */
static inline void store_groups(int G, const float *c, void *out, int out_f32, int64_t N,
                                int64_t nb, int64_t M) {
    for (int g = 0; g < G; ++g)
        for (int r = 0; r < 16 && g * 16 + r < M; ++r) {
            const __m512i bf = round_bf16(_mm512_loadu_ps(c + 256 * g + 16 * r));
            const int64_t at = (g * 16 + r) * N + nb * 16;
            if (out_f32)
                _mm512_storeu_si512((float *)out + at, _mm512_slli_epi32(bf, 16));
            else
                _mm256_storeu_si256((__m256i *)((uint16_t *)out + at), _mm512_cvtepi32_epi16(bf));
        }
}

/* This thread's tile palette: C 0-3 16 x 16 fp32, A 4-6 16 x 32 bf16, B 7 (the kernels
   below); bp_q4_amx_end releases it. Per thread, inside each parallel region that multiplies. */
void bp_q4_amx_begin(void) {
    tile_config cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int t = 0; t < 8; ++t) {
        cfg.rows[t] = 16;
        cfg.colsb[t] = 64;
    }
    AMX_MEMORY_FENCE(); /* else gcc 12 drops the stores above: a config of stack garbage */
    _tile_loadconfig(&cfg);
}

void bp_q4_amx_end(void) { _tile_release(); }

/* Output columns 16 nb .. 16 nb + 15 of all 16 G rows of a (bf16 [16 G][K], any finite values
   past the rows used) x W^T (the tiled layout), as float32 tiles c[g][16][16] (the tiles'
   own layout: row r of group g at c + 256 g + 16 r). The calling thread has run
   bp_q4_amx_begin. */
static void amx_columns(const uint16_t *a, int G, int64_t K, const uint8_t *tiles, int q8,
                        int64_t nb, float *c) {
    const int64_t kbs = K / 32, a_stride = K * 2, bytes = q8 ? Q8_TILE_BYTES : Q4_TILE_BYTES;
    uint32_t b[256] __attribute__((aligned(64))); /* tile_loadd copies it: one buffer */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint8_t *tile = tiles + nb * kbs * bytes;
    for (int64_t kb = 0; kb < kbs; ++kb, tile += bytes) {
        for (int line = 0; line < bytes; line += 64) /* a tile's lines, further on */
            _mm_prefetch((const char *)(tile + WEIGHT_PREFETCH_BYTES + line), _MM_HINT_T0);
        if (q8)
            decode_tile_q8(tile, b);
        else
            decode_tile(tile, b);
        AMX_MEMORY_FENCE();
        switch (G) {
        case 1: MULTIPLY_GROUPS(1); break;
        case 2: MULTIPLY_GROUPS(2); break;
        case 3: MULTIPLY_GROUPS(3); break;
        default: MULTIPLY_GROUPS(4); break;
        }
    }
    for (int g = 0; g < G; ++g)
        switch (g) { /* tile numbers are immediates */
        case 0: _tile_stored(0, c, 64); break;
        case 1: _tile_stored(1, c + 256, 64); break;
        case 2: _tile_stored(2, c + 512, 64); break;
        default: _tile_stored(3, c + 768, 64); break;
        }
    AMX_MEMORY_FENCE();
}

/* out[M][N] = a[M][K] bf16 x W^T rounded to bf16 (out bf16, or its float32 widening where
   out_f32), W [N][K] in Q4_1 (q8 0) or Q8_0 tiles; a holds 16 G rows (G = ceil(M / 16) <=
   MAX_GROUPS; rows past M are any finite values). 0, or -1 when the sizes are outside its
   limits or AMX is not granted (nothing written then). */
static int amx_matmul(const uint16_t *a, int64_t M, int64_t K, const uint8_t *tiles, int q8,
                      int64_t N, void *out, int out_f32, int64_t num_threads) {
    const int G = (int)((M + 15) / 16);
    if (M < 1 || G > MAX_GROUPS || N % 16 != 0 || K % 32 != 0 || !bp_q4_amx_ready())
        return -1;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        bp_q4_amx_begin();
        float c[MAX_GROUPS * 256] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t nb = 0; nb < N / 16; ++nb) {
            amx_columns(a, G, K, tiles, q8, nb, c);
            store_groups(G, c, out, out_f32, N, nb, M);
        }
        bp_q4_amx_end();
    }
    return 0;
}

int bp_q4_amx_matmul(const uint16_t *a, int64_t M, int64_t K, const uint8_t *tiles,
                     int64_t N, void *out, int64_t out_f32, int64_t num_threads) {
    return amx_matmul(a, M, K, tiles, 0, N, out, (int)out_f32, num_threads);
}

int bp_q8_amx_matmul(const uint16_t *a, int64_t M, int64_t K, const uint8_t *tiles,
                     int64_t N, void *out, int64_t out_f32, int64_t num_threads) {
    return amx_matmul(a, M, K, tiles, 1, N, out, (int)out_f32, num_threads);
}

/* Row t of in float [T][K] -> out bf16 [T_pad][K] (cpu_vector_math.h's narrow: as torch's
   .to(bfloat16)); rows T .. T_pad - 1 zero. */
static void row_to_bf16(const float *in, int64_t t, int64_t T, int64_t K, uint16_t *out) {
    if (t < T)
        narrow(in + t * K, out + t * K, 1, K);
    else
        memset(out + t * K, 0, (size_t)K * sizeof(uint16_t));
}

/* For the native decode layers (cpu_layers.c, weights_format 4), called by every thread of
   their parallel region, each having run bp_q4_amx_begin: y[t, o] = (accumulate ? y[t, o] :
   0) + (in[t] . W[o] + b[o]) for t < T <= 64, o < N; in float [T][K] rounded to bf16 into
   a16 ([16 ceil(T / 16)][K]), then 16 output columns at a time, each split over the team. */
void bp_q4_amx_project(const uint8_t *tiles, const float *bias, const float *in, int64_t T,
                       int64_t K, int64_t N, float *y, int64_t ldy, int accumulate,
                       uint16_t *a16) {
    const int G = (int)((T + 15) / 16);
#pragma omp for schedule(static)
    for (int64_t t = 0; t < 16 * (int64_t)G; ++t)
        row_to_bf16(in, t, T, K, a16);
#pragma omp for schedule(static)
    for (int64_t nb = 0; nb < N / 16; ++nb) {
        float c[MAX_GROUPS * 256] __attribute__((aligned(64)));
        amx_columns(a16, G, K, tiles, 0, nb, c);
        for (int64_t t = 0; t < T; ++t) {
            const float *ct = c + 256 * (t / 16) + 16 * (t % 16);
            float *yt = y + t * ldy + nb * 16;
            for (int n = 0; n < 16; ++n)
                yt[n] = (accumulate ? yt[n] : 0.0f) + (ct[n] + (bias ? bias[nb * 16 + n] : 0.0f));
        }
    }
}
#else
int bp_q4_amx_ready(void) { return 0; }
int bp_q4_amx_matmul(const uint16_t *a, int64_t M, int64_t K, const uint8_t *tiles,
                     int64_t N, void *out, int64_t out_f32, int64_t num_threads) {
    (void)a; (void)M; (void)K; (void)tiles; (void)N; (void)out; (void)out_f32;
    (void)num_threads;
    return -1;
}
int bp_q8_amx_matmul(const uint16_t *a, int64_t M, int64_t K, const uint8_t *tiles,
                     int64_t N, void *out, int64_t out_f32, int64_t num_threads) {
    (void)a; (void)M; (void)K; (void)tiles; (void)N; (void)out; (void)out_f32;
    (void)num_threads;
    return -1;
}
/* never called: callers check bp_q4_amx_ready first */
void bp_q4_amx_begin(void) {}
void bp_q4_amx_end(void) {}
void bp_q4_amx_project(const uint8_t *tiles, const float *bias, const float *in, int64_t T,
                       int64_t K, int64_t N, float *y, int64_t ldy, int accumulate,
                       uint16_t *a16) {
    (void)tiles; (void)bias; (void)in; (void)T; (void)K; (void)N; (void)y; (void)ldy;
    (void)accumulate; (void)a16;
}
#endif
