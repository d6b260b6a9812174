#!/usr/bin/env bash
# The main job on any machine, with nothing downloaded: generate the numbers corpus
# (English words -> German words, tools/make_numbers_corpus.py), preprocess it into
# HDF5 shards with a SentencePiece vocabulary, and train input/numbers.ini on it,
# printing training and validation loss. A few minutes on 2 CPU cores.
#
#   bash tools/run_default_job.sh [--section.key=value ...]   # overrides go to the trainer
#
# BUILD (default: build) is the CMake build directory; MPIRUN="mpirun -np 2" runs the
# training on several ranks.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${BUILD:-build}
corpus=$build/numbers

python3 tools/make_numbers_corpus.py --out "$corpus/text" --seed 1
"$build/transformer_preprocess" --source-lang en --target-lang de \
  --trainpref "$corpus/text/train" --validpref "$corpus/text/valid" \
  --testpref "$corpus/text/test" --destdir "$corpus/data" \
  --vocab-size 200 --model-type bpe --shards 2 --seed 1 2> "$corpus/preprocess.log" ||
  { cat "$corpus/preprocess.log" >&2; exit 1; }
${MPIRUN:-} "$build/transformer_hpc" input/numbers.ini --data.dir="$corpus/data" "$@"
