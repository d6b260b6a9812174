#!/usr/bin/env bash
# Everything a session with a lent GPU (H100/H200) should run. GPU time comes in
# 15-minute windows (900 s of device time, the machine's start of 1-2 minutes, the
# transfers and idle waits included): three device calls sent back to back (a machine
# idle for 30 s is given back), everything in them prepared and rehearsed here first.
#
#   bash bench/gpu_session.sh --prepare GPU_HOST_DIR   # here (Debian, apt): the bundle, data
#       and CTranslate2's wheel (--prepare-ctranslate2 makes the wheel alone)
#   bash bench/gpu_session.sh --dry-run                # here: the plan with its time
#       estimates, every check that needs no GPU, the calls rehearsed on the CPU
#   bash bench/gpu_session.sh --rehearse [step|ranks|followup]   # here: one call's rehearsal
# The next window's plan (after 2026-12-04's eighth: issue 52 is resolved, so the ranks
# call below gives way to one rank's batch against the CUDA-graph compiled peer, whose
# compilation did not finish in that window's 277 s: now call 1 compiles it beside its
# twin tests, start_peer_warmup, and call 2 finds it in build-gpu/inductor-cache; the
# three calls back to back, ~860 s with the machine's start of ~45 s: call 3 may be cut
# at its end by the budget, and its lines are printed as each run ends):
#   1: run(command="STEP_SECONDS=1 SHORT_ATTENTION_LENGTHS= timeout 350 bash
#          bench/gpu_session.sh step", timeout_s=365, carry=["gpu-bundle", "shared-for-gpu"])
#      (~340 s: the twins, fuller_column_sums', worker_graphs', the fused attention's
#      second design's, fused_norm_grads', fast_loss_exp's and bias_grads_in_gemm's first
#      among them, the captured decoding's and linear.cu's (CudaLinear, CudaGemmSweep) as
#      changed twins, the whole model, beside them the peer's compilation, which the
#      profiles wait for until 260 s, in the wait the memcheck of fuller_column_sums' twins
#      (what its promotion needs), then the fused attention's, fused_norm_grads',
#      fast_loss_exp's and bias_grads_in_gemm's, then the racecheck of the first two, then
#      the profiles: each step candidate alone, fused_attention's by-op and by-length
#      lines against verified, fused_norm_grads' add & norm backward, fast_loss_exp's loss;
#      after them the GEMM sweep at 3,125 tokens: what the cuBLASLt heuristic's other
#      offers would save of one rank's 3.07 ms of GEMMs, its gemm_sweep_total line, ~30 s;
#      then the program against the benchmark and one rank's batch, which earlier windows
#      and call 2 measure too, and which the call's time-out cuts first; reading the
#      twins: fused_norm_grads finishes its sums with fuller_column_sums' lanes kernel
#      whether or not that candidate is on, so both failing is that kernel's failure, and
#      bias_grads_in_gemm's twin covers linear_backward, its linear_relu_backward (the
#      FFN's second layer) only the whole-model check with the candidates)
#   2: run(command="timeout 285 env CURVE_SECONDS=270 CURVE_ROWS= CURVE_COMPILED='base 3125
#          compile-graphs' OURS_VARIANTS='verified=train.cuda_kernels=verified
#          graphs=train.cuda_kernels=step_graphs
#          fuller=train.cuda_kernels=step_graphs,fuller_column_sums
#          short128=train.cuda_kernels=step_graphs,fuller_column_sums,train.short_attention_max_len=128
#          fusedattn=train.cuda_kernels=step_graphs,fuller_column_sums,fused_attention
#          normgrads=train.cuda_kernels=step_graphs,fuller_column_sums,fused_norm_grads
#          fastloss=train.cuda_kernels=step_graphs,fuller_column_sums,fused_norm_grads,
#          fast_loss_exp
#          biasgemm=train.cuda_kernels=step_graphs,fuller_column_sums,fused_norm_grads,
#          fast_loss_exp,bias_grads_in_gemm
#          beside=train.cuda_kernels=step_graphs,fuller_column_sums,weight_grads_beside
#          bothgemm=train.cuda_kernels=step_graphs,fuller_column_sums,fused_norm_grads,
#          fast_loss_exp,bias_grads_in_gemm,weight_grads_beside'
#          bash bench/gpu_session.sh curve", timeout_s=300, same carry; one line, each
#          setting's line-end comma joined to the name after it)
#      (issue 51's compile_ratio at 3,125 tokens in one call, each of ours with its warm-up
#      rounds: the second round with graphs is every shape's capture, what step_graphs
#      waits for; when call 1 says "peer warm-up: stopped", give it CURVE_SECONDS=330.
#      The compiled peer runs first, and ours start only in the row's first seconds less
#      40 (PEERS_FIRST, OURS_SECONDS): the variants the time leaves out say "skipped",
#      the ratio's peer line and the summary stay; so list them most wanted first.
#      short128: the short kernels at every length; their bound of 48 was measured at
#      25,000 tokens, where the batched GEMMs win from 64, but one rank's 32 sentences of
#      96 give the batched path (some eight launches an attention, forward and backward)
#      1.7 ms a step, 4.4 TFLOP/s: the by-bucket lines say which wins at 64 and 96;
#      fusedattn: the fused attention's second design, only if call 1 passed its twins,
#      else leave it out: one rank's attention was 1.11 of its 7.10 ms profiled;
#      normgrads: 30 partial-sum launches fewer a step, likewise only if its twins passed;
#      fastloss: and the loss's exps as exp2, ~29 -> ~21 instructions a logit;
#      biasgemm: and each layer's bias gradient summed in its weight gradient's GEMM
#      (BGRADA), ~54 n = 1 products a step fewer;
#      beside: each weight gradient's GEMM on a side stream beside the input gradient's,
#      the graphs holding both: neutral at 25,000 tokens (30.40 against 30.24 ms), never
#      timed at one rank's batch, where a [3,125 x 512] x [512 x 512] product fills 100
#      of 132 SMs for a few microseconds and GEMMs ran at 382 TFLOP/s against 628);
#      bothgemm: biasgemm's with beside's, each layer's summing GEMM and its addition
#      beside (since 2026-12-07 they no longer exclude each other: the sums in the side
#      stream's own buffer), read against both)
#   3: run(command="timeout 240 env TRAIN_MINUTES=0.5 CHECKPOINT_MINUTES=0.09
#          TRAIN_KERNELS=step_graphs GPU_WORKERS=2 DECODE_CANDIDATE=worker_graphs
#          TRANSLATE_SECONDS=230 bash bench/gpu_session.sh translate", timeout_s=250,
#          carry=[".whl", "shared-for-gpu"])
#      (TRAIN_KERNELS: the program trains Multi30k with step_graphs, which the benchmark
#      has timed but the program never trained with on a GPU: a real corpus's shapes, its
#      "captured passes:" line and step rate against the 9.7 ms of 2026-12-04's verified
#      run; a failure trains again with the default, ~40 s, so decoding keeps its model;
#      add fuller_column_sums etc. when call 2 showed them faster, leave it empty when
#      step_graphs' twins failed in call 1)
#      (issue 53: the captured decoding steps, now the default, against CTranslate2, and
#      two workers with worker_graphs, each capturing its steps: ours_candidate_b32_w2 and
#      the int8 profile's "device idle, all 2 workers", the host gaps' < 3%; when call 1
#      says worker_graphs' twin failed, DECODE_CANDIDATE= instead. Since 2026-12-07 a
#      worker_graphs capture holds a ConcurrentCaptureScope and every free of the CUDA
#      backends waits for it (kernels/capture_free_lock.h: a review found another
#      worker's cudaFree would synchronise the device mid-capture and invalidate it);
#      should the twin still fail on its " 0 refused, ", some other call of another
#      worker synchronises the device (a cudaFree outside the backends, a
#      cudaDeviceSynchronize, a cudaMallocHost outside the backends: since the same day
#      the backends' pinned allocations wait behind the gate too);
#      should it hang, that lock (a free waiting on a capture that waits on the freeing
#      thread). Also read CudaGemmSweep's max_relative_difference at 3,125 tokens: cuBLAS before
#      13.4 Update 1 has a split-K fault on sm_90 (algorithm 66, a split count that does
#      not divide k) that gives wrong products)
# The standing plan (print_plan, `--dry-run`):
#   call 1:  run(command="PEERS=eager timeout 400 bash bench/gpu_session.sh step",
#                timeout_s=430, carry=["gpu-bundle", "shared-for-gpu"])
#       (PEERS=eager: the compiled peer, ~230 s, was last run on 2026-11-26's fourth
#       window, 1.269x, and the step has not changed since; drop it when it has. While
#       the step stays unchanged, STEP_SECONDS=1 SHORT_ATTENTION_LENGTHS= skips the peers
#       and the length profiles too: call 1 then took 70 s in the fifth window, build
#       and all twins included, and left calls 2 and 3 their whole time-outs.)
#   call 2, AT ONCE (a machine idle for 30 s is given back, and with it build-gpu/ and
#   the unpacked bundle): ranks sharing the GPU (issue 52; the mission's order is the
#   training step, then ranks sharing a GPU, then decoding):
#            run(command="timeout 300 bash bench/gpu_session.sh ranks", timeout_s=330,
#                carry=["gpu-bundle", "shared-for-gpu"])
#   call 3, at once, with what the window has left: decoding (issue 53). At once means
#   the next tool call, with nothing read in between: on 2026-12-04 some 30 s spent
#   reading call 2's output lost the machine, call 3 met a fresh one (62 s to start) and
#   stopped at once without the bundle; it was sent again carrying gpu-bundle, and found
#   the wheel the failed call had carried, but not call 1's record of the candidates whose
#   twins passed, so it decoded without them: on a fresh machine give that list, as call
#   1's "the others passed: train.cuda_kernels=..." line printed it, as DECODE_CANDIDATE=:
#            run(command="timeout 330 env TRAIN_MINUTES=1 CHECKPOINT_MINUTES=0.17
#                bash bench/gpu_session.sh translate", timeout_s=360,
#                carry=[".whl", "shared-for-gpu"])
#       ours, with the decoding candidates when call 1 passed them, and CTranslate2 on
#       the same weights. CTranslate2's wheel (25 MB, .whl/) and the bundle (41 MB) do not
#       fit in one call's 64 MiB together, so this call carries the wheel and uses the
#       bundle call 1 left on the warm machine (it stops at once, saying so, on a fresh
#       machine: then carry gpu-bundle instead of .whl and CTranslate2 is left out).
#       Its time: training and BLEU ~100 s, the decode-speed runs ~20 s, the comparison
#       with CTranslate2 ~170 s with the candidates (2026-11-29, H200: a 270 s call was
#       cut inside the comparison, which then ran as a call of its own), and two GPU
#       workers against CTranslate2's inter_threads 2 add ~50 s (GPU_WORKERS=1 leaves
#       them out): give it 330 s or more when calls 1 and 2 ran short (they took 125 +
#       72 s that day).
#       `followup` (memcheck of the candidate twins, big profiled) is the call after, in
#       a window with time left.
#   the step curve (issue 51), a call of its own (2026-11-28, H200: 420 s cold):
#            run(command="timeout 450 env CURVE_SECONDS=420 bash bench/gpu_session.sh curve",
#                timeout_s=470, carry=["gpu-bundle", "shared-for-gpu"])
#       base at 3,125 / 6,250 / 12,500 / 25,000 and big at 3,125 / 25,000 tokens, each
#       with the eager peer and host_gap_share, then the CUDA-graph compiled peer at
#       3,125 (212 s to compile: it needs a warm call of its own, CURVE_ROWS="").
#   ranks (call 2 above; ~4 min cold, estimated, when it is a call of its own):
#       the CudaDistributed.* tests (2 and 4 ranks on one GPU through dist.reducer = mpi
#       against one rank accumulating, fp32 and bf16; bf16 reduction; NCCL's refusal named;
#       4 ranks stopped by SIGTERM resumed on 2 and on 1; a killed rank; one-rank NCCL),
#       compute-sanitizer memcheck of the candidates' kernel twins and racecheck of the
#       fused attention's (on the tests call 1 built on the warm machine: what a
#       candidate's promotion needs besides its twins),
#       then base-sized steps of the synthetic task on 1 and 2 ranks sharing the GPU
#       (RANKS_STEPS, default 60), and a base checkpoint's stall written in the step and
#       beside training (bench/checkpoint_stall.sh, 40-100 s estimated).
#   `--dry-run` prints the plan (print_plan below) with each item's estimate.
#
# step (call 1; STEP_SECONDS, default 370, leaves the 400 s time-out room for the log):
#   0. build for sm_90 on every core (ccache where the machine has one: the CMakeLists
#      use it when it is on PATH; a cache made here cannot serve there, another compiler
#      and other paths, so the kept build-gpu/ is what the second call reuses) only what
#      the stage runs: transformer_bench_step, the kernel twin tests (tests/kernels/) and
#      test_cuda_training;
#   1. the candidate kernels' twins in fp32 and bf16 (CANDIDATE_TWINS: the kernels behind
#      train.cuda_kernels = candidate, not yet the default: fused_attention, step_graphs,
#      relu_masks, weight_grads_beside, fuller_column_sums, worker_graphs; when some fail,
#      the others by name) and the whole model with them; then the verified twins of the
#      files changed
#      since the last GPU run
#      (CHANGED_TWINS; OTHER_TWINS=all runs every kernel twin) and the whole-model checks
#      with the verified kernels: fp32 separate and fused against the CPU
#      (CudaTraining.Fp32ThreeSteps*, also with model.activation_dropout), bf16 with the
#      short attention against the batched
#      (CudaTraining.Bf16ThreeStepsWithShortAttention*), the register-held add & norms
#      against the separate ops (CudaTraining.Bf16RegisterHeldNorms*), decoding steps
#      against the CPU's cached decoder (CudaTraining.DecodingStepsMatchTheCpu), the
#      one-pass Adam taken at every step (CudaTraining.EveryStepTakesTheOnePassAdam);
#   2. the bf16 GEMM ceiling (cuBLAS 8192^3 through PyTorch), for every MFU figure;
#   3. transformer_bench_step --profile, base, 25,000 + 25,000 tokens, bf16,
#      train.cuda_kernels = verified and (only if the candidate twins passed in 1.)
#      candidate, and candidate without step_graphs (its kernels by op class, no
#      captures), and each candidate of STEP_KERNEL_CANDIDATES alone (its own rows);
#      then the default once per train.short_attention_max_len in
#      SHORT_ATTENTION_LENGTHS (default "0 64": the batched path alone, and one length
#      more than the default 48), each its step and by-bucket lines only; the program
#      against the benchmark at 3,125 tokens; the small batch (base, 3,125 tokens) timed
#      and profiled per kernel setting, the candidates' with CUDA graphs, and timed without
#      each of SMALL_BATCH_LEAVE_OUT (default weight_grads_beside), there and at 25,000
#      tokens (small_batch_step);
#   4. PEERS="eager compile" bench/step_vs_torch.sh base with ours verified and candidate
#      (OURS_VARIANTS), ours and eager first, the compiled peer (torch.compile, default
#      mode, static shapes: nine lengths) last with what is left; a peer cut off leaves
#      its inductor cache in build-gpu/ for call 2.
# followup (call 3; FOLLOWUP_SECONDS, default 240):
#   1. compute-sanitizer memcheck of the candidate twins, and racecheck of the
#      short-sentence attention's (its blocks share memory between phases);
#   2. big (input/big.ini) at 25,000 + 25,000 tokens: the profile and the unprofiled line
#      (peak memory, step ms, MFU), verified and (candidate twins passed) candidate;
#   3. what call 1 did not finish: the compiled peer with ours off and on, on the
#      inductor cache call 1 left.
# model.fused_ops's default (CudaBackend::fused_ops_by_default) was flipped to on by the
# session of 2026-11-26 (bench/RESULTS.md), in which the fused twins, the fused
# whole-model check and memcheck passed on an H100; train.cuda_kernels = candidate is the
# switch measured now (docs/testing.md, "Kernels not yet run on a GPU").
#
# translate (call 2; 124 s warm with TRAIN_MINUTES=0.75 CHECKPOINT_MINUTES=0.14 on
# 2026-11-26, without CTranslate2): Multi30k with base-sized layers (6 x 512, d_ff 2048,
# 8 heads) trained for TRAIN_MINUTES (default 4; train.max_minutes), a checkpoint every
# CHECKPOINT_MINUTES (default 0.7; TRANSLATE_CONFIG=input/multi30k.ini trains that file's
# model instead), the last 5 checkpoints averaged, test_2016_flickr decoded with beam 4
# and scored (sacreBLEU 13a), newstest2014 (3,003 lines) decoded with beam 4 and greedily
# (wall tokens/s), then bench/decode_vs_ctranslate2.sh on it: ours with the model load
# excluded, in 4,096-token batches and batches of 32 sentences, with and without the
# candidate kernels (when call 1 passed their twins), and CTranslate2 on the same weights
# (its wheel from .whl/, the host's cuBLAS 13 standing in for the 12 it asks for).
#
# The older stages, each longer than a window's second call now (2026-11-25, H100):
#   tests      (526 s cold) the CUDA twin tests and whole-model GPU tests (memcheck on a
#              short run among them), racecheck on the attention, layer-norm and top-k
#              twins, the step benchmark, two MPI ranks on the one GPU, the CPU suite;
#   parse      (428 s warm) input/parse_wsj.ini trained for TRAIN_MINUTES (default 5),
#              dev and test decoded with the config's beam 21 and scored with EVALB
#              beside the right-branching baseline;
#   peers      step 4 alone (STEP_SECONDS).
#
# --prepare runs GPU_HOST_DIR/fetch.sh (the scripts that make a CUDA host without our
# Debian libraries able to build: .debs unpacked with dpkg -x, see their README) into
# gpu-bundle/, and copies what the GPU run reads into shared-for-gpu/: the data sets the
# GPU tests and benchmarks use, laid out for THPC_DATA (from $THPC_DATA, see
# tools/fetch_data.sh), and the PyTorch peer (from $TORCH_REFERENCE); then
# --prepare-ctranslate2 puts CTranslate2's wheel for the host's python3 into .whl/. The
# three folders are git-ignored: they travel only as a device call's carried paths.
#
# --rehearse runs a stage here on the CPU, on the existing build/ (BUILD): the twins as
# their CPU rehearsals (THPC_TWIN_REHEARSAL), the profiles, big line and peer comparison
# on small shapes with the CPU backend (the peer only where TORCH_REFERENCE and PyTorch
# are there, eager only), memcheck and the GPU-only whole-model tests reported as
# skipped: it checks the stage's commands, arguments and logs, not a number.
#
# On the GPU host every stage unpacks the Debian libraries (gpu-bundle/use.sh) and builds
# in build-gpu/ (incrementally when a warm machine kept it). A stage's logs go to one
# archive, $OUT/logs_STAGE.tgz (./gpu-logs/ without $OUT), of a few hundred kB: the
# console output is the summary.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1

