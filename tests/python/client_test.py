"""Tests of client/python/moeplan_client.py against a running moeplan-server.

Run by tests/python/launcher_test.sh, which starts the server and sets
  MOEPLAN_SERVER       host:port of the server
  MOEPLAN_PYTHONPATH   the generated stubs (build/client/python)
  MOEPLAN_SOURCE_DIR   the repository root (default: two levels up from here)
  MOEPLAN_TLS_SERVER   host:port of a second server with --tls-cert and --token-file
  MOEPLAN_TLS_CA, MOEPLAN_TOKEN_FILE   its CA certificate and token
Expects a fresh data directory (no stored profiles). Use /usr/bin/python3.
"""

import copy
import json
import os
import sys
import unittest

SOURCE_DIR = os.environ.get(
    "MOEPLAN_SOURCE_DIR",
    os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
sys.path.insert(0, os.path.join(SOURCE_DIR, "client", "python"))

import moeplan_client  # noqa: E402  (finds the stubs through MOEPLAN_PYTHONPATH)
from moeplan_client import PlannerClient, PlannerError  # noqa: E402

SERVER = os.environ.get("MOEPLAN_SERVER", "")
BUILTINS = {"a100-8x8", "a100-8x8-hdr", "b200-8x8", "gb200-nvl72", "h100-8x8", "h200-8x8", "h800-8x8",
            "rtx2080ti-8x4", "v100-8x8"}
SCHEDULES = {"SCHEDULE_DEFAULT", "SCHEDULE_S1", "SCHEDULE_S2"}


def example_layer(name="gpt2-moe-layer.json"):
    with open(os.path.join(SOURCE_DIR, "examples", name), encoding="utf-8") as f:
        return json.load(f)


def example_model(name):
    with open(os.path.join(SOURCE_DIR, "examples", "models", name), encoding="utf-8") as f:
        return json.load(f)


class ClientTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not SERVER:
            raise unittest.SkipTest("MOEPLAN_SERVER is not set (run launcher_test.sh)")
        cls.client = PlannerClient(SERVER, timeout_s=10.0)

    @classmethod
    def tearDownClass(cls):
        cls.client.close()

    def test_health(self):
        self.assertEqual(self.client.health(), "SERVING")

    def test_plan_layer_all_schedules(self):
        plan = self.client.plan_layer(example_layer())
        self.assertEqual(plan["profile_name"], "a100-8x8")
        self.assertGreaterEqual(plan["profile_version"], 1)
        self.assertIn(plan["best_schedule"], SCHEDULES)
        candidates = plan["candidates"]
        self.assertEqual({c["schedule"] for c in candidates}, SCHEDULES)
        totals = [c["total_us"] for c in candidates]
        self.assertEqual(totals, sorted(totals), "candidates are fastest first")
        self.assertEqual(candidates[0]["schedule"], plan["best_schedule"])
        for c in candidates:
            self.assertGreater(c["total_us"], 0.0)
            self.assertAlmostEqual(c["forward_us"] + c["backward_us"], c["total_us"], places=3)
            self.assertEqual(c["ops"], [], "no timeline unless asked")
            self.assertGreaterEqual(int(c["inter_node_bytes"]), 0)  # int64: a JSON string
        self.assertEqual(plan["derived"]["tokens"], "8192")  # B*L, int64 as a JSON string
        # DerivedShape.ranks = mp*dp*pp = 4*16*1.
        self.assertEqual(plan["derived"]["ranks"], 64)
        decision = plan["decision"]
        self.assertEqual(decision["best"], plan["best_schedule"])
        self.assertAlmostEqual(decision["margin_us"],
                               candidates[1]["total_us"] - candidates[0]["total_us"], places=3)
        self.assertGreaterEqual(decision["speedup_over_default"], 1.0)

    def test_plan_layer_one_schedule_with_timeline(self):
        plan = self.client.plan_layer(example_layer(), profile="h200-8x8", schedules=["s2"],
                                      include_timeline=True)
        self.assertEqual(plan["profile_name"], "h200-8x8")
        self.assertEqual(plan["best_schedule"], "SCHEDULE_S2")
        (only,) = plan["candidates"]
        self.assertTrue(only["ops"])
        for op in only["ops"]:
            self.assertLessEqual(op["start_us"], op["end_us"])
            self.assertLessEqual(op["end_us"], only["total_us"] + 1e-6)
        self.assertEqual(moeplan_client.schedule_short_name(plan["best_schedule"]), "s2")

    def test_plan_model_variants(self):
        with open(os.path.join(SOURCE_DIR, "examples", "models", "gpt2-s-moe.a100.json"),
                  encoding="utf-8") as f:
            model = json.load(f)
        plan = self.client.plan_model(model)
        names = [v["name"] for v in plan["variants"]]
        self.assertEqual(names, ["none", "tutel", "dw", "partition", "lancet"])
        best = min(plan["variants"], key=lambda v: v["iteration_us"])
        self.assertEqual(plan["best_variant"], best["name"])
        for v in plan["variants"]:
            self.assertGreater(v["iteration_us"], 0.0)
            self.assertEqual(len(v["layers"]), 6, "an MoE layer every other block of 12")
            self.assertEqual(v["ops"], [], "no timeline unless asked")
        only = self.client.plan_model(model, options={"variants": ["OVERLAP_VARIANT_LANCET"],
                                                      "partition_max_k": 2})
        self.assertEqual([v["name"] for v in only["variants"]], ["lancet"])
        for layer in only["variants"][0]["layers"]:
            self.assertLessEqual(layer["partitions"], 2)
        bad = dict(model, num_attention_heads=7)
        with self.assertRaises(PlannerError) as ctx:
            self.client.plan_model(bad)
        self.assertEqual(ctx.exception.code, "INVALID_ARGUMENT")
        self.assertIn("model.num_attention_heads", str(ctx.exception))

    def test_plan_model_search(self):
        model = example_model("gpt3-medium-moe.json")
        # A search plans many stages: a longer deadline than the class client's.
        with PlannerClient(SERVER, timeout_s=60.0) as client:
            plan = client.plan_model(model, profile="v100-8x8", search={"top": 3, "gpus": 32})
        self.assertEqual(plan["profile_name"], "v100-8x8")
        self.assertEqual(plan["gpus"], 32)
        self.assertEqual(plan["global_batch_size"], 256)  # the model file's
        candidates = plan["candidates"]
        self.assertTrue(1 <= len(candidates) <= 3, f"{len(candidates)} candidates")
        times = [c["iteration_us"] for c in candidates]
        self.assertEqual(times, sorted(times), "candidates are fastest first")
        for i, c in enumerate(candidates):
            self.assertTrue(c["feasible"], c["infeasible_reason"])
            self.assertEqual(c["rank"], i + 1)
            layout = c["layout"]
            self.assertEqual(layout["dp"] * layout["tp"] * layout["pp"], 32, layout)
            # global_batch_size = dp * microbatches * micro_batch_size
            self.assertEqual(layout["dp"] * layout["microbatches"] * layout["micro_batch_size"],
                             256, layout)
            self.assertGreater(c["iteration_us"], 0.0)
            self.assertGreater(c["tokens_per_s_per_gpu"], 0.0)
            self.assertGreater(c["memory_bytes_per_gpu"], 0)
        stats = plan["search_stats"]
        self.assertGreater(int(stats["simulated"]), 0)
        self.assertGreaterEqual(int(stats["enumerated"]), int(stats["simulated"]))

    def test_plan_model_layout(self):
        model = example_model("gpt3-medium-moe.json")
        with PlannerClient(SERVER, timeout_s=60.0) as client:
            # A fixed layout comes back as one candidate, feasible or not.
            plan = client.plan_model(model, profile="v100-8x8",
                                     layout={"dp": 32, "tp": 1, "pp": 1, "ep": 32, "esp": 1})
            (only,) = plan["candidates"]
            self.assertEqual({k: only["layout"][k] for k in ("dp", "tp", "pp", "ep", "esp")},
                             {"dp": 32, "tp": 1, "pp": 1, "ep": 32, "esp": 1})
            if not only["feasible"]:
                self.assertTrue(only["infeasible_reason"])
            # tp = 16 spans two 8-GPU nodes (dp*tp = ep*esp = 32: tp is the only fault).
            with self.assertRaises(PlannerError) as ctx:
                client.plan_model(model, profile="v100-8x8",
                                  layout={"dp": 2, "tp": 16, "pp": 1, "ep": 8, "esp": 4})
        self.assertEqual(ctx.exception.code, "INVALID_ARGUMENT")
        self.assertEqual(ctx.exception.method, "PlanModel")
        self.assertIn("layout.tp", ctx.exception.message)
        # Unknown fields are rejected before anything is sent.
        with self.assertRaises(PlannerError) as ctx:
            self.client.plan_model(model, layout={"dp": 2, "tensor_parallel": 4})
        self.assertEqual(ctx.exception.code, "INVALID_ARGUMENT")
        self.assertIn("layout", ctx.exception.message)

    def test_plan_model_search_and_layout_refused(self):
        model = example_model("gpt3-medium-moe.json")
        with self.assertRaises(ValueError):
            self.client.plan_model(model, profile="v100-8x8", search={"top": 3},
                                   layout={"dp": 32, "tp": 1, "pp": 1, "ep": 32, "esp": 1})

    def test_plan_layer_inline_profile(self):
        profile = self.client.get_profile("h200-8x8")
        by_name = self.client.plan_layer(example_layer("bert-moe-layer.json"),
                                         profile="h200-8x8")
        inline = self.client.plan_layer(example_layer("bert-moe-layer.json"), profile=profile)
        self.assertEqual(by_name["candidates"], inline["candidates"])

    def test_list_profiles(self):
        profiles = self.client.list_profiles()
        names = {p["name"] for p in profiles}
        self.assertTrue(BUILTINS <= names, names)
        for p in profiles:
            if p["name"] in BUILTINS:
                self.assertEqual(p["source"], "PROFILE_SOURCE_SPEC")
                self.assertGreaterEqual(p["version"], 1)
                self.assertGreaterEqual(p["nodes"] * p["gpus_per_node"], 32)

    def test_get_profile(self):
        profile = self.client.get_profile("a100-8x8")
        self.assertEqual(profile["name"], "a100-8x8")
        self.assertEqual((profile["nodes"], profile["gpus_per_node"]), (8, 8))
        self.assertGreater(profile["links"]["inter"]["beta_us_per_byte"], 0.0)

    def test_put_profile_round_trip(self):
        profile = copy.deepcopy(self.client.get_profile("a100-8x8"))
        profile["name"] = "py-client-test"
        profile["version"] = 3
        profile["source"] = "PROFILE_SOURCE_MEASURED"
        profile["comment"] = "client_test.py: a100-8x8 with a slower inter-node link"
        profile["links"]["inter"]["beta_us_per_byte"] *= 2.0

        self.assertEqual(self.client.put_profile(profile),
                         {"name": "py-client-test", "version": 3})
        self.assertEqual(self.client.get_profile("py-client-test"), profile)
        listed = {p["name"]: p for p in self.client.list_profiles()}
        self.assertEqual(listed["py-client-test"]["version"], 3)

        # Same version, different numbers: refused; a higher version: stored.
        changed = copy.deepcopy(profile)
        changed["links"]["inter"]["alpha_us"] += 1.0
        with self.assertRaises(PlannerError) as ctx:
            self.client.put_profile(changed)
        self.assertEqual(ctx.exception.code, "FAILED_PRECONDITION")
        self.assertIn("version", ctx.exception.message)
        changed["version"] = 4
        self.assertEqual(self.client.put_profile(changed)["version"], 4)
        self.assertEqual(self.client.get_profile("py-client-test"), changed)

        # Plans against the stored profile report its name and version, and the
        # slower inter-node link makes the layer slower than on a100-8x8.
        layer = example_layer()
        slow = self.client.plan_layer(layer, profile="py-client-test", schedules=["default"])
        base = self.client.plan_layer(layer, profile="a100-8x8", schedules=["default"])
        self.assertEqual((slow["profile_name"], slow["profile_version"]), ("py-client-test", 4))
        self.assertGreater(slow["candidates"][0]["total_us"], base["candidates"][0]["total_us"])

    def test_put_profile_builtin_name_refused(self):
        profile = self.client.get_profile("h200-8x8")
        profile["version"] += 1
        with self.assertRaises(PlannerError) as ctx:
            self.client.put_profile(profile)
        self.assertEqual(ctx.exception.code, "FAILED_PRECONDITION")

    def test_invalid_argument_names_the_field(self):
        layer = example_layer()
        layer["num_experts"] = 2
        layer["top_k"] = 4
        layer["parallel"] = {"mp": 1, "ep": 2, "esp": 1}
        with self.assertRaises(PlannerError) as ctx:
            self.client.plan_layer(layer)
        e = ctx.exception
        self.assertEqual(e.code, "INVALID_ARGUMENT")
        self.assertEqual(e.method, "PlanLayer")
        self.assertIn("layer.top_k", e.message)
        self.assertIn("num_experts", e.message)
        self.assertTrue(str(e).startswith("INVALID_ARGUMENT: "))

    def test_unknown_field_rejected_locally(self):
        layer = example_layer()
        layer["parallel"]["tp"] = 4
        with self.assertRaises(PlannerError) as ctx:
            self.client.plan_layer(layer)
        self.assertEqual(ctx.exception.code, "INVALID_ARGUMENT")
        self.assertIn("tp", ctx.exception.message)
        self.assertNotIn("\n", ctx.exception.message)

    def test_unknown_profile_not_found(self):
        with self.assertRaises(PlannerError) as ctx:
            self.client.plan_layer(example_layer(), profile="no-such-profile")
        self.assertEqual(ctx.exception.code, "NOT_FOUND")
        self.assertIn("a100-8x8", ctx.exception.message)  # lists the known ones
        with self.assertRaises(PlannerError) as ctx:
            self.client.get_profile("no-such-profile")
        self.assertEqual(ctx.exception.code, "NOT_FOUND")

    def test_bad_schedule_name(self):
        with self.assertRaises(ValueError):
            self.client.plan_layer(example_layer(), schedules=["s3"])

    def test_report_measurement(self):
        layer = example_layer()
        plan = self.client.plan_layer(layer, schedules=["s1"], include_timeline=True)
        ops = {op["name"]: (op["end_us"] - op["start_us"]) * 1.1
               for op in plan["candidates"][0]["ops"]}
        total = plan["candidates"][0]["total_us"] * 1.1
        version = plan["profile_version"]
        first = self.client.report_measurement("a100-8x8", version, layer, "s1", ops, total)
        second = self.client.report_measurement("a100-8x8", version, layer, "SCHEDULE_S1",
                                                list(ops.items()), total)
        self.assertGreaterEqual(first, 1)
        self.assertEqual(second, first + 1)
        # With starts, the whole answer: every op 10 % slower than planned
        # composes as planned (no composition error) and the plan's costs are
        # 1/1.1 of the replay.
        starts = {op["name"]: op["start_us"] * 1.1 for op in plan["candidates"][0]["ops"]}
        answer = self.client.report_measurement("a100-8x8", version, layer, "s1", ops, total,
                                                starts=starts, full=True)
        self.assertEqual(answer["stored"], second + 1)
        self.assertAlmostEqual(answer["replay"]["replayed_us"], total, delta=1e-6 * total)
        self.assertAlmostEqual(answer["replay"].get("composition_error_pct", 0.0), 0.0, places=6)
        self.assertAlmostEqual(answer["cost_error_pct"], 100 * (1 / 1.1 - 1), places=6)
        self.assertEqual(answer["replay"]["ops"], len(ops))
        with self.assertRaises(PlannerError) as ctx:
            self.client.report_measurement("a100-8x8", version, layer, "s1", {}, total)
        self.assertEqual(ctx.exception.code, "INVALID_ARGUMENT")
        self.assertIn("ops", ctx.exception.message)

    def test_refit_profile(self):
        profile = copy.deepcopy(self.client.get_profile("a100-8x8"))
        profile["name"] = "py-refit"
        profile["version"] = 1
        self.client.put_profile(profile)
        # Three runs that took twice the prediction, op for op.
        layer = example_layer()
        for batch in (2, 8, 4):
            layer["batch_size"] = batch
            plan = self.client.plan_layer(layer, profile="py-refit", schedules=["s1"],
                                          include_timeline=True)
            ops = {op["name"]: 2.0 * (op["end_us"] - op["start_us"])
                   for op in plan["candidates"][0]["ops"]}
            self.client.report_measurement("py-refit", 1, layer, "s1", ops,
                                           2.0 * plan["candidates"][0]["total_us"])
        before = plan["candidates"][0]["total_us"]
        refit = self.client.refit_profile("py-refit")
        self.assertEqual(refit["profile"]["version"], 2)
        self.assertEqual((refit["measurements"], refit["used"]), (3, 3))
        self.assertIn("# Refit of py-refit: version 1 -> 2", refit["report"])
        after = self.client.plan_layer(layer, profile="py-refit", schedules=["s1"])
        self.assertEqual(after["profile_version"], 2)
        self.assertAlmostEqual(after["candidates"][0]["total_us"], 2.0 * before,
                               delta=1e-6 * before)
        with self.assertRaises(PlannerError) as ctx:
            self.client.refit_profile("a100-8x8")
        self.assertEqual(ctx.exception.code, "FAILED_PRECONDITION")
        self.assertIn("read-only", ctx.exception.message)

    def test_unreachable_server_is_unavailable(self):
        with PlannerClient("127.0.0.1:1", timeout_s=2.0) as c:
            with self.assertRaises(PlannerError) as ctx:
                c.list_profiles()
        self.assertIn(ctx.exception.code, {"UNAVAILABLE", "DEADLINE_EXCEEDED"})

    def test_context_manager_closes(self):
        with PlannerClient(SERVER) as c:
            self.assertTrue(c.list_profiles())
        with self.assertRaises(ValueError):
            c.list_profiles()
        c.close()  # idempotent


class SecureClientTest(unittest.TestCase):
    """A server with TLS and a bearer token: writes need the token, reads do not."""

    @classmethod
    def setUpClass(cls):
        cls.server = os.environ.get("MOEPLAN_TLS_SERVER", "")
        if not cls.server:
            raise unittest.SkipTest("MOEPLAN_TLS_SERVER is not set (run launcher_test.sh)")
        cls.ca = os.environ["MOEPLAN_TLS_CA"]
        cls.token = os.environ["MOEPLAN_TOKEN_FILE"]

    def profile(self, name):
        with PlannerClient(self.server, tls_ca=self.ca) as c:
            p = c.get_profile("a100-8x8")
        p["name"] = name
        p["version"] = 1
        return p

    def test_writes_need_the_token(self):
        with PlannerClient(self.server, tls_ca=self.ca) as anon:
            self.assertIn(anon.plan_layer(example_layer())["best_schedule"], SCHEDULES)
            with self.assertRaises(PlannerError) as ctx:
                anon.put_profile(self.profile("py-secure"))
            self.assertEqual(ctx.exception.code, "UNAUTHENTICATED")
            self.assertNotIn("py-secure", {p["name"] for p in anon.list_profiles()})
        with PlannerClient(self.server, tls_ca=self.ca, token_file=self.token) as c:
            stored = c.put_profile(self.profile("py-secure"))
            self.assertEqual(stored["name"], "py-secure")

    def test_plaintext_cannot_reach_a_tls_server(self):
        with PlannerClient(self.server, timeout_s=2.0) as c:
            with self.assertRaises(PlannerError) as ctx:
                c.list_profiles()
            self.assertIn(ctx.exception.code, {"UNAVAILABLE", "DEADLINE_EXCEEDED"})

    def test_bad_files_are_value_errors(self):
        with self.assertRaises(ValueError):
            PlannerClient(self.server, tls_ca=self.token)  # not a certificate
        with self.assertRaises(ValueError):
            PlannerClient(self.server, token_file="/no/such/token")


if __name__ == "__main__":
    unittest.main()
