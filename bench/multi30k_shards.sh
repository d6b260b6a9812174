#!/usr/bin/env bash
# Multi30k EN-DE as shards for the benchmarks that train on it (reduce_dtype_curve.sh,
# embedding_sum.sh): $THPC_DATA/multi30k's train and val preprocessed with a joint BPE
# vocabulary of VOCAB into DEST (once: kept when DEST already holds them).
#
#   bash bench/multi30k_shards.sh BUILD VOCAB DEST
set -euo pipefail
build=$1 vocab=$2 dest=$3
corpus=${THPC_DATA:?set THPC_DATA to the data sets (tools/fetch_data.sh)}/multi30k
for split in train.en train.de val.en val.de; do
  [ -f "$corpus/$split" ] || { echo "missing $corpus/$split (tools/fetch_data.sh)" >&2; exit 2; }
done
[ -f "$dest/train.00000.h5" ] && exit 0
mkdir -p "$dest"
"$build/transformer_preprocess" --source-lang en --target-lang de --trainpref "$corpus/train" \
  --validpref "$corpus/val" --destdir "$dest" --vocab-size "$vocab" --model-type bpe \
  --shards 1 --seed 1 > "$dest.preprocess.log" 2>&1 ||
  { cat "$dest.preprocess.log" >&2; exit 1; }
