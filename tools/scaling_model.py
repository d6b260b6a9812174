#!/usr/bin/env python3
"""Predicts data-parallel scaling of transformer_hpc from first principles.

Compute per step and GPU: matrix FLOPs of forward + backward (3x forward) for the
per-GPU token batch, at a stated fraction of the H200's bf16 peak (790 TFLOP/s dense,
measured ceiling). Communication per step: a ring all-reduce of the fp32 gradient,
2 (N - 1) / N x gradient bytes through the slowest link of the ring. Weak scaling: each
GPU keeps the paper's per-GPU batch (25000 source + 25000 target tokens over 8 GPUs).

    python3 tools/scaling_model.py            # prints the tables of docs/scaling.md
"""

PEAK_FLOPS = 790e12          # H200 bf16 dense, measured (device notes)
EFFICIENCY = 0.5             # fraction of peak a training step sustains (assumed)
NVLINK_BYTES_PER_S = 450e9   # H200 HGX NVLink: 900 GB/s bidirectional = 450 GB/s each way
IB_BYTES_PER_S = 200e9       # 4 x 400 Gb/s InfiniBand per node = 200 GB/s each way
GPUS_PER_NODE = 8
VOCAB = 37000
TOKENS_PER_GPU = 25000 / 8   # per side (source, target): the paper's batch on 8 GPUs
MEAN_LENGTH = 27             # mean WMT14 EN-DE sentence length in BPE tokens
BACKWARD_SHARE = 2 / 3       # backward is 2/3 of the step's FLOPs: what overlap can hide

MODELS = {"base": dict(N=6, d=512, f=2048), "big": dict(N=6, d=1024, f=4096)}
# The paper's recipes (§5.2): steps, and its time on 8 P100 GPUs (0.4 s and 1.0 s a step).
RECIPES = {"base": (100_000, "12 hours"), "big": (300_000, "3.5 days")}
BATCH_TOKENS = 25000         # per side, per step, over all GPUs (§5.1)


def parameters(N, d, f):
    ffn = 2 * d * f + f + d
    encoder = 4 * d * d + ffn + 4 * d
    decoder = 8 * d * d + ffn + 6 * d
    return VOCAB * d + N * (encoder + decoder)


def step_flops(N, d, f, src, tgt, L):
    """Forward + backward matrix FLOPs (2 per multiply-add, backward = 2x forward)."""
    encoder = N * (4 * d * d + 2 * d * f)
    decoder = N * (8 * d * d + 2 * d * f)
    forward = 2 * (src * encoder + tgt * (decoder + VOCAB * d))
    # QK^T and PV per layer: encoder self, decoder self, decoder cross.
    forward += 2 * 2 * N * d * L * (src + tgt + tgt)
    return 3 * forward


def allreduce_seconds(gpus, grad_bytes):
    if gpus == 1:
        return 0.0
    link = NVLINK_BYTES_PER_S if gpus <= GPUS_PER_NODE else IB_BYTES_PER_S
    return 2 * (gpus - 1) / gpus * grad_bytes / link


def main():
    for name, m in MODELS.items():
        p = parameters(**m)
        grad_bytes = 4 * p
        compute = step_flops(**m, src=TOKENS_PER_GPU, tgt=TOKENS_PER_GPU, L=MEAN_LENGTH) / (
            EFFICIENCY * PEAK_FLOPS)
        print(f"### {name}: {p / 1e6:.1f}M parameters, fp32 gradient {grad_bytes / 1e6:.0f} MB, "
              f"compute {compute * 1e3:.1f} ms per step per GPU\n")
        print("| GPUs | link | all-reduce ms | efficiency, no overlap | efficiency, overlapped |")
        print("|---:|---|---:|---:|---:|")
        for gpus in (1, 8, 16, 64):
            comm = allreduce_seconds(gpus, grad_bytes)
            exposed = max(0.0, comm - BACKWARD_SHARE * compute)
            link = "-" if gpus == 1 else ("NVLink" if gpus <= GPUS_PER_NODE else "InfiniBand")
            print(f"| {gpus} | {link} | {comm * 1e3:.1f} | {compute / (compute + comm):.1%} "
                  f"| {compute / (compute + exposed):.1%} |")
        print()
    print("### The paper's recipes: 25000 + 25000 tokens per step (one GPU accumulates the "
          "step's batch)\n")
    print("| model | steps | GPUs | ms per step | training time | the paper, 8 P100 |")
    print("|---|---:|---:|---:|---:|---|")
    for name, (steps, paper) in RECIPES.items():
        m = MODELS[name]
        grad_bytes = 4 * parameters(**m)
        for gpus in (1, 8):
            tokens = BATCH_TOKENS / gpus
            compute = step_flops(**m, src=tokens, tgt=tokens, L=MEAN_LENGTH) / (
                EFFICIENCY * PEAK_FLOPS)
            exposed = max(0.0, allreduce_seconds(gpus, grad_bytes) - BACKWARD_SHARE * compute)
            step = compute + exposed
            print(f"| {name} | {steps:,} | {gpus} | {step * 1e3:.1f} | "
                  f"{steps * step / 3600:.1f} h | {paper} |")
    print()


if __name__ == "__main__":
    main()
