#!/usr/bin/env bash
# Decoding speed against CTranslate2 (and Hugging Face generate) on the same weights, the
# same sentences and the same search, in one run on one machine:
#
#   [DEVICE=cpu|cuda] [THREADS="1 2"] [COMPUTE_TYPES="float32 int8"] [RUNS=2] [MAX_LEN=80]
#   [BEAM=4] [GPU_WORKERS=2] [PYTHON=...]
#       bash bench/decode_vs_ctranslate2.sh CHECKPOINT [LINES]
#
# The checkpoint is converted once (tools/convert_to_ctranslate2.py; not timed), the first
# LINES lines of $THPC_DATA/wmt14_test/newstest2014.en (default 40 on the CPU, 3003 on the
# GPU) are translated by transformer_decode, by CTranslate2 (tools/translate_ctranslate2.py)
# and by generate() of a Marian model holding the same weights
# (bench/hf_marian_translate.py, CPU only, skipped with the reason when torch or
# transformers is missing): beam BEAM, no length penalty (CTranslate2's and Hugging Face's
# penalties are not our GNMT one; without one all three rank by log P), every output
# limited to MAX_LEN tokens, eos counted (a fixed limit: the same for every sentence and
# system; a random-init model runs every hypothesis to it), fp32 on the CPU. Tokens are
# the SentencePiece pieces of each system's output (the checkpoint's model, eos not
# counted, as bench/cpu_decode_speed.sh counts). Each system's time with model load
# excluded is its decoding alone: CTranslate2's and HF's from the helper's own clock
# (translate_batch/generate), ours as the program's wall time less the wall time of the
# same command on an empty input (start, checkpoint read and verify, model build); the
# wall time with everything is given beside it. The systems are alternated RUNS times
# for each thread count; medians are reported.
#
# CPU (DEVICE=cpu): for each N in THREADS and each compute type T in COMPUTE_TYPES
# (default "float32 int8"), ours --threads N --compute-type T (N workers of one thread,
# or one worker of N threads for fewer than 2N batches: 40 lines are one batch),
# CTranslate2 intra_threads N (inter_threads 1) compute_type T, and for float32
# torch.set_num_threads(N). One line per N and T:
#   decode_vs_ctranslate2: device=cpu threads=N compute_type=T lines=L beam=B max_len=M
#     ours_tok_s=A ct2_tok_s=B ratio=A/B [cpu_int8_vs_ct2_int8=A/B] hf_tok_s=C hf_ratio=A/C
#     ours_wall_tok_s=.. ct2_wall_tok_s=.. hf_wall_tok_s=.. tokens_ours=.. tokens_ct2=..
#     tokens_hf=.. same_as_ct2=K/L same_as_hf=K/L same_as_ours_float32=K/L
#     ours_gemm=onednn|openblas ours_openblas=CORE[-by-OPENBLAS_CORETYPE|-instead-of-OLD]
#     loadavg=...
# (same_as_*: output lines identical to ours, first run; same_as_ours_float32: ours in T
# against ours in float32; ratio > 1: ours faster.)
#
# GPU (DEVICE=cuda): CTranslate2 fp16 and bf16 in batches of 32 sentences, and fp16 in
# 4,096-token batches; ours in bf16 (the checkpoint's train.precision; train.backend auto
# finds the GPU) in 4,096-token batches and in batches of 32 sentences (--batch-sentences
# 32, as CTranslate2's; until 2026-11-26 ~32: --batch-tokens 32 x the mean padded source
# length). First it checks that CTranslate2's wheel runs on the GPU. Its PyPI wheels open
# CUDA 12's libcublas.so.12; on a host with CUDA 13 alone it is given the host's cuBLAS
# under that name (below: ct2_cublas=13-as-12). When it still cannot run, it says why and
# prints CTranslate2's published anchor instead of a ratio — also when PYTHON cannot import
# ctranslate2 at all (then it needs only h5py, for the checkpoint's SentencePiece model:
# the GPU host's python3 has it). One line:
#   decode_vs_ctranslate2: device=cuda lines=L beam=B max_len=M ours_bf16_tok_s=A
#     ours_bf16_b32_tok_s=.. ours_wall_tok_s=.. ours_bf16_b32_launched_tok_s=..
#     graphs_gain_b32=.. (ours at batch 32 with --cuda-graphs off, the default's gain)
#     ct2_fp16_b32_tok_s=B ct2_bf16_b32_tok_s=..
#     ratio_fp16_b32=ours_b32/B ratio_bf16_b32=.. ct2_int8_float16_b32_tok_s=D
#     ours_bf16_vs_ct2_int8_float16_b32=ours_b32/D (CTranslate2's quantized GPU path
#     against ours in bf16) ours_int8_b32_tok_s=E int8_same_as_bf16_b32=K/L
#     gpu_quant_vs_ct2_int8=E/D (ours in int8, --compute-type int8 --cuda-kernels
#     verified, against it: issue 53's field) ct2_fp16_t4096_tok_s=C
#     ratio_fp16_t4096=A/C ct2_wall_fp16_b32_tok_s=.. same_as_ct2_fp16_b32=K/L
#     ct2_cublas=12|13-as-12 ...
# After that line (PROFILE=1, the default on the GPU; PROFILE=int8 keeps only the int8
# runs' profiles, issue 53's path; 0 none), two more, untimed runs of ours, in
# 4,096-token batches and in batches of 32 sentences, with --profile: the time per batch
# of each op class and the host time between the backend's ops (launch gaps and the
# search's host work; ours captures its decoder steps into CUDA graphs, transformer_decode's
# default with one GPU worker since 2026-12-04: what is left is the search's own).
# CANDIDATE=NAMES (GPU): ours once more in each batching with --cuda-kernels NAMES (the
# kernels not yet run on a GPU, e.g. candidate), profiled too; the line adds
# candidate=NAMES ours_candidate_bf16_tok_s=.. ours_candidate_b32_tok_s=..
# candidate_same_lines=K/L (its translations identical to ours, first run), and with int8
# ours_int8_candidate_b32_tok_s=.. gpu_quant_candidate_vs_ct2_int8=.. (ours in int8 with
# the candidates too).
# GPU_WORKERS=N (GPU, default 2; 1 leaves it out): ours with --gpu-workers N (N workers
# sharing the GPU, each on its own stream, so that one's kernels run while another's host
# picks its beam's tokens) against CTranslate2 with inter_threads N (its workers on
# their own streams too), in batches of 32, bf16/fp16 and int8/int8_float16; the line adds
# gpu_workers=N ours_bf16_b32_wN_tok_s=.. ours_int8_b32_wN_tok_s=.. ct2_fp16_b32_wN_tok_s=..
# ct2_int8_float16_b32_wN_tok_s=.. ratio_fp16_b32_wN=.. gpu_quant_vs_ct2_int8_wN=..
# workers_same_lines=K/L (ours with N workers against one, first run: the same batches;
# ours' time then holds the other workers' set-up, a CUDA context's handles and a model
# copy each, which the empty run it is less does not make: against ours, not for it),
# and a profiled int8 run says how long the device had no worker's op in flight; with
# CANDIDATE, ours with both (ours_candidate_b32_wN_tok_s=.. ratio_candidate_fp16_b32_wN=..,
# and in int8 ours_int8_candidate_b32_wN_tok_s=.. gpu_quant_candidate_vs_ct2_int8_wN=..),
# the int8 run profiled too: with the candidate worker_graphs every worker captures its
# steps (one worker's are captured anyway: --cuda-graphs on, the default).
#
# PYTHON: an interpreter with ctranslate2, sentencepiece, h5py and numpy (torch and
# transformers for the HF peer); default $THPC_PYTHON, else $THPC_VENV/bin/python or
# ~/.cache/thpc-venv/bin/python (`bash tools/install_deps.sh --ctranslate2`), else python3.
# WHEELS=DIR (default .whl when it exists): a folder of wheels installed with --target
# into a folder put on PYTHONPATH when PYTHON lacks ctranslate2: for a machine without
# network (the GPU host has numpy, pyyaml, h5py and sentencepiece; only CTranslate2's
# wheel travels, made by `bash bench/gpu_session.sh --prepare-ctranslate2`: pip download
# and bench/slim_wheel.py). THPC_BUILD (or BUILD) names the build directory (default build).
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -ge 1 ] || { sed -n '2,95p' "$0" >&2; exit 2; }
checkpoint=$1
device=${DEVICE:-cpu}
case $device in
  cpu) lines=${2:-40} ;;
  cuda) lines=${2:-3003} ;;
  *) echo "DEVICE must be cpu or cuda, not '$device'" >&2; exit 2 ;;
