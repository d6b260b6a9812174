#!/usr/bin/env bash
# The training-step benchmark against the PyTorch peers (torch_reference.py, which is not
# part of this repository: TORCH_REFERENCE names it), in one run on one machine:
#
#   TORCH_REFERENCE=PATH [BUILD=build (or THPC_BUILD)] [DEVICE=cuda|cpu] [RUNS=1] [THREADS=2]
#       [PEERS="eager compile"] [OURS_VARIANTS="NAME=SECTION.KEY=VALUE[,...] ..."]
#       [PROFILE=1] bash bench/step_vs_torch.sh [small|base|big] [TOKENS]
#   bash bench/step_vs_torch.sh --ceiling      # the GPU's bf16 GEMM ceiling alone (TFLOP/s)
#
# Every system trains on the same batch shapes (TOKENS / L sentences of length L for L in
# 12..96, source and target alike) and prints one JSON line. PEERS names the PyTorch
# variants to run (torch_reference.py's flags):
#   eager             bf16 autocast (fp32 on the CPU), SDPA, fused Adam
#   eager-liger       the same with Liger's fused linear cross-entropy (--loss liger)
#   compile           torch.compile over forward + loss, mode default, static shapes
#   compile-dynamic   the same with dynamic shapes (one graph for every length)
#   compile-autotune  mode max-autotune-no-cudagraphs, static shapes
#   compile-liger     compile with Liger's loss
#   compile-graphs    torch.compile mode reduce-overhead, static shapes: Inductor's kernels
#                     replayed as CUDA graphs (one per shape), what a PyTorch user picks
#                     for small, launch-bound batches (GPU only)
# A compiled peer keeps Inductor's cache in INDUCTOR_CACHE (default $BUILD/inductor-cache;
# another folder where BUILD is a read-only install), so that its second and later runs
# (RUNS > 1, or a later call on the same machine) reuse the compiled kernels;
# its JSON line has the compile seconds. A peer that cannot run here (Liger without its
# package) prints "skipped" and is left out. RUNS > 1 alternates the systems RUNS times.
# WARM_ONLY=1 runs the compiled peers of PEERS alone, one timed step each after their
# warm-up (every shape compiled), and prints no step_vs_torch line: it fills Inductor's
# cache for a later call on the same machine (bench/gpu_session.sh runs it beside the
# twin tests of call 1, so that call 2's CUDA-graph peer, 212 s to compile cold on an
# H200, starts warm; the cache changes what a compilation costs, not the kernels).
# Both sides read the loss back every step (ours always does; the peer's default).
# PROFILE=1 also runs each of our variants once with --profile (in the first run, after
# the unprofiled ones) and adds host_gap_share=S to its line: the share of the profiled
# step in which the device ran none of our kernels (the profile's "host time between
# kernels" row; the profiler's own two events per op are in it, so it is an upper bound).
# OURS_VARIANTS runs transformer_hpc once per named variant, each with its config
# overrides (e.g. "unfused=model.fused_ops=off fused=model.fused_ops=on"; a value may be a
# list: "graphs=train.cuda_kernels=step_graphs,async_upload,model.fused_ops=on"), against the
# same peer runs: each variant then ends with its own step_vs_torch line, with an
# ours=NAME field. Ours run before the peers in each run, so that a call cut off while a
# peer compiles still has our numbers; PEERS_FIRST=1 runs the peers first (a compiled
# peer warmed by an earlier call, whose line every ratio needs), and OURS_SECONDS=N starts
# no variant after N seconds of the script (each left out says so), so that a caller's
# time-out with many variants still leaves the peer's line and the summary.
# On the GPU: bf16, vocabulary 37000, 60 timed steps after 15 (compiled peers: after two
# passes over the shapes). On the CPU (bench/cpu_step_vs_torch.sh): fp32, vocabulary
# 8000, THREADS threads, 9 timed steps after 2. The last line is always
#   step_vs_torch: device=D preset=P tokens=T runs=R ours_step_ms=S ours_tokens_per_s=A
#     eager_tokens_per_s=B compile_tokens_per_s=C compile_peer=NAME eager_ratio=X
#     compile_ratio=Y mfu=M mfu_spec=N gemm_ceiling_tflops=G ours_peak_mem_gib=...
#     eager_peak_mem_gib=... compile_peak_mem_gib=...
#     [on the CPU: ours_gemm=onednn|openblas ours_openblas=CORE... eager_mfu=M
#      eager_gemm_ceiling_tflops=G compile_mfu=... compile_gemm_ceiling_tflops=...: each
#      peer against its own library's ceiling, which it measures; loadavg=BEFORE->AFTER
#      (1-minute, the runs' threads included) cores=N: a shared machine's noise shows]
# (after ours=NAME with OURS_VARIANTS) with medians over the runs; eager_* is the
# fastest eager-family peer, compile_* the
# fastest compiled one ("none" where none ran); a ratio > 1 means transformer_hpc is
# faster. mfu is model FLOPs/s over the GEMM ceiling: on the CPU the fp32 sgemm rate
# transformer_bench_step measures in the same run, on the GPU the bf16 cuBLAS rate
# measured below in this call; mfu_spec divides by the dense-bf16 specification
# (989.4 TFLOP/s, H100/H200 SXM) as public MFU figures do (GPU only). Installs nothing:
# PyTorch comes from PyPI (`python3 -m pip install torch`, and `liger-kernel` for the
# Liger peers); PYTHON names the interpreter that has them.
set -euo pipefail
cd "$(dirname "$0")/.."

