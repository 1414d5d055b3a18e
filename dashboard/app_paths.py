"""The repository the dashboard runs from (for files the checklist checks: grafana/...)."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
