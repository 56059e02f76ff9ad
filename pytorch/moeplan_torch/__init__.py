"""moeplan.torch: an MoE layer for PyTorch whose schedule comes from moeplan's
planner and runs on moeplan's executor (pytorch/README.md).

    from moeplan.torch import MoE, Planner, init_process_group
    init_process_group()                 # gloo over the mpirun (or torchrun-style) ranks
    moe = MoE(model_dim=512, hidden_dim=2048, num_experts=8, top_k=2,
              capacity_factor=1.25, ep=4, schedule="auto",
              planner=Planner(server="127.0.0.1:50051", profile="cpu-testbed-2x2"))
    y = moe(x)                           # x: [..., model_dim] float32 CPU tensor

The layer's forward and backward are the planner's op graph for the chosen
schedule (default, s1 or s2), run by the executor's CPU kernels over MPI
inside a torch.autograd.Function; gradients land in the module's parameters
(the gate weight, replicated, and this rank's expert shards) and the input.

This module only re-exports; the code lives in layer.py (MoE,
dense_parameters), planner.py (Planner), process_group.py (world,
init_process_group), errors.py (PlannerUnavailable) and _native.py (the
extension _C, loaded after libmpi; every module that uses _C takes it from
there); the schedule names come from the client's moeplan_schedules.
"""

from .errors import PlannerUnavailable
from .layer import GATES, SCHEDULES, MoE, dense_parameters
from .planner import Planner
from .process_group import init_process_group, world

__all__ = ["MoE", "Planner", "PlannerUnavailable", "init_process_group", "world",
           "dense_parameters", "SCHEDULES", "GATES"]