# The bf16 GEMM ceiling of this GPU, in TFLOP/s: cuBLAS (through PyTorch's matmul) on
# 8192^3 random bf16 operands, the best of five timings of ten products after three
# warm-ups. `bash bench/step_vs_torch.sh --ceiling` prints it alone (bench/gpu_session.sh
# measures it once per call and passes it back in as CEILING_TFLOPS).
measure_ceiling() {
  "${PYTHON:-python3}" - <<'PY'
import torch
n = 8192
a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
for _ in range(3):
    a @ b
torch.cuda.synchronize()
start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
best_ms = float("inf")
for _ in range(5):
    start.record()
    for _ in range(10):
        a @ b
    end.record()
    torch.cuda.synchronize()
    best_ms = min(best_ms, start.elapsed_time(end) / 10)
print(round(2 * n**3 / best_ms / 1e9, 1))
PY
}
if [[ ${1:-} == --ceiling ]]; then measure_ceiling; exit; fi

preset=${1:-base}
device=${DEVICE:-cuda}
runs=${RUNS:-1}
threads=${THREADS:-2}
build=${BUILD:-${THPC_BUILD:-build}}  # (THPC_BUILD: the decoding script's name)
python=${PYTHON:-python3}
reference=${TORCH_REFERENCE:-}
read -r -a peers <<< "${PEERS-eager compile}"
readonly SPEC_TFLOPS=989.4  # H100/H200 SXM dense bf16 (NVIDIA's datasheet, without sparsity)
case $device in
  cuda) tokens=${2:-25000} ;;
  cpu) tokens=${2:-$([[ $preset == small ]] && echo 2000 || echo 1000)} ;;
  *) echo "DEVICE must be cuda or cpu, not '$device'" >&2; exit 2 ;;
esac
[[ $preset =~ ^(small|base|big)$ ]] || { echo "preset must be small, base or big, not '$preset'" >&2; exit 2; }
# PEERS="" runs ours alone (the CPU rehearsal of bench/gpu_session.sh without PyTorch).
if [[ ${#peers[@]} -gt 0 ]]; then
  [[ -n $reference && -f $reference ]] || {
    echo "TORCH_REFERENCE must name torch_reference.py (the PyTorch peer; got '${reference}')" >&2; exit 2; }
  "$python" -c 'import torch' 2>/dev/null || {
    echo "$python has no PyTorch: python3 -m pip install torch (or set PYTHON)" >&2; exit 2; }
fi
[[ -x $build/transformer_bench_step ]] || { echo "build first: cmake --build $build" >&2; exit 1; }

# torch_reference.py's flags for each peer name.
peer_args() {
  local cache=(--inductor-cache-dir "${INDUCTOR_CACHE:-$build/inductor-cache}")
  case $1 in
    eager) ;;
    eager-liger) echo --loss liger ;;
    compile) echo --compile --compile-mode default --dynamic false "${cache[@]}" ;;
    compile-dynamic) echo --compile --compile-mode default --dynamic true "${cache[@]}" ;;
    compile-autotune) echo --compile --compile-mode max-autotune-no-cudagraphs --dynamic false "${cache[@]}" ;;
    compile-liger) echo --compile --compile-mode default --dynamic false --loss liger "${cache[@]}" ;;
    compile-graphs) echo --compile --compile-mode reduce-overhead --dynamic false "${cache[@]}" ;;
    *) return 1 ;;
  esac
}
# Our variants: NAME and its --set arguments ("ours" with none by default).
read -r -a variants <<< "${OURS_VARIANTS:-}"
variant_names=() variant_sets=()
for variant in "${variants[@]}"; do
  [[ $variant =~ ^[A-Za-z0-9_-]+=[a-z_]+[.][a-z_]+=.+$ ]] || {
    echo "OURS_VARIANTS: '$variant' is not NAME=SECTION.KEY=VALUE[,SECTION.KEY=VALUE...]" >&2; exit 2; }
  variant_names+=("${variant%%=*}")
  variant_sets+=("${variant#*=}")
