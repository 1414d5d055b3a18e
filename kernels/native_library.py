"""The native CPU library: every C source here (cpu_decode.c, cpu_layers.c,
cpu_quant_dot.c, cpu_elementwise.c) compiled into one shared library on first use, loaded
by ctypes, and the call into its decode attention kernel.

Why native: torch has no op that reads a paged cache in place, so the torch decode path
(kernels/cpu_attention.decode_attention) copies every decode's context out of the cache
once per layer and then runs small batched matmuls over the copy; at 64 decodes of 128
tokens (SmolLM2 shapes) the copy and the matmuls were ~85% of attention. The C kernel walks
the block table and reads each key and value row where it lies (see its header comment).

Build: `$CC -O3 -march=native -fopenmp` ($CC split like a shell: "ccache gcc" works; else
gcc or cc) into a shared library cached under $BATCHPILOT_KERNEL_CACHE (default
~/.cache/batchpilot/kernels, created 0o700), named by a hash of the sources, the flags,
the compiler's version and this CPU's features (_cpu_features: the machine, /proc/cpuinfo's
model and flags/Features, and what gcc resolves -march=native to), so a changed source,
compiler or CPU rebuilds, also in a cache shared between machines; a build takes seconds and
happens once per machine. Trust (kernels/private_cache.py): the library is loaded only
from a directory owned by this user and writable by nobody else, and only when the file
is too; a refused file is rebuilt in place, a refused directory is bypassed by a build in
a private temporary directory, each with a logged warning naming the path and why.
No torch headers are involved (ctypes, raw pointers), so any C compiler with OpenMP works.
Where there is no compiler, the build fails, or BATCHPILOT_CPU_NATIVE=0, `load()` returns
None (the reason in `unavailable_reason()`, warned once) and callers keep the torch path.

NOTE: the library links libgomp.so.1 by soname; torch's wheel ships and loads its own
libgomp.so.1 first, so the dynamic linker reuses it and torch and the kernel share one
OpenMP thread pool (two runtimes would oversubscribe the cores).
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import logging
import os
import platform
import shlex
import shutil
import subprocess
import tempfile
import warnings
from pathlib import Path

import torch

from kernels import private_cache

log = logging.getLogger(__name__)

# cpu_decode.c: decode attention; cpu_layers.c: whole small decode steps (uses the former
# and cpu_quant_dot.c, its GEMV over GGUF blocks); cpu_elementwise.c: the work between the
# projections of the other steps; cpu_amx_q4.c: decode steps' projections on AMX over GGUF
# Q4_1 and Q8_0 weights, re-laid as tiles by cpu_amx_tiles.c; cpu_prefill.c and
# cpu_prefill_amx.c and cpu_prefill_bf16.c: prefill attention (float32 FMAs, and bf16
# caches on AMX or, without it, AVX-512-BF16);
# cpu_argmax.c: the sampler's row argmax
SOURCES = tuple(Path(__file__).with_name(name) for name in
                ("cpu_decode.c", "cpu_layers.c", "cpu_quant_dot.c", "cpu_elementwise.c",
                 "cpu_prefill.c", "cpu_prefill_amx.c", "cpu_prefill_bf16.c", "cpu_amx_q4.c",
                 "cpu_amx_tiles.c", "cpu_argmax.c"))
HEADERS = tuple(Path(__file__).with_name(name) for name in  # included by the sources
                ("cpu_vector_math.h", "cpu_decode_tiled.h", "cpu_decode_amx.h",
                 "cpu_prefill_amx_pack.h", "cpu_prefill_amx_d64.h", "cpu_prefill_tiles.h",
                 "cpu_tiles_avx512.h", "cpu_decode_dpbf16.h", "cpu_prefill_entry.h"))
FLAGS = ("-O3", "-march=native", "-fopenmp", "-fno-math-errno", "-fPIC", "-shared")
NATIVE_ENV_VAR = "BATCHPILOT_CPU_NATIVE"  # "0": never build or use the native kernel
CACHE_ENV_VAR = "BATCHPILOT_KERNEL_CACHE"
CPUINFO = Path("/proc/cpuinfo")  # Linux; elsewhere the key has the machine and gcc's view
MAX_HEADS, MAX_HEADS_X_DIM = 128, 16384  # MAX_H, MAX_HD of cpu_decode.c
# False: decodes over a bf16 cache keep float32 products (the parity tests of that path;
# A/B runs). True: both products on AMX tiles where the CPU has them (cpu_decode_amx.h), else
# in AVX-512-BF16 (cpu_decode_dpbf16.h), rounding q * scale and the softmax weights to bf16
# as the prefill kernels do.
AMX_DECODE = True
# The tiles those bf16 products may take, the first that the CPU has wins: AMX
# (cpu_decode_amx.h), else VDPBF16PS (cpu_decode_dpbf16.h). Tests narrow it to one.
DECODE_TILES = ("AMX", "AVX512-BF16")
PARALLEL_MIN_WORK = 4096  # key x query-head pairs per layer: below, one thread (threads_for)

_reason: list[str] = []  # why load() returned None (one entry once it has)

_I64, _PTR, _F32 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_float
_ARGTYPES = [_PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _I64, _I64, _I64, _PTR, _I64, _PTR,
             _PTR, _PTR, _F32, _PTR, _I64]


def unavailable_reason() -> str | None:
    """Why the native kernel is not in use (None: it is, or load() was not called yet)."""
    return _reason[0] if _reason else None


def _cache_dir() -> Path:
    configured = os.environ.get(CACHE_ENV_VAR)
    return Path(configured) if configured else Path.home() / ".cache" / "batchpilot" / "kernels"


def _compiler() -> list[str] | None:
    """The compiler's argv: $CC split as a shell would ("ccache gcc" is a wrapper and its
    compiler), else gcc or cc from PATH; None when there is none."""
    configured = os.environ.get("CC", "").strip()
    if configured:
        return shlex.split(configured)
    found = shutil.which("gcc") or shutil.which("cc")
    return [found] if found else None


def _cpu_features(compiler: list[str]) -> str:
    """What -march=native builds for on this machine, on any architecture: the machine
    name, /proc/cpuinfo's model and feature lines (x86 `flags`, Arm `Features`) and the
    target options the compiler resolves -march=native to (gcc; other compilers may print
    nothing). Two CPUs sharing a cache never share a library unless all of these agree."""
    parts = [platform.machine()]
    try:
        lines = CPUINFO.read_text().splitlines()
    except OSError:
        lines = []
    for prefix in ("model name", "flags", "CPU implementer", "CPU part", "Features"):
        parts += [line for line in lines if line.startswith(prefix)][:1]  # the first CPU's
    target = subprocess.run([*compiler, "-march=native", "-Q", "--help=target"],
                            capture_output=True, text=True, check=False, timeout=60)
    if target.returncode == 0:
        parts.append(target.stdout)
    return "\n".join(parts)


def _library_name(compiler: list[str]) -> str:
    version = subprocess.run([*compiler, "--version"], capture_output=True, text=True,
                             check=False, timeout=30).stdout
    key = "\n".join([*(src.read_text() for src in (*SOURCES, *HEADERS)), " ".join(FLAGS),
                     version, _cpu_features(compiler)])
    return f"cpu_decode_{hashlib.sha256(key.encode()).hexdigest()[:16]}.so"


def _build(compiler: list[str], target: Path) -> None:
    """Compile into a temporary file in target's directory, then rename: concurrent builders
    never see half a library. The library is made 0o700 whatever the umask, so that
    private_cache accepts it."""
    fd, tmp = tempfile.mkstemp(suffix=".so", dir=target.parent)
    os.close(fd)
    try:
        done = subprocess.run([*compiler, *FLAGS, *map(str, SOURCES), "-o", tmp],
                              capture_output=True, text=True, check=False, timeout=300)
        if done.returncode != 0:
            raise RuntimeError(f"{shlex.join(compiler)} failed: {done.stderr.strip()[-500:]}")
        os.chmod(tmp, 0o700)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _open_checked(target: Path) -> ctypes.CDLL:
    """dlopen `target` only if private_cache trusts it (the caller checked its directory)."""
    problem = private_cache.untrusted_reason(target)
    if problem is not None:
        raise RuntimeError(f"refusing to load {problem}")
    return ctypes.CDLL(str(target))


def _load_cached(compiler: list[str]) -> ctypes.CDLL:
    """The library from the cache directory, built there when missing or refused. A cache
    directory that private_cache refuses is not used at all: the library is built in a
    private temporary directory, loaded, and deleted (it stays mapped), once per process."""
    cache, name = _cache_dir(), _library_name(compiler)
    problem = private_cache.private_dir(cache)
    if problem is not None:
        log.warning("not using the native kernel cache: %s; building in a private temporary"
                    " directory instead", problem)
        with tempfile.TemporaryDirectory(prefix="batchpilot-kernels-") as private:
            _build(compiler, Path(private) / name)
            return _open_checked(Path(private) / name)
    target = cache / name
    if os.path.lexists(target):
        problem = private_cache.untrusted_reason(target)
        if problem is None:
            return _open_checked(target)
        # replacing it is safe: only this user can write the directory
        log.warning("not loading the cached native kernel: %s; rebuilding it", problem)
    _build(compiler, target)
    return _open_checked(target)


@functools.cache
def load() -> ctypes.CDLL | None:
    """The compiled kernel library (built if needed), or None when it cannot be had here."""
    if os.environ.get(NATIVE_ENV_VAR, "1").strip() == "0":
        _reason.append(f"{NATIVE_ENV_VAR}=0")
        return None
    try:
        compiler = _compiler()
        if not compiler:
            raise RuntimeError("no C compiler (gcc or cc) on PATH")
        lib = _load_cached(compiler)
    except (OSError, RuntimeError, ValueError, subprocess.SubprocessError) as exc:
        _reason.append(f"native CPU decode kernel unavailable ({exc}); using the torch path")
        warnings.warn(_reason[0], stacklevel=2)
        return None
    _declare(lib)
    return lib


def _declare(lib: ctypes.CDLL) -> None:
    """Argument and return types of every exported function (ctypes checks nothing else)."""
    lib.bp_decode_attention.argtypes = _ARGTYPES
    lib.bp_decode_attention.restype = ctypes.c_int
    lib.bp_decode_layers.argtypes = [_PTR, _I64, _PTR, _PTR]
    lib.bp_decode_layers.restype = ctypes.c_int
    lib.bp_project_rows.argtypes = [_PTR, _I64, _PTR, _PTR, _I64, _I64, _I64, _PTR, _I64]
    lib.bp_project_rows.restype = ctypes.c_int
    lib.bp_dequantize_rows.argtypes = [_I64, _PTR, _I64, _I64, _PTR]
    lib.bp_dequantize_rows.restype = ctypes.c_int
    for fmt in ("q4", "q8"):
        getattr(lib, f"bp_{fmt}_tile_pack").argtypes = [_PTR, _I64, _I64, _PTR]
        getattr(lib, f"bp_{fmt}_tile_unpack").argtypes = [_PTR, _I64, _I64, _PTR]
        getattr(lib, f"bp_{fmt}_amx_matmul").argtypes = [_PTR, _I64, _I64, _PTR, _I64, _PTR,
                                                         _I64, _I64]
    lib.bp_q4_amx_ready.argtypes = []
    lib.bp_amx_decode_takes.argtypes = [_I64, _I64, _I64, _I64]
    lib.bp_dp_decode_takes.argtypes = [_I64, _I64]
    lib.bp_quant_row_bytes.argtypes = [_I64, _I64]
    lib.bp_quant_row_bytes.restype = _I64
    lib.bp_add_rmsnorm.argtypes = [_PTR, _PTR, _I64, _PTR, _F32, _PTR, _I64, _I64, _I64, _I64]
    lib.bp_silu_mul.argtypes = [_PTR, _I64, _PTR, _I64, _I64, _I64, _I64]
    lib.bp_row_argmax.argtypes = [_PTR, _I64, _I64, _PTR, _I64]
    lib.bp_rope_store.argtypes = [_PTR, _I64, _PTR, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _I64,
                                  _I64, _I64, _I64, _I64]
    lib.bp_prefill_attention.argtypes = [_PTR, _I64, _PTR, _PTR, _I64, _I64, _PTR, _PTR, _PTR,
                                         _PTR, _I64, _I64, _I64, _I64, _PTR, _I64, _F32,
                                         _PTR, _I64, _I64]
    for name in ("bp_prefill_attention_amx", "bp_prefill_attention_bf16"):
        getattr(lib, name).argtypes = [_PTR, _I64, _PTR, _PTR, _I64, _PTR, _PTR, _PTR, _PTR,
                                       _I64, _I64, _I64, _I64, _PTR, _I64, _F32, _PTR, _I64,
                                       _I64]
    lib.bp_prefill_bf16_built.argtypes = []
    for name in ("bp_add_rmsnorm", "bp_silu_mul", "bp_row_argmax", "bp_rope_store",
                 "bp_prefill_attention", "bp_prefill_attention_amx", "bp_prefill_attention_bf16",
                 "bp_prefill_bf16_built", "bp_amx_decode_takes", "bp_dp_decode_takes",
                 "bp_q4_tile_pack", "bp_q4_tile_unpack", "bp_q4_amx_ready", "bp_q4_amx_matmul",
                 "bp_q8_tile_pack", "bp_q8_tile_unpack", "bp_q8_amx_matmul"):
        getattr(lib, name).restype = ctypes.c_int


def threads_for(keys: int, num_heads: int) -> int:
    """OpenMP threads for a step whose decodes read `keys` keys in all: one below
    PARALLEL_MIN_WORK key-heads (~50 us of work), where waking a second thread costs more
    than it saves (and on a busy machine can stall far longer), else torch's thread count."""
    return 1 if keys * num_heads < PARALLEL_MIN_WORK else torch.get_num_threads()


