/* Prefill attention over a bf16 paged KV cache on AVX-512-BF16, for CPUs without AMX (AMD
   Zen 4 and 5, Intel Cooper Lake): cpu_prefill_amx.c's algorithm, packing and rounding
   (its header), its body (cpu_prefill_tiles.h) run on the tile operations of
   cpu_tiles_avx512.h. Driven by kernels/cpu_prefill_amx.py where AMX is not granted.

   Why: torch's flash SDPA, the path before, runs its bf16 products as float32 GEMMs on such
   CPUs; on the offline workload's prefill steps (SmolLM2, 2 threads, an AMD EPYC) a
   2,048-row step's layer took 17.6-21.3 ms there and 6.2-7.0 ms here.
   Limits: as bp_prefill_attention_amx's, and a build with AVX-512-BF16 (else -1, nothing
   written); head_dim 64 takes the one-pass item too (TILES_TWO_PASS_D64 0). */

#include <stdint.h>

#if defined(__AVX512BF16__) && defined(__AVX512F__)
#include "cpu_tiles_avx512.h"

#define TILE_ZERO(t) sw_tile_zero(t)
#define TILE_LOAD(t, base, stride) sw_tile_load(t, base, stride)
#define TILE_DP(c, a, b) sw_tile_dp(c, a, b)
#define TILE_STORE(t, base, stride) sw_tile_store(t, base, stride)
#define TILES_FENCE() ((void)0) /* plain loads and stores: the compiler orders them */
#define TILES_BEGIN() ((void)0)
#define TILES_END() ((void)0)
#define TILES_COSTLIEST_FIRST 1
#define TILES_TWO_PASS_D64 0

#include "cpu_prefill_tiles.h" /* prefill_tiled */

#define BF16_BUILD 1
#else
#define BF16_BUILD 0
#endif

/* 1 where this library was built with AVX-512-BF16 (the kernel below runs), else 0 */
int bp_prefill_bf16_built(void) { return BF16_BUILD; }

#define PREFILL_ENTRY bp_prefill_attention_bf16
#define PREFILL_BUILT BF16_BUILD
#define PREFILL_READY() 1
#include "cpu_prefill_entry.h"
