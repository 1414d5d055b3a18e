"""The native kernel cache (kernels/native_library.py, kernels/private_cache.py) never dlopens a
library that another user could have written, keys libraries by the CPU's features on
every architecture, and builds with a $CC that carries arguments ("ccache gcc").

Most tests build with a fake compiler (a shell script that writes a marker into its -o
file) and record what ctypes.CDLL is asked to open, so they need no C compiler; the
$CC-with-arguments test runs the real gcc (skipped only where there is none, outside CI).
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import stat
from pathlib import Path
from unittest import mock

import pytest
from fixtures.native_build import reload_native as reload_any

from kernels import native_library, private_cache

FRESH = b"fresh build\n"  # what the fake compiler writes into its -o file
FAKE_CC = """#!/bin/sh
out=""
while [ $# -gt 0 ]; do
  [ "$1" = "-o" ] && out="$2"
  shift
done
[ -n "$out" ] && printf 'fresh build\\n' > "$out"
exit 0
"""


def script(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(0o755)
    return path


def reload_native(monkeypatch, **env):
    """The shared reload (tests/fixtures/native_build.py) with the native path switched on."""
    return reload_any(monkeypatch, **{native_library.NATIVE_ENV_VAR: "1", **env})


@pytest.fixture
def opened(monkeypatch, tmp_path):
    """Builds with the fake compiler; returns the list of (path, bytes, mode) that
    ctypes.CDLL was asked to open (it opens nothing)."""
    calls = []

    def fake_cdll(name, *args, **kwargs):
        st = os.stat(name)
        calls.append((Path(name), Path(name).read_bytes(), stat.S_IMODE(st.st_mode)))
        return mock.MagicMock()

    monkeypatch.setattr(native_library.ctypes, "CDLL", fake_cdll)
    monkeypatch.setenv("CC", str(script(tmp_path / "bin" / "fakecc", FAKE_CC)))
    return calls


@pytest.mark.parametrize("mode", [0o660, 0o606], ids=["group-writable", "world-writable"])
def test_writable_library_is_rebuilt_not_loaded(monkeypatch, tmp_path, opened, caplog, mode):
    cache = tmp_path / "kernels"
    lib, _ = reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(cache))
    assert lib is not None
    [built] = cache.glob("cpu_decode_*.so")
    built.write_bytes(b"planted by another user")
    built.chmod(mode)
    with caplog.at_level(logging.WARNING, logger=native_library.__name__):
        lib, reason = reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(cache))
    assert lib is not None and reason is None
    path, content, loaded_mode = opened[-1]
    assert (path, content) == (built, FRESH)  # rebuilt in place, then loaded
    assert loaded_mode & 0o022 == 0
    assert all(content != b"planted by another user" for _, content, _ in opened)
    assert str(built) in caplog.text and "writable by group or others" in caplog.text
    assert stat.S_IMODE(cache.stat().st_mode) == 0o700  # as created


@pytest.mark.parametrize("mode", [0o777, 0o770], ids=["world-writable", "group-writable"])
def test_shared_cache_directory_is_not_used(monkeypatch, tmp_path, opened, caplog, mode):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(mode)
    with caplog.at_level(logging.WARNING, logger=native_library.__name__):
        lib, reason = reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(shared))
    assert lib is not None and reason is None  # built in a private temporary directory
    [(path, content, loaded_mode)] = opened
    assert shared not in path.parents and content == FRESH and loaded_mode & 0o022 == 0
    assert not path.exists()  # the temporary copy is gone; the mapping stays
    assert list(shared.iterdir()) == []  # nothing built where others could swap it
    assert str(shared) in caplog.text and "writable by group or others" in caplog.text


def test_library_of_another_user_is_not_loaded(monkeypatch, tmp_path, opened):
    cache = tmp_path / "kernels"
    assert reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(cache))[0] is not None
    opened.clear()
    [built] = cache.glob("cpu_decode_*.so")
    assert private_cache.untrusted_reason(built) is None
    owner = built.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)  # now every file is another's
    assert f"owned by uid {owner}" in private_cache.untrusted_reason(built)
    with pytest.warns(UserWarning, match="native CPU decode kernel unavailable"):
        lib, reason = reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(cache))
    assert lib is None and opened == []
    assert f"owned by uid {owner}, not by this user" in reason


ARM_CPUINFO = "processor\t: 0\nBogoMIPS\t: 50.00\nFeatures\t: fp asimd evtstrm {}\n"


def test_library_name_follows_the_cpu_features(monkeypatch, tmp_path):
    compiler = [str(script(tmp_path / "cc", "#!/bin/sh\necho cc 1.0\n"))]
    monkeypatch.setattr(native_library, "CPUINFO", tmp_path / "cpuinfo")
    names = {}
    for machine, extra in [("aarch64", ""), ("aarch64", "sve"), ("x86_64", "")]:
        monkeypatch.setattr(native_library.platform, "machine", lambda m=machine: m)
        (tmp_path / "cpuinfo").write_text(ARM_CPUINFO.format(extra))
        assert f"fp asimd evtstrm {extra}" in native_library._cpu_features(compiler)
        names[machine, extra] = native_library._library_name(compiler)
    assert len(set(names.values())) == 3  # any feature or machine differs: another library
    assert native_library._library_name(compiler) == names["x86_64", ""]  # and stable


def test_a_cache_directory_behind_a_symbolic_link_is_used(monkeypatch, tmp_path, opened,
                                                          caplog):
    """BATCHPILOT_KERNEL_CACHE may name a symbolic link to a private directory (a cache on
    another disk): the library is built and kept there, not rebuilt in a temporary
    directory by every process."""
    real = tmp_path / "disk" / "kernels"
    real.mkdir(parents=True)
    real.chmod(0o700)
    link = tmp_path / "kernels"
    link.symlink_to(real)
    with caplog.at_level(logging.WARNING, logger=native_library.__name__):
        lib, reason = reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(link))
    assert lib is not None and reason is None
    [(path, content, _)] = opened
    assert path.parent == link and content == FRESH
    assert [p.name for p in real.iterdir()] == [path.name]
    assert "not using the native kernel cache" not in caplog.text


def test_a_library_that_is_a_symbolic_link_is_rebuilt_not_followed(monkeypatch, tmp_path,
                                                                   opened, caplog):
    """A cached library replaced by a symbolic link is not loaded through it (what a link
    points to may change under us): it is rebuilt in place, with a warning."""
    cache = tmp_path / "kernels"
    assert reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(cache))[0] is not None
    [built] = cache.glob("cpu_decode_*.so")
    elsewhere = tmp_path / "elsewhere.so"
    elsewhere.write_bytes(b"linked library")
    elsewhere.chmod(0o700)
    built.unlink()
    built.symlink_to(elsewhere)
    opened.clear()
    with caplog.at_level(logging.WARNING, logger=native_library.__name__):
        lib, reason = reload_native(monkeypatch, BATCHPILOT_KERNEL_CACHE=str(cache))
    assert lib is not None and reason is None
    [(path, content, _)] = opened
    assert path == built and content == FRESH and not built.is_symlink()
    assert "is a symbolic link" in caplog.text


X86_CPUINFO = "processor\t: 0\nmodel name\t: AMD EPYC 9R14\nflags\t\t: fpu sse2 avx2 {}\n"


def test_library_name_follows_the_x86_flags(monkeypatch, tmp_path):
    """Two x86 machines of one model name whose flags differ (a VM with AVX-512 masked) get
    different libraries: one built with -march=native for the other could SIGILL."""
    compiler = [str(script(tmp_path / "cc", "#!/bin/sh\necho cc 1.0\n"))]
    monkeypatch.setattr(native_library, "CPUINFO", tmp_path / "cpuinfo")
    monkeypatch.setattr(native_library.platform, "machine", lambda: "x86_64")
    names = set()
    for extra in ("", "avx512f avx512_bf16"):
        (tmp_path / "cpuinfo").write_text(X86_CPUINFO.format(extra))
        names.add(native_library._library_name(compiler))
    assert len(names) == 2


def test_library_name_follows_the_headers(monkeypatch, tmp_path):
    """A changed header the sources include is a new library, as a changed source is: a
    cached build of the old header is never loaded for the new one."""
    compiler = [str(script(tmp_path / "cc", "#!/bin/sh\necho cc 1.0\n"))]
    header = tmp_path / "cpu_vector_math.h"
    monkeypatch.setattr(native_library, "HEADERS", (header,))
    names = set()
    for body in ("#define ROW 1\n", "#define ROW 2\n"):
        header.write_text(body)
        names.add(native_library._library_name(compiler))
    assert len(names) == 2


@pytest.mark.skipif(shutil.which("gcc") is None and not os.environ.get("CI"),
                    reason="no gcc on PATH (CI has one: there this test must run)")
def test_cc_with_a_wrapper_argument_builds(monkeypatch, tmp_path):
    # As CC="ccache gcc": a wrapper whose first argument is the compiler; the wrapper's own
    # path holds a space, quoted as a shell would.
    calls = tmp_path / "calls"
    wrapper = script(tmp_path / "cc wrapper" / "wrap.sh",
                     f'#!/bin/sh\necho "$@" >> {shlex.quote(str(calls))}\nexec "$@"\n')
    cache = tmp_path / "kernels"
    lib, reason = reload_native(monkeypatch, CC=shlex.join([str(wrapper), "gcc"]),
                                BATCHPILOT_KERNEL_CACHE=str(cache))
    assert lib is not None, reason
    assert hasattr(lib, "bp_decode_attention")
    assert len(list(cache.glob("cpu_decode_*.so"))) == 1
    assert any(line.startswith("gcc -O3") for line in calls.read_text().splitlines())
