/* Projections of mid-sized decode steps on AMX, reading GGUF Q4_1 weights (built with the
   other sources by kernels/native_library.py, driven by kernels/cpu_amx_q4.py).

   Why: a decode step of 9-64 rows through oneDNN reads every projection's bf16 copy (2
   bytes a weight; SmolLM2-135M: 212 MB a step, ~16-24 ms on this VM), while the GGUF's own
   Q4_1 blocks are 4.5 bits a weight. The native GEMV (cpu_quant_dot.c) reads the blocks but
   multiplies in float32 FMAs, which costs more than the bytes it saves past ~8 rows. Here
   each 32 x 16 tile of weights is decoded once into bf16, straight into AMX's B-tile layout,
   and multiplied with up to 64 activation rows by TDPBF16PS.

   Exactness: a Q4_1 weight is d * q + m in float32 (one rounding, as gguf-py decodes it),
   then rounded to bf16 to nearest even: bit for bit the model's bf16 copy of that weight
   (Projection.weight_bf16). Activations are bf16, sums float32 (as oneDNN's bf16 GEMM), the
   output rounded to bf16 to nearest even: the oneDNN path's result in another summation
   order.

   Tiled layout (bp_q4_tile_pack; N % 16 == 0, K % 32 == 0): tile (nb, kb) covers weight rows
   16 nb .. 16 nb + 15 and columns 32 kb .. 32 kb + 31, tiles in order nb-major, each 320 B:
     fp16 d[16], fp16 m[16]   the Q4_1 block scale and minimum of each of the 16 rows
     uint8 q[16][16]          q[p][n] = the row n's weights 2p (low nibble), 2p + 1 (high)
   so that B-tile row p (columns 2p, 2p + 1 of 16 weight rows, as pairs) decodes from 16
   bytes with vector ops. */

#include <stdint.h>
#include <string.h>

#include "cpu_vector_math.h" /* half_to_f32 */

#define Q4_TILE_BYTES 320
#define MAX_GROUPS 4 /* 16-row groups of activations: up to 64 rows a call */

/* GGUF Q4_1 rows [N][K / 32 blocks of 20 bytes] -> the tiled layout above; -1 on bad sizes */
int bp_q4_tile_pack(const uint8_t *blocks, int64_t N, int64_t K, uint8_t *out) {
    if (N % 16 != 0 || K % 32 != 0 || N <= 0 || K <= 0) return -1;
    const int64_t row_bytes = K / 32 * 20, kbs = K / 32;
    for (int64_t nb = 0; nb < N / 16; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb) {
            uint8_t *tile = out + (nb * kbs + kb) * Q4_TILE_BYTES;
            for (int n = 0; n < 16; ++n) {
                const uint8_t *b = blocks + (nb * 16 + n) * row_bytes + kb * 20;
                memcpy(tile + 2 * n, b, 2);       /* d */
                memcpy(tile + 32 + 2 * n, b + 2, 2); /* m */
                for (int p = 0; p < 16; ++p) {
                    const int k0 = 2 * p, k1 = 2 * p + 1; /* weight j < 16: low nibble of b[4+j] */
                    const int q0 = k0 < 16 ? b[4 + k0] & 15 : b[4 + k0 - 16] >> 4;
                    const int q1 = k1 < 16 ? b[4 + k1] & 15 : b[4 + k1 - 16] >> 4;
                    tile[64 + p * 16 + n] = (uint8_t)(q0 | q1 << 4);
                }
            }
        }
    return 0;
}

/* The float32 weights of a tiled matrix, [N][K] (tests) */
int bp_q4_tile_unpack(const uint8_t *tiles, int64_t N, int64_t K, float *out) {
    if (N % 16 != 0 || K % 32 != 0) return -1;
    const int64_t kbs = K / 32;
    for (int64_t nb = 0; nb < N / 16; ++nb)
        for (int64_t kb = 0; kb < kbs; ++kb) {
            const uint8_t *tile = tiles + (nb * kbs + kb) * Q4_TILE_BYTES;
            for (int n = 0; n < 16; ++n) {
                const float d = half_to_f32(tile + 2 * n), m = half_to_f32(tile + 32 + 2 * n);
                for (int p = 0; p < 16; ++p) {
                    const uint8_t q = tile[64 + p * 16 + n];
                    float *row = out + (nb * 16 + n) * K + kb * 32;
                    row[2 * p] = d * (float)(q & 15) + m;
                    row[2 * p + 1] = d * (float)(q >> 4) + m;
                }
            }
        }
    return 0;
}

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

/* One tile's 16 B-tile rows (64 bytes each: row p = columns 2p, 2p + 1 of the 16 weight
   rows, as bf16 pairs) into b. VCVTNE2PS2BF16 rounds to nearest even, as round_bf16 and
   torch's .to(bfloat16) do for finite values; it puts the 16 even columns' bf16 before the
   16 odd ones', and one word permute interleaves them into pairs. */
