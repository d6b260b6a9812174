#!/usr/bin/env python3
"""Translates with CTranslate2 over a model tools/convert_to_ctranslate2.py wrote, with
transformer_decode's search settings, so that both decode the same weights the same way.

  tools/translate_ctranslate2.py --model DIR [--input FILE] [--output FILE] [--beam N]
      [--greedy] [--lenpen A] [--max-len-a A] [--max-len-b B] [--nbest N]
      [--batch-tokens N | --batch-sentences N] [--threads N] [--inter-threads N]
      [--device cpu|cuda]
      [--compute-type TYPE] [--stats]

One output line per input line, in input order (an empty line gives an empty line), the
SentencePiece model of DIR turning text into pieces and back (a model of separate
vocabularies: DIR/spm.source.model encodes the input, DIR/spm.model decodes the output,
as transformer_decode uses the checkpoint's two). What each option sets:
  --beam, --greedy        beam_size (greedy: 1)
  --lenpen A              CTranslate2's length_penalty: a finished hypothesis of n tokens
                          (eos not counted) is ranked by log P / n^A. Not transformer_decode's
                          GNMT penalty, log P / ((5 + n + 1) / 6)^A (eos counted): only A = 0,
                          the raw log-probability, ranks alike on both (the default here)
  --max-len-a, --max-len-b  at most int(a * |x| + b) target tokens, eos counted, capped at the
                          model's max_positions - 1, as transformer_decode (a hypothesis that
                          reaches it ends there); sentences with equal limits go to
                          CTranslate2 together (max_decoding_length is one per call)
  always                  min_decoding_length 0 (eos may come first, as in ours), inputs
                          longer than max_positions - 1 pieces truncated, with a warning, as
                          ours. Ours never extends a hypothesis by <pad> or <s>, leaving
                          them out after the softmax; CTranslate2's suppress_sequences
                          would leave them out before it, which raises every other token's
                          log-probability by -log(1 - p(<pad>) - p(<s>)), so nothing is
                          suppressed here: the log-probabilities are the same, and the
                          programs differ only where <pad> or <s> would rank among the
                          best (never, in a trained model: neither is ever a target)
  --batch-tokens N        CTranslate2's batch_type "tokens", max_batch_size N (default 4096:
                          transformer_decode's --batch-tokens); --batch-sentences N: "examples"
  --threads N             intra_threads N (default: 1)
  --inter-threads N       inter_threads N (default: 1): N workers, each translating whole
                          batches of the call (on a GPU each on its own CUDA stream, the
                          weights shared), as transformer_decode --gpu-workers N
  --compute-type          float32 (default), float16, bfloat16, int8, ... (CTranslate2's)
  --stats                 a last line on stderr: ct2_stats: load_s=... translate_s=...
                          sentences=... tokens=... (tokens: the output pieces, eos not
                          counted, as bench/cpu_decode_speed.sh counts ours; load_s
                          includes one warm-up translation of a one-piece sentence, so
                          that translate_s holds no one-time set-up such as the first
                          cuBLAS handle, as ours, timed less an empty run, holds none)
--nbest N prints `LINE ||| translation ||| score` lines in transformer_decode's layout;
the score is CTranslate2's own (with the default --lenpen 0 the sum of the
log-probabilities), not transformer_decode's length-normalised one, so only the texts and
their order compare.
Needs ctranslate2 and sentencepiece (`bash tools/install_deps.sh --ctranslate2`). Exit
codes: 0 done, 2 a bad command line, 1 a model or file that cannot be read.
"""
import argparse
import json
import math
import os
import sys
import time

PROGRAM = "translate_ctranslate2.py"


class Parser(argparse.ArgumentParser):
    def error(self, message):
        sys.stderr.write(f"{self.prog}: {message} (see --help)\n")
        sys.exit(2)


def fail(message, program=PROGRAM):
    sys.stderr.write(f"{program}: error: {message}\n")
    sys.exit(1)


