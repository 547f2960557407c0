"""What the loop asks of an agent: rebuild itself from a run's log, then act one step at a time.

The loop owns the budget, the log and the judge (through ``Toolbox``); an agent only decides
what to call next. Keeping all of an agent's state derivable from the log is what makes a run
resumable after ``kill -9``.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # pragma: no cover
    from ..tools import Toolbox


class Agent(ABC):
    """Writes candidates and asks for their evaluation through a ``Toolbox``."""

    name: str = "agent"

    @abstractmethod
    def restore(self, events: list[dict]) -> None:
        """Rebuild state from a run's events (all of them, also for a fresh run's set-up)."""

    @abstractmethod
    def act(self, tools: "Toolbox") -> bool:
        """Make one or more tool calls; return False when there is nothing left to try.

        ``tools.call`` raises ``BudgetExhausted`` when the budget is spent; let it propagate.
        """
