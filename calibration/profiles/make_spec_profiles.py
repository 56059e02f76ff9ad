#!/usr/bin/env python3
"""Writes the built-in spec-derived cluster profiles (calibration/profiles/*.json).

Every number comes from a public datasheet figure (cited in the profile) or from
a stated assumption; nothing here was measured. Re-run after editing:
    /usr/bin/python3 calibration/profiles/make_spec_profiles.py
"""
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))

# GEMM efficiency grid axes (elements). Spec sheets give only peak throughput, so
# the shape dependence is an assumed saturation curve,
#   eff = e_max * m/(m+128) * n/(n+128) * k/(k+64),
# standing in for tile quantisation and the fixed cost of small GEMMs until a
# measured profile replaces it (moeplan calibrate).
AXIS = [32, 128, 512, 2048, 8192, 32768]

# Link latencies are not in any datasheet: assumed alpha of one NCCL step.
ASSUMPTIONS = (
    "alpha values (per-step latency) are assumptions, not datasheet figures: "
    "{intra} us intra-node, {inter} us inter-node; kernel launch overhead {launch} us; "
    "effective memory bandwidth = 80% of the datasheet peak; GEMM efficiency = "
    "{emax} * m/(m+128) * n/(n+128) * k/(k+64) (assumed saturation curve)."
)


def efficiency_grid(e_max):
    grid = []
    for m in AXIS:
        for n in AXIS:
            for k in AXIS:
                e = e_max * m / (m + 128) * n / (n + 128) * k / (k + 64)
                grid.append(round(e, 4))
    return grid


def beta_us_per_byte(gbytes_per_s):
    # 1 GB/s = 1e3 bytes per microsecond.
    return 1.0 / (gbytes_per_s * 1e3)


def profile(name, comment, citations, nodes, gpus, mem_gib, intra_gbs, intra_alpha,
            inter_gbs, inter_alpha, tflops, launch_us, hbm_gbs, e_max):
    return {
        "schema_version": 1,
        "name": name,
        "version": 1,
        "source": "PROFILE_SOURCE_SPEC",
        "comment": comment + " " + ASSUMPTIONS.format(
            intra=intra_alpha, inter=inter_alpha, launch=launch_us, emax=e_max),
        "citations": citations,
        "nodes": nodes,
        "gpus_per_node": gpus,
        "gpu_memory_gib": mem_gib,
        "links": {
            "intra": {"alpha_us": intra_alpha, "beta_us_per_byte": beta_us_per_byte(intra_gbs)},
            "inter": {"alpha_us": inter_alpha, "beta_us_per_byte": beta_us_per_byte(inter_gbs)},
        },
        "collectives": [],
        "gemm": {
            "peak_tflops": tflops,
            "launch_overhead_us": launch_us,
            "m": AXIS,
            "n": AXIS,
            "k": AXIS,
            "efficiency": efficiency_grid(e_max),
        },
        "memory": {"bandwidth_gbytes_per_s": round(0.8 * hbm_gbs, 3), "launch_overhead_us": launch_us},
    }