# The device call carries the tree and these paths, 64 MiB in all (the device tool's limit).
readonly CARRIED=(gpu-bundle shared-for-gpu)
# The translate call's instead (call 2): CTranslate2's wheel in place of the bundle.
readonly TRANSLATE_CARRIED=(.whl shared-for-gpu)
# CTranslate2's wheel for the GPU host's python3 (3.12 there): the version whose cuBLAS
# functions bench/decode_vs_ctranslate2.sh names (it takes them from the host's cuBLAS).
readonly CT2_VERSION=4.8.5 CT2_PYTHON_TAG=cp312
readonly TRANSFER_LIMIT_BYTES=$((64 * 1024 * 1024))
# Data sets the GPU run reads (tests/test_cuda_training.cc: multi30k; the decode numbers:
# wmt14_test; the parser's GPU numbers: ptb_sample and evalb).
readonly GPU_DATA_SETS=(multi30k wmt14_test ptb_sample evalb)
# --prepare copies from the caller's THPC_DATA and TORCH_REFERENCE; the run reads the copies.
SOURCE_DATA=${SOURCE_DATA:-${THPC_DATA:-}}
SOURCE_TORCH_REFERENCE=${SOURCE_TORCH_REFERENCE:-${TORCH_REFERENCE:-}}
export THPC_DATA=$PWD/shared-for-gpu/data
export TORCH_REFERENCE=$PWD/shared-for-gpu/bench/torch_reference.py

prepare() {
  local host_dir=${1:?usage: bench/gpu_session.sh --prepare GPU_HOST_DIR}
  local data=${SOURCE_DATA:?set THPC_DATA to the data folder (tools/fetch_data.sh)}
  local reference=${SOURCE_TORCH_REFERENCE:?set TORCH_REFERENCE to torch_reference.py}
  bash "$host_dir/fetch.sh" gpu-bundle || { echo "fetch.sh failed" >&2; exit 1; }
  rm -rf shared-for-gpu
  mkdir -p shared-for-gpu/data shared-for-gpu/bench
  for set in "${GPU_DATA_SETS[@]}"; do
    [ -d "$data/$set" ] || { echo "$data/$set missing: bash tools/fetch_data.sh $set DIR" >&2; exit 1; }
    cp -r "$data/$set" shared-for-gpu/data/
  done
  cp "$reference" shared-for-gpu/bench/torch_reference.py
  prepare_ctranslate2
  dry_run
}

# .whl/: CTranslate2's wheel for the GPU host's Python, its debug sections stripped
# (bench/slim_wheel.py: 43 -> 25 MB) so that it fits in the translate call's 64 MiB.
prepare_ctranslate2() {
  local download
  download=$(mktemp -d)
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version "${CT2_PYTHON_TAG#cp}" \
    --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d "$download" \
    "ctranslate2==$CT2_VERSION" || { echo "pip download of ctranslate2==$CT2_VERSION failed" >&2; exit 1; }
  rm -rf .whl
  python3 bench/slim_wheel.py "$download"/ctranslate2-*.whl .whl || exit 1
  rm -rf "$download"
}

# The window's plan, each item's estimate in seconds (low high), for --dry-run and the
# start of each call. Sources: the H100 sessions of 2026-11-25 (the 44 GPU tests with the
# CPU suite in 526 s) and 2026-11-26 (bench/RESULTS.md: call 1 took 337 s, its build 20 s,
# the twins and whole model 41 s, the profiles 15 s; the compiled peer's nine static-shape
# compilations 228 s, so it fitted in call 1; call 2 took 53 s). The compiled peer gets
# what is left of call 1 and spills into call 2 when compilation runs longer. The fifth
# window (2026-11-26/27, call 1 cut as above): call 1 70 s (build 29 s, twins and whole
# model 29 s), translate 235 s (CTranslate2 included), followup 239 s; 617 s held in all
# with two short extra calls, the start included.
readonly PLAN=(
  "start|machine start (counted, not in a call)|60|120"
  "1|setup: gpu-bundle unpacked, nvidia-smi|10|20"
  "1|build: bench_step, transformer_hpc, kernel twin tests, test_cuda_training (16 cores)|20|110"
  "1|candidate twins (CudaCandidate*: fused_attention, step_graphs, relu_masks, weight_grads_beside, fuller_column_sums, worker_graphs, fused_norm_grads, fast_loss_exp, bias_grads_in_gemm, weight_decay) and the whole model with them|5|35"
  "1|the verified twins of the changed files (OTHER_TWINS=all: every one)|10|40"
  "1|whole model: fp32 3 steps vs the CPU (fused off, on); bf16 short vs batched; decoding|3|25"
  "1|the timings wait for the CUDA-graph peer's compilation, begun beside the twins (WARM_PEER; until 260 s of the call); meanwhile memcheck of WAIT_MEMCHECK's candidate twins, then racecheck of the fused attention's and fused_norm_grads' (WAIT_RACECHECK)|0|150"
  "1|bf16 GEMM ceiling (8192^3)|10|15"
  "1|profile base verified (27 steps), candidate (36: two warm-up rounds with graphs), candidate without step_graphs; each step-kernel candidate alone; short_attention_max_len 0, 64 (27 each)|50|120"
  "1|GEMM sweep: base, 3,125 tokens (GEMM_SWEEP_TOKENS), verified, 18 steps; each product shape's first 8 cuBLASLt offers (GEMM_OFFERS) timed|20|45"
  "1|program vs benchmark: base, 3,125 tokens, 40 steps each (bench/program_vs_bench.sh)|10|30"
  "1|small batch: base, 3,125 tokens, verified and candidate (CUDA graphs), timed and profiled; candidate without weight_grads_beside timed (and at 25,000); candidate without graphs profiled|30|70"
  "1|ours verified (and candidate if it acts in training; the loss in chunks of 1,024 rows; 75 steps each); eager|45|90"
  "1|torch.compile peer, only without PEERS=eager (228 s to compile on 2026-11-26)|0|0"
  "2|setup on the warm machine (bundle kept), build of mpi_equivalence, test_distributed, the trainer|15|60"
  "2|CudaDistributed.*: 2 and 4 ranks on GPU 0 vs accumulation (fp32, bf16), bf16 sums, per_use, NCCL refused|50|140"
  "2|CudaDistributed.*: 4 ranks stopped, resumed on 2 and 1; a killed rank, a SIGSTOP'd one; one-rank NCCL|30|70"
  "2|compute-sanitizer memcheck of the candidates' kernel twins (call 1's build), racecheck of the fused attention's|40|120"
  "2|base-sized steps on 1 and 2 ranks sharing the GPU, and 1 with NCCL's sums timed (RANKS_STEPS=60)|25|80"
  "2|a base checkpoint's stall, in the step, beside training (2 runs of 241 steps, one every 80)|30|80"
  "3|setup on the warm machine (bundle kept), build of the programs|15|60"
  "3|Multi30k base-sized layers 1 min, last 5 averaged, test_2016 BLEU|80|100"
  "3|newstest2014 decode speed, ours (bf16; int8; 2 GPU workers) against CTranslate2 (what is left)|200|250"
  "gaps|transfers, the sends of calls 2 and 3|10|30"
)
readonly CALL1_TIMEOUT_S=430 CALL2_TIMEOUT_S=330 CALL3_TIMEOUT_S=360 WINDOW_S=900

