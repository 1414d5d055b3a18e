"""Runbooks as executable steps: every ```bash block of playbooks/runbooks/*.md with the
`Prints:` line after it (the backticked fragments its output contains).

    for step in runbook_steps(path): step.command, step.expect, step.line
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

PLAYBOOKS = Path(__file__).resolve().parents[2] / "playbooks"
RUNBOOKS = PLAYBOOKS / "runbooks"
TUNING = PLAYBOOKS / "tuning.md"
BLOCK = re.compile(r"^```bash\n(?P<body>.*?)^```\n(?P<after>[^\n]*)", re.M | re.S)


@dataclass(frozen=True)
class Step:
    runbook: str
    line: int  # where the block starts, for messages
    command: str
    expect: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.runbook}:{self.line}: {self.command}"


def runbook_steps(path: Path) -> list[Step]:
    text = path.read_text()
    steps = []
    for match in BLOCK.finditer(text):
        body = re.sub(r"\\\n\s*", "", match["body"])  # join continued lines
        commands = [c for c in body.splitlines() if c.strip()
                    and not c.lstrip().startswith("#")]
        expect = tuple(re.findall(r"`([^`]+)`", match["after"])) \
            if match["after"].startswith("Prints:") else ()
        line = text.count("\n", 0, match.start()) + 1
        for command in commands:
            steps.append(Step(path.name, line, command, expect))
    return steps


def all_runbooks() -> list[Path]:
    return sorted(p for p in RUNBOOKS.glob("*.md") if p.name != "README.md")
