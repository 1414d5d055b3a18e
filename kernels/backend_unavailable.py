"""The error every attention backend raises when it cannot run here (no triton, no CUDA,
no interpreter): its message names the fix. Its own module, below both the backend choice
(kernels/backends.py) and the Triton backend that raise it."""

from __future__ import annotations


class BackendUnavailableError(RuntimeError):
    """The requested attention backend cannot run here (no triton, no CUDA, no interpreter);
    the message names the fix."""