def slots_inside(slots: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether C may write a step's K/V at `slots` (block * block_size + offset, as
    AttentionMetadata.slot_mapping): int64, contiguous, not empty, and every slot inside
    k_cache [num_blocks, block_size, ...] (torch would raise; C would write out of bounds)."""
    if slots.dtype != torch.int64 or not slots.is_contiguous() or slots.numel() == 0:
        return False
    lo, hi = torch.aminmax(slots)
    return int(lo) >= 0 and int(hi) < k_cache.shape[0] * k_cache.shape[1]


def supports(q: torch.Tensor, k_cache: torch.Tensor) -> bool:
    """Whether the kernel takes these shapes and dtypes (else the caller's torch path)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    return (k_cache.dtype in (torch.float32, torch.bfloat16) and num_heads <= MAX_HEADS
            and num_heads * head_dim <= MAX_HEADS_X_DIM and load() is not None)


def cache_mode(is_bf16: bool) -> int:
    """The kernels' cache argument: 0 float32, 1 bfloat16 with float32 products, 2 bfloat16
    with bf16 products (AMX_DECODE) on AMX, else AVX-512-BF16, where the library has them
    (else as 1), 3 the same never on AMX (DECODE_TILES narrowed to AVX512-BF16: tests)."""
    if not is_bf16:
        return 0
    if not AMX_DECODE:
        return 1
    return 3 if DECODE_TILES == ("AVX512-BF16",) else 2


