#!/usr/bin/env python3
"""CTranslate2's Translator.score_batch over a source and a reference file, the peer of
transformer_decode --score-reference (bench/score_vs_ctranslate2.sh):

  ct2_score_batch.py --model DIR --source F --reference F --output F [--threads N]
                     [--inter-threads N] [--compute-type T] [--batch-tokens 4096]

DIR is a tools/convert_to_ctranslate2.py model (its spm.model encodes both sides, or the
reference only where DIR/spm.source.model, of separate vocabularies, encodes the source).
Writes one line per pair, log P(reference | source) summed over the reference's pieces
and </s> (CTranslate2 appends both eos itself, as ours does), with six decimals as
transformer_decode writes them, and prints `score_s=S pieces=P`: score_batch's own time,
model load and encoding excluded. --threads is intra_threads (one replica's threads);
--inter-threads N runs N replicas of one thread each instead, the batches shared among
them.
"""
import argparse
import os
import time

import ctranslate2
import sentencepiece


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--source", required=True)
    parser.add_argument("--reference", required=True)
    parser.add_argument("--output", required=True)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--inter-threads", type=int, default=1)
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--batch-tokens", type=int, default=4096)
    args = parser.parse_args()
    pieces = sentencepiece.SentencePieceProcessor(model_file=args.model + "/spm.model")
    source_model = os.path.join(args.model, "spm.source.model")
    source_pieces = (sentencepiece.SentencePieceProcessor(model_file=source_model)
                     if os.path.exists(source_model) else pieces)
    with open(args.source, encoding="utf-8") as f:
        sources = [source_pieces.encode(line.rstrip("\n"), out_type=str) for line in f]
    with open(args.reference, encoding="utf-8") as f:
        references = [pieces.encode(line.rstrip("\n"), out_type=str) for line in f]
    if len(sources) != len(references):
        raise SystemExit(f"{args.source} has {len(sources)} lines, {args.reference} {len(references)}")
    intra, inter = (1, args.inter_threads) if args.inter_threads > 1 else (args.threads, 1)
    translator = ctranslate2.Translator(args.model, device="cpu", compute_type=args.compute_type,
                                        intra_threads=intra, inter_threads=inter)
    start = time.perf_counter()
    results = translator.score_batch(sources, references, max_batch_size=args.batch_tokens,
                                     batch_type="tokens")
    seconds = time.perf_counter() - start
    with open(args.output, "w", encoding="utf-8") as out:
        for result in results:
            out.write("%.6f\n" % sum(result.log_probs))
    print(f"score_s={seconds:.3f} pieces={sum(len(r.log_probs) for r in results)}")


if __name__ == "__main__":
    main()