print_plan() {
  local item call what low high sum_low=0 sum_high=0 current=""
  echo "plan: three device calls in a ${WINDOW_S} s window (timeout_s ${CALL1_TIMEOUT_S}, ${CALL2_TIMEOUT_S}, ${CALL3_TIMEOUT_S}; call 3 gets what is left)"
  for item in "${PLAN[@]}"; do
    IFS='|' read -r call what low high <<< "$item"
    if [ "$call" != "$current" ]; then
      case $call in
        1) echo "  call 1: PEERS=eager timeout 400 bash bench/gpu_session.sh step   (carry: ${CARRIED[*]})" ;;
        2) echo "  call 2 (at once, warm machine): timeout 300 bash bench/gpu_session.sh ranks   (carry: ${CARRIED[*]})" ;;
        3) echo "  call 3 (at once, what the window has left): timeout 330 env TRAIN_MINUTES=1 CHECKPOINT_MINUTES=0.17 bash bench/gpu_session.sh translate   (carry: ${TRANSLATE_CARRIED[*]})" ;;
        *) echo "  outside the calls:" ;;
      esac
      current=$call
    fi
    printf '    %-86s %4d-%-4d s\n' "$what" "$low" "$high"
    sum_low=$((sum_low + low)) sum_high=$((sum_high + high))
  done
  echo "  estimated window: ${sum_low}-${sum_high} s of ${WINDOW_S}: call 3's time-out is what is left after call 2"
}

# Bytes a device call would carry: the files git tracks or would track, and the paths
# named (CARRIED, or TRANSLATE_CARRIED).
transfer_bytes() {
  { git ls-files -z --cached --others --exclude-standard; find "$@" -type f -print0 2>/dev/null; } |
    du -cb --files0-from=- 2>/dev/null | tail -1 | cut -f1
}

# Everything the GPU run needs that can be checked without a GPU.
dry_run() {
  local problems=0
  problem() { echo "dry-run: $*"; problems=$((problems + 1)); }
  print_plan
  [ -f gpu-bundle/use.sh ] || problem "gpu-bundle/use.sh missing (bash bench/gpu_session.sh --prepare GPU_HOST_DIR)"
  if [ -f gpu-bundle/MANIFEST.txt ]; then
    while IFS=$'\t' read -r sub package version sha; do
      [[ $sub == \#* || -z $sha ]] && continue
      compgen -G "gpu-bundle/$sub/${package}_*.deb" > /dev/null || problem "gpu-bundle/$sub: $package $version listed but absent"
    done < gpu-bundle/MANIFEST.txt
  else
    problem "gpu-bundle/MANIFEST.txt missing"
  fi
  for set in "${GPU_DATA_SETS[@]}"; do
    bash tools/fetch_data.sh --verify "$set" "$THPC_DATA" > /dev/null 2>&1 ||
      problem "$THPC_DATA/$set missing or not the expected bytes"
  done
  [ -f "$TORCH_REFERENCE" ] || problem "$TORCH_REFERENCE missing"
  for script in bench/gpu_session.sh bench/step_vs_torch.sh bench/cpu_decode_speed.sh \
      bench/checkpoint_stall.sh tools/fetch_data.sh tools/run_multi30k.sh tools/run_parser.sh \
      tools/evaluate.sh; do
    bash -n "$script" || problem "$script does not parse"
  done
  for config in input/base.ini input/big.ini input/tiny.ini input/parse_wsj.ini; do
    [ -f "$config" ] || problem "$config missing"
  done
  local wheel
  wheel=$(ls .whl/ctranslate2-"$CT2_VERSION"-"$CT2_PYTHON_TAG"-*.whl 2>/dev/null | head -1)
  if [ -z "$wheel" ]; then
    problem "CTranslate2's wheel missing (bash bench/gpu_session.sh --prepare-ctranslate2)"
  elif ! unzip -tq "$wheel" > /dev/null 2>&1; then
    problem "$wheel is not a whole zip (bash bench/gpu_session.sh --prepare-ctranslate2)"
  fi
  [ "$(ls .whl/*.whl 2>/dev/null | wc -l)" -le 1 ] ||
    problem ".whl/ holds more than CTranslate2's wheel: the translate call carries it all"
  local bytes carried
  for carried in "${CARRIED[*]}" "${TRANSLATE_CARRIED[*]}"; do
    # shellcheck disable=SC2086
    bytes=$(transfer_bytes $carried)
    echo "dry-run: a device call carrying ${carried// /, } sends $((bytes / 1024 / 1024)) MiB (limit 64)"
    [ "$bytes" -le "$TRANSFER_LIMIT_BYTES" ] || problem "carrying $carried is over the 64 MiB transfer limit"
  done
  local configure_dir
  configure_dir=$(mktemp -d)
  if cmake -S . -B "$configure_dir" -G Ninja -DCMAKE_BUILD_TYPE=Release \
       -DCMAKE_CUDA_ARCHITECTURES=90 > "$configure_dir.log" 2>&1; then
    grep -q "THPC_HAVE_CUDA:INTERNAL=ON\|CMAKE_CUDA_COMPILER:" "$configure_dir/CMakeCache.txt" ||
      problem "configured without CUDA (see $configure_dir.log)"
    # Every target the step stage builds exists in that configuration.
    local known
    known=$(ninja -C "$configure_dir" -t targets all 2>/dev/null)
    for target in $(step_targets); do
      grep -q "^$target:" <<< "$known" || problem "the step stage's target $target is not in the build"
    done
  else
    problem "cmake configure failed: $(tail -3 "$configure_dir.log")"
  fi
  rm -rf "$configure_dir" "$configure_dir.log"
  # The candidate stage's pattern takes every candidate twin suite the build has.
  local all_candidates matched
  all_candidates=$(ctest --test-dir "${BUILD:-build}" -N -R "^CudaCandidate" 2>/dev/null |
    grep -c "Test *#")
  matched=$(ctest --test-dir "${BUILD:-build}" -N -R "^(${CANDIDATE_TWINS})[.]" 2>/dev/null |
    grep -c "Test *#")
  echo "dry-run: the candidate stage's pattern takes $matched of the $all_candidates CudaCandidate* tests"
  [ "$matched" = "$all_candidates" ] ||
    problem "CANDIDATE_TWINS ($CANDIDATE_TWINS) leaves CudaCandidate tests out"
  # Every candidate twin suite names a candidate of kernels/ops.h, which a failed twin then
  # holds back (candidates_whose_twins_passed), and the names are there to be read.
  local names suite_names unnamed
  names=$(candidate_names)
  [ -n "$names" ] || problem "no candidate names read from kernels/ops.h (candidate_names)"
  suite_names=$(ctest --test-dir "${BUILD:-build}" -N -R "^CudaCandidate" 2>/dev/null |
    grep -oE "CudaCandidate[A-Za-z0-9]*[.]" | sort -u | candidate_of_suite)
  unnamed=$(comm -23 <(echo "$suite_names" | sort -u) <(echo "$names" | sort -u) | paste -sd' ')
  echo "dry-run: candidates $(echo "$names" | paste -sd,); suites without a candidate: ${unnamed:-none}"
  [ -z "$unnamed" ] || problem "CudaCandidate suites that name no candidate: $unnamed"
  # The calls rehearsed on the CPU (--rehearse): their commands, arguments and logs.
  local call rehearsal_out
  for call in step ranks followup; do
    rehearsal_out=$(mktemp -d)
    echo "dry-run: rehearsing call '$call' on the CPU (BUILD=${BUILD:-build})"
    if OUT=$rehearsal_out bash "$0" --rehearse "$call" > "$rehearsal_out/console.txt" 2>&1 &&
       ! grep -q "(exit [1-9]" "$rehearsal_out/console.txt"; then
      grep -E "^(candidate twins|twin lines|memcheck|racecheck|peers|step:|followup:|==|big|ranks:|100% tests|checkpoint stall|buckets at|program|### base with|\| (8|64) \| )" "$rehearsal_out/console.txt" |
        sed 's/^/  /'
      echo "  logs: $(du -k "$rehearsal_out/logs_$call.tgz" | cut -f1) kB"
    else
      problem "the rehearsal of '$call' failed: $(tail -5 "$rehearsal_out/console.txt")"
    fi
    rm -rf "$rehearsal_out"
  done
  # Call 2's decoding comparison, its GPU half with CTranslate2 on the CPU
  # (test_ctranslate2's rehearsal of bench/decode_vs_ctranslate2.sh), where PYTHON or
  # THPC_PYTHON imports ctranslate2 (bash tools/install_deps.sh --ctranslate2).
  local build_dir=${BUILD:-build} decoding
  if cmake --build "$build_dir" -j2 --target test_ctranslate2 transformer_decode > /dev/null 2>&1; then
    decoding=$(env ${PYTHON:+THPC_PYTHON=$PYTHON} "$build_dir/tests/test_ctranslate2" \
      --gtest_filter='*GpuComparisonScriptRehearses*' 2>&1)
    if grep -q "^\[  PASSED  \] 1 test" <<< "$decoding"; then
      echo "dry-run: call 2's decoding comparison rehearsed on the CPU (CT2_DEVICE=cpu): passed"
    elif grep -q "^\[  SKIPPED \]" <<< "$decoding"; then
      echo "dry-run: call 2's decoding comparison not rehearsed: $(grep -m1 -A1 "Skipped" <<< "$decoding" | tail -1)"
    else
      problem "call 2's decoding comparison failed its rehearsal: $(grep -E "Failure|missing|in decode_vs" <<< "$decoding" | head -5)"
    fi
  else
    problem "cmake --build $build_dir --target test_ctranslate2 transformer_decode failed"
  fi
  if [ "$problems" -gt 0 ]; then echo "dry-run: $problems problem(s)"; exit 1; fi
  echo "dry-run: ready for the device call"
}

# The candidate kernels' twin suites (train.cuda_kernels = candidate: kernels written
# since the last GPU run, behind that switch until a GPU session sees these pass): the
# candidate setting is measured only when they passed in this call. (Until 2026-11-26 the
# switch measured was model.fused_ops, whose fused kernels are now the default.)
# Digits too: until 2026-11-29 "[A-Za-z]*" left CudaCandidateInt8Products.* out of the
# stage (the dry run now checks that every CudaCandidate suite is matched).
readonly CANDIDATE_TWINS="CudaCandidate[A-Za-z0-9]*"

# The candidate kernels' names (one a line), from kernels/ops.h's THPC_CANDIDATE_KERNELS
# (X(kEnumerator, bit, "name") lines). Until 2026-12-07 this read kernels/ops.cc's former
# {"name", kEnumerator} table, which the list replaced on 2026-12-06: it read nothing, and
# the failed-twins fallback and the per-candidate profiles would have measured none.
candidate_names() {
  grep -oE 'X\(k[A-Za-z0-9]+, [0-9]+, "[a-z0-9_]+"\)' kernels/ops.h | cut -d'"' -f2
}

# The CudaCandidate* suites' candidate names: CudaCandidateFastLossExp.X -> fast_loss_exp.
candidate_of_suite() {
  sed -E 's/^CudaCandidate([A-Za-z0-9]*)[.].*/\1/' | sed -E 's/([a-z0-9])([A-Z])/\1_\2/g' |
    tr 'A-Z' 'a-z'
}

# Whether a candidate changes the training step: fused_attention, step_graphs,
# relu_masks and weight_grads_beside all do, so the step stage measures the step with and
# without them. (The one before, gathered_attention,
# acted in decoding only: set this to 0 when no waiting candidate trains.)
readonly CANDIDATES_ACT_IN_TRAINING=1
# The twins of the ops whose files changed since the last GPU run (2026-12-04, the
# eighth window, where the twins of the files the seventh's promotions changed, 47, all
# passed): the captures' (cuda_backend.cu's can_capture, now asked for a CaptureUse):
# decoding steps captured without step_graphs, transformer_decode's default with one GPU
# worker, whose twins (CudaCapturedDecoding.*, in test_cuda_training) passed there as
# step_graphs'; and linear.cu's and layernorm.cu's column sums, whose verified path
# fuller_column_sums left as it was (its launches now through finish_column_sums); and
# linear.cu's plans, their descriptors and preference made by describe() and
# preference_for() (the same calls, moved for the GEMM sweep, whose test is CudaGemmSweep);
# and (2026-12-07) cross_entropy.cu's softmax_nll_rows, a host entry to the loss's kernels
# for scoring (CudaCrossEntropy.NllRowsMatchCpu), adam.cu's launches shared with the
# candidate weight_decay's AdamW (CudaAdam), and the dropout ops run in place by the FFN's
# activation dropout (CudaElementwise.DropoutMatchesCpuMaskExactly).
readonly CHANGED_TWINS="CudaCapturedDecoding|CudaReluBiasBackward|CudaLayerNorm|CudaAddNorm|\
CudaVectorNorms|CudaLinear|CudaGemmSweep|CudaCrossEntropy|CudaAdam|CudaElementwise"

# What the step and followup stages build: the benchmark, the trainer (the program against
# the benchmark), every kernel twin test executable and the whole-model GPU tests.
step_targets() {
  echo transformer_bench_step
  echo transformer_hpc
  echo test_cuda_training
  echo transformer_decode  # and test_decode: its GPU workers test (run_other_twins)
  echo test_decode
  for source in tests/kernels/*_test.cc; do
    local name=${source##*/}
    echo "test_kernel_${name%_test.cc}"
  done
}

rehearsal=0
case ${1:-} in
  --prepare) prepare "${2:-}"; exit ;;
  --prepare-ctranslate2) prepare_ctranslate2; exit ;;
  --dry-run) dry_run; exit ;;
  --rehearse) rehearsal=1; stage=${2:-step} ;;
  "") stage=step ;;
  step | followup | peers | tests | translate | parse | curve | ranks) stage=$1 ;;
  *) sed -n '2,40p' "$0" >&2; exit 2 ;;
