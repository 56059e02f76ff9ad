"""The exceptions of moeplan.torch beyond Python's own (pytorch/README.md, "Bad use")."""

from __future__ import annotations

__all__ = ["PlannerUnavailable"]


class PlannerUnavailable(ConnectionError):
    """The planner server did not answer and the Planner was told not to fall back."""
