"""Trust checks for the on-disk caches whose contents a process loads as code or weights:
the native kernel library (kernels/native_library.py) and converted GGUF models
(engine/models/gguf_cache.py).

Invariant: a cached entry is used only when it, and the directory holding it, are owned by
this process's user (os.getuid()) and writable by nobody else (mode & 0o022 == 0). Then no
other user can create, replace or rename anything in that directory between the check and
the load (root aside), so one check just before loading is enough. A shared or
world-writable cache (a /tmp path, a umask 002 leftover) would let another user plant a
library that this process dlopens, or weights that it serves.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

PRIVATE_DIR_MODE = 0o700  # new cache directories: only their owner may list or enter them
_OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH  # 0o022


def untrusted_reason(path: Path, *, follow: bool = False) -> str | None:
    """Why `path` must not be trusted (None: it may be): not owned by this user, or writable
    by group or others. follow=False judges a symbolic link itself, which is refused: what it
    points to may change under us."""
    st = os.stat(path) if follow else os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        return f"{path} is a symbolic link"
    getuid = getattr(os, "getuid", None)  # None: no POSIX owners (Windows)
    if getuid is not None and st.st_uid != getuid():
        return f"{path} is owned by uid {st.st_uid}, not by this user (uid {getuid()})"
    if st.st_mode & _OTHERS_WRITE:
        return (f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):o}); "
                "chmod go-w it or remove it")
    return None


def private_dir(path: Path) -> str | None:
    """Create directory `path` (mode 0o700; missing parents as umask allows) unless it
    exists; None when it may hold trusted entries, else why not. An existing directory is
    judged where a symbolic link leads (a configured cache may sit behind one)."""
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE, parents=True, exist_ok=True)
    except FileExistsError:
        return f"{path} is not a directory"
    if not path.is_dir():
        return f"{path} is not a directory"
    return untrusted_reason(path, follow=True)


def untrusted_tree(path: Path) -> str | None:
    """untrusted_reason for directory `path` and everything under it (None: all trusted);
    symbolic links anywhere, `path` included, are refused."""
    problem = untrusted_reason(path)
    if problem is not None:
        return problem
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            problem = untrusted_reason(Path(root) / name)
            if problem is not None:
                return problem
    return None


def make_private(path: Path) -> None:
    """chmod directory `path` and everything under it to owner-only (dirs 0o700, files
    0o600), whatever the umask that wrote them, so that untrusted_tree accepts them.
    Symbolic links are left alone (chmod would change what they point to)."""
    os.chmod(path, PRIVATE_DIR_MODE)
    for root, dirs, files in os.walk(path):
        for name in (*dirs, *files):
            entry = Path(root) / name
            if not entry.is_symlink():
                os.chmod(entry, PRIVATE_DIR_MODE if name in dirs else 0o600)
