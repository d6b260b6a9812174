#!/usr/bin/env python3
"""Predicts data-parallel scaling of transformer_hpc from its measured per-rank step.

What is measured and what is modelled:
- measured: the training step of one GPU at each batch size, from the newest
  `step_vs_torch: device=cuda ...` line per (preset, tokens) in bench/RESULTS.md
  (bench/step_vs_torch.sh; the step each of eight GPUs runs is tokens=3125);
- modelled: the all-reduce time (a ring: 2 (N - 1) / N x gradient bytes through the
  slowest link, at the links' nominal bandwidth below), which part of it backward hides
  (the buckets after the first start while backward runs; backward taken as 2/3 of the
  measured step), and the tied embedding's sum, which is final only when backward ends
  and so is always exposed (30% of base's gradient, 18% of big's).
- measured, and read with --buckets: the bucket schedule on a GPU (issue 52's overlap
  measurement: one rank's sums through NCCL timed by CUDA events, docs/scaling.md);
- not yet measured: the NCCL transport between GPUs (no machine with two GPUs has been
  lent). When it is, the link constants below are what to replace.
- with --buckets LOG: a measured bucket schedule replaces the 2/3 rule. LOG is a
  transformer_hpc log with dist.log_buckets = true (its last `buckets at step` line: when
  each bucket's sum could start, as a share of the pass's compute, and each bucket's share
  of the gradient); the sums then run one after another, each as soon as it is posted and
  the one before is done, at the modelled link's rate plus COLLECTIVE_LATENCY_S, and what
  ends after the step's compute is exposed. The posting schedule is measured, the
  transfer modelled. The shares are applied to --buckets-preset's gradient as they are,
  so LOG should come from that model: the output says when the log's run trained another
  parameter count (its `training N parameters` line), or that the log does not say.

    python3 tools/scaling_model.py [--results bench/RESULTS.md]   # the tables of docs/scaling.md
    python3 tools/scaling_model.py --buckets run.log [--buckets-preset base]
"""

import argparse
import os
import re
import sys

# Links, nominal, each way (what a ring edge carries in one direction).
NVLINK4_BYTES_PER_S = 450e9  # H100/H200 HGX: NVLink 4, 900 GB/s bidirectional per GPU
NDR_NIC_BYTES_PER_S = 50e9   # InfiniBand NDR: 400 Gb/s per NIC
NICS_PER_NODE = 8            # one NDR NIC per GPU (DGX H100 / HGX H200 reference designs)
GPUS_PER_NODE = 8
BACKWARD_SHARE = 2 / 3       # backward's share of a step: what overlap can hide (modelled)

VOCAB = 37000                # base.ini / big.ini: the WMT14 EN-DE joint vocabulary
MODELS = {"base": dict(N=6, d=512, f=2048), "big": dict(N=6, d=1024, f=4096)}
# The paper's recipes (§5.2): steps, and its time on 8 P100 GPUs (0.4 s and 1.0 s a step).
RECIPES = {"base": (100_000, "12 hours"), "big": (300_000, "3.5 days")}
BATCH_TOKENS = 25000         # per side, per step, over all GPUs (§5.1)
GPU_COUNTS = (8, 16, 64)
COLLECTIVE_LATENCY_S = 30e-6  # one ring all-reduce's fixed cost, modelled (NCCL: tens of us)


def parameters(N, d, f):
    """The parameter count of transformer_hpc's model (tied embedding, biases, norms)."""
    ffn = 2 * d * f + f + d
    encoder = 4 * d * d + ffn + 4 * d
    decoder = 8 * d * d + ffn + 6 * d
    return VOCAB * d + N * (encoder + decoder)


def refuse(message):
    """A bad argument: one line to standard error, exit 2 (as argparse's own), no traceback."""
    print(message, file=sys.stderr)
    sys.exit(2)


def measured_steps(results_path):
    """{(preset, tokens): (ms, heading)} from the newest line of each in RESULTS.md."""
    steps = {}
    heading = ""
    line_pattern = re.compile(r"^step_vs_torch: device=cuda preset=(\w+) tokens=(\d+) .*?"
                              r"ours_step_ms=([0-9.]+)")
    try:
        with open(results_path, encoding="utf-8") as results:
            for line in results:
                if line.startswith("## "):
                    heading = line[3:].strip()
                match = line_pattern.match(line)
                if match:
                    key = (match.group(1), int(match.group(2)))
                    steps.setdefault(key, (float(match.group(3)), heading))  # newest first
    except OSError as error:
        refuse(f"--results {results_path}: {error.strerror}")
    except UnicodeDecodeError:
        refuse(f"--results {results_path}: not UTF-8 text (give bench/RESULTS.md or a copy)")
    return steps