esac
[[ $stage =~ ^(step|followup|peers|tests|translate|parse|curve|ranks)$ ]] || { echo "unknown stage '$stage'" >&2; exit 2; }

# The logs of a stage go to one archive, $OUT/logs_STAGE.tgz (the device call brings back
# at most 8 files from $OUT; a stage writes a dozen), also when the stage is stopped by a
# time-out's SIGTERM. Its console output is the summary; the device call returns the last
# 12,000 characters of it, so the stage's key lines are printed again at its end
# (print_summary), from a copy of the console kept in the logs.
RESULT_DIR=${OUT:-$PWD/gpu-logs}
LOGS=$(mktemp -d)
mkdir -p "$RESULT_DIR"
# The copy's tee ignores SIGTERM: the call's time-out signals the whole process group, and a
# tee that died with it would take the summary and the archive's message with it.
exec > >(trap '' TERM INT; exec tee -a "$LOGS/console.txt") 2>&1

# The lines print_summary repeats: builds, the twins' counts and failures, the settings
# measured, each run's line, the profiles' totals and host rows, the peers' and the other
# scripts' result lines.
readonly SUMMARY_LINES='^(build|gemm_sweep_total|candidate twins|twins and whole model|twin lines|bf16 GEMM ceiling|ceiling:|== |program vs benchmark|program_vs_bench:|step_vs_torch:|peers:|step: |peer warm-up|ranks: |checkpoint stall|multi30k training|newstest|decode_vs_ctranslate2:|run [0-9]|memcheck|racecheck|gpu-bundle|total \(the step\)|host time between)|tests passed|tests failed|\((Failed|Timeout|Not Run|Skipped)\)|BLEU'
print_summary() {
  sleep 1  # the console's copy is written by tee, a moment behind
  echo "==== the $stage call's key lines, again ($SECONDS s) ===="
  grep -E "$SUMMARY_LINES" "$LOGS/console.txt" | cut -c1-700 | tail -c 7000
}
# (And a peer's warm-up still compiling, start_peer_warmup: its process group.)
trap '[ -n "${WARM_PEER_PID:-}" ] && kill -- "-$WARM_PEER_PID" 2> /dev/null
  print_summary; tar czf "$RESULT_DIR/logs_$stage.tgz" -C "$LOGS" . && echo "logs: $RESULT_DIR/logs_$stage.tgz"' EXIT

# Every capped command runs in the background while the shell waits for it. Why: bash runs
# a trap only between commands, and `timeout` puts its command in a process group of its
# own, which the call's own time-out's SIGTERM does not reach; a capped run in the
# foreground held the traps (and the logs' archive) until its own cap, up to 150 s, past
# the device call's end. Waiting in `wait`, the shell takes the signal at once, ends the
# capped command's group and writes the logs. (A capped command in a pipeline or under
# `env` would not be this function: none is.)
CAPPED=""
timeout() {
  command timeout "$@" &
  CAPPED=$!
  wait "$CAPPED"
  local status=$?
  CAPPED=""
  return "$status"
}
trap '[ -n "$CAPPED" ] && kill -TERM -- "-$CAPPED" "$CAPPED" 2> /dev/null
  [ -n "${WARM_PEER_PID:-}" ] && kill -- "-$WARM_PEER_PID" 2> /dev/null; exit 143' TERM INT
if [ "$rehearsal" = 1 ]; then
  # Here, on the CPU: the existing build, its test and benchmark targets brought up to date.
  BUILD_DIR=${BUILD:-build}
  # shellcheck disable=SC2046
  cmake --build "$BUILD_DIR" -j2 $(step_targets | sed 's/^/--target /') --target mpi_equivalence \
    --target test_distributed > "$LOGS/build.log" 2>&1 || {
    echo "build failed"; tail -40 "$LOGS/build.log"; exit 1; }
else
  BUILD_DIR=build-gpu
  if [ ! -f gpu-bundle/use.sh ]; then
    # The translate call carries CTranslate2's wheel instead of the bundle (both do not
    # fit in one call) and uses the one call 1 left on this machine.
    echo "gpu-bundle/ is not on this machine: a fresh machine, the one before was given back."
    echo "Run this stage again carrying gpu-bundle and shared-for-gpu (not .whl: CTranslate2 is then left out)."
    exit 3
  fi
  # shellcheck disable=SC1091
  source gpu-bundle/use.sh /tmp/sysroot gpu-bundle > "$LOGS/setup.log" 2>&1 || {
    echo "gpu-bundle/use.sh failed"; tail -20 "$LOGS/setup.log"; exit 1; }
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv | tee "$LOGS/gpu.txt"
  # Each stage builds only what it runs (a cold machine then spends its minutes on the
  # measurements, not on executables it does not need): step and peers the benchmark and
  # the kernel twins, translate and parse the programs, tests everything.
  targets=()
  case $stage in
    curve) targets=(--target transformer_bench_step) ;;
    ranks) targets=(--target transformer_hpc mpi_equivalence test_distributed test_cuda_training) ;;
    step | followup | peers) read -r -a targets <<< "$(step_targets | sed 's/^/--target /' | tr '\n' ' ')" ;;
    translate | parse) targets=(--target transformer_hpc transformer_preprocess
      transformer_data_stats transformer_average transformer_decode transformer_score
      transformer_trees transformer_evalb) ;;
  esac
  build_start=$SECONDS
  { cmake -S . -B build-gpu -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_CUDA_ARCHITECTURES=90 &&
    cmake --build build-gpu -j"$(nproc)" "${targets[@]}"; } > "$LOGS/build.log" 2>&1 || {
    echo "build failed"; tail -40 "$LOGS/build.log"; exit 1; }
  echo "build: $((SECONDS - build_start)) s"
  [ -x build-gpu/transformer_hpc ] &&
    ldd build-gpu/transformer_hpc | grep -E "not found|cuda|nccl|mpi|hdf5" | tee "$LOGS/ldd.txt"
fi

# ---- step and peers ---------------------------------------------------------------------

# transformer_bench_step's arguments for a preset at the stage's size: on the GPU the
# issue's 25,000 + 25,000 tokens in bf16; in the rehearsal a one-layer, 64-wide model on
# the CPU (the commands and their output, not the numbers).
bench_args() {
  local preset=$1 steps=$2 warmup=$3
  if [ "$rehearsal" = 1 ]; then
    echo --config "input/$preset.ini" --backend cpu --tokens 120 --steps 2 --warmup-steps 1 \
      --vocab 300 --set train.threads=2 --set model.layers=1 --set model.d_model=64 \
      --set model.d_ff=128 --set model.heads=4 --set model.d_k=0 --set model.d_v=0
  else
    echo --config "input/$preset.ini" --backend cuda --precision bf16 --tokens 25000 \
      --vocab 37000 --peak-tflops "$CEILING" --spec-tflops 989.4 --steps "$steps" \
      --warmup-steps "$warmup"
  fi
}

# The train.cuda_kernels settings to measure: verified (the default) and, when their twins
# passed in this call, the candidates (CANDIDATE_SETTING: candidate = all of them).
kernel_settings() {
  echo verified
  [ "${CANDIDATE_TWINS_PASSED:-0}" = 1 ] && [ "$CANDIDATES_ACT_IN_TRAINING" = 1 ] &&
    echo "${CANDIDATE_SETTING:-candidate}"
  return 0
}

# bench/step_vs_torch.sh base with the peers, ours once per train.cuda_kernels setting, and
# once with the loss in chunks of LOSS_CHUNK_ROWS target rows (default 1024; 0: not; issue
# 51: the [25,000 x 37,000] logits never whole, 1.85 GB less; only verified kernels), inside
# `seconds` (a cut-off run leaves the JSON lines it printed in the log).
peers_step() {
  local seconds=$1 peers=$2 variants=() args=(base 25000)
  # A variant's name is one word: a list of candidates (those whose twins passed when
  # others failed) runs as "candidate" (the 2026-11-29 window lost its peers to a name
  # with commas in it).
  local name
  for setting in $(kernel_settings); do
    name=$setting
    [[ $setting == *,* ]] && name=candidate
    variants+=("$name=train.cuda_kernels=$setting")
  done
  local chunk_rows=${LOSS_CHUNK_ROWS:-1024}
  [ "$chunk_rows" != 0 ] && variants+=("loss_chunk_$chunk_rows=train.loss_chunk_rows=$chunk_rows")
  if [ "$rehearsal" = 1 ]; then
    if [ -z "${SOURCE_TORCH_REFERENCE}" ] || ! "${PYTHON:-python3}" -c 'import torch' 2> /dev/null; then
      echo "peers: skipped in the rehearsal (no TORCH_REFERENCE or no PyTorch for ${PYTHON:-python3})"
      return 1
    fi
    export TORCH_REFERENCE=$SOURCE_TORCH_REFERENCE
    peers=eager args=(small 200)
  fi
  echo "peers: PEERS=\"$peers\", ours ${variants[*]}, within ${seconds} s"
  DEVICE=$([ "$rehearsal" = 1 ] && echo cpu || echo cuda) BUILD=$BUILD_DIR PEERS=$peers \
    OURS_VARIANTS="${variants[*]}" CEILING_TFLOPS=${CEILING:-} \
    timeout "$seconds" bash bench/step_vs_torch.sh "${args[@]}" > "$LOGS/step_vs_torch_base.txt" 2>&1
  local status=$?
  grep -E "^(step_vs_torch:|run |peer |\{)" "$LOGS/step_vs_torch_base.txt"
  if [ "$status" = 124 ]; then
    echo "peers: stopped after ${seconds} s (the followup call or \`peers\` runs the rest)"
    return 1
  fi
  return "$status"
}

# The GEMM ceiling of this call (bf16 cuBLAS through PyTorch), for the profiles' and the
# big line's MFU.
measure_ceiling() {
  [ "$rehearsal" = 1 ] && return
  CEILING=$(BUILD=$BUILD_DIR bash bench/step_vs_torch.sh --ceiling 2> "$LOGS/ceiling.log")
  if [ -z "$CEILING" ]; then
    CEILING=790
    echo "ceiling: not measured (see ceiling.log); MFU against the assumed 790 TFLOP/s"
  else
    echo "bf16 GEMM ceiling (cuBLAS 8192^3, measured now): $CEILING TFLOP/s"
  fi
}

# What call 1 learnt, for call 2 on the same machine (build-gpu/ survives between them).
state_file() { echo "$BUILD_DIR/gpu_session_state"; }
remember() { echo "$1" >> "$(state_file)"; }

# The candidates (kernels/ops.cc's names) whose twin suites are not among the failed
# tests $1 (CudaCandidateFusedAttention.* names fused_attention), comma-joined; nothing
# when a whole-model check with all of them failed (no one candidate to blame) or none
# is left. A GPU session whose twins fail for one candidate still measures the others.
passing_candidates() {
  local failed=$1
  if [ -z "$failed" ] || echo "$failed" | grep -qv "^CudaCandidate"; then return 0; fi
  candidates_whose_twins_passed "$failed" | paste -sd,
}

# The candidates (one a line) whose CudaCandidate* suites are not among the failed tests $1.
candidates_whose_twins_passed() {
  local failed=$1 name suite
  for name in $(candidate_names); do
    suite=$(echo "$failed" | candidate_of_suite | grep -x "$name" || true)
    [ -z "$suite" ] && echo "$name"
  done
  return 0
}

