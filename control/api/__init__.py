"""The OpenAI-compatible data plane, on uvicorn's event loop: where a request enters.

    routes.py         /v1/completions, /v1/chat/completions, /v1/models, /healthz, /readyz
    vllm_routes.py    vLLM's /health, /version, /tokenize, /detokenize
    schemas.py        request and response shapes (pydantic: the edge only); vLLM's in
                      vllm_schemas.py
    request_meta.py   tenant, lane, priority, deadline and timeout from headers and body
    generation.py     one admitted request's events, aborts on disconnect/timeout/idle
    responses.py      one JSON body, or server-sent events
    openai_format.py  engine events -> OpenAI bodies, SSE chunks, X-Batchpilot-* headers
    errors.py         every failure in OpenAI's error shape
    app.py            the FastAPI app: these routes plus admin/, trace/ and /metrics
"""
