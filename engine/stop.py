"""When a request stops after a sampled token. Stop strings are checked on text by the
detokenizing layer, which then finishes the request through the engine."""

from __future__ import annotations

from engine.request import Request, RequestStatus


def stop_status(req: Request, token_id: int, max_model_len: int) -> RequestStatus | None:
    """STOPPED for EOS (unless ignore_eos) or a stop token; LENGTH at a length limit."""
    params = req.sampling_params
    if not params.ignore_eos and token_id == req.eos_token_id:
        return RequestStatus.STOPPED
    if token_id in params.stop_token_ids:
        return RequestStatus.STOPPED
    if req.num_tokens - req.num_prompt_tokens >= params.max_tokens:
        return RequestStatus.LENGTH
    if req.num_tokens >= max_model_len:
        return RequestStatus.LENGTH
    return None