# 1. The candidate kernels' twins and their whole-model checks (fp32 training on the GPU
# against the CPU with train.cuda_kernels = candidate, and bf16 candidate against bf16
# verified, for the kernels that only bf16 takes; skipped in the rehearsal, which has
# no GPU); sets CANDIDATE_TWINS_PASSED.
run_candidate_twins() {
  local twin_env=(env) prefix="" exclude="^Rehearsal[.]"
  if [ "$rehearsal" = 1 ]; then twin_env=(env THPC_TWIN_REHEARSAL=1) prefix="Rehearsal[.]" exclude="^$"; fi
  "${twin_env[@]}" ctest --test-dir "$BUILD_DIR" \
    -R "^${prefix}(${CANDIDATE_TWINS})[.]|^CudaTraining[.][A-Za-z0-9]*WithCandidateKernels" \
    -E "$exclude" --output-on-failure --timeout 120 -j4 > "$LOGS/ctest_candidate_twins.log" 2>&1
  local status=$?
  grep -E "tests passed|Failed|\*\*\*|Skipped" "$LOGS/ctest_candidate_twins.log" | tail -16
  cp "$BUILD_DIR/Testing/Temporary/LastTest.log" "$LOGS/ctest_candidate_twins_all_output.log"
  grep -h "GPU fp32\|GPU bf16" "$LOGS/ctest_candidate_twins_all_output.log" | head -3
  export CANDIDATE_SETTING=candidate
  if grep -q "No tests were found" "$LOGS/ctest_candidate_twins.log"; then
    export CANDIDATE_TWINS_PASSED=0
    echo "candidate twins: none (no kernel waits behind train.cuda_kernels = candidate)"
  elif [ "$status" = 0 ] && grep -q "100% tests passed" "$LOGS/ctest_candidate_twins.log"; then
    export CANDIDATE_TWINS_PASSED=1
    if [ "$CANDIDATES_ACT_IN_TRAINING" = 1 ]; then
      echo "candidate twins: passed (train.cuda_kernels=candidate is measured below)"
    else
      echo "candidate twins: passed (they act in decoding: the translate stage measures them)"
    fi
  else
    export CANDIDATE_TWINS_PASSED=0
    echo "candidate twins: FAILED or did not run (only train.cuda_kernels=verified is measured)"
    local failed
    failed=$(sed -n '/The following tests FAILED/,$p' "$LOGS/ctest_candidate_twins.log" |
      grep -oE '(Cuda[A-Za-z0-9]*\.[A-Za-z0-9]*)' || true)
    [ -n "$failed" ] && echo "candidate twins failed: $(echo "$failed" | tr '\n' ' ')"
    local passed
    passed=$(passing_candidates "$failed")
    # The whole model with every candidate failed: each candidate whose own twins passed,
    # alone through the same check (THPC_CANDIDATE_SETTING), so that one candidate's fault
    # holds back only itself (~10 s a candidate, only when it failed).
    local whole=CudaTraining.Fp32ThreeStepsWithCandidateKernelsMatchTheCpu
    if echo "$failed" | grep -qx "$whole"; then
      local name alone=()
      for name in $(candidates_whose_twins_passed "$(echo "$failed" | grep -vx "$whole")"); do
        if env THPC_CANDIDATE_SETTING="$name" ctest --test-dir "$BUILD_DIR" -R "^${whole//./[.]}\$" \
          --output-on-failure --timeout 120 > "$LOGS/ctest_whole_model_$name.log" 2>&1; then
          alone+=("$name")
        fi
      done
      passed=$(IFS=,; echo "${alone[*]}")
      echo "candidate twins: the whole model with each alone passed for '${passed}'"
    fi
    if [ "$status" != 0 ] && [ -n "$passed" ]; then
      export CANDIDATE_TWINS_PASSED=1 CANDIDATE_SETTING=$passed
      echo "candidate twins: the others passed: train.cuda_kernels=$passed is measured below"
    fi
  fi
  remember "CANDIDATE_TWINS_PASSED=$CANDIDATE_TWINS_PASSED"
  remember "CANDIDATE_SETTING=$CANDIDATE_SETTING"
}

# The verified twins of the files the candidates changed (CHANGED_TWINS; OTHER_TWINS=all:
# every kernel twin), and the whole model with the verified kernels.
run_other_twins() {
  local twin_env=(env) prefix="" exclude="^Rehearsal[.]|^CudaTraining"
  local suites="(${CHANGED_TWINS})[.]"
  [ "${OTHER_TWINS:-changed}" = all ] && suites="Cuda" exclude="$exclude|^CudaDistributed"
  if [ "$rehearsal" = 1 ]; then twin_env=(env THPC_TWIN_REHEARSAL=1) prefix="Rehearsal[.]" exclude="^$"; fi
  "${twin_env[@]}" ctest --test-dir "$BUILD_DIR" -R "^${prefix}${suites}" -E "${exclude}|(${CANDIDATE_TWINS})[.]" \
    --output-on-failure --timeout 120 -j4 > "$LOGS/ctest_twins.log" 2>&1
  grep -E "tests passed|Failed|\*\*\*|Skipped" "$LOGS/ctest_twins.log" | tail -24
  cp "$BUILD_DIR/Testing/Temporary/LastTest.log" "$LOGS/ctest_twins_all_output.log"
  # Each twin case's measured error beside its tolerance, for tightening the bf16 bounds.
  cat "$LOGS"/ctest_*twins_all_output.log | grep -E "^twin " > "$LOGS/twin_errors.txt"
  echo "twin lines: $(wc -l < "$LOGS/twin_errors.txt")"
  # The whole model: fp32 training on the GPU against the CPU, separate and fused kernels,
  # transformer_decode's GPU workers, each on its own stream, translating as one, and
  # --score-reference's GPU scores against the CPU's
  # (skipped in the rehearsal: they need the GPU itself).
  ctest --test-dir "$BUILD_DIR" \
    -R "^(CudaTraining[.](Fp32ThreeSteps(MatchTheCpu|WithFusedOps|WithActivationDropout|WithSeparateVocabularies)|Bf16ThreeStepsWithShortAttention|Bf16RegisterHeldNorms|DecodingStepsMatchTheCpu|DecodeAttentionStepsMatchTheCpu|APinnedStagedState|EveryStepTakesTheOnePassAdam)|CudaDecodeProgram[.](GpuWorkersShareTheDeviceWithoutChangingAnyTranslation|OneWorkerCapturesItsStepsAndOffLaunchesThemOneByOne|ScoreReferenceGivesTheCpusScoresToBf16Rounding))" \
    --output-on-failure --timeout 150 > "$LOGS/ctest_whole_model.log" 2>&1
  grep -E "tests passed|Failed|Skipped|\*\*\*" "$LOGS/ctest_whole_model.log" | tail -6
  grep -h "GPU fp32\|GPU bf16" "$BUILD_DIR/Testing/Temporary/LastTest.log" | head -4
}

# Call 2's CUDA-graph compiled peer took 212 s to compile cold on 2026-11-28, and was
# cut off still compiling after 277 s on 2026-12-04: so call 1 compiles it beside the
# twin tests (which time nothing), into the Inductor cache that build-gpu/ keeps on the
# warm machine for call 2 (bench/step_vs_torch.sh WARM_ONLY=1). WARM_PEER="PRESET TOKENS
# PEER" (default "base 3125 compile-graphs"; "" : none); the timings after the twins wait
# for it, at most until WARM_PEER_SECONDS (default 260) of the call, so that none of them
# shares the device or the cores with it; one stopped keeps what it compiled.
start_peer_warmup() {
  local spec=${WARM_PEER-base 3125 compile-graphs} preset tokens peer
  WARM_PEER_PID=""
  [ -n "$spec" ] && [ "$rehearsal" = 0 ] || return 0
  if ! "${PYTHON:-python3}" -c 'import torch' 2> /dev/null; then
    echo "peer warm-up: skipped (no PyTorch for ${PYTHON:-python3})"
    return 0
  fi
  read -r preset tokens peer <<< "$spec"
  # A process group of its own (setsid), so that a stop reaches the Python under it.
  DEVICE=cuda BUILD=$BUILD_DIR PEERS=$peer WARM_ONLY=1 CEILING_TFLOPS=1 \
    setsid bash bench/step_vs_torch.sh "$preset" "$tokens" > "$LOGS/warm_peer.txt" 2>&1 &
  WARM_PEER_PID=$!
  echo "peer warm-up: $spec in the background (at ${SECONDS} s)"
}
finish_peer_warmup() {
  [ -n "${WARM_PEER_PID:-}" ] || return 0
  local limit=${WARM_PEER_SECONDS:-260}
  while kill -0 "$WARM_PEER_PID" 2> /dev/null && [ "$SECONDS" -lt "$limit" ]; do sleep 2; done
  if kill -0 "$WARM_PEER_PID" 2> /dev/null; then
    kill -- "-$WARM_PEER_PID" 2> /dev/null
    wait "$WARM_PEER_PID" 2> /dev/null
    echo "peer warm-up: stopped at ${SECONDS} s (WARM_PEER_SECONDS=$limit; what it compiled stays cached)"
  else
    wait "$WARM_PEER_PID"
    echo "peer warm-up: exit $? at ${SECONDS} s: $(tail -1 "$LOGS/warm_peer.txt" | cut -c1-300)"
  fi
  WARM_PEER_PID=""
  return 0
}

# While the peer still compiles, nothing is timed: the wait goes to compute-sanitizer's
# memcheck of the candidates' twins not yet memchecked on a GPU (WAIT_MEMCHECK, regular
# expressions of CudaCandidate* suites separated by spaces, each in the time the ones
# before it left; default CudaCandidateFullerColumnSums, then CudaCandidateFusedAttention,
# whose second design has not run, then CudaCandidateFusedNormGrads,
# CudaCandidateFastLossExp and CudaCandidateBiasGradsInGemm; "" : none), and then
# racecheck (WAIT_RACECHECK: racecheck_kernels' names separated by spaces, default "fused
# norms": the fused attention's, then fused_norm_grads' warp sums; "" : none): what a
# candidate's promotion needs besides its twins, so that one window can promote it.
memcheck_while_the_peer_compiles() {
  local all=${WAIT_MEMCHECK-CudaCandidateFullerColumnSums CudaCandidateFusedAttention
CudaCandidateFusedNormGrads CudaCandidateFastLossExp CudaCandidateBiasGradsInGemm}
  local suites left
  [ -n "${WARM_PEER_PID:-}" ] || return 0
  if ! command -v compute-sanitizer > /dev/null; then
    echo "memcheck while the peer compiles: no compute-sanitizer on PATH"
    return 0
  fi
  for suites in $all; do
    left=$((${WARM_PEER_SECONDS:-260} - SECONDS - 10))
    kill -0 "$WARM_PEER_PID" 2> /dev/null && [ "$left" -ge 30 ] || return 0
    echo "memcheck while the peer compiles: $suites, within ${left} s"
    MEMCHECK_SUITES=$suites MEMCHECK_SECONDS=$left MEMCHECK_SUITE_SECONDS=$left memcheck_candidates
  done
  local kernels
  for kernels in ${WAIT_RACECHECK-fused norms}; do
    left=$((${WARM_PEER_SECONDS:-260} - SECONDS - 10))
    kill -0 "$WARM_PEER_PID" 2> /dev/null && [ "$left" -ge 30 ] || return 0
    echo "racecheck while the peer compiles: $kernels, within ${left} s"
    RACECHECK_SECONDS=$left racecheck_kernels "$kernels"
  done
}

step_stage() {
  local deadline=${STEP_SECONDS:-370}
  rm -f "$(state_file)"
  print_plan
  start_peer_warmup
  run_candidate_twins
  run_other_twins
  echo "twins and whole model: at ${SECONDS} s"
  memcheck_while_the_peer_compiles
  finish_peer_warmup
  measure_ceiling
  profile preset=base
  profile_candidates_without_graphs
  profile_each_step_candidate
  profile_short_attention_lengths
  echo "profiles: at ${SECONDS} s"
  # Before the two that repeat earlier windows' measurements (the program against the
  # benchmark: 0.990 on 2026-12-04; one rank's batch: call 2 times it against the peer),
  # which the call's time-out cuts first.
  gemm_sweep_step
  program_vs_bench_step
  small_batch_step
  local left=$((deadline - SECONDS))
  if [ "$left" -lt 60 ]; then
    echo "peers: skipped, ${left} s left of STEP_SECONDS=${deadline}; call 2 (followup) runs them"
  else
    peers_step "$left" "${PEERS:-eager compile}" && [[ ${PEERS:-eager compile} == *compile* ]] &&
      remember "COMPILE_PEER_DONE=1"
  fi
  echo "step: ${SECONDS} s"
}

# The cuBLASLt heuristic's choices against its other offers (transformer_bench_step
# --gemm-sweep, kernels/gemm_sweep.h): one rank's 3,125 tokens (GEMM_SWEEP_TOKENS) with
# the verified kernels (GEMMs 3.07 of 7.10 ms profiled there, at 382 TFLOP/s against 628
# at 25,000, where 15 ms of GEMMs would make a few percent worth a look too), each
# product shape of the 18 timed steps with its first GEMM_OFFERS (default 8) offers timed on
# random operands of the same shape, alignments and epilogue. Its lines say per shape what
# the fastest offer gains, and gemm_sweep_total the milliseconds a step it would save: a
# fixed choice per shape is worth writing only if that is more than noise (~20-30 s).
gemm_sweep_step() {
  local args
  read -r -a args <<< "$(bench_args base 18 18 |
    sed "s/--tokens 25000/--tokens ${GEMM_SWEEP_TOKENS:-3125}/")"
  timeout 90 "$BUILD_DIR/transformer_bench_step" "${args[@]}" --gemm-sweep "${GEMM_OFFERS:-8}" \
    > "$LOGS/gemm_sweep.txt" 2>&1
  echo "gemm sweep: exit $?"
  grep -E "^gemm_sweep_total" "$LOGS/gemm_sweep.txt"
  grep -E "^gemm_sweep:" "$LOGS/gemm_sweep.txt" | head -12
}

