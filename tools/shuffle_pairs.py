#!/usr/bin/env python3
"""Shuffles the lines of a parallel corpus, both sides alike, with a fixed seed.

    python3 tools/shuffle_pairs.py PREFIX SRC TGT OUT_PREFIX [--seed 1]

reads PREFIX.SRC and PREFIX.TGT (line i of one is the translation of line i of the other)
and writes OUT_PREFIX.SRC and OUT_PREFIX.TGT with the same pairs in an order drawn from
the seed. transformer_preprocess cuts its --shards from consecutive lines, and the reader
shuffles the shards' order and each shard's batches, not pairs across shards: a corpus
concatenated from sub-corpora (WMT14's Europarl, Common Crawl, News Commentary) in many
shards would train on stretches of one sub-corpus at a time (docs/data.md). Shuffled
first, every shard holds a mix of them all.

Lines are bytes split at '\\n' (as transformer_preprocess reads them: a '\\r' before it
stays with its line), so no encoding or tab in the text matters; a last line without
its newline gets one. Both files are held in memory, a few times their size with
Python's per-line objects (WMT14 EN-DE's two files are about 1.4 GB). Each output is
written under a temporary name and renamed; the source side's first.
"""
import argparse
import os
import random
import sys


def lines_of(path):
    with open(path, "rb") as f:
        data = f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()  # the newline that ends the last line
    return lines


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("prefix")
    parser.add_argument("source_lang")
    parser.add_argument("target_lang")
    parser.add_argument("out_prefix")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    inputs = [f"{args.prefix}.{lang}" for lang in (args.source_lang, args.target_lang)]
    outputs = [f"{args.out_prefix}.{lang}" for lang in (args.source_lang, args.target_lang)]
    for path in inputs:
        if not os.path.isfile(path):
            sys.exit(f"shuffle_pairs.py: {path}: no such file")
    for output in outputs:
        if any(os.path.exists(p) and os.path.exists(output) and os.path.samefile(p, output)
               for p in inputs):
            sys.exit(f"shuffle_pairs.py: {output} is an input: give another OUT_PREFIX")
    source, target = (lines_of(path) for path in inputs)
    if len(source) != len(target):
        sys.exit(f"shuffle_pairs.py: {inputs[0]} has {len(source)} lines but {inputs[1]} has "
                 f"{len(target)} (the files must be line-aligned)")
    order = list(range(len(source)))
    random.Random(args.seed).shuffle(order)
    directory = os.path.dirname(args.out_prefix)
    if directory:
        os.makedirs(directory, exist_ok=True)
    for lines, output in ((source, outputs[0]), (target, outputs[1])):
        temporary = os.path.join(os.path.dirname(output) or ".",
                                 "." + os.path.basename(output) + ".tmp")
        with open(temporary, "wb") as f:
            for i in order:
                f.write(lines[i])
                f.write(b"\n")
        os.replace(temporary, output)
    print(f"shuffle_pairs.py: {len(order)} pairs of {inputs[0]}, {inputs[1]} written to "
          f"{outputs[0]}, {outputs[1]} in an order of seed {args.seed}")


if __name__ == "__main__":
    main()
