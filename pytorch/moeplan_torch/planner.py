"""`Planner`: answers `schedule="auto"` — moeplan-server through the Python
client, or the planner inside the extension on a local profile — on rank 0, and
broadcasts the answer to every rank."""

from __future__ import annotations

import json
import warnings
from typing import Any, Dict, Optional, Tuple

import moeplan_schedules

from ._native import _C
from .errors import PlannerUnavailable
from .process_group import world

__all__ = ["Planner", "canonical_json"]


def canonical_json(layer: Dict[str, Any]) -> str:
    """A LayerConfig dict as the extension and the cache keys take it."""
    return json.dumps(layer, sort_keys=True, separators=(",", ":"))


class Planner:
    """Answers `schedule="auto"`: which schedule is fastest for a layer.

    Rank 0 asks — moeplan-server at `server` if given, else the planner in
    this process on `profile` (a built-in profile name or a profile JSON
    file) — once per layer shape, and broadcasts the answer, so every rank
    runs the same schedule. If the server does not answer, the local profile
    plans instead with a warning, or PlannerUnavailable is raised when
    `fallback` is False.
    """

    def __init__(self, server: Optional[str] = None, profile: str = "a100-8x8",
                 fallback: bool = True, timeout_s: float = 10.0,
                 tls_ca: Optional[str] = None, token_file: Optional[str] = None):
        if not isinstance(profile, str) or not profile:
            raise ValueError("Planner.profile: must be a profile name or a profile file path")
        if timeout_s <= 0:
            raise ValueError(f"Planner.timeout_s: must be > 0 (got {timeout_s})")
        self.server = server
        self.profile = profile
        self.fallback = bool(fallback)
        self.timeout_s = float(timeout_s)
        self.tls_ca = tls_ca
        self.token_file = token_file
        self._cache: Dict[str, Dict[str, Any]] = {}
        self._client = None

    def client(self):
        """A moeplan_client.PlannerClient on `server` (None without one)."""
        if self.server is None:
            return None
        if self._client is None:
            import moeplan_client  # the Python client, next to this package
            self._client = moeplan_client.PlannerClient(self.server, timeout_s=self.timeout_s,
                                                         tls_ca=self.tls_ca, token_file=self.token_file)
        return self._client

    def _ask(self, layer: Dict[str, Any], schedules: Tuple[str, ...]) -> Dict[str, Any]:
        """This rank's answer: {"plan": PlanLayerResponse dict, "source": ...}."""
        if self.server is not None:
            try:
                import moeplan_client
                plan = self.client().plan_layer(layer, self.profile, schedules=list(schedules))
                return {"plan": plan, "source": f"server {self.server}"}
            except moeplan_client.PlannerError as e:
                if e.code != "UNAVAILABLE" and e.code != "DEADLINE_EXCEEDED":
                    # The server answered: the request is wrong, not the link.
                    return {"error": f"{e.code}: {e.message}", "kind": "value"}
                if not self.fallback:
                    return {"error": f"moeplan.torch: the planner server {self.server} did not "
                                     f"answer ({e.code}: {e.message})", "kind": "unavailable"}
                warnings.warn(f"moeplan.torch: the planner server {self.server} did not answer "
                              f"({e.code}); planning with the local profile {self.profile!r}",
                              RuntimeWarning, stacklevel=4)
        try:
            plan = json.loads(_C.plan_layer(canonical_json(layer), self.profile, list(schedules)))
        except (ValueError, KeyError) as e:
            return {"error": str(e), "kind": "value"}
        return {"plan": plan, "source": f"local profile {self.profile}"}

    def plan(self, layer: Dict[str, Any], schedules: Tuple[str, ...] = ()) -> Dict[str, Any]:
        """The plan for `layer` under `schedules` (empty: the planner's own
        set, which leaves out S1/S2 where they equal the default, mp = 1);
        collective over the MPI world: rank 0 asks, every rank gets its
        answer: {"schedule" (the fastest), "plan", "source"}."""
        schedules = tuple(schedules)
        key = canonical_json(layer) + "|" + ",".join(schedules)
        if key not in self._cache:
            rank, _ = world()
            mine = ""
            if rank == 0:
                try:
                    mine = json.dumps(self._ask(layer, schedules))
                except Exception as e:  # noqa: BLE001  (every rank must hear about it)
                    mine = json.dumps({"error": f"{type(e).__name__}: {e}", "kind": "value"})
            answer = json.loads(_C.broadcast(mine.encode(), 0).decode())
            if "error" in answer:
                if answer["kind"] == "unavailable":
                    raise PlannerUnavailable(answer["error"])
                raise ValueError(f"moeplan.torch: planning failed: {answer['error']}")
            best = answer["plan"]["best_schedule"]
            answer["schedule"] = moeplan_schedules.short_name(best)
            self._cache[key] = answer
        return self._cache[key]

    def predict(self, layer: Dict[str, Any], schedule: str) -> Dict[str, Any]:
        """The planner's candidate for `schedule` on `layer` (a CandidatePlan
        dict: total_us, forward_us, ...), asked for by name where the plan of
        the planner's own set does not hold it (collective, like plan)."""
        if schedule not in moeplan_schedules.SCHEDULES:
            raise ValueError(f"Planner.predict: schedule must be {moeplan_schedules.one_of()} "
                             f"(got {schedule!r})")
        want = moeplan_schedules.enum_name(schedule)
        for schedules in ((), (schedule,)):
            for c in self.plan(layer, schedules)["plan"]["candidates"]:
                if c["schedule"] == want:
                    return c
        raise ValueError(f"Planner.predict: the planner has no {schedule} plan for the layer")

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None
