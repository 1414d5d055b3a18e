"""The executor over a real model: flatten a step's batch, run one forward, sample.

Batch layout (T tokens from S sequences, concatenated):

    | decode 0 | decode 1 | ... | prefill chunk 0 ........ | prefill chunk 1 .. |
      1 token    1 token          n_0 tokens                 n_1 tokens

Sample rows: every decode, then the last token of each prefill chunk that reaches its
request's last known token. The model runner owns only weights, KV tensors and device
state; which tokens run is the scheduler's decision.
"""

from __future__ import annotations

import torch

from engine.models import LoadedModel, allocate_kv_caches, build_attention_metadata
from engine.records import SchedulerOutput
from engine.request import Request
from engine.sampler import sample

CPU_KV_CACHE_BYTES = 1 << 30  # KV pool on CPU when not sized explicitly
GPU_MEMORY_UTILIZATION = 0.85  # share of free GPU memory given to the KV pool


def kv_block_bytes(loaded: LoadedModel, block_size: int) -> int:
    """Bytes of one block over all layers, K and V."""
    model = loaded.model
    itemsize = torch.empty((), dtype=loaded.dtype).element_size()
    return 2 * model.num_layers * block_size * model.num_kv_heads * model.head_dim * itemsize


def auto_num_kv_blocks(loaded: LoadedModel, block_size: int) -> int:
    """Blocks that fit the memory left for the KV pool: free GPU memory, or 1 GiB on CPU."""
    if loaded.device.type == "cuda":
        free, _total = torch.cuda.mem_get_info(loaded.device)
        budget = int(free * GPU_MEMORY_UTILIZATION)
    else:
        budget = CPU_KV_CACHE_BYTES
    return max(1, budget // kv_block_bytes(loaded, block_size))


class ModelRunner:
    def __init__(self, loaded: LoadedModel, num_kv_blocks: int, block_size: int):
        self.loaded = loaded
        self.model = loaded.model
        self.device = loaded.device
        self.block_size = block_size
        self.num_kv_blocks = num_kv_blocks
        self.kv_caches = allocate_kv_caches(
            self.model.num_layers, num_kv_blocks, block_size, self.model.num_kv_heads,
            self.model.head_dim, loaded.dtype, self.device)

    def execute(self, out: SchedulerOutput) -> list[int]:
        """Run the step's batch; one sampled token per sample row."""
        input_ids, tables, context_lens, query_lens = [], [], [], []
        rows: list[int] = []  # index in the flat batch of each sample row
        sample_requests: list[Request] = []
        for req in out.decodes:
            rows.append(len(input_ids))
            input_ids.append(req.token_ids[req.num_computed_tokens])
            tables.append(req.block_ids)
            context_lens.append(req.num_computed_tokens + 1)
            query_lens.append(1)
            sample_requests.append(req)
        for chunk in out.prefills:
            req, start = chunk.request, chunk.request.num_computed_tokens
            input_ids.extend(req.token_ids[start:start + chunk.num_tokens])
            tables.append(req.block_ids)
            context_lens.append(start + chunk.num_tokens)
            query_lens.append(chunk.num_tokens)
            if chunk.sample:
                rows.append(len(input_ids) - 1)
                sample_requests.append(req)
        positions, meta = build_attention_metadata(tables, context_lens, query_lens,
                                                   self.block_size, self.device)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        with torch.inference_mode():
            hidden = self.model(ids, positions, self.kv_caches, meta)  # [T, D]
            if not rows:
                return []
            index = torch.tensor(rows, dtype=torch.int64, device=self.device)
            logits = self.model.compute_logits(hidden.index_select(0, index))  # [R, V]
            return sample(logits, sample_requests)
