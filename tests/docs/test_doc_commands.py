"""Every command the docs show runs against today's command line.

A reader copies `batchpilot ...`, `python -m bench.X ...` and `make X` lines from README.md,
docs/ and playbooks/; a flag renamed in the code and not in the docs fails only for them.
So, from the Markdown itself:

- a command in a fenced block must parse whole with the real parser (`$VAR`s take the
  sample values below), as it would when pasted;
- a command quoted inline (`batchpilot fleet --limit`) is often a fragment, so only what
  it names must exist: its subcommands, its `--flags`, its bench module;
- a fenced `batchpilot ctl set` applies to the default config (lanes it removes aside:
  they are the reader's own);
- `make X` names a target of the Makefile;
- a serving config shown in YAML (a block with `serving:` or `lanes:` at its top) loads;
- the README's Python example runs as shown, on the bundled model.

The metrics and HTTP routes the docs name: test_doc_names.py.

Commands are parsed only: nothing runs, no server starts. The bench modules' parsers are caught at
their `parse_args` call (runpy, with the call patched to hand the parser over).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import runpy
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml

from control.cli.ctl import build_patch
from control.cli.main import build_parser, relative_times
from engine.config import LiveConfig, StaticConfig
from engine.config.patch import apply_patch
from engine.config.yaml_loader import load_config_dict
from tests.docs.doc_files import ROOT, documents

SAMPLE_ENV = {"INCIDENT_TIME": "14:02"}  # the runbooks' shell variables
FENCE = re.compile(r"^\s*```")
INLINE = re.compile(r"`((?:batchpilot|python -m bench\.|make )[^`]*)`")
SHELL_OPS = re.compile(r"\s*(?:&&|\|\||;|\|)\s*")
WORD = re.compile(r"[a-z][a-z0-9-]*")


@dataclass(frozen=True)
class Quoted:
    where: str  # file:line
    text: str
    block: bool  # in a fenced block (a whole command) or inline (maybe a fragment)


def quoted_commands(path: Path, text: str) -> list[Quoted]:
    """The commands `text` shows, one per shell command (split at && ; | ||), comments and
    the prompt's `$ ` off, a block's backslash continuations joined."""
    found, in_block, held = [], False, ""
    for number, line in enumerate(text.splitlines(), 1):
        where = f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path}:{number}"
        if FENCE.match(line):
            in_block, held = not in_block, ""
            continue
        if not in_block:
            found += [Quoted(where, m.group(1), False) for m in INLINE.finditer(line)]
            continue
        line = f"{held} {line.strip()}" if held else line.strip()
        if line.endswith("\\"):
            held = line[:-1]
            continue
        held = ""
        line = re.split(r"\s+#\s", line.removeprefix("$ "))[0]
        found += [Quoted(where, part, True) for part in SHELL_OPS.split(line)
                  if part.startswith(("batchpilot ", "python -m bench.", "make "))]
    return found


class _Caught(Exception):
    def __init__(self, parser: argparse.ArgumentParser) -> None:
        self.parser = parser


def bench_parser(module: str) -> argparse.ArgumentParser:
    """The parser `python -m <module>` builds, caught at its parse_args call."""
    def catch(self: argparse.ArgumentParser, *args: object, **kwargs: object) -> None:
        raise _Caught(self)

    saved = sys.argv
    sys.argv = [module]
    sys.modules.pop(module, None)  # run afresh as __main__, as `python -m` does
    try:
        with (pytest.MonkeyPatch.context() as patch, contextlib.redirect_stdout(io.StringIO())):
            patch.setattr(argparse.ArgumentParser, "parse_args", catch)
            patch.setattr(argparse.ArgumentParser, "parse_known_args", catch)
            runpy.run_module(module, run_name="__main__")
    except _Caught as caught:
        return caught.parser
    finally:
        sys.argv = saved
    raise AssertionError(f"python -m {module} parsed no arguments")


def problems(quoted: Quoted, make_targets: set[str]) -> str | None:
    """Why `quoted` does not run against today's code (None: it does)."""
    try:
        words = shlex.split(re.sub(r"\$\{?(\w+)\}?",
                                   lambda m: SAMPLE_ENV.get(m.group(1), m.group(0)), quoted.text))
    except ValueError as err:
        return f"not one shell command ({err})"
    if words[0] == "make":
        missing = [w for w in words[1:] if WORD.fullmatch(w) and w not in make_targets]
        return f"no Makefile target {missing}" if missing else None
    if words[0] == "python":
        module = words[2]
        if not re.fullmatch(r"bench\.[a-z_0-9]+", module):  # `python -m bench.NAME`
            return None
        if not (ROOT / f"{module.replace('.', '/')}.py").exists():
            return f"no module {module}"
        parser, args = bench_parser(module), words[3:]
    else:
        parser, args = build_parser(), relative_times(words[1:])
    if not quoted.block:
        return names_exist(parser, args)
    parsed = parse_whole(parser, args)
    if isinstance(parsed, str):
        return parsed
    return config_change_refused(parsed)