esac
read -r -a thread_counts <<< "${THREADS:-1 2}"
read -r -a compute_types <<< "${COMPUTE_TYPES:-float32 int8}"
runs=${RUNS:-2}
max_len=${MAX_LEN:-80}
beam=${BEAM:-4}
build=${THPC_BUILD:-${BUILD:-build}}  # (BUILD as step_vs_torch.sh names it)
data=${WMT14_TEST:-${THPC_DATA:-}/wmt14_test}
[ -f "$checkpoint" ] || { echo "checkpoint '$checkpoint' not found" >&2; exit 2; }
[ -f "$data/newstest2014.en" ] || { echo "$data/newstest2014.en not found: run 'bash tools/fetch_data.sh wmt14_test DIR' and set THPC_DATA=DIR" >&2; exit 1; }
[ -x "$build/transformer_decode" ] || { echo "build first: cmake --build $build" >&2; exit 1; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# The interpreter, as tests/python_interpreter.h finds it, or one made from WHEELS.
venv_python=${THPC_VENV:-$HOME/.cache/thpc-venv}/bin/python
python=${PYTHON:-${THPC_PYTHON:-$( [ -x "$venv_python" ] && echo "$venv_python" || echo python3)}}
wheels=${WHEELS:-$( [ -d .whl ] && echo .whl || true)}
if ! "$python" -c 'import ctranslate2, sentencepiece, h5py, numpy' 2> /dev/null; then
  if [ -n "$wheels" ] && ls "$wheels"/ctranslate2-*.whl > /dev/null 2>&1; then
    echo "$python lacks ctranslate2: installing the wheels of $wheels into $work/site"
    "$python" -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
      --target "$work/site" "$wheels"/*.whl
    export PYTHONPATH=$work/site${PYTHONPATH:+:$PYTHONPATH}
    "$python" -c 'import ctranslate2, sentencepiece, h5py, numpy' || {
      echo "$python still cannot import ctranslate2, sentencepiece, h5py and numpy: add their wheels to $wheels" >&2
      exit 1; }
  elif [ "$device" = cuda ] && "$python" -c 'import h5py' 2> /dev/null; then
    # On the GPU ours is measured all the same, beside CTranslate2's published anchor.
    echo "$python cannot import ctranslate2: ours alone, beside CTranslate2's published anchor"
    ct2_importable=no
  else
    echo "$python cannot import ctranslate2, sentencepiece, h5py and numpy: bash tools/install_deps.sh --ctranslate2 (or set PYTHON, or WHEELS=DIR)" >&2
    exit 1
  fi
fi
ct2_importable=${ct2_importable:-yes}
hf=yes
hf_why=""
if [ "$device" = cpu ]; then
  if ! hf_why=$("$python" -c 'import torch, transformers' 2>&1); then
    hf=no
    hf_why=$(echo "$hf_why" | tail -1)
  fi
else
  hf=no
  hf_why="the GPU comparison is with CTranslate2"
fi
# bench/hf_marian_translate.py maps one vocabulary; a model of separate ones would end
# the run (set -e) after ours and CTranslate2's had run.
if [ "$hf" = yes ] && h5dump -a /architecture "$checkpoint" 2>/dev/null | grep -q 'source_vocab_size='; then
  hf=no
  hf_why="a model of separate source and target vocabularies, which the Hugging Face peer does not map"
fi

echo "$(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'); load average $(cut -d' ' -f1-3 /proc/loadavg)"
# The kernels OpenBLAS gives ours ("Core: ..." at OPENBLAS_VERBOSE=2), marked when
# OPENBLAS_CORETYPE chose them: CTranslate2's and PyTorch's BLAS do not read that variable,
# and on an AVX-512 CPU OPENBLAS_CORETYPE=Haswell makes ours ~1.5x slower
# (kernels/cpu/openblas_core.h). The CPU line says ours_openblas=CORE[-by-OPENBLAS_CORETYPE]
# or, where the program chose them for a CPU OpenBLAS does not know, CORE-instead-of-OLD.
# Most of ours' products are oneDNN's where the build has it and its kernels are AVX-512
# ones (ours_gemm=onednn; OpenBLAS then multiplies the smallest: kernels/cpu/blas.h), or
# OpenBLAS's (ours_gemm=openblas).
ours_openblas=$(bash "$(dirname "$0")/openblas_kernels.sh" "$build/transformer_decode")
ours_gemm=n/a
[ "$device" = cpu ] && ours_gemm=$(bash "$(dirname "$0")/cpu_gemm.sh" "$build")
echo "ours: matrix products by $ours_gemm; OpenBLAS $ours_openblas kernels${OPENBLAS_CORETYPE:+ (OPENBLAS_CORETYPE=$OPENBLAS_CORETYPE)}"
echo "checkpoint $checkpoint: $(h5dump -a /architecture "$checkpoint" | grep -o '"layers=[^"]*"')"
[ "$ct2_importable" = yes ] &&
  echo "ctranslate2 $("$python" -c 'import ctranslate2; print(ctranslate2.__version__)') from $python"
[ "$hf" = yes ] && echo "transformers $("$python" -c 'import transformers, torch; print(transformers.__version__, "torch", torch.__version__)')" \
  || echo "Hugging Face peer skipped: $hf_why"

head -n "$lines" "$data/newstest2014.en" > "$work/source.en"
: > "$work/empty.en"
if [ "$ct2_importable" = yes ]; then
  "$python" tools/convert_to_ctranslate2.py --checkpoint "$checkpoint" --output_dir "$work/ct2_model"
  spm=$work/ct2_model/spm.model
else  # the checkpoint's SentencePiece model, for counting pieces
  spm=$work/spm.model
  "$python" -c 'import h5py, sys; open(sys.argv[2], "wb").write(h5py.File(sys.argv[1], "r")["spm_model"][()].tobytes())' \
    "$checkpoint" "$spm"
fi
pieces() { spm_encode --model "$spm" < "$1" | wc -w; }
same_lines() { paste -d '\t' "$1" "$2" | awk -F'\t' '$1 == $2' | wc -l; }
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) print "n/a"; else print (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }
seconds() {  # seconds COMMAND...: runs it, prints its wall seconds, stdout and stderr to $work/log
  local start end
  start=$(date +%s.%N)
  "$@" > "$work/log" 2>&1 || { cat "$work/log" >&2; return 1; }
  end=$(date +%s.%N)
  awk -v a="$start" -v b="$end" 'BEGIN { printf "%.3f\n", b - a }'
}
stat_of() { grep -o "$1=[0-9.]*" "$work/log" | tail -1 | cut -d= -f2; }
search=(--beam "$beam" --lenpen 0 --max-len-a 0 --max-len-b "$max_len")

# ours NAME OPTIONS...: one timed decode; appends "tokens decode_s wall_s" to $work/NAME.
ours() {
  local name=$1
  shift
  local load wall
  load=$(seconds "$build/transformer_decode" --checkpoint "$checkpoint" --input "$work/empty.en" --output /dev/null "${search[@]}" "$@") || return 1
  wall=$(seconds "$build/transformer_decode" --checkpoint "$checkpoint" --input "$work/source.en" --output "$work/$name.out" "${search[@]}" "$@") || return 1
  echo "$(pieces "$work/$name.out") $(awk -v w="$wall" -v l="$load" 'BEGIN { print w - l }') $wall" >> "$work/$name"
}
# try_ours NAME OPTIONS...: ours, for the runs not yet seen on a GPU (several workers, the
# candidate kernels): one that fails is said and left out (its fields n/a), and the others
# and the line go on.
try_ours() {
  ours "$@" && return 0
  echo "ours $1: failed, left out (its fields n/a)"
  touch "$work/$1" "$work/$1.out"
}
# peer NAME SCRIPT MODEL_OPTION MODEL OPTIONS...: the same for a Python helper (--stats),
# run with ct2_env (on the GPU, what lets CTranslate2 find a cuBLAS: below).
ct2_env=()
peer() {
  local name=$1 script=$2 option=$3 model=$4
  shift 4
  local wall
  wall=$(seconds "${ct2_env[@]}" "$python" "$script" "$option" "$model" --input "$work/source.en" --output "$work/$name.out" "${search[@]}" --stats "$@")
  echo "$(pieces "$work/$name.out") $(stat_of translate_s) $wall" >> "$work/$name"
}
# field NAME COLUMN: the median of that column over the runs; rate NAME COLUMN: tokens/s.
# A run whose time is not positive (ours is a run's wall time less an empty run's: on a
# model too small to time, noise around zero) gives no rate; none left: n/a.
rate() { awk -v c="$2" '$c > 0 { printf "%.1f\n", $1 / $c }' "$work/$1" | median; }
tokens() { awk '{ print $1 }' "$work/$1" | median; }
# (b must be a number: awk compared "n/a" > 0 as text, true, and printed a / 0 as inf.)
ratio() {
  awk -v a="$1" -v b="$2" 'BEGIN {
    if (a ~ /^[0-9]/ && b ~ /^[0-9]/ && b + 0 > 0) printf "%.3f", a / b; else print "n/a"
  }'
}

if [ "$device" = cpu ]; then
  for threads in "${thread_counts[@]}"; do
    for compute_type in "${compute_types[@]}"; do
      rm -f "$work"/{ours,ct2,hf}
      # Hugging Face's generate has no int8 of the same kind: it is the float32 lines' peer.
      with_hf=$([ "$hf" = yes ] && [ "$compute_type" = float32 ] && echo yes || echo no)
      for run in $(seq "$runs"); do
        ours ours --threads "$threads" --compute-type "$compute_type"
        peer ct2 tools/translate_ctranslate2.py --model "$work/ct2_model" --threads "$threads" --compute-type "$compute_type"
        [ "$with_hf" = yes ] && peer hf bench/hf_marian_translate.py --checkpoint "$checkpoint" --threads "$threads"
        if [ "$run" = 1 ]; then
          same_ct2=$(same_lines "$work/ours.out" "$work/ct2.out")
          same_hf=$([ "$with_hf" = yes ] && same_lines "$work/ours.out" "$work/hf.out" || echo n/a)
          cp "$work/ours.out" "$work/ours_$compute_type.out"
          same_float=n/a
          [ "$compute_type" != float32 ] && [ -f "$work/ours_float32.out" ] &&
            same_float=$(same_lines "$work/ours.out" "$work/ours_float32.out")/$lines
        fi
        echo "threads $threads $compute_type run $run (tokens, decode s, wall s): ours $(tail -1 "$work/ours") | ct2 $(tail -1 "$work/ct2")$([ "$with_hf" = yes ] && echo " | hf $(tail -1 "$work/hf")")"
      done
      ours_tok_s=$(rate ours 2)
      ct2_tok_s=$(rate ct2 2)
      hf_tok_s=n/a hf_wall=n/a hf_tokens=n/a
      [ "$with_hf" = yes ] && { hf_tok_s=$(rate hf 2); hf_wall=$(rate hf 3); hf_tokens=$(tokens hf); }
      # The issue's field for the int8 row: ours int8 against CTranslate2's int8.
      named_ratio=""
      [ "$compute_type" = int8 ] && named_ratio=" cpu_int8_vs_ct2_int8=$(ratio "$ours_tok_s" "$ct2_tok_s")"
      echo "decode_vs_ctranslate2: device=cpu threads=$threads compute_type=$compute_type lines=$lines beam=$beam max_len=$max_len" \
        "ours_tok_s=$ours_tok_s ct2_tok_s=$ct2_tok_s ratio=$(ratio "$ours_tok_s" "$ct2_tok_s")$named_ratio" \
        "hf_tok_s=$hf_tok_s hf_ratio=$([ "$with_hf" = yes ] && ratio "$ours_tok_s" "$hf_tok_s" || echo n/a)" \
        "ours_wall_tok_s=$(rate ours 3) ct2_wall_tok_s=$(rate ct2 3) hf_wall_tok_s=$hf_wall" \
        "tokens_ours=$(tokens ours) tokens_ct2=$(tokens ct2) tokens_hf=$hf_tokens" \
        "same_as_ct2=$same_ct2/$lines same_as_hf=$same_hf/$lines same_as_ours_float32=$same_float" \
        "runs=$runs ours_gemm=$ours_gemm ours_openblas=$ours_openblas loadavg=$(cut -d' ' -f1 /proc/loadavg)"
    done
  done
  exit 0
fi

# ---- DEVICE=cuda ----
anchor="CTranslate2's published table: 10,991 target tokens/s, fp16, NVIDIA A10G, batch 32, beam 4, a WMT14 EN-DE base model with a 32k vocabulary"
# CTranslate2's PyPI wheels (4.x, built with CUDA 12, the runtime linked in statically)
# open cuBLAS by the name libcublas.so.12 and take nine functions from it with dlsym, by
# name (its src/cuda/cublas_stub.cc; `strings` on 4.8.5's library lists the same nine).
# A host with CUDA 13 alone (the lent H100s) has libcublas.so.13, which exports all nine
# with the same signatures and enums. So when libcublas.so.12 cannot be loaded,
# CTranslate2 runs with a folder first on its LD_LIBRARY_PATH that holds libcublas.so.12
# linked to the host's newer cuBLAS (and that cuBLAS's libcublasLt beside it): its GEMMs
# are then the host's cuBLAS's, as ours are; the line says ct2_cublas=13-as-12.
readonly CT2_CUBLAS_FUNCTIONS="cublasCreate_v2 cublasDestroy_v2 cublasSetStream_v2 cublasGetMathMode cublasGetProperty cublasSgemm_v2 cublasSgemmStridedBatched cublasGemmEx cublasGemmStridedBatchedEx"
newer_cublas() {  # the path of a libcublas.so.N, N >= 13: the loader's, CUDA's, or pip's
  local found
  found=$(ldconfig -p 2>/dev/null | awk '$1 ~ /^libcublas\.so\.[0-9]+$/ { split($1, v, "."); if (v[3] >= 13) print $NF }' | sort -V | tail -1)
  [ -z "$found" ] && found=$(ls "${CUDA_HOME:-/usr/local/cuda}"/lib64/libcublas.so.1[3-9] 2>/dev/null | sort -V | tail -1)
  [ -z "$found" ] && found=$("$python" -c 'import glob, nvidia.cublas as m; print(sorted(glob.glob(list(m.__path__)[0] + "/lib/libcublas.so.1[3-9]"))[-1])' 2>/dev/null)
  [ -n "$found" ] && [ -f "$found" ] && echo "$found"
}
ct2_cublas=n/a
if [ "$ct2_importable" = yes ]; then
  if "$python" -c 'import ctypes; ctypes.CDLL("libcublas.so.12")' 2> /dev/null; then
    ct2_cublas=12
  elif cublas=$(newer_cublas); then
    mkdir -p "$work/cublas12"
    ln -s "$cublas" "$work/cublas12/libcublas.so.12"
    for lt in "$(dirname "$cublas")"/libcublasLt.so.[0-9]*; do
      [ -e "$lt" ] && ln -sf "$lt" "$work/cublas12/"
    done
    if missing=$(LD_LIBRARY_PATH="$work/cublas12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$python" - $CT2_CUBLAS_FUNCTIONS 2>&1 <<'EOF'
import ctypes, sys
library = ctypes.CDLL("libcublas.so.12")
absent = [name for name in sys.argv[1:] if not hasattr(library, name)]
if absent:
    sys.exit(" ".join(absent))
EOF
    ); then
      ct2_env=(env "LD_LIBRARY_PATH=$work/cublas12${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}")
      ct2_cublas="${cublas##*.so.}-as-12"
      echo "CTranslate2's wheel opens libcublas.so.12; this host has $cublas: linked as libcublas.so.12 for CTranslate2 (the nine functions it takes are all there)"
    else
      echo "CTranslate2's wheel opens libcublas.so.12; $cublas cannot stand in: $(echo "$missing" | tail -1)"
    fi
  fi
fi
# CT2_DEVICE=cpu: a rehearsal of this part on a machine without a GPU, CTranslate2 run on
# the CPU with the GPU's options but float32 (it refuses float16 and bfloat16 there): the
# commands and the line, not a number.
ct2_device=${CT2_DEVICE:-cuda}
ct2_type() { if [ "$ct2_device" = cpu ]; then echo float32; else echo "$1"; fi; }
if [ "$ct2_importable" = no ]; then
  ct2_cuda=no
  echo "CTranslate2 cannot run here: $python cannot import it"
elif [ "$ct2_device" = cpu ]; then
  ct2_cuda=yes
  echo "CTranslate2 rehearsed on the CPU (CT2_DEVICE=cpu): its numbers are not the GPU's"
elif ! why=$("${ct2_env[@]}" "$python" - "$work/ct2_model" 2>&1 <<'EOF'
import logging
import sys
import ctranslate2
count = ctranslate2.get_cuda_device_count()
if count < 1:
    sys.exit("ctranslate2 sees no CUDA device")
ctranslate2.set_log_level(logging.INFO)  # its "Loaded cuBLAS library version" line
translator = ctranslate2.Translator(sys.argv[1], device="cuda", compute_type="float16")
translator.translate_batch([["▁a"]], max_decoding_length=2)
print("ctranslate2 runs on", count, "GPU(s):", ctranslate2.get_supported_compute_types("cuda"))
EOF
); then
  ct2_cuda=no
  echo "CTranslate2 cannot run on this GPU: $(echo "$why" | tail -1)"
  echo "(its PyPI wheels open CUDA 12's libcublas.so.12; $(ls /usr/local/cuda/lib64/libcublas.so.* 2>/dev/null | tr '\n' ' ')here)"
else
  ct2_cuda=yes
  echo "$why"
fi
# Ours in CTranslate2's batching: 32 sentences a batch, longest first (--batch-sentences;
# a token budget no batch of 32 reaches).
b32=(--batch-sentences 32 --batch-tokens 1000000)
echo "ours in batches of 32 sentences: ${b32[*]}"
rm -f "$work"/{ours,ours_b32,ours_b32_launched,ours_int8_b32,ours_candidate,ours_candidate_b32,ct2_fp16,ct2_bf16,ct2_int8_fp16,ct2_fp16_t4096}
candidate=${CANDIDATE:-}
gpu_workers=${GPU_WORKERS:-2}
[[ $gpu_workers =~ ^[1-9][0-9]*$ ]] || { echo "GPU_WORKERS must be a count >= 1, not '$gpu_workers'" >&2; exit 2; }
w=w$gpu_workers  # the fields' suffix
workers_option=(--gpu-workers "$gpu_workers")
# The rehearsal (CT2_DEVICE=cpu, below) runs ours on the CPU, whose workers are --threads.
[ "${CT2_DEVICE:-cuda}" = cpu ] && workers_option=(--threads "$gpu_workers")
rm -f "$work"/{ours_b32_$w,ours_int8_b32_$w,ours_candidate_b32_$w,ours_int8_candidate_b32_$w}
rm -f "$work"/{ct2_fp16_$w,ct2_int8_fp16_$w}
# Ours in int8 (issue 53): every weight matrix through cuBLASLt's int8 GEMMs, the other
# ops in bf16 (--compute-type int8; a candidate named int8_products until its twins
# passed on an H200 on 2026-11-29), with the verified kernels whatever the checkpoint
# names, in batches of 32 against CTranslate2's int8_float16. INT8=0 leaves it out; so
# does a first try that fails, saying why.
int8=(--compute-type int8 --cuda-kernels verified)
# With CANDIDATE, ours in int8 once more with those kernels too.
int8_candidate=(--compute-type int8 --cuda-kernels "$candidate")
with_int8=${INT8:-1}
if [ "$with_int8" = 1 ]; then
  if ! why_int8=$("$build/transformer_decode" --checkpoint "$checkpoint" --input "$work/empty.en" \
      --output /dev/null "${search[@]}" "${int8[@]}" 2>&1); then
    echo "ours in int8 cannot run here: $(echo "$why_int8" | tail -1)"
    with_int8=0
  fi
fi
# ct2_run NAME COMPUTE_TYPE BATCHING...: one timed CTranslate2 decode on $ct2_device.
ct2_run() {
  local name=$1 compute_type=$2
  shift 2
  peer "$name" tools/translate_ctranslate2.py --model "$work/ct2_model" --device "$ct2_device" \
    --compute-type "$(ct2_type "$compute_type")" "$@"
}
# Per run: ours, then CTranslate2, then the candidate kernels, each "run" line printed as
# soon as its numbers exist (a call cut short by its time-out keeps what was measured).
for run in $(seq "$runs"); do
  ours ours --batch-tokens 4096
  ours ours_b32 "${b32[@]}"
  # The same with each step's kernels launched one by one (--cuda-graphs off; captured
  # steps are the default since 2026-12-04): what the graphs give, in the same call.
  try_ours ours_b32_launched "${b32[@]}" --cuda-graphs off
  if [ "$with_int8" = 1 ]; then
    ours ours_int8_b32 "${b32[@]}" "${int8[@]}"
    if [ "$run" = 1 ]; then same_int8=$(same_lines "$work/ours_b32.out" "$work/ours_int8_b32.out"); fi
  fi
  if [ "$ct2_cuda" = yes ]; then
    ct2_run ct2_fp16 float16 --batch-sentences 32
    ct2_run ct2_bf16 bfloat16 --batch-sentences 32
    # CTranslate2's quantized GPU path (issue 53's target for ours in int8 or fp8; until
    # ours has one, ours in bf16 against it).
    ct2_run ct2_int8_fp16 int8_float16 --batch-sentences 32
    # And in ours' own batching (CTranslate2's batch_type "tokens"), beside ours at 4,096.
    ct2_run ct2_fp16_t4096 float16 --batch-tokens 4096
    # The same weights and search: most lines identical (fp16 against bf16 and another
    # batching move a few near-ties), far fewer if CTranslate2's GEMMs went wrong.
    [ "$run" = 1 ] && same_ct2=$(same_lines "$work/ours_b32.out" "$work/ct2_fp16.out")
  fi
  echo "run $run (tokens, decode s, wall s): ours $(tail -1 "$work/ours") | ours b32 $(tail -1 "$work/ours_b32") | ours b32 launched $(tail -1 "$work/ours_b32_launched")$([ "$with_int8" = 1 ] && echo " | ours int8 b32 $(tail -1 "$work/ours_int8_b32")")$([ "$ct2_cuda" = yes ] && echo " | ct2 fp16 $(tail -1 "$work/ct2_fp16") | ct2 bf16 $(tail -1 "$work/ct2_bf16") | ct2 int8_float16 $(tail -1 "$work/ct2_int8_fp16") | ct2 fp16 t4096 $(tail -1 "$work/ct2_fp16_t4096")")"
  if [ "$gpu_workers" -gt 1 ]; then
    try_ours "ours_b32_$w" "${b32[@]}" "${workers_option[@]}"
    [ "$run" = 1 ] && same_workers=$(same_lines "$work/ours_b32.out" "$work/ours_b32_$w.out")
    if [ "$with_int8" = 1 ]; then try_ours "ours_int8_b32_$w" "${b32[@]}" "${int8[@]}" "${workers_option[@]}"; fi
    if [ "$ct2_cuda" = yes ]; then
      ct2_run "ct2_fp16_$w" float16 --batch-sentences 32 --inter-threads "$gpu_workers"
      ct2_run "ct2_int8_fp16_$w" int8_float16 --batch-sentences 32 --inter-threads "$gpu_workers"
    fi
    echo "run $run, $gpu_workers workers (tokens, decode s, wall s): ours b32 $(tail -1 "$work/ours_b32_$w")$([ "$with_int8" = 1 ] && echo " | ours int8 b32 $(tail -1 "$work/ours_int8_b32_$w")")$([ "$ct2_cuda" = yes ] && echo " | ct2 fp16 $(tail -1 "$work/ct2_fp16_$w") | ct2 int8_float16 $(tail -1 "$work/ct2_int8_fp16_$w")")"
  fi
  if [ -n "$candidate" ]; then
    [ "$run" = 1 ] && cp "$work/ours.out" "$work/ours_first.out"
    try_ours ours_candidate --batch-tokens 4096 --cuda-kernels "$candidate"
    try_ours ours_candidate_b32 "${b32[@]}" --cuda-kernels "$candidate"
    [ "$run" = 1 ] && cp "$work/ours_candidate.out" "$work/ours_candidate_first.out"
    if [ "$with_int8" = 1 ]; then try_ours ours_int8_candidate_b32 "${b32[@]}" "${int8_candidate[@]}"; fi
    # Both: the workers to fill the round trips, with the candidates (worker_graphs among
    # them: every worker's steps captured).
    if [ "$gpu_workers" -gt 1 ]; then
      try_ours "ours_candidate_b32_$w" "${b32[@]}" --cuda-kernels "$candidate" \
        "${workers_option[@]}"
      if [ "$with_int8" = 1 ]; then
        try_ours "ours_int8_candidate_b32_$w" "${b32[@]}" "${int8_candidate[@]}" \
          "${workers_option[@]}"
      fi
    fi
    echo "run $run, --cuda-kernels $candidate (tokens, decode s, wall s): ours $(tail -1 "$work/ours_candidate") | ours b32 $(tail -1 "$work/ours_candidate_b32")$([ "$with_int8" = 1 ] && echo " | ours int8 b32 $(tail -1 "$work/ours_int8_candidate_b32")")"
  fi
done
ours_tok_s=$(rate ours 2)
ours_b32_tok_s=$(rate ours_b32 2)
line="decode_vs_ctranslate2: device=cuda lines=$lines beam=$beam max_len=$max_len ours_bf16_tok_s=$ours_tok_s ours_bf16_b32_tok_s=$ours_b32_tok_s ours_wall_tok_s=$(rate ours 3) tokens_ours=$(tokens ours)"
launched_b32_tok_s=$(rate ours_b32_launched 2)
line="$line ours_bf16_b32_launched_tok_s=$launched_b32_tok_s graphs_gain_b32=$(ratio "$ours_b32_tok_s" "$launched_b32_tok_s")"
if [ "$with_int8" = 1 ]; then
  int8_b32_tok_s=$(rate ours_int8_b32 2)
  line="$line ours_int8_b32_tok_s=$int8_b32_tok_s int8_same_as_bf16_b32=$same_int8/$lines"
fi
if [ "$gpu_workers" -gt 1 ]; then
  line="$line gpu_workers=$gpu_workers ours_bf16_b32_${w}_tok_s=$(rate "ours_b32_$w" 2) workers_same_lines=$same_workers/$lines"
  if [ "$with_int8" = 1 ]; then line="$line ours_int8_b32_${w}_tok_s=$(rate "ours_int8_b32_$w" 2)"; fi
fi
if [ -n "$candidate" ]; then
  same=$(same_lines "$work/ours_first.out" "$work/ours_candidate_first.out")
  line="$line candidate=$candidate ours_candidate_bf16_tok_s=$(rate ours_candidate 2) ours_candidate_b32_tok_s=$(rate ours_candidate_b32 2) candidate_same_lines=$same/$lines"
  if [ "$gpu_workers" -gt 1 ]; then
    line="$line ours_candidate_b32_${w}_tok_s=$(rate "ours_candidate_b32_$w" 2)"
  fi
  if [ "$with_int8" = 1 ]; then
    int8_candidate_b32_tok_s=$(rate ours_int8_candidate_b32 2)
    line="$line ours_int8_candidate_b32_tok_s=$int8_candidate_b32_tok_s"
    if [ "$gpu_workers" -gt 1 ]; then
      line="$line ours_int8_candidate_b32_${w}_tok_s=$(rate "ours_int8_candidate_b32_$w" 2)"
    fi
  fi
fi
if [ "$ct2_cuda" = yes ]; then
  fp16=$(rate ct2_fp16 2)
  bf16=$(rate ct2_bf16 2)
  fp16_t4096=$(rate ct2_fp16_t4096 2)
  int8_fp16=$(rate ct2_int8_fp16 2)
  if [ "$with_int8" = 1 ]; then line="$line gpu_quant_vs_ct2_int8=$(ratio "$int8_b32_tok_s" "$int8_fp16")"; fi
  if [ "$with_int8" = 1 ] && [ -n "$candidate" ]; then
    line="$line gpu_quant_candidate_vs_ct2_int8=$(ratio "$int8_candidate_b32_tok_s" "$int8_fp16")"
    if [ "$gpu_workers" -gt 1 ]; then
      line="$line gpu_quant_candidate_vs_ct2_int8_$w=$(ratio "$(rate "ours_int8_candidate_b32_$w" 2)" "$(rate "ct2_int8_fp16_$w" 2)")"
    fi
  fi
  if [ "$gpu_workers" -gt 1 ]; then
    fp16_w=$(rate "ct2_fp16_$w" 2)
    int8_fp16_w=$(rate "ct2_int8_fp16_$w" 2)
    line="$line ct2_fp16_b32_${w}_tok_s=$fp16_w ct2_int8_float16_b32_${w}_tok_s=$int8_fp16_w ratio_fp16_b32_$w=$(ratio "$(rate "ours_b32_$w" 2)" "$fp16_w")"
    if [ -n "$candidate" ]; then
      candidate_w=$(rate "ours_candidate_b32_$w" 2)
      line="$line ratio_candidate_fp16_b32_$w=$(ratio "$candidate_w" "$fp16_w")"
    fi
    if [ "$with_int8" = 1 ]; then line="$line gpu_quant_vs_ct2_int8_$w=$(ratio "$(rate "ours_int8_b32_$w" 2)" "$int8_fp16_w")"; fi
  fi
  echo "$line ct2_fp16_b32_tok_s=$fp16 ct2_bf16_b32_tok_s=$bf16 ratio_fp16_b32=$(ratio "$ours_b32_tok_s" "$fp16") ratio_bf16_b32=$(ratio "$ours_b32_tok_s" "$bf16") ct2_int8_float16_b32_tok_s=$int8_fp16 ours_bf16_vs_ct2_int8_float16_b32=$(ratio "$ours_b32_tok_s" "$int8_fp16") ct2_fp16_t4096_tok_s=$fp16_t4096 ratio_fp16_t4096=$(ratio "$ours_tok_s" "$fp16_t4096") ct2_wall_fp16_b32_tok_s=$(rate ct2_fp16 3) tokens_ct2=$(tokens ct2_fp16) same_as_ct2_fp16_b32=$same_ct2/$lines ct2_cublas=$ct2_cublas runs=$runs"
else
  echo "$line ct2=unavailable anchor_ct2_fp16_a10g_b32_tok_s=10991 ($anchor) runs=$runs"
fi

# profiled HEADING OPTIONS...: one untimed run of ours with --profile, its table printed
# under HEADING (gpu_session.sh picks the tables out by their "ours..., profiled" lines).
profiled() {
  local label=$1
  shift
  echo "$label"
  "$build/transformer_decode" --checkpoint "$checkpoint" --input "$work/source.en" \
    --output /dev/null "${search[@]}" "$@" --profile > /dev/null 2> "$work/profile.txt" ||
    { echo "failed: $(tail -1 "$work/profile.txt")"; return 0; }
  sed -n '/^profile: /,$p' "$work/profile.txt"
}
profile=${PROFILE:-1}
[[ $profile =~ ^(0|1|int8)$ ]] || { echo "PROFILE must be 0, 1 or int8, not '$profile'" >&2; exit 2; }
if [ "$profile" != 0 ]; then
  if [ "$profile" = 1 ]; then
    profiled "ours, profiled (4,096-token batches, untimed):" --batch-tokens 4096
    # And in batches of 32 sentences, CTranslate2's batching, where ours is about half as
    # fast per token: how much of that is host time between kernels.
    profiled "ours, profiled (batches of 32 sentences, untimed):" "${b32[@]}"
  fi
  # The workers' profiles first: their device idle time is issue 53's open number (one
  # worker's host share, 12.6-13.2% launched and 8.3% captured, was taken in three
  # windows), and on 2026-12-04 the call's time-out cut it after the one worker's. With
  # the candidates (worker_graphs: every worker captures its steps) before without them.
  if [ "$gpu_workers" -gt 1 ] && [ "$with_int8" = 1 ] && [ -n "$candidate" ]; then
    profiled "ours in int8 with --gpu-workers $gpu_workers and --cuda-kernels $candidate,\
 profiled (batches of 32 sentences, untimed):" \
      "${b32[@]}" "${int8_candidate[@]}" "${workers_option[@]}"
  fi
  if [ "$gpu_workers" -gt 1 ] && [ "$with_int8" = 1 ]; then
    profiled "ours in int8 with --gpu-workers $gpu_workers, profiled (batches of 32 sentences, untimed):" \
      "${b32[@]}" "${int8[@]}" "${workers_option[@]}"
  fi
  if [ "$with_int8" = 1 ]; then
    profiled "ours in int8, profiled (batches of 32 sentences, untimed):" "${b32[@]}" "${int8[@]}"
  fi
  if [ -n "$candidate" ]; then
    if [ "$profile" = 1 ]; then
      profiled "ours with --cuda-kernels $candidate, profiled (4,096-token batches, untimed):" \
        --batch-tokens 4096 --cuda-kernels "$candidate"
      profiled "ours with --cuda-kernels $candidate, profiled (batches of 32 sentences, untimed):" \
        "${b32[@]}" --cuda-kernels "$candidate"
    fi
    if [ "$with_int8" = 1 ]; then
      profiled "ours in int8 with --cuda-kernels $candidate, profiled (batches of 32 sentences, untimed):" \
        "${b32[@]}" "${int8_candidate[@]}"
    fi
  fi
fi
