"""Retention: drop trace rows older than an age, and keep the file under a size.

DuckDB reuses the space of deleted rows after a checkpoint but does not shrink the file,
so a size limit stops growth rather than reclaiming disk: when the file (with its WAL)
passes `max_bytes`, the oldest `trim_fraction` of the recorded time span is deleted.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from control.trace.schema import RUNS, TABLES


@dataclass(frozen=True)
class Retention:
    max_age_s: float | None = None  # None: keep everything
    max_bytes: int | None = None  # None: no size limit
    check_every_s: float = 60.0
    trim_fraction: float = 0.2  # of the time span, deleted each time the size is over

    def validate(self) -> Retention:
        if self.max_age_s is not None and self.max_age_s <= 0:
            raise ValueError(f"trace retention max age {self.max_age_s!r} must be > 0 seconds")
        if self.max_bytes is not None and self.max_bytes < 1 << 20:
            raise ValueError(f"trace max size {self.max_bytes!r} must be at least 1 MiB")
        return self


def file_bytes(path: str) -> int:
    return sum(os.path.getsize(p) for p in (path, path + ".wal") if os.path.exists(p))


def delete_before(con, cutoff: float) -> int:
    """Delete rows of every table (runs excepted) whose time is before `cutoff`."""
    deleted = 0
    for table in TABLES.values():
        if table is RUNS:
            continue
        n = con.execute(f"DELETE FROM {table.name} WHERE {table.time_column} < ?",
                        [cutoff]).fetchone()[0]
        deleted += int(n)
    return deleted


def apply_retention(con, path: str, retention: Retention, now: float) -> int:
    """Apply both limits; the number of rows deleted."""
    deleted = 0
    if retention.max_age_s is not None:
        deleted += delete_before(con, now - retention.max_age_s)
    if retention.max_bytes is not None and file_bytes(path) > retention.max_bytes:
        lo, hi = con.execute("SELECT min(start_time), max(start_time) FROM steps").fetchone()
        if lo is not None and hi > lo:
            deleted += delete_before(con, lo + (hi - lo) * retention.trim_fraction)
    if deleted:
        con.execute("CHECKPOINT")
    return deleted