PROFILES = [
    profile(
        "a100-8x8",
        "8 nodes x 8 NVIDIA A100-SXM4-80GB on NVLink 3 (NVSwitch), 4 x 100 Gb/s NICs per "
        "node. Intra link: 300 GB/s per direction per GPU. Inter link: per-GPU share of the "
        "node's NICs, 4 x 12.5 GB/s / 8 GPUs = 6.25 GB/s. The default profile.",
        [
            "NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 Tensor Core 312 TFLOPS (dense), "
            "80 GB HBM2e at 2,039 GB/s (SXM), NVLink 600 GB/s (bidirectional, 12 links)",
            "100 Gb/s per NIC (InfiniBand HDR100 / 100 GbE), 4 NICs per node as specified",
        ],
        nodes=8, gpus=8, mem_gib=80, intra_gbs=300.0, intra_alpha=3.0,
        inter_gbs=4 * 12.5 / 8, inter_alpha=8.0, tflops=312.0, launch_us=4.0,
        hbm_gbs=2039.0, e_max=0.8),
    profile(
        "rtx2080ti-8x4",
        "8 nodes x 4 NVIDIA GeForce RTX 2080 Ti on PCIe 3.0 x16, 1 x 100 Gb/s NIC per node. "
        "Intra link: PCIe 3.0 x16, 15.75 GB/s per direction (no NVLink). Inter link: per-GPU "
        "share of the NIC, 12.5 GB/s / 4 GPUs = 3.125 GB/s.",
        [
            "NVIDIA Turing architecture whitepaper: RTX 2080 Ti (reference) 53.8 TFLOPS FP16 "
            "Tensor with FP32 accumulate (107.6 with FP16 accumulate), 11 GB GDDR6 at 616 GB/s",
            "PCI Express 3.0: 8 GT/s per lane, 128b/130b encoding: 15.75 GB/s per direction for x16",
            "100 Gb/s per NIC, 1 NIC per node as specified",
        ],
        nodes=8, gpus=4, mem_gib=11, intra_gbs=15.75, intra_alpha=8.0,
        inter_gbs=12.5 / 4, inter_alpha=10.0, tflops=53.8, launch_us=5.0,
        hbm_gbs=616.0, e_max=0.7),
    profile(
        "h200-8x8",
        "8 nodes x 8 NVIDIA H200 SXM on NVLink 4 (NVSwitch), 8 x 400 Gb/s NICs per node. "
        "Intra link: 450 GB/s per direction per GPU. Inter link: one 400 Gb/s NIC per GPU = "
        "50 GB/s.",
        [
            "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16/FP16 Tensor Core 989 TFLOPS dense "
            "(1,979 with sparsity), 141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s (bidirectional)",
            "400 Gb/s per NIC (NDR InfiniBand / 400 GbE), 8 NICs per node as specified",
        ],
        nodes=8, gpus=8, mem_gib=141, intra_gbs=450.0, intra_alpha=3.0,
        inter_gbs=400 / 8, inter_alpha=6.0, tflops=989.0, launch_us=4.0,
        hbm_gbs=4800.0, e_max=0.7),
    profile(
        "v100-8x8",
        "8 nodes x 8 NVIDIA Tesla V100-SXM2-32GB on NVLink 2 (hybrid cube-mesh, no NVSwitch), "
        "1 x 100 Gb/s NIC per node. Intra link: 150 GB/s per direction per GPU (6 NVLink 2 "
        "links x 25 GB/s, i.e. half the 300 GB/s bidirectional datasheet figure, as for "
        "a100-8x8); the cube-mesh is not all-to-all, so this per-GPU aggregate is an upper "
        "bound that NCCL rings over all six links approach. Inter link: per-GPU share of the "
        "NIC, 12.5 GB/s / 8 GPUs = 1.5625 GB/s.",
        [
            "NVIDIA Tesla V100 GPU datasheet (SXM2): Tensor Performance (FP16, mixed precision) "
            "125 TFLOPS, 32 GB HBM2 at 900 GB/s, NVLink interconnect 300 GB/s (bidirectional)",
            "NVIDIA Tesla V100 GPU architecture whitepaper: 6 NVLink 2.0 links per GPU at 25 GB/s "
            "per direction each (50 GB/s bidirectional); 8 GPUs in a hybrid cube-mesh (DGX-1)",
            "100 Gb/s per NIC (InfiniBand EDR / 100 GbE), 1 NIC per node as specified",
        ],
        nodes=8, gpus=8, mem_gib=32, intra_gbs=6 * 25.0, intra_alpha=3.0,
        inter_gbs=12.5 / 8, inter_alpha=10.0, tflops=125.0, launch_us=5.0,
        hbm_gbs=900.0, e_max=0.7),
]


def main():
    for p in PROFILES:
        path = os.path.join(HERE, p["name"] + ".json")
        with open(path + ".tmp", "w") as f:
            json.dump(p, f, indent=1)
            f.write("\n")
        os.replace(path + ".tmp", path)
        print("wrote", os.path.relpath(path))


if __name__ == "__main__":
    main()