def config_change_refused(args: argparse.Namespace) -> str | None:
    """Why the default config refuses a parsed `ctl set`'s changes (None: it takes them)."""
    if getattr(args, "ctl_command", None) != "set":
        return None
    patch = build_patch(args.assignments)
    lanes = patch.get("lanes", {})
    for name in [lane for lane, value in lanes.items() if value is None]:
        del lanes[name]
    try:
        apply_patch(LiveConfig(), StaticConfig(), patch)
    except ValueError as err:
        return f"the config refuses it: {err}"
    return None


def parse_whole(parser: argparse.ArgumentParser, args: list[str]) -> argparse.Namespace | str:
    """`args` parse, each flag by its whole name (the CLI takes an unambiguous prefix, but a
    doc that shows one breaks when a longer flag comes along)."""
    for each in parsers_under(parser):
        each.allow_abbrev = False
    err = io.StringIO()
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            return parser.parse_args(args)
    except SystemExit as stop:  # --help exits 0
        return err.getvalue().strip().splitlines()[-1] if stop.code not in (0, None) else ""


def names_exist(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    """A fragment's subcommands (followed while they name one) and --flags all exist."""
    options: set[str] = set()
    for arg in args:
        options |= set(parser._option_string_actions)
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        if subs and WORD.fullmatch(arg) and arg in subs[0].choices:
            parser = subs[0].choices[arg]
    options |= set(parser._option_string_actions)
    flags = {a.strip("[]").split("=")[0] for a in args if a.strip("[").startswith("--")}
    unknown = sorted(f for f in flags if f not in options)
    return f"unknown flags {unknown}" if unknown else None


def parsers_under(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += parsers_under(sub)
    return found


def makefile_targets() -> set[str]:
    text = (ROOT / "Makefile").read_text()
    return set(re.findall(r"^([a-z][a-z0-9-]*):", text, re.M))


def test_every_documented_command_runs_against_the_code() -> None:
    targets = makefile_targets()
    quoted = [q for doc in documents() for q in quoted_commands(doc, doc.read_text())]
    assert len([q for q in quoted if q.block]) > 100, "the docs' commands were not found"
    broken = [f"{q.where}: `{q.text}`: {why}" for q in quoted
              if (why := problems(q, targets))]
    assert not broken, "commands in the docs that today's code refuses:\n" + "\n".join(broken)


def serving_configs(text: str) -> list[str]:
    """The YAML blocks of `text` that are serving configs (`serving:` or `lanes:` on top)."""
    blocks = re.findall(r"^```ya?ml\n(.*?)^```", text, re.M | re.S)
    return [b for b in blocks if re.search(r"^(serving|lanes):", b, re.M)]


def test_every_serving_config_the_docs_show_loads() -> None:
    shown = [(doc, block) for doc in documents() for block in serving_configs(doc.read_text())]
    assert shown, "README.md shows a serving config"
    for doc, block in shown:
        try:
            load_config_dict(yaml.safe_load(block))
        except ValueError as err:
            pytest.fail(f"{doc.relative_to(ROOT)} shows a config the loader refuses: {err}")


def test_the_readmes_python_example_runs_as_shown(capsys: pytest.CaptureFixture[str]) -> None:
    blocks = re.findall(r"^```python\n(.*?)^```", (ROOT / "README.md").read_text(), re.M | re.S)
    assert blocks, "the README shows the offline API in Python"
    for block in blocks:
        exec(compile(block, "README.md", "exec"), {"__name__": "readme"})
    printed = capsys.readouterr().out  # the text, its finish reason and TTFT (s)
    assert re.search(r" (stop|length) \d+\.\d+(e-\d+)?\n", printed), printed


def test_the_check_finds_a_stale_flag_a_missing_module_and_target(tmp_path: Path) -> None:
    doc = tmp_path / "stale.md"
    doc.write_text("Run `batchpilot fleet --replicas 2 --old-flag` or:\n\n```bash\n"
                   "$ batchpilot trace --url http://127.0.0.1:8000 slow --since -15m \\\n"
                   "    --lmit 3  # a comment\n"
                   "python -m bench.goodput_policy --smoke --rounds 2\n"
                   "make test && python -m bench.no_such_bench\n"
                   "make no-such-target\n"
                   "batchpilot ctl set max_num_seqs=8 lanes.interactive.slo.ttft=1\n```\n")
    found = quoted_commands(doc, doc.read_text())
    verdicts = [problems(q, makefile_targets()) for q in found]
    assert [q.text.split()[:2] for q in found] == [
        ["batchpilot", "fleet"], ["batchpilot", "trace"], ["python", "-m"], ["make", "test"],
        ["python", "-m"], ["make", "no-such-target"], ["batchpilot", "ctl"]]
    assert verdicts[0] == "unknown flags ['--old-flag']"
    assert "--lmit" in verdicts[1] and "unrecognized" in verdicts[1]
    assert "--rounds" in verdicts[2]
    assert verdicts[3] is None
    assert verdicts[4] == "no module bench.no_such_bench"
    assert verdicts[5] == "no Makefile target ['no-such-target']"
    assert verdicts[6].startswith("the config refuses it: unknown key(s) ['ttft']")
