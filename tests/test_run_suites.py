"""make test's runner (tests/run_suites.py): every quiet file runs in exactly one stage of
the quiet phase, and nothing that starts a Ray fleet runs beside another quiet file."""

from __future__ import annotations

import run_suites


def test_every_quiet_file_runs_once_and_ray_files_never_beside_another():
    stages = run_suites.quiet_stages()
    placed = [f for stage in stages for _, files in stage.values() for f in files]
    assert sorted(placed) == run_suites.quiet_files()
    assert len(placed) == len(set(placed))
    for stage in stages:
        for marks, files in stage.values():
            assert marks == ["-m", "quiet"]
            if len(stage) > 1:  # side by side: light files only, none with a Ray fleet
                assert not [f for f in files if f.endswith("_ray.py")], stage
                assert all(run_suites.LIGHT_MARK.search((run_suites.ROOT / f).read_text())
                           for f in files), stage
    assert len(stages[-1]) <= run_suites.LIGHT_PROCESSES


def test_a_light_quiet_file_is_one_marked_so_at_module_level(tmp_path, monkeypatch):
    tests = tmp_path / "tests"
    tests.mkdir()
    (tests / "test_heavy.py").write_text("import pytest\npytestmark = pytest.mark.quiet\n")
    (tests / "test_light.py").write_text(
        "import pytest\npytestmark = pytest.mark.quiet(light=True)\n")
    (tests / "test_other_light.py").write_text(
        "import pytest\npytestmark = [pytest.mark.quiet(light=True)]\n")
    (tests / "test_loud.py").write_text("import pytest\n\ndef test_x():\n    pass\n")
    monkeypatch.setattr(run_suites, "ROOT", tmp_path)
    heavy, light = run_suites.quiet_stages()
    assert list(heavy.values()) == [(["-m", "quiet"], ["tests/test_heavy.py"])]
    assert sorted(f for _, files in light.values() for f in files) == [
        "tests/test_light.py", "tests/test_other_light.py"]
