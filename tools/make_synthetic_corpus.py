#!/usr/bin/env python3
"""A parallel corpus of any size built from real sentences, for measuring preprocessing
at WMT scale without downloading WMT: each pair joins one to three real English-German
pairs, drawn at random, source to source and target to target.

    python3 tools/make_synthetic_corpus.py --pairs 1000000 --out DIR [--seed 1]

reads its pool from $THPC_DATA (tools/fetch_data.sh multi30k DIR, then wmt14_test DIR):
Multi30k's train, val and test_2016_flickr and newstest2013/2014, 37,017 pairs; writes
DIR/train.en and DIR/train.de. A pair averages about 25 words a side, so line lengths,
subword counts and the vocabulary are a news corpus's rather than Multi30k's captions'.
The draws come from make_numbers_corpus's fixed 64-bit generator: the same seed gives
the same files on every machine. The text repeats its pool's sentences: it measures
time and memory, it is not for training a model (it holds the test sets).
"""
import argparse
import os

from make_numbers_corpus import Generator

POOL = ["multi30k/train", "multi30k/val", "multi30k/test_2016_flickr",
        "wmt14_test/newstest2013", "wmt14_test/newstest2014"]


def read_pool(data):
    source, target = [], []
    for prefix in POOL:
        with open(os.path.join(data, prefix + ".en"), encoding="utf-8") as en, \
                open(os.path.join(data, prefix + ".de"), encoding="utf-8") as de:
            en_lines, de_lines = en.read().splitlines(), de.read().splitlines()
        if len(en_lines) != len(de_lines):
            raise SystemExit("%s.en and %s.de differ in lines" % (prefix, prefix))
        source += en_lines
        target += de_lines
    return source, target


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--pairs", type=int, required=True, help="pairs to write")
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--data", default=os.environ.get("THPC_DATA", ""),
                        help="the data directory (default $THPC_DATA)")
    args = parser.parse_args()
    if args.pairs < 1:  # (0 wrote two empty files, exit 0)
        parser.error("--pairs must be >= 1, got %d" % args.pairs)
    if not args.data:
        raise SystemExit("make_synthetic_corpus: set THPC_DATA or --data "
                         "(tools/fetch_data.sh multi30k DIR and wmt14_test DIR fill it)")
    source, target = read_pool(args.data)
    os.makedirs(args.out, exist_ok=True)
    generator = Generator(args.seed)
    block = 100000  # pairs joined in memory before each write
    with open(os.path.join(args.out, "train.en"), "w", encoding="utf-8") as en, \
            open(os.path.join(args.out, "train.de"), "w", encoding="utf-8") as de:
        for start in range(0, args.pairs, block):
            en_lines, de_lines = [], []
            for _ in range(min(block, args.pairs - start)):
                picks = [generator.below(len(source)) for _ in range(1 + generator.below(3))]
                en_lines.append(" ".join(source[i] for i in picks) + "\n")
                de_lines.append(" ".join(target[i] for i in picks) + "\n")
            en.writelines(en_lines)
            de.writelines(de_lines)
    print("wrote %d pairs to %s/train.{en,de}" % (args.pairs, args.out))


if __name__ == "__main__":
    main()