def allreduce_seconds(gpus, grad_bytes):
    """A ring all-reduce: inside a node every edge is NVLink; across nodes each node's
    NICs carry one ring each, so a node moves its share at NICS_PER_NODE x one NIC."""
    if gpus == 1:
        return 0.0
    if gpus <= GPUS_PER_NODE:
        link = NVLINK4_BYTES_PER_S
    else:
        link = min(NVLINK4_BYTES_PER_S, NICS_PER_NODE * NDR_NIC_BYTES_PER_S)
    return 2 * (gpus - 1) / gpus * grad_bytes / link


def exposed_seconds(comm, step, embedding_share):
    """The part of the all-reduce a step waits for: the tied embedding's share always
    (final only when backward ends), the rest beyond what backward's time hides."""
    return embedding_share * comm + max(0.0, (1 - embedding_share) * comm - BACKWARD_SHARE * step)


def bucket_schedule(log_path):
    """(shares of the gradient, posting times as shares of the pass's compute, the
    parameter count of the run or None) from the last `buckets at step` line of a
    transformer_hpc log (dist.log_buckets = true) and the `training N parameters` line
    before it."""
    line_pattern = re.compile(r"^buckets at step \d+ \(ms from [^)]*\): backward done ([0-9.]+), "
                              r"sums done [0-9.]+, exposed [0-9.]+; \d+ buckets "
                              r"\(MiB posted done\):(.*)$")
    count_pattern = re.compile(r"^training (\d+) parameters ")
    found = None
    count = found_count = None
    try:
        with open(log_path, encoding="utf-8") as log:
            for line in log:
                counted = count_pattern.match(line)
                if counted:
                    count = int(counted.group(1))
                match = line_pattern.match(line.strip())
                if match:
                    found, found_count = match, count
    except OSError as error:
        refuse(f"--buckets {log_path}: {error.strerror}")
    except UnicodeDecodeError:
        refuse(f"--buckets {log_path}: not UTF-8 text (give transformer_hpc's log)")
    # One GPU rank times its sums through NCCL (dist.log_buckets), as docs/scaling.md's
    # schedule was taken; a CPU rank alone has no sums, so there it takes two.
    if found is None:
        refuse(f"--buckets {log_path}: no 'buckets at step' line (run transformer_hpc with "
               f"--dist.log_buckets=true on one GPU, or on more than one rank)")
    backward_done = float(found.group(1))
    buckets = [(float(mib), float(posted)) for mib, posted, _ in
               re.findall(r"\| ([0-9.]+) ([0-9.]+) ([0-9.]+)", found.group(2))]
    total = sum(mib for mib, _ in buckets)
    if not buckets or total <= 0 or backward_done <= 0:
        refuse(f"--buckets {log_path}: its last 'buckets at step' line holds no buckets")
    return ([mib / total for mib, _ in buckets], [posted / backward_done for _, posted in buckets],
            found_count)