def parse_arguments(program=PROGRAM, description=__doc__, model_option="--model",
                    model_help="a convert_to_ctranslate2.py directory"):
    """The command line, also bench/hf_marian_translate.py's (with --checkpoint)."""
    parser = Parser(prog=program, description=description.split("\n\n")[0],
                    formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(model_option, required=True, help=model_help)
    parser.add_argument("--input", default="-", help="source text, one sentence a line")
    parser.add_argument("--output", default="-")
    # One or the other, as transformer_decode takes them ("--beam 3 --greedy" decoded with
    # beam 1 without a word; a helper's trial).
    search = parser.add_mutually_exclusive_group()
    search.add_argument("--beam", type=int, default=4)
    search.add_argument("--greedy", action="store_true", help="beam 1")
    parser.add_argument("--lenpen", type=float, default=0.0)
    parser.add_argument("--max-len-a", type=float, default=1.0)
    parser.add_argument("--max-len-b", type=int, default=50)
    parser.add_argument("--nbest", type=int, default=1)
    batching = parser.add_mutually_exclusive_group()
    batching.add_argument("--batch-tokens", type=int, default=4096)
    batching.add_argument("--batch-sentences", type=int)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--inter-threads", type=int, default=1)
    parser.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    parser.add_argument("--compute-type", default="float32")
    parser.add_argument("--stats", action="store_true")
    args = parser.parse_args()
    if args.greedy:
        args.beam = 1
    if min(args.beam, args.nbest, args.threads, args.inter_threads, args.batch_tokens,
           args.batch_sentences or 1) < 1 or args.nbest > args.beam:
        parser.error("--beam, --nbest, --threads, --inter-threads and the batch size must be "
                     ">= 1, --nbest <= --beam")
    if not (math.isfinite(args.max_len_a) and math.isfinite(args.lenpen)):
        parser.error("--max-len-a and --lenpen must be finite")
    if args.max_len_a < 0 or args.max_len_b < 0 or args.lenpen < 0:
        parser.error("--max-len-a, --max-len-b and --lenpen must be >= 0")
    return args


def one_line_text(spm, hypothesis):
    """A hypothesis (pieces or ids) as text, as transformer_decode's detokenize writes it:
    a line feed, carriage return or NUL that byte pieces spell becomes a space, so that
    each translation stays one line."""
    return spm.decode(hypothesis).translate({0x0A: " ", 0x0D: " ", 0x00: " "})


def translate(args, program, tag, max_positions, spm, load, translate_group, source_spm=None):
    """The driver both translate_ctranslate2.py and bench/hf_marian_translate.py run:
    reads args.input, `load()`s the model (timed apart), hands each group of sentences
    with one length limit to `translate_group(model, pieces, limit)` (which returns a
    (hypotheses, scores) pair per sentence, hypotheses as piece or id lists, best first),
    writes the translations as transformer_decode does, and with --stats a last stderr
    line `TAG: load_s=... translate_s=... sentences=... tokens=...`. `spm` encodes the
    input too unless `source_spm` is given (separate vocabularies)."""
    source_spm = source_spm or spm
    try:
        source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")
        lines = [line.rstrip("\n") for line in source]
    except OSError as error:
        fail(f"cannot read input file '{args.input}': {error.strerror}", program)
    # The --output's missing directories are made before the translation, as
    # transformer_decode makes them: opened after it, a missing one lost the whole
    # translation to a traceback.
    if args.output != "-":
        directory = os.path.dirname(os.path.abspath(args.output))
        try:
            os.makedirs(directory, exist_ok=True)
        except FileExistsError:  # a component of the path is a file
            fail(f"--output {args.output}: {directory} is not a directory; give a path "
                 "in a writable directory", program)
        except OSError as error:
            fail(f"--output {args.output}: cannot create its directory {directory}: "
                 f"{error.strerror}; give a path in a writable directory", program)
        if not os.access(directory, os.W_OK | os.X_OK):
            fail(f"--output {args.output}: this user cannot write in {directory}; give a "
                 "path in a writable directory", program)
        # A directory as --output (or a path ending in '/') failed only when it was opened,
        # after the translation, with a traceback.
        if os.path.isdir(args.output) or args.output.endswith(os.sep):
            fail(f"--output {args.output} is a directory; give the path of a file", program)

    started = time.perf_counter()
    model = load()
    loaded = time.perf_counter()

    # Pieces per line, truncated as transformer_decode truncates (the source's eos needs
    # the last position); the limit of each, as its beam search computes it.
    longest = max_positions - 1
    pieces, groups = [], {}
    for number, line in enumerate(lines, 1):
        tokens = source_spm.encode(line, out_type=str) if line.strip() else []
        if len(tokens) > longest:
            sys.stderr.write(f"{program}: warning: line {number} has {len(tokens)} pieces, "
                             f"truncated to {longest} (model.max_positions = {max_positions})\n")
            tokens = tokens[:longest]
        pieces.append(tokens)
        if tokens:
            # int(a * |x| + b) rounded down, as transformer_decode (and fairseq) limit it.
            limit = max(1, min(int(args.max_len_a * len(tokens) + args.max_len_b), longest))
            groups.setdefault(limit, []).append(number - 1)
    results = [([], [])] * len(lines)
    for limit, members in sorted(groups.items()):
        found = translate_group(model, [pieces[i] for i in members], limit)
        for i, result in zip(members, found):
            results[i] = result
    translated = time.perf_counter()

    tokens = 0
    out = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")
    for i, (hypotheses, scores) in enumerate(results):
        if hypotheses:
            tokens += len(hypotheses[0])
        if args.nbest == 1:
            out.write((one_line_text(spm, hypotheses[0]) if hypotheses else "") + "\n")
            continue
        for hypothesis, score in zip(hypotheses, scores):
            out.write(f"{i} ||| {one_line_text(spm, hypothesis)} ||| {score:.4f}\n")
        if not hypotheses:
            out.write(f"{i} |||  ||| 0.0000\n")
    out.flush()
    if args.stats:
        sys.stderr.write(f"{tag}: load_s={loaded - started:.3f} "
                         f"translate_s={translated - loaded:.3f} "
                         f"sentences={sum(1 for p in pieces if p)} tokens={tokens}\n")


def main():
    args = parse_arguments()
    try:
        import ctranslate2
        import sentencepiece
    except ImportError as missing:
        fail(f"needs ctranslate2 and sentencepiece ({missing}); "
             "bash tools/install_deps.sh --ctranslate2 installs them")
    try:
        with open(os.path.join(args.model, "thpc_model.json"), encoding="utf-8") as file:
            max_positions = int(json.load(file)["max_positions"])
    except (OSError, ValueError, KeyError) as error:
        fail(f"{args.model}: not a model convert_to_ctranslate2.py wrote ({error})")
    spm = sentencepiece.SentencePieceProcessor()
    if not spm.Load(os.path.join(args.model, "spm.model")):
        fail(f"{args.model}/spm.model cannot be loaded")
    # Written by the converter for a model of separate vocabularies only.
    source_spm = None
    source_model = os.path.join(args.model, "spm.source.model")
    if os.path.exists(source_model):
        source_spm = sentencepiece.SentencePieceProcessor()
        if not source_spm.Load(source_model):
            fail(f"{source_model} cannot be loaded")

    def load():
        try:
            translator = ctranslate2.Translator(args.model, device=args.device,
                                                compute_type=args.compute_type,
                                                intra_threads=args.threads,
                                                inter_threads=args.inter_threads)
            # The first translation sets up what a process does once (on a GPU the cuBLAS
            # handle and the memory pool): done here, it counts as loading.
            translator.translate_batch([(source_spm or spm).encode("a", out_type=str)[:1] or ["a"]],
                                       beam_size=args.beam, max_decoding_length=2)
            return translator
        except (RuntimeError, ValueError) as error:
            fail(f"{args.model}: {error}")

    def translate_group(translator, sources, limit):
        found = translator.translate_batch(
            sources, max_batch_size=args.batch_sentences or args.batch_tokens,
            batch_type="examples" if args.batch_sentences else "tokens",
            beam_size=args.beam, num_hypotheses=args.nbest, length_penalty=args.lenpen,
            max_decoding_length=limit, min_decoding_length=0,
            max_input_length=max_positions, return_scores=True)
        return [(result.hypotheses, result.scores) for result in found]

    translate(args, PROGRAM, "ct2_stats", max_positions, spm, load, translate_group, source_spm)
    return 0


if __name__ == "__main__":
    sys.exit(main())
