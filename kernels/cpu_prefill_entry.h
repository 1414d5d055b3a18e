/* The exported entry of a tiled prefill unit (cpu_prefill_amx.c, cpu_prefill_bf16.c), one
   definition for both; part of the library's build hash (kernels/native_library.py). The
   unit defines, before including this:
     PREFILL_ENTRY    the function's name
     PREFILL_BUILT    1 where its tiles were built (prefill_tiled exists), else 0
     PREFILL_READY()  whether the tiles may run now (AMX: the OS granted them)
   Returns 0, or -1 (nothing written) outside the kernel's limits, where the tiles were not
   built or may not run, or when the packed contexts cannot be allocated: callers then
   keep torch's SDPA. Arguments: cpu_prefill_amx.c's header. */

int PREFILL_ENTRY(const float *q, int64_t q_stride, const uint16_t *k_cache,
                  const uint16_t *v_cache, int64_t num_chunks, const int32_t *chunk_seq,
                  const int32_t *chunk_row, const int32_t *chunk_len, const int32_t *chunk_ctx,
                  int64_t nh, int64_t kvh, int64_t d, int64_t bs, const int32_t *tables,
                  int64_t table_stride, float scale, void *out, int64_t out_bf16,
                  int64_t num_threads) {
#if PREFILL_BUILT
    if (!PREFILL_READY()) return -1;
    return prefill_tiled(q, q_stride, k_cache, v_cache, num_chunks, chunk_seq, chunk_row,
                         chunk_len, chunk_ctx, nh, kvh, d, bs, tables, table_stride, scale,
                         out, out_bf16, num_threads);
#else
    (void)q; (void)q_stride; (void)k_cache; (void)v_cache; (void)num_chunks; (void)chunk_seq;
    (void)chunk_row; (void)chunk_len; (void)chunk_ctx; (void)nh; (void)kvh; (void)d;
    (void)bs; (void)tables; (void)table_stride; (void)scale; (void)out; (void)out_bf16;
    (void)num_threads;
    return -1;
#endif
}
