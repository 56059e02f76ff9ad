"""The MoE layer schedules' names, defined once for the Python side.

The planner's schedules (docs/notation.md) by the short names the CLI spells
(`--schedules default,s1,s2`, `--moe-schedule s2`), each with its
`moeplan.v1.Schedule` enum name ("SCHEDULE_S2"), as the server's JSON answers
carry them. `moeplan_client` (the gRPC client) and `moeplan.torch` (the PyTorch
layer) both import this module; it imports nothing, so either can use it
without the other (and without gRPC). The build copies it next to
`moeplan_client.py` in `build/client/python`.
"""

from __future__ import annotations

from typing import Dict, Tuple

__all__ = ["SCHEDULE_ENUM_NAMES", "SCHEDULES", "AUTO", "ESP_IS_MP", "enum_name",
           "short_name", "one_of"]

# Short name -> moeplan.v1.Schedule enum name, in the planner's order.
SCHEDULE_ENUM_NAMES: Dict[str, str] = {
    "default": "SCHEDULE_DEFAULT",
    "s1": "SCHEDULE_S1",
    "s2": "SCHEDULE_S2",
}

# The schedules a layer can run: ("default", "s1", "s2").
SCHEDULES: Tuple[str, ...] = tuple(SCHEDULE_ENUM_NAMES)

# Not a schedule: "ask the planner which one" (moeplan.torch.MoE(schedule="auto")).
AUTO = "auto"

# The schedules whose ESP group is the MP group: they need esp == mp.
ESP_IS_MP: Tuple[str, ...] = ("s1", "s2")

_ENUM_TO_SHORT = {enum: short for short, enum in SCHEDULE_ENUM_NAMES.items()}


def enum_name(short: str) -> str:
    """"SCHEDULE_S2" for "s2" (a short name, lower case); KeyError otherwise."""
    return SCHEDULE_ENUM_NAMES[short]


def short_name(enum: str) -> str:
    """"s2" for "SCHEDULE_S2"; ValueError for a name with no short name."""
    try:
        return _ENUM_TO_SHORT[enum]
    except KeyError:
        raise ValueError(f"schedule: no short name for {enum}") from None


def one_of(names: Tuple[str, ...] = SCHEDULES) -> str:
    """"default, s1 or s2": the names for an error message."""
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} or {names[-1]}"
