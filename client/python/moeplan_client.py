"""A thin Python client of the moeplan.v1.Planner gRPC service (docs/service.md).

Messages go in and come out as plain dicts in protobuf's JSON mapping with the
.proto field names (snake_case), exactly as `moeplan plan-layer --format json`
prints them:

- every scalar field is present, defaults included (0, 0.0, "", false);
- enums are their names ("SCHEDULE_S2", "PROFILE_SOURCE_SPEC");
- 64-bit integers (e.g. `inter_node_bytes`, `bytes`, `tokens`) are *strings*,
  as the JSON mapping prescribes; convert with int() where you need numbers.

Units follow the .proto files: times in microseconds (`*_us`), sizes in bytes
(`*_bytes`), layer dimensions in elements.

Needs the generated stubs (`moeplan/v1/*_pb2.py`, `service_pb2_grpc.py`), which the
CMake target `moeplan_python_stubs` writes to `build/client/python/` together with
a copy of this file. If `moeplan.v1` is not importable as-is, this module looks in
the directories of $MOEPLAN_PYTHONPATH (os.pathsep-separated), then next to itself,
then in `<repo>/build/client/python`. Use Debian's /usr/bin/python3 (it sees
python3-grpcio and python3-protobuf).

    from moeplan_client import PlannerClient, PlannerError

    with PlannerClient("127.0.0.1:50051") as client:
        plan = client.plan_layer(layer_dict, profile="a100-8x8")
        print(plan["best_schedule"], plan["candidates"][0]["total_us"])
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any, Iterable, Mapping, Optional, Sequence, Tuple, Union

# The schedules' short names ("default", "s1", "s2") and enum names, defined once
# for this client and moeplan.torch: moeplan_schedules.py, next to this file (here
# and in build/client/python).
import moeplan_schedules

try:
    import grpc
    from google.protobuf import json_format
except ImportError as e:  # pragma: no cover - environment problem
    raise ImportError(
        f"moeplan_client needs grpcio and protobuf ({e}); on Debian install python3-grpcio "
        "and python3-protobuf and run /usr/bin/python3") from e

_STUB_MARKER = os.path.join("moeplan", "v1", "service_pb2_grpc.py")


def _stub_candidates() -> list:
    here = os.path.dirname(os.path.abspath(__file__))
    dirs = [d for d in os.environ.get("MOEPLAN_PYTHONPATH", "").split(os.pathsep) if d]
    dirs.append(here)  # the copy in build/client/python sits next to the stubs
    # client/python/moeplan_client.py -> <repo>/build/client/python
    dirs.append(os.path.join(os.path.dirname(os.path.dirname(here)), "build", "client", "python"))
    return dirs


def _import_stubs():
    try:
        from moeplan.v1 import layer_pb2, model_pb2, plan_pb2, profile_pb2, service_pb2, service_pb2_grpc
    except ImportError:
        tried = _stub_candidates()
        for d in tried:
            if os.path.isfile(os.path.join(d, _STUB_MARKER)):
                sys.path.insert(0, os.path.abspath(d))
                break
        else:
            raise ImportError(
                "moeplan_client: generated stubs (moeplan/v1/*_pb2.py) not found on sys.path nor in "
                + ", ".join(tried)
                + "; build them with `ninja -C build moeplan_python_stubs` and set "
                "MOEPLAN_PYTHONPATH=build/client/python") from None
        from moeplan.v1 import layer_pb2, model_pb2, plan_pb2, profile_pb2, service_pb2, service_pb2_grpc
    return layer_pb2, model_pb2, plan_pb2, profile_pb2, service_pb2, service_pb2_grpc


layer_pb2, model_pb2, plan_pb2, profile_pb2, service_pb2, service_pb2_grpc = _import_stubs()

__all__ = ["PlannerClient", "PlannerError", "schedule_enum", "schedule_short_name"]

DEFAULT_PROFILE = "a100-8x8"


def schedule_enum(schedule: Union[str, int]) -> int:
    """Schedule enum value of `schedule`: "default"/"s1"/"s2" (any case), an enum
    name such as "SCHEDULE_S2", or an int enum value. Raises ValueError otherwise."""
    if isinstance(schedule, int) and not isinstance(schedule, bool):
        if schedule in plan_pb2.Schedule.values() and schedule != plan_pb2.SCHEDULE_UNSPECIFIED:
            return schedule
        raise ValueError(f"schedule: unknown value {schedule}")
    if isinstance(schedule, str):
        name = moeplan_schedules.SCHEDULE_ENUM_NAMES.get(schedule.lower(), schedule.upper())
        if name in plan_pb2.Schedule.keys() and name != "SCHEDULE_UNSPECIFIED":
            return plan_pb2.Schedule.Value(name)
    raise ValueError(f"schedule: must be one of {', '.join(moeplan_schedules.SCHEDULES)} "
                     f"(got {schedule!r})")


def schedule_short_name(schedule: Union[str, int]) -> str:
    """"default", "s1" or "s2" for an enum name ("SCHEDULE_S2") or value."""
    value = schedule_enum(schedule)
    return moeplan_schedules.short_name(plan_pb2.Schedule.Name(value))


class PlannerError(Exception):
    """A failed call: the gRPC status code name and the server's one-line message.

    Attributes:
        code: the status code name, e.g. "INVALID_ARGUMENT", "NOT_FOUND",
            "FAILED_PRECONDITION", "UNAVAILABLE", "DEADLINE_EXCEEDED".
        message: the server's message, naming the field and the rule, e.g.
            "layer.top_k: must be <= num_experts (got top_k=4, num_experts=2)".
        method: the RPC, e.g. "PlanLayer".

    A dict that does not parse as the request message (unknown field, wrong type)
    raises PlannerError with code "INVALID_ARGUMENT" before anything is sent.
    """

    def __init__(self, code: str, message: str, method: str = ""):
        self.code = code
        self.message = " ".join(message.split("\n")).strip()
        self.method = method
        super().__init__(f"{code}: {self.message}")


def _parse(value: Mapping[str, Any], message, field: str):
    """ParseDict with unknown fields rejected; errors become PlannerError."""
    if not isinstance(value, Mapping):
        raise PlannerError("INVALID_ARGUMENT", f"{field}: must be a JSON object (a dict), got "
                           f"{type(value).__name__}")
    try:
        return json_format.ParseDict(value, message, ignore_unknown_fields=False)
    except json_format.ParseError as e:
        # protobuf appends the list of available fields; keep the first sentence.
        text = str(e).split("\n")[0].split("  Available Fields")[0].strip()
        raise PlannerError("INVALID_ARGUMENT", f"{field}: {text}") from None


def _to_dict(message) -> dict:
    return json_format.MessageToDict(message, including_default_value_fields=True,
                                     preserving_proto_field_name=True)


# gRPC's retry policy for the idempotent methods (the C++ client's, too).
_SERVICE_CONFIG = json.dumps({"methodConfig": [{
    "name": [{"service": "moeplan.v1.Planner", "method": m}
             for m in ("PlanLayer", "PlanModel", "ListProfiles", "GetProfile", "PutProfile")],
    "retryPolicy": {"maxAttempts": 5, "initialBackoff": "1s", "maxBackoff": "4s",
                    "backoffMultiplier": 2, "retryableStatusCodes": ["UNAVAILABLE"]},
}]})


class PlannerClient:
    """Client of one moeplan-server.

    Args:
        address: "host:port" (e.g. "127.0.0.1:50051") or "unix:PATH".
        timeout_s: deadline of every call, in seconds.
        tls_ca: path of the PEM CA certificate that signed the server's
            certificate (moeplan-server --tls-cert): the channel is TLS. None:
            plaintext (a loopback server without TLS).
        token_file: path of a file whose first line is the server's bearer token
            (moeplan-server --token-file), sent with every call. PutProfile and
            ReportMeasurement need it on a server that has one.
        max_message_mib: largest response accepted (the server's --max-message-mib).

    Idempotent calls (plans, list, get, put_profile) are retried with
    exponential backoff while the server is UNAVAILABLE (e.g. restarting): up
    to 5 attempts, 1 s doubling to 4 s (jittered: ~5 s in all), within timeout_s.
    report_measurement appends and refit_profile stores a version, so neither is
    retried.

    Use as a context manager, or call close(), to release the channel.
    """

    def __init__(self, address: str, timeout_s: float = 10.0, tls_ca: Optional[str] = None,
                 token_file: Optional[str] = None, max_message_mib: int = 64):
        if timeout_s <= 0:
            raise ValueError(f"timeout_s: must be > 0 (got {timeout_s})")
        self.address = address
        self.timeout_s = float(timeout_s)
        self._metadata: Tuple[Tuple[str, str], ...] = ()
        if token_file is not None:
            try:
                with open(token_file, encoding="ascii") as f:
                    token = f.readline().rstrip("\r\n ")
            except (OSError, UnicodeDecodeError) as e:
                raise ValueError(f"token_file: cannot read {token_file}: {e}") from None
            if not token:
                raise ValueError(f"token_file: {token_file} holds no token on its first line")
            self._metadata = (("authorization", f"Bearer {token}"),)
        options = [("grpc.service_config", _SERVICE_CONFIG), ("grpc.enable_retries", 1),
                   ("grpc.initial_reconnect_backoff_ms", 100),
                   ("grpc.min_reconnect_backoff_ms", 100), ("grpc.max_reconnect_backoff_ms", 1000),
                   ("grpc.max_receive_message_length", int(max_message_mib) << 20)]
        if tls_ca is not None:
            try:
                with open(tls_ca, "rb") as f:
                    root = f.read()
            except OSError as e:
                raise ValueError(f"tls_ca: cannot read {tls_ca}: {e}") from None
            if b"-----BEGIN CERTIFICATE-----" not in root:
                raise ValueError(f"tls_ca: {tls_ca} holds no PEM certificate")
            creds = grpc.ssl_channel_credentials(root_certificates=root)
            self._channel = grpc.secure_channel(address, creds, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        self._stub = service_pb2_grpc.PlannerStub(self._channel)
        self._closed = False

    # -- lifetime ---------------------------------------------------------------

    def close(self) -> None:
        """Closes the channel; idempotent. Calls after close() raise ValueError."""
        if not self._closed:
            self._closed = True
            self._channel.close()

    def __enter__(self) -> "PlannerClient":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _call(self, method: str, request):
        if self._closed:
            raise ValueError("PlannerClient: the channel is closed")
        try:
            return getattr(self._stub, method)(request, timeout=self.timeout_s,
                                               metadata=self._metadata)
        except grpc.RpcError as e:
            code = e.code() if hasattr(e, "code") else None
            details = e.details() if hasattr(e, "details") else str(e)
            raise PlannerError(code.name if code is not None else "UNKNOWN", details or "",
                               method) from None

    # -- Planner ----------------------------------------------------------------

    def plan_layer(self, layer: Mapping[str, Any],
                   profile: Union[str, Mapping[str, Any]] = DEFAULT_PROFILE,
                   schedules: Optional[Iterable[Union[str, int]]] = None,
                   include_timeline: bool = False) -> dict:
        """Plans one MoE layer: PlanLayer.

        Args:
            layer: a moeplan.v1.LayerConfig as a dict (the layer JSON files' fields:
                batch_size, seq_len, model_dim, hidden_dim, num_experts, top_k,
                capacity_factor, optional bytes_per_element, token_skew, and
                parallel {mp, ep, esp, dp?, pp?}). Unknown fields are rejected.
            profile: a built-in or stored profile name ("a100-8x8", "h100-8x8",
                "h200-8x8", "b200-8x8", "gb200-nvl72", ...; list_profiles lists them,
                or one put with put_profile), or a whole ClusterProfile dict sent
                inline (not stored).
            schedules: schedules to plan, "default"/"s1"/"s2" or enum names;
                None or empty: all three.
            include_timeline: also return every candidate's op timeline
                (candidates[].ops, start_us/end_us in microseconds).

        Returns:
            The PlanLayerResponse dict: profile_name, profile_version, derived
            (tokens, capacity, activation_bytes, dispatch_bytes, ranks),
            candidates (fastest first; forward_us, backward_us, total_us, comm_us,
            hidden_comm_us, exposed_comm_us, compute_us in microseconds per layer
            forward+backward on the representative rank, inter_node_bytes in bytes),
            best_schedule ("SCHEDULE_S2", ...) and decision (margin_us, margin_pct,
            speedup_over_default, deciding_terms, summary).

        Raises:
            PlannerError: INVALID_ARGUMENT with the offending field
                ("layer.top_k: ..."), NOT_FOUND for an unknown profile name, ...
            ValueError: an unknown schedule name.
        """
        request = plan_pb2.PlanLayerRequest()
        request.layer.CopyFrom(_parse(layer, layer_pb2.LayerConfig(), "layer"))
        if isinstance(profile, str):
            request.profile_name = profile
        else:
            request.profile.CopyFrom(_parse(profile, profile_pb2.ClusterProfile(), "profile"))
        for s in schedules or ():
            request.schedules.append(schedule_enum(s))
        request.include_timeline = bool(include_timeline)
        return _to_dict(self._call("PlanLayer", request))

    def plan_model(self, model: Mapping[str, Any],
                   profile: Union[str, Mapping[str, Any]] = DEFAULT_PROFILE,
                   options: Optional[Mapping[str, Any]] = None,
                   include_timeline: bool = False,
                   search: Optional[Mapping[str, Any]] = None,
                   layout: Optional[Mapping[str, Any]] = None,
                   memory: Optional[Mapping[str, Any]] = None) -> dict:
        """Plans a whole model: PlanModel (docs/model.md).

        Three modes: neither `search` nor `layout` plans model.parallel under
        every overlap variant; `search` ranks every parallel layout (dp, tp, pp,
        ep, esp, ZeRO stage, pipeline schedule, micro-batches) of the model on
        the cluster; `layout` evaluates one layout. At most one of the two.

        Args:
            model: a moeplan.v1.ModelConfig as a dict (the files of examples/models/:
                num_layers, hidden_size, num_attention_heads, ffn_hidden_size,
                seq_length, micro_batch_size, optional vocab_size and
                bytes_per_element, moe {layer_freq, num_experts, top_k,
                capacity_factor, expert_ffn_hidden_size, optional
                shared_expert_ffn_hidden_size, gate "GATE_SWITCH"/...}, parallel
                {mp, ep, esp, dp?}, optional global_batch_size). Unknown fields
                are rejected.
            profile: a profile name, or a whole ClusterProfile dict sent inline.
            options: a moeplan.v1.ModelPlanOptions dict (variants
                ["OVERLAP_VARIANT_LANCET", ...], schedules, alltoall_algorithms,
                bucket_bytes, partition_max_k, partition_groups,
                partition_max_span); None: every variant with the defaults.
            include_timeline: also return every variant's ops (large); with
                search or layout, each candidate's pipeline of one iteration
                (search's timeline_top: only the best N).
            search: a moeplan.v1.SearchOptions dict: top (candidates returned,
                best first; unset: 10), gpus (unset: the profile's nodes *
                gpus_per_node), families (["dpmoe", "ppmoe", "parm"]), pipelines
                (["gpipe", "1f1b", "interleaved"]), zero_stages ([0, 1, 2, 3]),
                max_microbatches (unset: 64), virtual_stages (interleaved v;
                empty: [2]), exhaustive (simulate every layout that fits, no
                lower-bound pruning). {} searches with every default.
            layout: a moeplan.v1.Layout dict: dp, tp, pp, ep, esp, microbatches
                (0: 1 when pp = 1, else pp), zero_stage, family ("dpmoe",
                "ppmoe", "parm"; "": inferred), pipeline ("gpipe", "1f1b",
                "interleaved"; "": 1f1b), virtual_stages, recompute.
            memory: a moeplan.v1.MemoryOptions dict: param_bytes, grad_bytes,
                optimizer_bytes (bytes per parameter before ZeRO divides them),
                gpu_memory_gib (overrides the profile's; 0: memory not checked).
                Used by search and layout.

        Returns:
            The PlanModelResponse dict: profile_name, profile_version, ranks,
            moe_layers, params_per_rank (int64: a string), alltoall_crossover and

            - without search or layout: variants (name, iteration_us,
              exposed_comm_us, hidden_comm_us, speedup_over_none,
              speedup_over_tutel, layers [{block, schedule, alltoall,
              partitions}], partition_ranges, dw_placements, alternatives, ...)
              and best_variant;
            - with search or layout: candidates (best first; a search returns
              feasible ones only, a layout its one candidate either way), each
              with layout {dp, tp, pp, ep, esp, microbatches, zero_stage, family,
              pipeline, virtual_stages, recompute, micro_batch_size}, family,
              feasible, infeasible_reason, iteration_us, tokens_per_s_per_gpu,
              memory_bytes_per_gpu (a number), memory {params_bytes,
              grads_bytes, optimizer_bytes, activations_bytes,
              capacity_buffer_bytes, total_bytes, limit_bytes,
              in_flight_microbatches, activation_bytes_per_microbatch, stage}
              (bytes as numbers),
              variant, schedule, alltoall, compute_us, exposed_comm [{term, us}],
              grad_sync_us, optimizer_us, bubble_us, bubble_fraction,
              stage_forward_us, stage_backward_us, rank (1-based);
              search_stats {enumerated, pruned_memory, pruned_bound, simulated,
              stage_plans, stage_cache_hits, over_limit (int64 strings)}; gpus;
              global_batch_size.

        Raises:
            PlannerError: INVALID_ARGUMENT naming the field ("model.moe.top_k: ...",
                "options.partition_max_k: ...", "layout.tp: ...",
                "search.gpus: ..."), NOT_FOUND for an unknown profile.
            ValueError: both search and layout given.
        """
        if search is not None and layout is not None:
            raise ValueError("plan_model: pass at most one of search and layout")
        request = model_pb2.PlanModelRequest()
        request.model.CopyFrom(_parse(model, model_pb2.ModelConfig(), "model"))
        if isinstance(profile, str):
            request.profile_name = profile
        else:
            request.profile.CopyFrom(_parse(profile, profile_pb2.ClusterProfile(), "profile"))
        if options:
            request.options.CopyFrom(_parse(options, model_pb2.ModelPlanOptions(), "options"))
        request.include_timeline = bool(include_timeline)
        # The server tells the modes apart by field presence: search={} is a search
        # with every default, so mark the (possibly empty) message present.
        if search is not None:
            request.search.CopyFrom(_parse(search, model_pb2.SearchOptions(), "search"))
            request.search.SetInParent()
        if layout is not None:
            request.layout.CopyFrom(_parse(layout, model_pb2.Layout(), "layout"))
            request.layout.SetInParent()
        if memory is not None:
            request.memory.CopyFrom(_parse(memory, model_pb2.MemoryOptions(), "memory"))
        return _to_dict(self._call("PlanModel", request))

    def list_profiles(self) -> list:
        """Profiles the server knows (built-in and stored): ListProfiles.

        Returns:
            A list of ProfileSummary dicts: name, version, source
            ("PROFILE_SOURCE_SPEC" / "PROFILE_SOURCE_MEASURED"), nodes,
            gpus_per_node, comment.
        """
        response = self._call("ListProfiles", service_pb2.ListProfilesRequest())
        return [_to_dict(p) for p in response.profiles]

    def get_profile(self, name: str) -> dict:
        """One whole ClusterProfile by name: GetProfile.

        Returns:
            The ClusterProfile dict (times in microseconds, alpha_us and
            beta_us_per_byte, peak_tflops, bandwidth_gbytes_per_s, ...).

        Raises:
            PlannerError: NOT_FOUND for an unknown name (the message lists the
                known ones), INVALID_ARGUMENT for an empty one.
        """
        return _to_dict(self._call("GetProfile", service_pb2.GetProfileRequest(name=name)))

    def put_profile(self, profile: Mapping[str, Any]) -> dict:
        """Stores a ClusterProfile on the server: PutProfile.

        Args:
            profile: a ClusterProfile dict. `name` ([a-z0-9._-]+) must not be a
                built-in's; `version` (>= 1) must be greater than the stored
                version of the same name (re-putting identical content at the same
                version is accepted).

        Returns:
            {"name": ..., "version": ...} as stored.

        Raises:
            PlannerError: INVALID_ARGUMENT ("profile.<field>: ..."),
                FAILED_PRECONDITION (built-in name, version not increased).
        """
        request = service_pb2.PutProfileRequest()
        request.profile.CopyFrom(_parse(profile, profile_pb2.ClusterProfile(), "profile"))
        return _to_dict(self._call("PutProfile", request))

    def report_measurement(self, profile_name: str, profile_version: int,
                           layer: Mapping[str, Any], schedule: Union[str, int],
                           ops: Union[Mapping[str, float], Iterable[Tuple[str, float]]],
                           total_us: float, starts: Optional[Mapping[str, float]] = None,
                           full: bool = False) -> Union[int, dict]:
        """Sends the op times a job measured back to the server: ReportMeasurement.

        Args:
            profile_name: the profile the plan was made with.
            profile_version: its version (1 .. the stored version).
            layer: the LayerConfig dict that was planned (and run).
            schedule: the schedule that ran, "default"/"s1"/"s2" or an enum name.
            ops: measured op durations in microseconds, by op name (the plan's
                candidates[].ops[].name): a {name: duration_us} mapping or
                (name, duration_us) pairs; at least one.
            total_us: measured forward+backward time of the layer, microseconds.
            starts: optionally, when each op started (µs from the start of the
                layer's forward), by op name: the server's replay then names the
                ops that waited for what the plan does not have.
            full: return the whole answer instead of the count.

        Returns:
            How many measurements the server has stored for this profile so far;
            with full, the ReportMeasurementResponse as a dict: "stored", and the
            run's op durations replayed on the stored profile's plan ("replay":
            replayed_us, composition_error_pct, waits), the prediction
            ("predicted_us") and the cost error ("cost_error_pct";
            docs/calibration.md "Replay").
        """
        request = service_pb2.ReportMeasurementRequest(profile_name=profile_name,
                                                       profile_version=int(profile_version),
                                                       schedule=schedule_enum(schedule),
                                                       total_us=float(total_us))
        request.plan.layer.CopyFrom(_parse(layer, layer_pb2.LayerConfig(), "plan.layer"))
        pairs: Sequence[Tuple[str, float]] = list(ops.items() if isinstance(ops, Mapping) else ops)
        for name, duration_us in pairs:
            op = request.ops.add(name=name, duration_us=float(duration_us))
            if starts is not None and name in starts:
                op.start_us = float(starts[name])
                op.has_start = True
        response = self._call("ReportMeasurement", request)
        if not full:
            return int(response.stored)
        out = json_format.MessageToDict(response, preserving_proto_field_name=True)
        out["stored"] = int(response.stored)  # a uint64: a string in the JSON mapping
        return out

    def refit_profile(self, name: str) -> dict:
        """Refits a stored profile from the runs reported against it: RefitProfile.

        The server plans every reported run again, fits in-context op
        corrections on the measured op durations (the profile's own fits stay),
        and stores the result as the next version; later plans use it.

        Args:
            name: a profile stored on the server (put_profile); built-ins are
                read-only.

        Returns:
            {"profile": the new ClusterProfile dict, "report": Markdown (the
            corrections, the reported runs' error before and after),
            "measurements": runs stored for the profile, "used": runs fitted on}.

        Raises:
            PlannerError: NOT_FOUND (unknown name), FAILED_PRECONDITION (a
                built-in, nothing reported, or too few runs of any op to fit).
        """
        out = _to_dict(self._call("RefitProfile",
                                  service_pb2.RefitProfileRequest(profile_name=name)))
        out["measurements"] = int(out["measurements"])
        out["used"] = int(out["used"])
        return out

    def health(self, service: str = "") -> str:
        """The standard gRPC health check (grpc.health.v1.Health/Check).

        Args:
            service: the service to ask about; "" means the server as a whole.

        Returns:
            "SERVING", "NOT_SERVING", "SERVICE_UNKNOWN" or "UNKNOWN".

        Raises:
            PlannerError: e.g. UNAVAILABLE when nothing listens at the address.
        """
        # Hand-encoded so the client does not need the grpcio-health-checking
        # package: HealthCheckRequest{string service = 1},
        # HealthCheckResponse{ServingStatus status = 1}.
        if self._closed:
            raise ValueError("PlannerClient: the channel is closed")
        data = service.encode()
        if len(data) > 127:
            raise ValueError("health: service name too long")
        request = (b"\x0a" + bytes([len(data)]) + data) if data else b""
        check = self._channel.unary_unary("/grpc.health.v1.Health/Check",
                                          request_serializer=lambda b: b,
                                          response_deserializer=lambda b: b)
        try:
            reply = check(request, timeout=self.timeout_s, metadata=self._metadata)
        except grpc.RpcError as e:
            raise PlannerError(e.code().name, e.details() or "", "Health.Check") from None
        status = 0
        if len(reply) >= 2 and reply[0] == 0x08:
            status = reply[1]
        return {0: "UNKNOWN", 1: "SERVING", 2: "NOT_SERVING", 3: "SERVICE_UNKNOWN"}.get(
            status, "UNKNOWN")
