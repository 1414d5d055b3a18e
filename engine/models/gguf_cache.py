"""A converted copy of each GGUF model, so that only the first load pays for GGUF parsing.

Dequantizing SmolLM2-135M's GGUF through transformers takes ~40 s on the dev VM; the same
weights as safetensors load in ~2 s. After a GGUF load in float32, the model is written
once (atomically) to $BATCHPILOT_CACHE_DIR (default ~/.cache/batchpilot) under gguf/,
keyed by the file's content: `{stem}-{size}-{sha256 of the whole file}`. Two files with the
same name, size and modification time but other weights (two fine-tunes of one base) get
different entries. Hashing the whole file costs 0.06-0.2 s for SmolLM2's 98 MB in the page
cache on the dev VM (0.5-1.6 GB/s, quiet to busy; a cold read is disk-bound, and a GGUF
load reads the file anyway), against ~2 s to load the converted copy; it is done once per
file per process. Set BATCHPILOT_GGUF_CACHE=0 to always read the GGUF itself.

Trust (kernels/private_cache.py): gguf/ and each converted directory are created 0o700,
the files in them 0o600; a converted directory is read only when gguf/, it and everything
in it are owned by this user and writable by nobody else. A refused one is ignored with a
warning naming the path and why (the load reads the GGUF), and the next store() replaces
it; a refused gguf/ is neither read nor written.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from kernels import private_cache

log = logging.getLogger(__name__)

_MARKER = ".complete"
_CHUNK = 1 << 20  # bytes read per hash update


def enabled() -> bool:
    return os.environ.get("BATCHPILOT_GGUF_CACHE", "1") != "0"


def _root() -> Path:
    configured = os.environ.get("BATCHPILOT_CACHE_DIR")
    return (Path(configured) if configured else Path.home() / ".cache" / "batchpilot") / "gguf"


@functools.lru_cache(maxsize=16)
def _content_digest(path: str, identity: tuple[int, ...]) -> str:
    """SHA-256 of the file's bytes. `identity` (device, inode, size, mtime and ctime in ns)
    only keys this in-process memo: a rewritten file changes its ctime, which no user can
    set, so it is hashed again."""
    del identity
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def converted_dir(gguf: Path) -> Path:
    """Where the converted copy of this GGUF file lives (whether or not it exists)."""
    st = gguf.stat()
    identity = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    digest = _content_digest(str(gguf.resolve()), identity)
    return _root() / f"{gguf.stem}-{st.st_size}-{digest}"


def lookup(gguf: Path) -> Path | None:
    """The converted checkpoint directory for this GGUF file, if one is complete and
    trusted (see the module docstring)."""
    if not enabled():
        return None
    target = converted_dir(gguf)
    if not (target / _MARKER).is_file():
        return None
    problem = (private_cache.untrusted_reason(target.parent, follow=True)
               or private_cache.untrusted_tree(target))
    if problem is not None:
        log.warning("not using the converted GGUF model at %s: %s; reading the GGUF itself",
                    target, problem)
        return None
    return target


def store(gguf: Path, save) -> None:
    """Write the converted checkpoint with `save(dir)`; a failure only logs (read-only home,
    full disk, an untrusted gguf/ directory): serving goes on from the GGUF."""
    if not enabled():
        return
    target = converted_dir(gguf)
    try:
        problem = private_cache.private_dir(target.parent)
        if problem is not None:
            raise OSError(problem)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))  # mode 0o700
        save(tmp)
        (tmp / _MARKER).write_text(str(gguf))
        private_cache.make_private(tmp)
        if os.path.lexists(target):  # set aside first: rename cannot replace a full dir
            stale = Path(tempfile.mkdtemp(dir=target.parent, prefix=".stale-"))
            os.replace(target, stale / "old")
            shutil.rmtree(stale, ignore_errors=True)
        tmp.rename(target)
    except OSError as exc:
        log.warning("could not cache the converted GGUF model at %s: %s", target, exc)
