"""Every check, registered by importing the modules that define them."""

from __future__ import annotations

from control.checklist import (  # noqa: F401  (imported for their @register)
    checks_config,
    checks_loadtest,
    checks_ops,
    checks_runtime,
    checks_whatif,
)
from control.checklist.registry import CHECKS

__all__ = ["CHECKS"]