# The program against the benchmark at one rank's batch (issue 51 item 4): base at 3,125
# tokens, steps 11-50 of both on the same batches (the rehearsal: small, 200 tokens).
program_vs_bench_step() {
  local preset=base environment=(DEVICE=cuda TOKENS=3125 STEPS=40 WARMUP=10)
  if [ "$rehearsal" = 1 ]; then preset=small environment=(DEVICE=cpu TOKENS=200 STEPS=4 WARMUP=2); fi
  # Its runs' checkpoint (hundreds of MB) stays out of $LOGS, which comes back.
  timeout 90 env "${environment[@]}" BUILD="$BUILD_DIR" ROUNDS=1 WORK="$BUILD_DIR/program_vs_bench" \
    bash bench/program_vs_bench.sh "$preset" > "$LOGS/program_vs_bench.txt" 2>&1
  echo "program vs benchmark: exit $?"
  grep -E "^(round|program_vs_bench:)" "$LOGS/program_vs_bench.txt"
  rm -rf "$BUILD_DIR/program_vs_bench"
  return 0
}

# The small batch with its passes captured into CUDA graphs (issue 51 item 2): base at one
# rank's 3,125 + 3,125 tokens, once per kernel setting (the candidates' includes
# step_graphs), unprofiled (a profile times each op, so nothing is captured there); 20
# warm-up steps, two rounds of the benchmark's nine lengths: each shape captured before
# the timed steps replay it. The JSON lines carry captured_passes and replayed_passes.
# Then each setting profiled: a captured pass is one row there ("captured passes"), so
# the "host time between kernels" row is issue 51's host_gap_share with the graphs too.
small_batch_step() {
  local setting
  for setting in $(kernel_settings); do
    # shellcheck disable=SC2046
    timeout 60 "$BUILD_DIR/transformer_bench_step" $(bench_args base 40 20 | sed "s/--tokens 25000/--tokens 3125/") \
      --set "train.cuda_kernels=$setting" > "$LOGS/small_batch_${setting}.txt" 2>&1
    echo "== small batch, train.cuda_kernels=$setting (exit $?): $(grep "^{" "$LOGS/small_batch_${setting}.txt")"
    # shellcheck disable=SC2046
    timeout 60 "$BUILD_DIR/transformer_bench_step" $(bench_args base 40 20 | sed "s/--tokens 25000/--tokens 3125/") \
      --set "train.cuda_kernels=$setting" --profile > "$LOGS/small_batch_profile_${setting}.txt" 2>&1
    echo "== small batch profiled, train.cuda_kernels=$setting (exit $?): $(grep -E "^(captured passes|host time|total)" "$LOGS/small_batch_profile_${setting}.txt" | tr -s ' ' | paste -sd ';')"
  done
  # What each of SMALL_BATCH_LEAVE_OUT (default weight_grads_beside: products on a second
  # stream, a gain only a run can show) adds at one rank's batch: the measured candidates
  # without it, unprofiled as the first run of each setting above.
  local measured left_out
  measured=$(measured_candidates)
  for left_out in ${SMALL_BATCH_LEAVE_OUT-weight_grads_beside}; do
    echo "$measured" | tr ',' '\n' | grep -qx "$left_out" || continue
    setting=$(echo "$measured" | tr ',' '\n' | grep -vx "$left_out" | paste -sd,)
    [ -n "$setting" ] || continue  # it alone was measured: the verified runs are without it
    # shellcheck disable=SC2046
    timeout 60 "$BUILD_DIR/transformer_bench_step" $(bench_args base 40 20 | sed "s/--tokens 25000/--tokens 3125/") \
      --set "train.cuda_kernels=$setting" > "$LOGS/small_batch_without_${left_out}.txt" 2>&1
    echo "== small batch, the measured candidates but $left_out (exit $?): $(grep "^{" "$LOGS/small_batch_without_${left_out}.txt")"
    # And at 25,000 tokens, as step_vs_torch.sh times ours (60 steps): beside the peers
    # line's candidate variant, whether it loses at the full batch.
    # shellcheck disable=SC2046
    timeout 60 "$BUILD_DIR/transformer_bench_step" $(bench_args base 60 15) \
      --set "train.cuda_kernels=$setting" > "$LOGS/base_without_${left_out}.txt" 2>&1
    echo "== base 25,000, the measured candidates but $left_out (exit $?): $(grep "^{" "$LOGS/base_without_${left_out}.txt")"
  done
  # With graphs a replayed pass is one row: the candidates' kernels at one rank's batch,
  # by op class, only without them (issue 51's 1.5x at 3,125 tokens wants to know where
  # the 6.56 ms of the graphs' step go; the 2026-11-29 window kept no such table).
  setting=$(candidates_without_graphs)
  [ -n "$setting" ] || return 0
  # shellcheck disable=SC2046
  timeout 60 "$BUILD_DIR/transformer_bench_step" $(bench_args base 40 20 | sed "s/--tokens 25000/--tokens 3125/") \
    --set "train.cuda_kernels=$setting" --profile > "$LOGS/small_batch_profile_without_graphs.txt" 2>&1
  echo "== small batch profiled, train.cuda_kernels=$setting (no graphs; exit $?)"
  profile_lines "$LOGS/small_batch_profile_without_graphs.txt"
  return 0
}

# Profiles (and with line=1 the unprofiled big line) of one preset, off and on (with
# step_graphs transformer_bench_step warms up two rounds of its nine lengths itself, so
# that the timed steps replay: the 2026-11-29 window's one round left a capture in every
# other timed step, 37.5 ms against 32.3).
profile() {
  local preset=${1#preset=} line=${2:-} setting
  for setting in $(kernel_settings); do
    bench_profile "$LOGS/profile_${preset}_${setting}.txt" "$preset" \
      --set "train.cuda_kernels=$setting"
    echo "== profile $preset, train.cuda_kernels=$setting (exit $?)"
    profile_lines "$LOGS/profile_${preset}_${setting}.txt"
  done
  [ "$line" = line ] || return 0
  for setting in $(kernel_settings); do
    # shellcheck disable=SC2046
    timeout 120 "$BUILD_DIR/transformer_bench_step" $(bench_args "$preset" 30 9) \
      --set "train.cuda_kernels=$setting" > "$LOGS/${preset}_${setting}.txt" 2>&1
    echo "$preset, train.cuda_kernels=$setting (exit $?): $(tail -1 "$LOGS/${preset}_${setting}.txt")"
  done
}

# profile_lines LOG: a profile's table and by-bucket lines for the console, and its ten
# longest ops (the log keeps every op's "by op:" line).
profile_lines() {
  grep -v -E "^(\{|by op: )" "$1" | tail -34
  grep "^by op: " "$1" | head -11
}

# bench_profile LOG PRESET [OPTION...]: transformer_bench_step --profile of PRESET at
# 25,000 tokens (18 steps after 9 of warm-up) with OPTIONs into LOG, capped at 120 s; its
# exit status.
bench_profile() {
  local log=$1 preset=$2
  shift 2
  # shellcheck disable=SC2046
  timeout 120 "$BUILD_DIR/transformer_bench_step" $(bench_args "$preset" 18 9) --profile "$@" \
    > "$log" 2>&1
}

# The base profile with the passing candidates but step_graphs (when they passed): with
# graphs every timed step of the 18 holds a capture (nine shapes) and the captured passes
# are one row, so the candidates' kernels (fused_attention, relu_masks) are
# timed by op class only here (the 2026-11-29 window had no such row and kept them
# candidates).
profile_candidates_without_graphs() {
  local setting
  setting=$(candidates_without_graphs)
  [ -n "$setting" ] || return 0
  bench_profile "$LOGS/profile_base_without_graphs.txt" base --set "train.cuda_kernels=$setting"
  echo "== profile base, train.cuda_kernels=$setting (no graphs; exit $?)"
  profile_lines "$LOGS/profile_base_without_graphs.txt"
}

# The base profile once per measured candidate that changes the step's kernels, alone:
# on 2026-12-04 the candidates were profiled only together, and each one's share had to
# be told from the op classes it touches (relu_masks' and weight_grads_beside's both in
# the GEMM rows). The step's line, the rows those candidates change, and the host's.
readonly STEP_KERNEL_CANDIDATES="fused_attention relu_masks weight_grads_beside \
fuller_column_sums fused_norm_grads fast_loss_exp bias_grads_in_gemm"
profile_each_step_candidate() {
  local candidate
  for candidate in $(measured_candidates | tr ',' ' '); do
    [[ " $STEP_KERNEL_CANDIDATES " == *" $candidate "* ]] || continue
    bench_profile "$LOGS/profile_base_only_$candidate.txt" base \
      --set "train.cuda_kernels=$candidate"
    echo "== profile base, train.cuda_kernels=$candidate alone (exit $?)"
    grep -E "^(GEMM|attention |bias\+ReLU|residual\+dropout|cross-entropy|zero, copy|host time|total)" \
      "$LOGS/profile_base_only_$candidate.txt"
    # The ops it replaces, a call's microseconds against the verified profile's.
    grep -E "^by op: (attention_|relu_bias_backward|add_dropout_layernorm_backward|linear_|\
softmax_cross_entropy)" \
      "$LOGS/profile_base_only_$candidate.txt"
    # The attention's by length (the fused attention's second design packs the short ones).
    [ "$candidate" != fused_attention ] ||
      grep -E "^by bucket length" "$LOGS/profile_base_only_$candidate.txt"
  done
}

# The candidates measured in this call (CANDIDATE_SETTING), comma-joined by name
# ("candidate" spelled out); nothing when none are (their twins failed).
measured_candidates() {
  [ "$(kernel_settings | wc -l)" -gt 1 ] || return 0
  local setting=${CANDIDATE_SETTING:-candidate}
  if [ "$setting" = candidate ]; then
    setting=$(candidate_names | paste -sd,)
  fi
  echo "$setting"
}

# The measured candidates but step_graphs; nothing when step_graphs is all there is, or
# is not among them (the candidates' own runs are then without graphs already).
candidates_without_graphs() {
  local measured
  measured=$(measured_candidates | tr ',' '\n')
  echo "$measured" | grep -qx step_graphs || return 0
  echo "$measured" | grep -vx step_graphs | paste -sd,
}

# The base profile once more per train.short_attention_max_len in
# SHORT_ATTENTION_LENGTHS (default "0 64"; "" skips): whether the default of 48 (the
# lengths at which the short kernels won on the H100, 2026-11-26) is still the best
# cut-off. Only the step and the by-bucket lines: the rest is the default's table above.
profile_short_attention_lengths() {
  local length
  for length in ${SHORT_ATTENTION_LENGTHS-0 64}; do
    bench_profile "$LOGS/profile_base_short_attention_$length.txt" base \
      --set "train.short_attention_max_len=$length"
    echo "== profile base, train.short_attention_max_len=$length (exit $?)"
    grep -E "^(profile:|attention |by bucket length)" "$LOGS/profile_base_short_attention_$length.txt"
  done
}

# compute-sanitizer memcheck of the candidate kernels' twins, each run capped.
memcheck_candidates() {
  if [ "$rehearsal" = 1 ]; then
    echo "memcheck: skipped in the rehearsal (compute-sanitizer needs the GPU)"
    return
  fi
  # Also when some twins failed: memcheck's report is then the first clue to why.
  [ "${CANDIDATE_TWINS_PASSED:-0}" != 1 ] &&
    echo "memcheck: not every candidate passed its twins; memcheck looks for the cause"
  # Every CudaCandidate* test suite of the kernel test executables, one run each, capped
  # at MEMCHECK_SUITE_SECONDS (default 40), started while MEMCHECK_SECONDS (default 150)
  # last: memcheck runs kernels 10-100x slower, and one cap per executable let a slow
  # suite (test_kernel_linear's three candidates, many shapes each) cut off the verdict
  # of every candidate beside it (a review's finding). A cut-off suite is said so.
  local executable suite status started=$SECONDS
  local budget=${MEMCHECK_SECONDS:-150} cap=${MEMCHECK_SUITE_SECONDS:-40}
  for executable in "$BUILD_DIR"/tests/test_kernel_*; do
    for suite in $("$executable" --gtest_list_tests --gtest_filter='CudaCandidate*' 2> /dev/null |
                   sed -n 's/^\(CudaCandidate[A-Za-z0-9_]*\)\.$/\1/p'); do
      # MEMCHECK_SUITES: a regular expression of the suites to check (default all).
      [[ $suite =~ ^(${MEMCHECK_SUITES:-.*})$ ]] || continue
      if (( SECONDS - started >= budget )); then
        echo "memcheck $suite: not run (MEMCHECK_SECONDS=$budget spent)"
        continue
      fi
      # A suite may have cases in two executables (fuller_column_sums: linear's, layernorm's).
      local program=${executable##*/}
      local log="$LOGS/memcheck_${program}_$suite.log"
      timeout "$cap" compute-sanitizer --tool memcheck --error-exitcode 9 \
        "$executable" --gtest_filter="$suite.*" > "$log" 2>&1
      status=$?
      if [ "$status" = 124 ]; then
        echo "memcheck $suite ($program): cut off at ${cap} s, no verdict" \
          "(MEMCHECK_SUITE_SECONDS)"
      else
        echo "memcheck $suite ($program): exit $status ($(grep -m1 "ERROR SUMMARY" "$log"))"
      fi
    done
  done
}

# compute-sanitizer racecheck of the attention kernels whose blocks share memory between
# phases: the short-sentence attention (clean on the H100 on 2026-11-26, kept while its
# file changes) and the fused attention (candidate; its warps read K, V, P' and dS that
# the whole block loaded). Their host runs (ShortAttentionOnTheHost.*,
# FusedAttentionOnTheHost.*) check everything but races. Runs whether or not the twins
# passed: a race would be the likeliest cause of a failure. Capped: a cut-off run still
# prints the races it found.
# compute-sanitizer racecheck of the kernels that share memory between warps: the short
# and the fused attention's, fused_norm_grads' warp sums. $1: "short", "fused", "norms"
# or "" (short and fused, the followup's).
racecheck_kernels() {
  if [ "$rehearsal" = 1 ]; then
    echo "racecheck: skipped in the rehearsal (compute-sanitizer needs the GPU)"
    return
  fi
  local entry name program test log only=${1:-}
  for entry in short:attention:CudaAttention.ShortSentencesMatchCpu \
               fused:attention:CudaCandidateFusedAttention.MatchesCpu \
               norms:layernorm:CudaCandidateFusedNormGrads.AddNormGradientsMatchCpu; do
    IFS=: read -r name program test <<< "$entry"
    if [ -z "$only" ]; then
      [ "$name" != norms ] || continue
    elif [ "$name" != "$only" ]; then
      continue
    fi
    log="$LOGS/racecheck_${name}_$program.log"
    timeout "${RACECHECK_SECONDS:-60}" compute-sanitizer --tool racecheck --error-exitcode 9 \
      "$BUILD_DIR/tests/test_kernel_$program" --gtest_filter="$test" > "$log" 2>&1
    echo "racecheck $name $program: exit $? (races reported: $(grep -c "Race reported" "$log")," \
      "$(grep -m1 "RACECHECK SUMMARY" "$log" || echo "no summary: cut off"))"
  done
}

followup_stage() {
  local deadline=${FOLLOWUP_SECONDS:-240}
  print_plan
  # What call 1 found, if this is its machine; else the candidate twins again (seconds).
  # shellcheck disable=SC1090
  [ -f "$(state_file)" ] && source "$(state_file)"
  if [ -z "${CANDIDATE_TWINS_PASSED:-}" ]; then
    echo "followup: no state from call 1 on this machine (a fresh one): the candidate twins first"
    run_candidate_twins
  fi
  # 1. memcheck of the candidate kernels' twins, each run capped; racecheck of the
  # short-sentence attention.
  memcheck_candidates
  racecheck_kernels

  # 2. big: profile and line.
  measure_ceiling
  profile preset=big line
  echo "big: at ${SECONDS} s"
  # 3. The compiled peer, if call 1 did not finish it.
  local left=$((deadline - SECONDS))
  if [ "${COMPILE_PEER_DONE:-0}" = 1 ]; then
    echo "peers: call 1 finished them"
  elif [ "$left" -lt 45 ]; then
    echo "peers: skipped, ${left} s left of FOLLOWUP_SECONDS=${deadline}"
  else
    peers_step "$left" compile
  fi
  echo "followup: ${SECONDS} s"
}

# The step at each rank's batch (issue 51's curve): bench/step_vs_torch.sh with
# PROFILE=1 (host_gap_share) and the eager peer for each "PRESET TOKENS" of CURVE_ROWS,
# then the compiled peers of CURVE_COMPILED ("PRESET TOKENS PEER" each, the CUDA-graph
# peer at the eight-way split first) with what is left of CURVE_SECONDS (default 430):
# each compiled peer is a step_vs_torch run of its own, so a compilation cut off by the
# time-out loses only itself. In the rehearsal: small at 200 tokens, eager, on the CPU.
curve_stage() {
  local deadline=${CURVE_SECONDS:-430} row preset tokens peer left peers=eager
  measure_ceiling
  local rows=() compiled=()
  IFS=';' read -r -a rows <<< "${CURVE_ROWS-base 3125;base 6250;base 12500;base 25000;big 3125;big 25000}"
  IFS=';' read -r -a compiled <<< "${CURVE_COMPILED-base 3125 compile-graphs;base 3125 compile}"
  local device=cuda
  if [ "$rehearsal" = 1 ]; then
    device=cpu rows=("small 200") compiled=()
    peers=""
    if [ -n "${SOURCE_TORCH_REFERENCE}" ] && "${PYTHON:-python3}" -c 'import torch' 2> /dev/null; then
      export TORCH_REFERENCE=$SOURCE_TORCH_REFERENCE
      peers=eager
    fi
  fi
  # PRESET TOKENS PEERS SECONDS [PEERS_FIRST]: with PEERS_FIRST=1 (the compiled rows,
  # whose peer call 1 warmed) the peer runs first and ours start only in the row's first
  # SECONDS - 40 (OURS_SECONDS), so that many OURS_VARIANTS cannot cost the ratio's peer
  # line or the summary; the variants left out say so.
  curve_row() {
    local log="$LOGS/curve_$1_$2_${3// /+}.txt" ours_seconds=""
    [ "${5:-0}" = 1 ] && ours_seconds=$(($4 - 40))
    echo "== curve $1 $2, peers $3 (within $4 s, at ${SECONDS} s)"
    DEVICE=$device BUILD=$BUILD_DIR PEERS=$3 PROFILE=1 CEILING_TFLOPS=${CEILING:-} \
      PEERS_FIRST=${5:-0} OURS_SECONDS=$ours_seconds \
      timeout "$4" bash bench/step_vs_torch.sh "$1" "$2" > "$log" 2>&1
    local status=$?
    # The console keeps the profile's step and host rows; the log has the whole table.
    grep -E "^(step_vs_torch:|run |peer |ours [a-z0-9_]+: |\{|\
[a-z0-9]+ profiled: (profile:|host time|total))" "$log"
    [ "$status" = 0 ] || echo "curve $1 $2 $3: exit $status$([ "$status" = 124 ] && echo ", cut off after $4 s")"
  }
  for row in "${rows[@]}"; do
    read -r preset tokens <<< "$row"
    left=$((deadline - SECONDS))
    [ "$left" -lt 30 ] && { echo "curve: $row skipped, ${left} s left"; continue; }
    curve_row "$preset" "$tokens" "$peers" $((left < 90 ? left : 90))
  done
  for row in "${compiled[@]}"; do
    read -r preset tokens peer <<< "$row"
    left=$((deadline - SECONDS))
    [ "$left" -lt 60 ] && { echo "curve: $row skipped, ${left} s left"; continue; }
    curve_row "$preset" "$tokens" "$peer" "$left" 1
  done
  echo "curve: ${SECONDS} s"
}

# Ranks sharing the GPU (issue 52): dist.reducer = mpi stages the gradient buckets through
# pinned host memory, so 2 and 4 ranks run on one device. The tests first (in the
# rehearsal the CPU's twins of them, DataParallel* and the Distributed resume and kill
# cases: the GPU ones skip there), then the step of 1 rank and of 2 ranks sharing the GPU
# on the synthetic task at base size, the two ranks' step against the one's.
ranks_stage() {
  # mpirun refuses root unless told (the GPU host's use.sh tells it; the rehearsal here).
  [ "$(id -u)" = 0 ] && export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  local gpu_tests="^CudaDistributed|OneRankNcclGradients"
  local model_options="--train.backend=cuda --model.layers=6 --model.d_model=512 --model.d_ff=2048
    --model.heads=8 --train.tokens_per_step=6250"
  if [ "$rehearsal" = 1 ]; then
    gpu_tests="^DataParallel|^Distributed[.](AFourRank|AKilledRank)"
    model_options="--train.backend=cpu --model.layers=1 --train.tokens_per_step=800"
  fi
  # Capped (a test without a TIMEOUT of its own; the MPI cases have 300 s, and end at
  # once when a rank fails: mpi_equivalence's main) so that a hang leaves the call time.
  ctest --test-dir "$BUILD_DIR" -R "$gpu_tests|^CudaDistributed" --output-on-failure \
    --timeout 180 -j2 > "$LOGS/ctest_ranks.log" 2>&1
  grep -E "tests passed|Failed|\*\*\*|Skipped" "$LOGS/ctest_ranks.log" | tail -20
  grep -hE "sharing GPU 0|ranks: loss at step 25|60 steps" "$BUILD_DIR/Testing/Temporary/LastTest.log" | awk '!seen[$0]++'
  # compute-sanitizer memcheck of the candidates' twins, on the kernel tests call 1 built
  # on this machine: a candidate becomes the default when its twins, the whole model and
  # memcheck pass on a GPU (issue 51), and call 1 has no time left for it; this call has.
  # shellcheck disable=SC1090
  [ -f "$(state_file)" ] && source "$(state_file)"
  if [ -x "$BUILD_DIR/tests/test_kernel_linear" ] || [ "$rehearsal" = 1 ]; then
    memcheck_candidates
    # And racecheck of the fused attention's twin (its warps share K and V in shared
    # memory; no window has run it yet; the short kernels' passed on 2026-11-26).
    racecheck_kernels fused
  else
    echo "memcheck: skipped (no twin tests in $BUILD_DIR: a fresh machine)"
  fi
  local steps=${RANKS_STEPS:-60} ranks
  rm -rf "$BUILD_DIR/ranks_checkpoints"  # a cut call's: a new run refuses another run's files
  for ranks in 1 2; do
    local reducer=""
    [ "$ranks" -gt 1 ] && reducer="--dist.reducer=mpi --dist.device=0 --dist.log_buckets=true"
    # shellcheck disable=SC2086
    timeout 150 mpirun -np "$ranks" --oversubscribe "$BUILD_DIR/transformer_hpc" input/tiny.ini \
      $model_options $reducer --train.max_steps="$steps" --train.log_every=$((steps / 3)) \
      --checkpoint.minutes=0 --checkpoint.average_last=0 \
      --checkpoint.dir="$BUILD_DIR/ranks_checkpoints/np$ranks" > "$LOGS/ranks_np$ranks.log" 2>&1
    echo "ranks: np $ranks, exit $?: $(grep "^step $steps/" "$LOGS/ranks_np$ranks.log" | grep -o "ms/step [0-9.]*")"
    # The staged sums against backward (issue 52 item 4): the last step's buckets.
    grep "^buckets at step $steps " "$LOGS/ranks_np$ranks.log"
  done
  # One rank's sums through NCCL, timed by CUDA events (dist.log_buckets makes one GPU
  # rank sum as an N-rank job does; in place, NCCL moves nothing for one rank): when each
  # bucket's collective is posted against backward on the device's clock (issue 52 item
  # 4), where the two ranks' above are the host's; the transfers are the scaling model's.
  # shellcheck disable=SC2086
  timeout 150 mpirun -np 1 "$BUILD_DIR/transformer_hpc" input/tiny.ini $model_options \
    --dist.log_buckets=true --train.max_steps="$steps" --train.log_every=$((steps / 3)) \
    --checkpoint.minutes=0 --checkpoint.average_last=0 \
    --checkpoint.dir="$BUILD_DIR/ranks_checkpoints/np1_nccl" > "$LOGS/ranks_np1_nccl.log" 2>&1
  echo "ranks: np 1 with NCCL's sums timed, exit $?: $(grep "^step $steps/" "$LOGS/ranks_np1_nccl.log" | grep -o "ms/step [0-9.]*")"
  grep "^buckets at step $steps " "$LOGS/ranks_np1_nccl.log"
  # The scaling model with those schedules in place of its 2/3 rule (issue 52 item 5: when
  # each sum could start, measured; the transfers, modelled).
  local log
  for log in "$LOGS/ranks_np2.log" "$LOGS/ranks_np1_nccl.log"; do
    grep -q "^buckets at step" "$log" || continue
    python3 tools/scaling_model.py --buckets "$log" 2>&1 |
      sed -n '/measured bucket schedule/,/^### The paper/{/^### The paper/!p};/^--buckets/p'
  done
  rm -rf "$BUILD_DIR/ranks_checkpoints"
  # A checkpoint's stall, written in the step and beside training (issue 51 item 4): the
  # base model at 25,000 tokens; its 757 MB files stay out of $LOGS (which comes back).
  # Beside training the state is copied into pinned memory on the stream, not waited for
  # (the former candidate pinned_snapshot, the default since 2026-12-04). A checkpoint every
  # 80 steps of ~40 ms: 3.2 s, more than a write's ~2 s, so that a checkpoint does not wait
  # for the writer of the one before (every 3 steps did, on 2026-12-04: the later
  # checkpoints' 2 s were the writer's, only the first a stall).
  local stall=(BACKEND=cuda TOKENS=25000 STEPS=241 EVERY=80)
  [ "$rehearsal" = 1 ] && stall=(BACKEND=cpu TOKENS=100 STEPS=7 EVERY=2 CONFIG=input/tiny.ini)
  timeout 130 env "${stall[@]}" BUILD="$BUILD_DIR" WORK=/tmp/thpc_checkpoint_stall \
    bash bench/checkpoint_stall.sh > "$LOGS/checkpoint_stall.txt" 2>&1
  echo "checkpoint stall (exit $?): $(grep "^checkpoint_stall:" "$LOGS/checkpoint_stall.txt")"
  grep "longer than the" "$LOGS/checkpoint_stall.txt"
  rm -rf /tmp/thpc_checkpoint_stall
}

peers_stage() {
  measure_ceiling
  peers_step "${STEP_SECONDS:-370}" "${PEERS:-eager compile}"
}

tests_stage() {
  # The twin tests and the whole-model tests (they skip nothing here: a GPU is present);
  # not their CPU rehearsals (Rehearsal.*, which every CPU build runs).
  ctest --test-dir build-gpu -R "Cuda|GradientReducer" -E "^Rehearsal[.]" --output-on-failure -j4 \
    > "$LOGS/ctest_cuda.log" 2>&1
  grep -E "tests passed|Failed|\*\*\*" "$LOGS/ctest_cuda.log" | tail -30
  # Each twin case's measured error beside its tolerance, for tightening the bf16 bounds:
  # ctest shows the output of failed tests only, its LastTest.log that of every test (and
  # the next ctest run replaces it).
  cp build-gpu/Testing/Temporary/LastTest.log "$LOGS/ctest_cuda_all_output.log"
  grep -E "^twin " "$LOGS/ctest_cuda_all_output.log" > "$LOGS/twin_errors.txt"
  echo "twin lines: $(wc -l < "$LOGS/twin_errors.txt")"
  # The step benchmark against the PyTorch peer on base-shaped batches.
  BUILD=build-gpu bash bench/step_vs_torch.sh base 25000 2>&1 | tee "$LOGS/bench_base.txt"
  # Shared-memory races in the kernels that reduce within a block (after the benchmark:
  # racecheck is slow, and a call cut off at its limit should have the numbers first).
  for twin in attention:CudaAttention.* layernorm:CudaLayerNorm.* top_k:CudaRowTopK.*; do
    timeout 120 compute-sanitizer --tool racecheck --error-exitcode 9 \
      "build-gpu/tests/test_kernel_${twin%%:*}" --gtest_filter="${twin#*:}" \
      > "$LOGS/racecheck_${twin%%:*}.log" 2>&1
    echo "racecheck ${twin%%:*}: exit $? ($(grep -m1 "RACECHECK SUMMARY" "$LOGS/racecheck_${twin%%:*}.log"))"
  done
  # Two ranks on the one GPU (dist.device = 0 for both): NCCL usually refuses two ranks
  # of a communicator on one device ("Duplicate GPU detected"); then each run must end
  # with that reason, non-zero, well inside the time-out (the error path, checked). If it
  # accepts, the first run is the two-rank NCCL training and the second a rank failing
  # at step 2, which must end the whole job with the injected failure named.
  local two_ranks=build-gpu/two_ranks
  rm -rf "$two_ranks"
  for run in "np2" "np2_rank1_fails_at_2:THPC_FAIL_AT=1:2"; do
    local name=${run%%:*} injected=""
    [ "$run" != "$name" ] && injected=${run#*:}
    timeout 180 env $injected mpirun -np 2 --oversubscribe build-gpu/transformer_hpc \
      input/tiny.ini --train.backend=cuda --dist.device=0 --dist.timeout_s=60 \
      --train.max_steps=4 --train.log_every=1 --checkpoint.minutes=0 \
      --checkpoint.average_last=0 --checkpoint.dir="$two_ranks/$name" \
      > "$LOGS/two_ranks_$name.log" 2>&1
    echo "two ranks on one GPU, $name: exit $? ($(grep -m1 -E "^final:|Duplicate|rror|injected" "$LOGS/two_ranks_$name.log"))"
  done
  # The rest of the suite, on the CPU (ctest hides the GPU from it: tests/tests.cmake).
  # CpuThreads.OpenBlasIsTheOpenMpBuild is left out: it checks the build links Debian's
  # OpenMP OpenBLAS (tools/install_deps.sh), and the gpu-host bundle ships the pthread
  # one (it failed there for that reason alone on 2026-11-25).
  ctest --test-dir build-gpu -E "Cuda|Learning|OpenBlasIsTheOpenMpBuild" -j8 --output-on-failure \
    > "$LOGS/ctest_rest.log" 2>&1
  grep -E "tests passed|Failed" "$LOGS/ctest_rest.log" | tail -5
}

translate_stage() {
  # TRANSLATE_SECONDS (default 320, inside call 3's `timeout 330`): the comparison with
  # CTranslate2 ends by then, and the newstest decode-speed runs are left out when the
  # comparison would not fit after them.
  local deadline=${TRANSLATE_SECONDS:-320}
  # MEMCHECK=1: first the candidate kernels' memcheck, when call 1 on this warm machine
  # built their twin tests (the translate stage itself builds only the programs).
  if [ "${MEMCHECK:-0}" = 1 ]; then
    if [ -x "$BUILD_DIR/tests/test_kernel_linear" ] || [ "$rehearsal" = 1 ]; then
      memcheck_candidates
    else
      echo "memcheck: skipped (no twin tests in $BUILD_DIR: a fresh machine)"
    fi
  fi
  local checkpoints=build-gpu/multi30k/checkpoints
  # A checkpoint every 0.7 minutes (at least 5 in 4 minutes, the final one included): the
  # last 5 are averaged, as in the paper's base recipe. Minutes and time-outs are chosen
  # so that the stage, build kept from the tests stage, ends inside the 10-minute call.
  # TRANSLATE_CONFIG=FILE trains that configuration as it is (input/multi30k.ini: issue
  # 37's GPU recipe, 3 x 256 with dropout 0.3) instead of the base-sized layers.
  local model=(--model.layers=6 --model.d_model=512 --model.d_ff=2048 --model.heads=8)
  [ -n "${TRANSLATE_CONFIG:-}" ] && model=(--config "$TRANSLATE_CONFIG")
  # TRANSLATE_SET: more overrides, e.g. "--train.valid_every=300 --checkpoint.every_steps=300".
  local extra=()
  read -r -a extra <<< "${TRANSLATE_SET:-}"
  train_multi30k() {  # the train.cuda_kernels option, or none: the default
    # A new run refuses a directory holding another run's checkpoints or metrics.
    rm -rf "$checkpoints" build-gpu/multi30k/metrics.jsonl build-gpu/multi30k/events.out.tfevents.*
    BUILD=build-gpu bash tools/run_multi30k.sh "${model[@]}" --train.backend=cuda \
      --train.max_minutes="${TRAIN_MINUTES:-4}" --checkpoint.minutes="${CHECKPOINT_MINUTES:-0.7}" \
      --checkpoint.keep=5 --checkpoint.dir="$checkpoints" "${extra[@]}" "$@" \
      > "$LOGS/multi30k_train.log" 2>&1
  }
  training_lines() {
    grep -E "^(step|valid|summary|final|stopping|captured passes|multi30k)" \
      "$LOGS/multi30k_train.log" | tail -16
  }
  # TRAIN_KERNELS: the program trains with these candidates (e.g. step_graphs, whose
  # passes the benchmark has timed but the program has not trained with on a GPU: a real
  # corpus's shapes, its captured/replayed counts and step rate); should that run fail,
  # the stage trains again with the default, so that decoding keeps its model.
  local status
  if [ -n "${TRAIN_KERNELS:-}" ]; then
    train_multi30k --train.cuda_kernels="$TRAIN_KERNELS"
    status=$?
    echo "multi30k training with train.cuda_kernels=$TRAIN_KERNELS: exit $status"
    training_lines
    if [ "$status" != 0 ]; then
      cp "$LOGS/multi30k_train.log" "$LOGS/multi30k_train_$TRAIN_KERNELS.log"
      echo "multi30k training: again with the default kernels"
    fi
  fi
  if [ -z "${TRAIN_KERNELS:-}" ] || [ "$status" != 0 ]; then
    train_multi30k
    echo "multi30k training: exit $?"
    training_lines
  fi
  timeout 120 env THPC_BUILD=build-gpu bash tools/evaluate.sh "$checkpoints" \
    "$THPC_DATA/multi30k/test_2016_flickr.en" "$THPC_DATA/multi30k/test_2016_flickr.de" 5 \
    -- --beam 4 > "$LOGS/multi30k_bleu.txt" 2>&1
  cat "$LOGS/multi30k_bleu.txt"
  # input/multi30k.ini also averages its 5 best by validation perplexity, and
  # run_multi30k.sh's last line names the average with the better one: that one's BLEU too.
  local chosen
  chosen=$(sed -n 's/^multi30k: the better validation .*: //p' "$LOGS/multi30k_train.log" | tail -1)
  if [ -n "$chosen" ] && [ -f "$chosen" ]; then
    timeout 120 env THPC_BUILD=build-gpu bash tools/evaluate.sh "$chosen" \
      "$THPC_DATA/multi30k/test_2016_flickr.en" "$THPC_DATA/multi30k/test_2016_flickr.de" \
      -- --beam 4 > "$LOGS/multi30k_bleu_chosen.txt" 2>&1
    cat "$LOGS/multi30k_bleu_chosen.txt"
  fi
  # DECODE_BENCH=0: no decoding-speed runs (a call that has only the time to train).
  [ "${DECODE_BENCH:-1}" = 0 ] && return
  # Decoding speed on newstest2014 with the averaged model (transformer_decode's default
  # --batch-tokens 4096 padded source tokens per batch), when the call has the time for it
  # and the comparison below (~220 s with the candidates and two workers: issue 53's
  # numbers come first).
  if [ $((deadline - SECONDS)) -gt 280 ]; then
    timeout 150 env THPC_BUILD=build-gpu bash bench/cpu_decode_speed.sh \
      "$checkpoints/eval/average_last5.h5" 3003 > "$LOGS/newstest_decode_speed.txt" 2>&1
    cat "$LOGS/newstest_decode_speed.txt"
  else
    echo "newstest decode speed: skipped, $((deadline - SECONDS)) s left of TRANSLATE_SECONDS=$deadline"
  fi
  # The same model's decoding time alone (model load excluded), in 4,096-token batches and
  # in batches of 32 sentences, beside CTranslate2 (or its published anchor when its CUDA
  # 12 wheel cannot run: issue 33's GPU line), and where the time goes (--profile: the
  # host time between ops says whether CUDA graphs of the decoder step would pay), and ours
  # in int8 at batch 32 against CTranslate2's int8_float16 (gpu_quant_vs_ct2_int8: the
  # candidate int8_products, whose twins run in call 1; INT8=0 leaves it out). With
  # the candidate kernels too (transformer_decode --cuda-kernels candidate) when their twins
  # passed in call 1 on this machine (ours in int8 with them too: its decoder steps
  # captured when step_graphs is among them), or
  # DECODE_CANDIDATE=NAMES says so ("" : not). GPU_WORKERS (default 2; 1: not): ours with
  # that many workers sharing the GPU against CTranslate2's inter_threads as many (issue
  # 53's host gaps: one worker's kernels run while another's host works; ~50 s more).
  # DECODE_PROFILE (default int8: the int8 runs' profiles only, the bf16 ones were taken
  # in the sixth window; 1: all; 0: none).
  # shellcheck disable=SC1090
  [ -f "$(state_file)" ] && source "$(state_file)"
  # The candidates whose twins passed in call 1 (CANDIDATE_SETTING: all, or the list of
  # those that passed when others failed).
  local decode_candidate=""
  [ "${CANDIDATE_TWINS_PASSED:-0}" = 1 ] && decode_candidate=${CANDIDATE_SETTING:-candidate}
  decode_candidate=${DECODE_CANDIDATE-$decode_candidate}
  # What the call has left (its "run N" lines are printed as each round ends: a cut run
  # keeps the rounds before).
  local left=$((deadline - SECONDS))
  [ "$left" -lt 60 ] && left=60
  echo "decode_vs_ctranslate2: within ${left} s, candidates '${decode_candidate}'"
  timeout "$left" env THPC_BUILD=build-gpu DEVICE=cuda RUNS=1 PYTHON=python3 CANDIDATE="$decode_candidate" \
    GPU_WORKERS="${GPU_WORKERS:-2}" PROFILE="${DECODE_PROFILE:-int8}" \
    bash bench/decode_vs_ctranslate2.sh "$checkpoints/eval/average_last5.h5" 3003 \
    > "$LOGS/newstest_decode_vs_ctranslate2.txt" 2>&1
  grep -E "^(decode_vs_ctranslate2|CTranslate2|ctranslate2 runs|run )|Loaded cuBLAS" \
    "$LOGS/newstest_decode_vs_ctranslate2.txt"
  sed -n '/^ours, profiled/,/^total (the batch)/p;/^ours in int8, profiled/,/^total (the batch)/p;/^ours in int8 with --gpu-workers/,/^device idle/p;/^ours with --cuda-kernels/,/^total (the batch)/p;/^ours in int8 with --cuda-kernels/,/^total (the batch)/p' \
    "$LOGS/newstest_decode_vs_ctranslate2.txt"
}

parse_stage() {
  BUILD=build-gpu bash tools/run_parser.sh input/parse_wsj.ini \
    --train.max_minutes="${TRAIN_MINUTES:-5}" > "$LOGS/parse_wsj.log" 2>&1
  echo "parse_wsj: exit $?"
  grep -E "^(step|valid|summary|final|stopping|dev|test)" "$LOGS/parse_wsj.log" | tail -12
}

"${stage}_stage"
