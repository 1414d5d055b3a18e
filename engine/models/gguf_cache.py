"""A converted copy of each GGUF model, so that only the first load pays for GGUF parsing.

Dequantizing SmolLM2-135M's GGUF through transformers takes ~40 s on the dev VM; the same
weights as safetensors load in ~2 s. After a GGUF load in float32, the model is written
once (atomically) to $BATCHPILOT_CACHE_DIR (default ~/.cache/batchpilot), keyed by the
file's name, size and modification time; later loads read that directory. Set
BATCHPILOT_GGUF_CACHE=0 to always read the GGUF itself.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path

log = logging.getLogger(__name__)

_MARKER = ".complete"


def enabled() -> bool:
    return os.environ.get("BATCHPILOT_GGUF_CACHE", "1") != "0"


def converted_dir(gguf: Path) -> Path:
    root = Path(os.environ.get("BATCHPILOT_CACHE_DIR") or Path.home() / ".cache" / "batchpilot")
    stat = gguf.stat()
    return root / "gguf" / f"{gguf.stem}-{stat.st_size}-{stat.st_mtime_ns}"


def lookup(gguf: Path) -> Path | None:
    """The converted checkpoint directory for this GGUF file, if one is complete."""
    if not enabled():
        return None
    target = converted_dir(gguf)
    return target if (target / _MARKER).is_file() else None


def store(gguf: Path, save) -> None:
    """Write the converted checkpoint with `save(dir)`; a failure only logs (read-only home,
    full disk): serving goes on from the GGUF."""
    if not enabled():
        return
    target = converted_dir(gguf)
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        save(tmp)
        (tmp / _MARKER).write_text(str(gguf))
        if target.exists():
            shutil.rmtree(target)
        tmp.rename(target)
    except OSError as exc:
        log.warning("could not cache the converted GGUF model at %s: %s", target, exc)