def scheduled_exposed_seconds(gpus, grad_bytes, step, shares, posted):
    """The sums run one after another in posting order, each from when it is posted (its
    measured share of the step's compute) or the previous one ends; exposed: what ends
    after the compute."""
    if gpus == 1:
        return 0.0
    free = 0.0
    for share, at in zip(shares, posted):
        free = (max(free, at * step) + allreduce_seconds(gpus, share * grad_bytes)
                + COLLECTIVE_LATENCY_S)
    return max(0.0, free - step)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    here = os.path.dirname(os.path.abspath(__file__))
    parser.add_argument("--results", help="the measured steps (default: bench/RESULTS.md)")
    parser.add_argument("--buckets", help="a transformer_hpc log with dist.log_buckets = true")
    parser.add_argument("--buckets-preset", default="base", choices=sorted(MODELS),
                        help="the model whose step the measured schedule is applied to")
    args = parser.parse_args()
    schedule = bucket_schedule(args.buckets) if args.buckets else None
    # Named as given, or as the document names the default (the output is pasted there).
    results_name = args.results or "bench/RESULTS.md"
    steps = measured_steps(args.results or os.path.join(here, "..", "bench", "RESULTS.md"))
    per_rank = BATCH_TOKENS // 8
    for name, shape in MODELS.items():
        if (name, per_rank) not in steps:
            refuse(f"--results {results_name}: no step_vs_torch line for {name} at "
                   f"tokens={per_rank}")

    print(f"Measured steps used ({results_name}, newest line of each):\n")
    print("| preset | tokens a side | ms per step | from |")
    print("|---|---:|---:|---|")
    for (name, tokens), (ms, heading) in sorted(steps.items()):
        gpu = re.search(r"NVIDIA [A-Z0-9]+", heading)
        source = heading.split(":")[0] + (", " + gpu.group(0) if gpu else "")
        print(f"| {name} | {tokens:,} | {ms:.2f} | {source} |")
    print()

    for name, shape in MODELS.items():
        count = parameters(**shape)
        embedding_share = VOCAB * shape["d"] / count
        step_ms, _ = steps[(name, per_rank)]
        step = step_ms / 1e3
        print(f"### {name}: {count / 1e6:.1f}M parameters (tied embedding {embedding_share:.0%}), "
              f"measured step {step_ms:.2f} ms at {per_rank:,} tokens a side per GPU\n")
        print("| GPUs | link | sum dtype | all-reduce ms (modelled) | exposed ms | step ms "
              "| efficiency |")
        print("|---:|---|---|---:|---:|---:|---:|")
        for gpus in GPU_COUNTS:
            link = "NVLink 4" if gpus <= GPUS_PER_NODE else f"NDR x{NICS_PER_NODE} per node"
            for dtype, element_bytes in (("fp32", 4), ("bf16", 2)):
                comm = allreduce_seconds(gpus, element_bytes * count)
                exposed = exposed_seconds(comm, step, embedding_share)
                print(f"| {gpus} | {link} | {dtype} | {comm * 1e3:.2f} | {exposed * 1e3:.2f} "
                      f"| {(step + exposed) * 1e3:.2f} | {step / (step + exposed):.1%} |")
        print()

    if schedule:
        shares, posted, log_count = schedule
        name = args.buckets_preset
        count = parameters(**MODELS[name])
        step = steps[(name, per_rank)][0] / 1e3
        print(f"### {name} with the measured bucket schedule of {args.buckets}\n")
        # The shares are the log's model's: another model's (tiny.ini's, or base's shape
        # with a small vocabulary, whose embedding is no 30% of the gradient) is said.
        if log_count is None:
            print(f"The log does not say its model (no 'training N parameters' line): the "
                  f"schedule is taken as {name}'s, {count:,} parameters; it must come from "
                  f"a run of that model.\n")
        elif log_count != count:
            print(f"Note: the log's run trained {log_count:,} parameters, not {name}'s "
                  f"{count:,}: its schedule is applied to {name}'s gradient as it is "
                  f"(a log of a {name} run gives {name}'s own).\n")
        print(f"{len(shares)} buckets posted at "
              + ", ".join(f"{at:.2f}" for at in posted)
              + " of the pass's compute (measured); transfers modelled as above, "
              f"+{COLLECTIVE_LATENCY_S * 1e6:.0f} us each\n")
        print("| GPUs | link | sum dtype | exposed ms | step ms | efficiency |")
        print("|---:|---|---|---:|---:|---:|")
        for gpus in GPU_COUNTS:
            link = "NVLink 4" if gpus <= GPUS_PER_NODE else f"NDR x{NICS_PER_NODE} per node"
            for dtype, element_bytes in (("fp32", 4), ("bf16", 2)):
                exposed = scheduled_exposed_seconds(gpus, element_bytes * count, step, shares,
                                                    posted)
                print(f"| {gpus} | {link} | {dtype} | {exposed * 1e3:.2f} | "
                      f"{(step + exposed) * 1e3:.2f} | {step / (step + exposed):.1%} |")
        print()

    print("### The paper's recipes: 25,000 + 25,000 tokens a step\n")
    print("| model | steps | GPUs | ms per step | training time | the paper, 8 P100 |")
    print("|---|---:|---:|---:|---:|---|")
    for name, (recipe_steps, paper) in RECIPES.items():
        count = parameters(**MODELS[name])
        embedding_share = VOCAB * MODELS[name]["d"] / count
        for gpus in (1, 8):
            tokens = BATCH_TOKENS // gpus
            if (name, tokens) not in steps:
                continue
            step = steps[(name, tokens)][0] / 1e3
            exposed = exposed_seconds(allreduce_seconds(gpus, 4 * count), step, embedding_share)
            total = step + exposed
            print(f"| {name} | {recipe_steps:,} | {gpus} | {total * 1e3:.1f} | "
                  f"{recipe_steps * total / 3600:.2f} h | {paper} |")
    print()


if __name__ == "__main__":
    main()