def bf16_decode_tiles(kv_dtype: torch.dtype, head_dim: int) -> str | None:
    """The tiles ("AMX", "AVX512-BF16") that decodes over more than 16 keys of this cache
    take for bf16 products here, or None (float32 products): what a server's ready line
    says, by the C side's own rules (bp_amx_decode_takes, bp_dp_decode_takes)."""
    lib = load()
    if lib is None:
        return None
    mode = cache_mode(kv_dtype == torch.bfloat16)
    if lib.bp_amx_decode_takes(mode, 1, 1, head_dim) == 1:
        return "AMX"
    return "AVX512-BF16" if lib.bp_dp_decode_takes(mode, head_dim) == 1 else None


def decode_attention(lib: ctypes.CDLL, q: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, seqs: torch.Tensor, rows: torch.Tensor,
                     scale: float, out: torch.Tensor, num_threads: int) -> None:
    """out[rows[i]] = attention of q[rows[i]] over sequence seqs[i]'s whole context, in place.

    q: float32 [T, nh, d] with heads and d contiguous (q.stride(1) == d, any row stride);
    caches contiguous [num_blocks, bs, kvh, d] in float32 or bfloat16; block_tables int32
    [S, max_blocks] and context_lens int32 [S] (>= 1 where used), rows of contiguous
    memory; seqs, rows int32 [D] contiguous; out float32 contiguous [T, nh, d]. The caller
    validates shapes (cpu_attention.paged_attention); nothing else may touch these tensors
    while the kernel runs (it reads raw pointers). num_threads: OpenMP threads (1: none)."""
    num_heads, head_dim = q.shape[1], q.shape[2]
    block_size, num_kv_heads = k_cache.shape[1], k_cache.shape[2]
    status = lib.bp_decode_attention(
        q.data_ptr(), q.stride(0), k_cache.data_ptr(), v_cache.data_ptr(),
        cache_mode(k_cache.dtype == torch.bfloat16), seqs.shape[0], num_heads, num_kv_heads,
        head_dim, block_size, block_tables.data_ptr(), block_tables.stride(0),
        seqs.data_ptr(), rows.data_ptr(), context_lens.data_ptr(), scale, out.data_ptr(),
        num_threads)
    if status != 0:
        raise ValueError(f"{num_heads=} and {head_dim=} must satisfy num_heads <= {MAX_HEADS}"
                         f" and num_heads * head_dim <= {MAX_HEADS_X_DIM} (native kernel)")
