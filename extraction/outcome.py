"""What reconciling returns (`Outcome`) and which model it may use (`LLMContext`).

Apart from extraction/reconcile.py so that extraction/forget_words.py, which the
reconciler holds, can build them without the two modules importing each other.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any


@dataclass
class Outcome:
    """What reconciliation did with one fact (or one forget / retire request)."""

    action: str  # added, reinforced, superseded, unchanged, rejected, forgotten,
    # not_forgotten, retired, skipped
    memory_id: str | None = None
    old_ids: list[str] = field(default_factory=list)
    reason: str = ""
    spaces: dict[str, str] = field(default_factory=dict)  # memory id -> its space

    def as_dict(self) -> dict[str, Any]:
        return {
            "action": self.action,
            "memory_id": self.memory_id,
            "old_ids": self.old_ids,
            "reason": self.reason,
            "spaces": self.spaces,
        }


@dataclass
class LLMContext:
    """Which model and credentials the reconciler may use for one job."""

    model: str | None = None
    credentials: dict[str, str] = field(default_factory=dict)