static inline void decode_tile(const uint8_t *tile, uint32_t *b) {
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)tile));
    const __m512 m = _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)(tile + 32)));
    const __m512i nib = _mm512_set1_epi32(15);
    const __m512i pairs = _mm512_set_epi16(31, 15, 30, 14, 29, 13, 28, 12, 27, 11, 26, 10, 25,
                                           9, 24, 8, 23, 7, 22, 6, 21, 5, 20, 4, 19, 3, 18, 2,
                                           17, 1, 16, 0);
    for (int p = 0; p < 16; ++p) {
        const __m512i q = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(tile + 64 + 16 * p)));
        const __m512 even = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_and_si512(q, nib)), d, m);
        const __m512 odd = _mm512_fmadd_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(q, 4)), d, m);
        const __m512i halves = (__m512i)_mm512_cvtne2ps_pbh(odd, even);
        _mm512_store_si512((__m512i *)(b + 16 * p), _mm512_permutexvar_epi16(pairs, halves));
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

/* Output columns 16 nb .. 16 nb + 15 of rows 0 .. M - 1: c's float32 tiles to bf16 rows */
static inline void store_groups(int G, const float *c, uint16_t *out, int64_t N, int64_t nb,
                                int64_t M) {
    for (int g = 0; g < G; ++g)
        for (int r = 0; r < 16 && g * 16 + r < M; ++r) {
            const __m512 v = _mm512_loadu_ps(c + 256 * g + 16 * r);
            const __m256i h = _mm512_cvtepi32_epi16(round_bf16(v));
            _mm256_storeu_si256((__m256i *)(out + (g * 16 + r) * N + nb * 16), h);
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
static void amx_columns(const uint16_t *a, int G, int64_t K, const uint8_t *tiles, int64_t nb,
                        float *c) {
    const int64_t kbs = K / 32, a_stride = K * 2;
    uint32_t b[256] __attribute__((aligned(64))); /* tile_loadd copies it: one buffer */
    _tile_zero(0);
    _tile_zero(1);
    _tile_zero(2);
    _tile_zero(3);
    const uint8_t *tile = tiles + nb * kbs * Q4_TILE_BYTES;
    for (int64_t kb = 0; kb < kbs; ++kb, tile += Q4_TILE_BYTES) {
        if (kb + 1 < kbs) /* the next tile's 5 cache lines */
            for (int line = 0; line < Q4_TILE_BYTES; line += 64)
                _mm_prefetch((const char *)(tile + Q4_TILE_BYTES + line), _MM_HINT_T0);
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

/* out[M][N] bf16 = a[M][K] bf16 x W^T, W [N][K] in the tiled layout; a holds 16 G rows
   (G = ceil(M / 16) <= MAX_GROUPS; rows past M are any finite values). 0, or -1 when the
   sizes are outside its limits or AMX is not granted (nothing written then). */
int bp_q4_amx_matmul(const uint16_t *a, int64_t M, int64_t K, const uint8_t *tiles,
                     int64_t N, uint16_t *out, int64_t num_threads) {
    const int G = (int)((M + 15) / 16);
    if (M < 1 || G > MAX_GROUPS || N % 16 != 0 || K % 32 != 0 || !bp_q4_amx_ready())
        return -1;
#pragma omp parallel num_threads(num_threads) if (num_threads > 1)
    {
        bp_q4_amx_begin();
        float c[MAX_GROUPS * 256] __attribute__((aligned(64)));
#pragma omp for schedule(static)
        for (int64_t nb = 0; nb < N / 16; ++nb) {
            amx_columns(a, G, K, tiles, nb, c);
            store_groups(G, c, out, N, nb, M);
        }
        bp_q4_amx_end();
    }
    return 0;
}

/* Row t of in float [T][K] -> out bf16 [T_pad][K], rounded to nearest even (as torch's
   .to(bfloat16) for finite values); rows T .. T_pad - 1 zero. K % 16 == 0. */
static void row_to_bf16(const float *in, int64_t t, int64_t T, int64_t K, uint16_t *out) {
    if (t >= T) {
        memset(out + t * K, 0, (size_t)K * sizeof(uint16_t));
        return;
    }
    for (int64_t k = 0; k < K; k += 16) {
        const __m512i h = round_bf16(_mm512_loadu_ps(in + t * K + k));
        _mm256_storeu_si256((__m256i *)(out + t * K + k), _mm512_cvtepi32_epi16(h));
    }
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
        amx_columns(a16, G, K, tiles, nb, c);
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
                     int64_t N, uint16_t *out, int64_t num_threads) {
    (void)a; (void)M; (void)K; (void)tiles; (void)N; (void)out; (void)num_threads;
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
