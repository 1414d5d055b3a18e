"""The Markdown a reader follows: the README, docs/ and the playbooks (runbooks included)."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "playbooks").rglob("*.md"))]
