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
            inter_gbs, inter_alpha, tflops, launch_us, hbm_gbs, e_max, fp8_tflops=None):
    """tflops: dense BF16/FP16 tensor peak; fp8_tflops: dense FP8 tensor peak,
    None for GPUs without FP8 tensor cores (1-byte GEMMs then run at tflops)."""
    gemm = {"peak_tflops": tflops}
    if fp8_tflops is not None:
        gemm["fp8_peak_tflops"] = fp8_tflops
    gemm.update({
        "launch_overhead_us": launch_us,
        "m": AXIS,
        "n": AXIS,
        "k": AXIS,
        "efficiency": efficiency_grid(e_max),
    })
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
        "gemm": gemm,
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
        "a100-8x8-hdr",
        "8 nodes x 8 NVIDIA A100-SXM4-80GB (DGX A100) on NVLink 3 (NVSwitch), 8 x 200 Gb/s "
        "HDR InfiniBand NICs per node for compute: the DGX A100 SuperPOD's fabric (Selene, "
        "where the 2021 Megatron-LM runs were measured). Intra link: 300 GB/s per direction "
        "per GPU. Inter link: one 200 Gb/s NIC per GPU = 25 GB/s.",
        [
            "NVIDIA A100 Tensor Core GPU datasheet: BF16/FP16 Tensor Core 312 TFLOPS (dense), "
            "80 GB HBM2e at 2,039 GB/s (SXM), NVLink 600 GB/s (bidirectional, 12 links)",
            "NVIDIA DGX A100 datasheet: 8x single-port ConnectX-6 VPI, 200 Gb/s HDR "
            "InfiniBand, for the compute fabric",
        ],
        nodes=8, gpus=8, mem_gib=80, intra_gbs=300.0, intra_alpha=3.0,
        inter_gbs=200 / 8, inter_alpha=8.0, tflops=312.0, launch_us=4.0,
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
        "50 GB/s. 1-byte (FP8) GEMMs at the dense FP8 peak.",
        [
            "NVIDIA H200 Tensor Core GPU datasheet (SXM): BF16/FP16 Tensor Core 989 TFLOPS dense "
            "(1,979 with sparsity), FP8 Tensor Core 1,979 TFLOPS dense (3,958 with sparsity), "
            "141 GB HBM3e at 4.8 TB/s, NVLink 900 GB/s (bidirectional)",
            "400 Gb/s per NIC (NDR InfiniBand / 400 GbE), 8 NICs per node as specified",
        ],
        nodes=8, gpus=8, mem_gib=141, intra_gbs=450.0, intra_alpha=3.0,
        inter_gbs=400 / 8, inter_alpha=6.0, tflops=989.0, launch_us=4.0,
        hbm_gbs=4800.0, e_max=0.7, fp8_tflops=1979.0),
    profile(
        "h100-8x8",
        "8 nodes x 8 NVIDIA H100 SXM5 80GB (DGX H100) on NVLink 4 (NVSwitch), 8 x 400 Gb/s "
        "NICs per node. Intra link: 450 GB/s per direction per GPU (half the 900 GB/s "
        "bidirectional datasheet figure). Inter link: one 400 Gb/s NIC per GPU = 50 GB/s. "
        "Peaks are the datasheet's with-sparsity figures halved (dense); 1-byte (FP8) GEMMs "
        "at the dense FP8 peak.",
        [
            "NVIDIA H100 Tensor Core GPU datasheet (SXM): BF16/FP16 Tensor Core 1,979 TFLOPS "
            "and FP8 Tensor Core 3,958 TFLOPS, both with sparsity (dense: 989.5 and 1,979), "
            "80 GB HBM3 at 3.35 TB/s, NVLink 900 GB/s (bidirectional per GPU)",
            "NVIDIA DGX H100 datasheet: 4x OSFP ports serving 8x single-port NVIDIA ConnectX-7 "
            "VPI, 400 Gb/s InfiniBand/Ethernet (one 400 Gb/s NIC per GPU)",
        ],
        nodes=8, gpus=8, mem_gib=80, intra_gbs=450.0, intra_alpha=3.0,
        inter_gbs=400 / 8, inter_alpha=6.0, tflops=989.5, launch_us=4.0,
        hbm_gbs=3350.0, e_max=0.7, fp8_tflops=1979.0),
    profile(
        "h800-8x8",
        "8 nodes x 8 NVIDIA H800 SXM5 80GB (the export variant of the H100 SXM, as in "
        "DeepSeek-V3's training cluster) on NVLink (NVSwitch) cut to 400 GB/s, 8 x 400 Gb/s "
        "InfiniBand NICs per node. Intra link: 200 GB/s per direction per GPU (400 GB/s is "
        "the bidirectional total, as 900 GB/s is for H100). Inter link: one 400 Gb/s NIC per "
        "GPU = 50 GB/s. Links at their nominal rates (DeepSeek reports about 160 GB/s NVLink "
        "and 40 GB/s IB achieved; the profile's assumed alpha and a measured profile stand in "
        "for the difference). NVIDIA publishes no H800 SXM datasheet: compute and HBM are "
        "taken as the H100 SXM's, which DeepSeek's figures match (989 TFLOPS dense BF16, "
        "3.35 TB/s); 1-byte (FP8) GEMMs at the H100's dense FP8 peak.",
        [
            "Zhao et al., Insights into DeepSeek-V3: Scaling Challenges and Reflections on "
            "Hardware for AI Architectures (ISCA 2025, arXiv 2505.09343), sec. 4.1: the NVLink "
            "bandwidth in H800 SXM nodes is reduced from 900 GB/s to 400 GB/s; each node is "
            "equipped with eight 400G InfiniBand (IB) CX7 NICs; sec. 4.3: NVLink provides "
            "200GB/s bandwidth (about 160GB/s achieved), each 400Gbps IB NIC 50GB/s",
            "DeepSeek-V3 Technical Report (arXiv 2412.19437), sec. 3.1: 2048 NVIDIA H800 GPUs, "
            "8 GPUs per node connected by NVLink and NVSwitch, InfiniBand across nodes; "
            "sec. 3.2.2: NVLink 160 GB/s, IB 50 GB/s",
            "NVIDIA H100 Tensor Core GPU datasheet (SXM), compute and memory the H800 SXM keeps: "
            "BF16/FP16 Tensor Core 1,979 and FP8 Tensor Core 3,958 TFLOPS with sparsity "
            "(dense: 989.5 and 1,979), 80 GB HBM3 at 3.35 TB/s; for H800 itself, "
            "deepseek-ai/FlashMLA issue #75: 1979 TFLOPS for sparse mma, 989 TFLOPS for dense mma",
        ],
        nodes=8, gpus=8, mem_gib=80, intra_gbs=400 / 2, intra_alpha=3.0,
        inter_gbs=400 / 8, inter_alpha=6.0, tflops=989.5, launch_us=4.0,
        hbm_gbs=3350.0, e_max=0.7, fp8_tflops=1979.0),
    profile(
        "b200-8x8",
        "8 nodes x 8 NVIDIA B200 (DGX B200) on NVLink 5 (NVSwitch), 8 x 400 Gb/s ConnectX-7 "
        "NICs per node. Intra link: 900 GB/s per direction per GPU (half the 1.8 TB/s "
        "bidirectional figure). Inter link: one 400 Gb/s NIC per GPU = 50 GB/s. Peaks are the "
        "with-sparsity figures halved (dense); 1-byte (FP8) GEMMs at the dense FP8 peak. "
        "Memory: 180 GB per GPU, the DGX B200 datasheet's 1,440 GB / 8 and the figure of "
        "NVIDIA's HGX and MIG documents for shipping B200 systems; the 192 GB of the 2024 "
        "launch materials is not what these systems list, so the lower figure is used.",
        [
            "NVIDIA HGX B200 (8 GPUs): FP16/BF16 Tensor Core 36 PFLOPS, NVLink GPU-to-GPU "
            "bandwidth 1.8 TB/s (bidirectional per GPU); Specification in Sparse, dense is 1/2 "
            "the sparse spec (per GPU dense: 2,250 TFLOPS BF16)",
            "NVIDIA DGX B200 datasheet: 8x B200, 1,440 GB total GPU memory, 64 TB/s HBM3e "
            "bandwidth (180 GB at 8 TB/s per GPU), 72 petaFLOPS training (FP8, with sparsity: "
            "4,500 TFLOPS dense per GPU), 14.4 TB/s aggregate NVLink bandwidth; 4x OSFP ports "
            "serving 8x single-port NVIDIA ConnectX-7 VPI (up to 400 Gb/s InfiniBand/Ethernet)",
        ],
        nodes=8, gpus=8, mem_gib=180, intra_gbs=1800 / 2, intra_alpha=3.0,
        inter_gbs=400 / 8, inter_alpha=6.0, tflops=2250.0, launch_us=4.0,
        hbm_gbs=8000.0, e_max=0.7, fp8_tflops=4500.0),
    profile(
        "gb200-nvl72",
        "16 racks of NVIDIA GB200 NVL72 (each 36 GB200 superchips = 72 Blackwell GPUs in one "
        "NVLink 5 domain, 18 compute trays of 4 GPUs). A moeplan node is the NVLink domain, "
        "so a node here is a whole rack, not the 4-GPU compute tray the "
        "OS sees. Of each rack's 72 GPUs the profile uses 64 (gpus_per_node = 64, 8 left "
        "idle): moeplan places every parallel group inside a node or over whole nodes, and "
        "72 admits no power-of-two group above 8, so a 72-GPU node would refuse the layouts "
        "MoE jobs run (EP 64, 1,024 GPUs). Intra link: 900 GB/s per direction per GPU across "
        "the rack (half the 1.8 "
        "TB/s bidirectional figure). Inter link (rack to rack): one 400 Gb/s ConnectX-7 NIC "
        "per GPU = 50 GB/s; ASSUMED from the GB200 reference design as MLPerf systems list it "
        "(4 ConnectX-7 per 4-GPU tray), no NVIDIA datasheet line for it was found (GB300 NVL72 "
        "has 800 Gb/s per GPU). 16 racks (1,024 GPUs used) is an assumed size. Intra alpha is assumed equal to an 8-GPU NVSwitch "
        "node's although a rack crosses an extra switch level. Peaks are the rack's "
        "with-sparsity figures halved, per GPU; 1-byte (FP8) GEMMs at the dense FP8 peak. "
        "Memory: 186 GB per GPU (13.4 TB / 72, the rack's and NVIDIA's MIG table's figure; "
        "192 GB is the launch figure).",
        [
            "NVIDIA GB200 NVL72: 36 Grace CPUs and 72 Blackwell GPUs, fifth-generation NVLink "
            "1.8 TB/s GPU-to-GPU (bidirectional per GPU), 130 TB/s aggregate; FP16/BF16 Tensor "
            "Core 360 PFLOPS and FP8/FP6 720 PFLOPS, Specification in sparse, dense is one-half "
            "(per GPU dense: 2,500 TFLOPS BF16, 5,000 TFLOPS FP8); 13.4 TB HBM3E at 576 TB/s "
            "(186 GB at 8 TB/s per GPU)",
            "MLCommons inference v6.1, Crusoe GB200-NVL72 system description: 4 accelerators "
            "per node (compute tray), 186 GB per accelerator, 4 BlueField-3 / ConnectX-7 "
            "devices per 4-GPU node (ConnectX-7: up to 400 Gb/s)",
        ],
        nodes=16, gpus=64, mem_gib=186, intra_gbs=1800 / 2, intra_alpha=3.0,
        inter_gbs=400 / 8, inter_alpha=6.0, tflops=2500.0, launch_us=4.0,
        hbm_gbs=8000.0, e_max=0.7, fp8_tflops=5000.0),
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