done
if [[ ${#variants[@]} -eq 0 ]]; then variant_names=(ours); variant_sets=(""); fi
for peer in "${peers[@]}"; do
  peer_args "$peer" > /dev/null || {
    echo "PEERS: unknown peer '$peer' (eager eager-liger compile compile-dynamic compile-autotune compile-liger compile-graphs)" >&2
    exit 2; }
done

# The small preset is input/base.ini with torch_reference.py's "small" sizes.
model_sets=()
config=input/$preset.ini
if [[ $preset == small ]]; then
  config=input/base.ini
  model_sets=(--set model.layers=2 --set model.d_model=256 --set model.d_ff=1024
              --set model.heads=4 --set model.d_k=64 --set model.d_v=64)
fi
if [[ $device == cuda ]]; then
  torch_args=(--vocab 37000 --steps 60 --warmup-steps 15 --spec-tflops "$SPEC_TFLOPS")
  ours_args=(--vocab 37000 --steps 60 --warmup-steps 15 --backend cuda --precision bf16
             --spec-tflops "$SPEC_TFLOPS")
else
  torch_args=(--device cpu --vocab 8000 --steps 9 --warmup-steps 2 --threads "$threads")
  ours_args=(--vocab 8000 --steps 9 --warmup-steps 2 --backend cpu --set "train.threads=$threads")
fi

# On the GPU, MFU is taken against the bf16 GEMM ceiling measured here, in this call, on
# this device (measure_ceiling; CEILING_TFLOPS: one measured earlier in the same call).
# Both sides are given it.
if [[ $device == cuda ]]; then
  ceiling=${CEILING_TFLOPS:-}
  [[ -n $ceiling ]] || ceiling=$(measure_ceiling)
  echo "bf16 GEMM ceiling (cuBLAS 8192^3, measured in this call): $ceiling TFLOP/s"
  ours_args+=(--peak-tflops "$ceiling")
  torch_args+=(--peak-tflops "$ceiling")
fi

if [[ ${WARM_ONLY:-0} == 1 ]]; then
  for peer in "${peers[@]}"; do
    read -r -a extra <<< "$(peer_args "$peer")"
    [[ " ${extra[*]} " == *" --compile "* ]] || continue
    echo "warm $peer: $("$python" "$reference" --preset "$preset" --tokens "$tokens" \
      "${torch_args[@]}" "${extra[@]}" --steps 1 | tail -1)"
  done
  exit 0
fi

# Every JSON line, tagged with its system, goes to one file that the summary reads.
lines=$(mktemp)
trap 'rm -f "$lines"' EXIT
# Ours, each variant of run $1. OURS_SECONDS: a variant starts only before that many
# seconds of this script (later ones are reported skipped), so that a caller's time-out
# leaves the summary below its time (bench/gpu_session.sh's compiled peer row).
run_ours() {
  local run=$1 v
  for ((v = 0; v < ${#variant_names[@]}; v++)); do
    if [[ -n ${OURS_SECONDS:-} && $SECONDS -ge $OURS_SECONDS ]]; then
      echo "ours ${variant_names[v]}: skipped in run $run, OURS_SECONDS=$OURS_SECONDS spent"
      continue
    fi
    sets=()
    # Split at the commas that start another SECTION.KEY=; any other comma belongs to a
    # value that is a list (train.cuda_kernels=async_upload,step_graphs).
    IFS=, read -r -a pieces <<< "${variant_sets[v]}"
    overrides=()
    for piece in "${pieces[@]}"; do
      if [[ $piece =~ ^[a-z_]+[.][a-z_]+= || ${#overrides[@]} -eq 0 ]]; then
        overrides+=("$piece")
      else
        overrides[-1]+=",$piece"
      fi
    done
    for override in "${overrides[@]}"; do sets+=(--set "$override"); done
    # A variant that fails (a candidate's kernel in a GPU window) is reported and left out;
    # the other variants and the peers still run and make their lines.
    if ! line=$("$build"/transformer_bench_step --config "$config" --tokens "$tokens" \
                "${ours_args[@]}" "${model_sets[@]}" "${sets[@]}" | tail -1) ||
       [[ $line != \{* ]]; then
      echo "ours ${variant_names[v]}: failed in run $run, left out"
      continue
    fi
    echo "$line"
    printf '%s\t%s\t%s\n' "$run" "ours:${variant_names[v]}" "$line" >> "$lines"
    if [[ ${PROFILE:-0} == 1 && $run == 1 ]]; then
      profiled=$("$build"/transformer_bench_step --config "$config" --tokens "$tokens" \
                 "${ours_args[@]}" "${model_sets[@]}" "${sets[@]}" --profile)
      # The whole table and the by-bucket lines (the JSON line of a profiled run is not
      # the benchmark's number, so it is left out).
      grep -v "^{" <<< "$profiled" | sed "s/^/${variant_names[v]} profiled: /"
      share=$(sed -n 's/^host time between kernels *[0-9.]* *\([0-9.]*\)%$/\1/p' <<< "$profiled")
      [[ -n $share ]] || { echo "no host-time row in the profile of ${variant_names[v]}" >&2; exit 1; }
      printf '%s\t%s\t{"host_gap_share": %s}\n' "$run" "profile:${variant_names[v]}" \
        "$(awk -v s="$share" 'BEGIN { printf "%.4f", s / 100 }')" >> "$lines"
    fi
  done
}

# The peers of run $1.
run_peers() {
  local run=$1 peer
  for peer in "${peers[@]}"; do
    read -r -a extra <<< "$(peer_args "$peer")"
    if ! line=$("$python" "$reference" --preset "$preset" --tokens "$tokens" "${torch_args[@]}" \
                "${extra[@]}" | tail -1) || [[ $line != \{* ]]; then
      echo "peer $peer: failed in run $run, left out"
      continue
    fi
    echo "$line"
    printf '%s\t%s\t%s\n' "$run" "$peer" "$line" >> "$lines"
  done
}

# The 1-minute load average before the runs (the CPU line gives it with the one after): on a
# shared machine a load above the runs' own threads says another process took cores
# (2-thread ratios moved by 10% on a 2-core machine that way; one thread was stable).
load_before=$(cut -d' ' -f1 /proc/loadavg 2> /dev/null || echo unknown)
# PEERS_FIRST=1: each run's peers before ours, so that the peer a ratio needs has its line
# even when OURS_SECONDS leaves some of our variants out.
for ((run = 1; run <= runs; run++)); do
  if [[ ${PEERS_FIRST:-0} == 1 ]]; then
    run_peers "$run"
    run_ours "$run"
  else
    run_ours "$run"
    run_peers "$run"
  fi
done

# On the CPU, the kernels OpenBLAS gave ours ("Core: ..." at OPENBLAS_VERBOSE=2), marked
# when OPENBLAS_CORETYPE chose them (the peer's BLAS does not read that variable), or
# when the program chose them for a CPU OpenBLAS does not know ("SkylakeX-instead-of-
# Prescott": the first start's kernels, then the second's; kernels/cpu/openblas_core.h).
openblas=none
if [ "$device" = cpu ]; then
  openblas=$(bash "$(dirname "$0")/openblas_kernels.sh" "$build/transformer_bench_step")
fi
"$python" - "$lines" "$device" "$preset" "$tokens" "$runs" "${#variants[@]}" "$openblas" \
  "$load_before" "$(nproc 2> /dev/null || echo unknown)" <<'PY'
import json, statistics, sys

path, device, preset, tokens, runs, named_variants, openblas, load_before, cores = sys.argv[1:]
by_system = {}
for row in open(path):
    run, system, text = row.rstrip("\n").split("\t", 2)
    by_system.setdefault(system, []).append((int(run), json.loads(text)))

def median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None

def fmt(value, digits):
    return "none" if value is None else (f"{value:.{digits}f}" if isinstance(value, float) else str(value))

# Each variant's records by run (a run it failed in has none).
variants = {name.split(":", 1)[1]: dict(by_system.pop(name))
            for name in [n for n in by_system if n.startswith("ours:")]}
profiles = {name.split(":", 1)[1]: by_system.pop(name)[0][1]
            for name in [n for n in by_system if n.startswith("profile:")]}
peer_records = {name: [(run, r) for run, r in records if not r.get("skipped")]
                for name, records in by_system.items()}
for name, ran in peer_records.items():
    if not ran:
        print(f"peer {name}: skipped ({by_system[name][0][1].get('skipped')})")

for variant, ours in variants.items():
    label = "transformer_hpc" + (f" ({variant})" if int(named_variants) else "")
    ours_rate = median([r["tokens_per_s"] for r in ours.values()])
    # Per run, each peer's ratio against ours of the same run, then the medians.
    peers = {}
    for name, ran in peer_records.items():
        if not ran:
            continue
        for run, r in ran:
            if run not in ours:
                continue
            ratio = ours[run]["tokens_per_s"] / r["tokens_per_s"]
            print(f"run {run}: {label} {ours[run]['tokens_per_s']:.0f} / {name} "
                  f"{r['tokens_per_s']:.0f} tokens/s = {ratio:.3f}x"
                  + (f" (compile {r['compile_s']} s)" if r.get("compile_s") is not None else ""))
        peers[name] = {
            "tokens_per_s": median([r["tokens_per_s"] for _, r in ran]),
            "ratio": median([ours[run]["tokens_per_s"] / r["tokens_per_s"]
                             for run, r in ran if run in ours]),
            "peak_mem_gib": median([r.get("peak_mem_gib") for _, r in ran]),
            "mfu": median([r.get("mfu") for _, r in ran]),
            "gemm_ceiling_tflops": median([r.get("gemm_ceiling_tflops") for _, r in ran]),
        }

    def fastest(family):
        names = [n for n in peers if n.split("-")[0] == family]
        return max(names, key=lambda n: peers[n]["tokens_per_s"]) if names else None

    fields = [f"device={device}", f"preset={preset}", f"tokens={tokens}", f"runs={runs}"]
    if int(named_variants):
        fields.append(f"ours={variant}")
    fields += [f"ours_step_ms={fmt(median([r['median_step_ms'] for r in ours.values()]), 2)}",
               f"ours_tokens_per_s={fmt(ours_rate, 0)}"]
    chosen = {family: fastest(family) for family in ("eager", "compile")}
    for family, name in chosen.items():
        fields.append(f"{family}_tokens_per_s={fmt(peers[name]['tokens_per_s'] if name else None, 0)}")
    fields.append(f"compile_peer={chosen['compile'] or 'none'}")
    for family, name in chosen.items():
        fields.append(f"{family}_ratio={fmt(peers[name]['ratio'] if name else None, 3)}")
    fields += [f"mfu={fmt(median([r['mfu'] for r in ours.values()]), 3)}",
               f"mfu_spec={fmt(median([r.get('mfu_spec') for r in ours.values()]), 3)}",
               f"gemm_ceiling_tflops="
               f"{fmt(median([r['gemm_ceiling_tflops'] for r in ours.values()]), 4)}",
               f"ours_peak_mem_gib={fmt(median([r.get('peak_mem_gib') for r in ours.values()]), 2)}"]
    if variant in profiles:
        fields.append(f"host_gap_share={fmt(profiles[variant]['host_gap_share'], 4)}")
    for family, name in chosen.items():
        fields.append(f"{family}_peak_mem_gib={fmt(peers[name]['peak_mem_gib'] if name else None, 2)}")
    if device == "cpu":
        # The library of ours' products (kernels/cpu/blas.h), as transformer_bench_step said.
        fields.append(f"ours_gemm={next(iter(ours.values())).get('cpu_gemm') or 'unknown'}")
        fields.append(f"ours_openblas={openblas}")
        # Each peer against its own library's ceiling (torch.mm's, which it measures):
        # PyPI's PyTorch multiplies with MKL, 0.11 TFLOP/s a thread on a Zen 5 EPYC where
        # oneDNN gives ours 0.25, so a ratio there is mostly the libraries' (a helper's
        # walk); these fields say how much.
        for family, name in chosen.items():
            fields.append(f"{family}_mfu={fmt(peers[name]['mfu'] if name else None, 3)}")
            fields.append(f"{family}_gemm_ceiling_tflops="
                          f"{fmt(peers[name]['gemm_ceiling_tflops'] if name else None, 4)}")
        # The machine's 1-minute load average before and after the runs, and its cores
        # (the runs' own threads count in it).
        try:
            with open("/proc/loadavg") as f:
                load_after = f.read().split()[0]
        except OSError:
            load_after = "unknown"
        fields.append(f"loadavg={load_before}->{load_after}")
        fields.append(f"cores={cores}")
    print("step_vs_torch: " + " ".join(fields))
PY
