#!/usr/bin/env python3
"""Writes tests/moses_bleu/: what mosesdecoder's Perl scripts answer on generated text,
the expected values of tests/test_moses_bleu.cc.

    python3 tools/gen_moses_vectors.py MOSESDECODER [--data DIR] [--check]

MOSESDECODER is a git clone of github.com/moses-smt/mosesdecoder (git must be able to
read it). Two versions of its scripts are run, taken out of it with `git archive`:

  current  HEAD (tokenizer.perl last changed 2021-03-13, commit 75d4c67)
  2017     59119c0 (2016-12-23): the tokenizer.perl of the paper's time, what
           tensor2tensor's get_ende_bleu.sh ran in 2017 (see metrics/moses_tokenize.h)

Each version's scripts/tokenizer/tokenizer.perl (with scripts/share/nonbreaking_prefixes)
tokenizes; `perl -ple 's{(\\S)-(\\S)}{$1 ##AT##-##AT## $2}g'` splits compounds, as
tensor2tensor's get_ende_bleu.sh does; HEAD's scripts/generic/multi-bleu.perl scores
(its only change since 2017, chomp for chop, matters for files without a final newline,
and every file here has one).

Written (all UTF-8 text, one segment per line; .gitattributes keeps git from touching
their bytes):
  inputs.txt                 the text: hand-written cases (hyphens, numbers, quotes,
                             Unicode punctuation and spaces, control characters, empty
                             and blank lines, abbreviations, the tokenizer's own marker
                             words) and lines drawn at random (seed 20171206) from
                             such pieces
  tok.LANG.VERSION.txt       tokenizer.perl -l LANG of inputs.txt (de, fr x current, 2017)
  atat.de.VERSION.txt        the compound split of tok.de.VERSION.txt
  bleu/CASE.hyp, .refN       BLEU cases (hypotheses perturbed from inputs.txt, several
                             references, BP < 1, a zero-match order, no 4-grams at all,
                             multi-bleu.perl's 9999 cap, ties, and the two inputs it
                             cannot score); each text is written once
  bleu_expected.tsv          CASE, its hypothesis and reference files, LANG, VERSION,
                             compound yes/no, then multi-bleu.perl's line, or "exit N"
                             where it prints no score
  real_data_expected.tsv     with --data DIR (a THPC_DATA folder): sha256 of the tokenized
                             and compound-split newstest2013/2014/2017 German references,
                             and multi-bleu.perl's line for the 16 WMT17 En-De systems of
                             sacrebleu_tests and a shifted newstest2014; the text itself
                             is not copied, the test reads it from THPC_DATA

--check writes into a temporary folder and compares with tests/moses_bleu/ (exit 1 and
the differing files when they differ). Nothing of the Perl scripts is copied.
"""
import argparse
import filecmp
import hashlib
import os
import random
import shutil
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VECTOR_DIR = os.path.join(REPO, "tests", "moses_bleu")
VERSIONS = {"current": "HEAD", "2017": "59119c004"}
LANGUAGES = ["de", "fr"]
COMPOUND = r"s{(\S)-(\S)}{$1 ##AT##-##AT## $2}g"
SEED = 20171206
RANDOM_LINES = 200

# ---- the text ----

HAND_WRITTEN = [
    "", " ", "  ", "\t", "\u3000", "\u0085", "\u00a0 \u2028", "\r", "\x0b", "\x01", "\x1c",
    "\u3000\u3000", "\u00a0", "\ufeff",
    "rich-text format", "a-b-c", "a-b-c-d-e", "a-ü-b", "über-grüß-e", "-a", "a-", "a--b",
    "a - b", "- -", "x-y z-w", "E-Mail-Adresse", "3-4", "‐ – — ‑", "Nord–Süd-Achse",
    "Er kam am 5. Mai.", "iPhone 5.", "Thomson Reuters I/B/E/S.", "z.B.", "Das ist z.B. gut.",
    "Nr. 5", "Nr. 5 und Nr. a", "Dr. Müller kam.", "Prof. Dr. med. Schmidt", "Art. 3 GG.",
    "Es war der 3. Oktober.", "ca. 5 km.", "Er sagte: Nein.", "U.S.A.", "e.g. this.",
    "bzw. das", "usw.", "ff. 12", "XIV.", "XIV. Jahrhundert", "c.-à-d. voilà.",
    "...", "a...b", "a. . .b", "Hallo...Welt", "..a..b...c....", ". .. ...",
    "DOTMULTI", "DOTMULTI..", "x.DOTMULTI.", "DOTDOTMULTI", "DOTMULTIDOTMULTI..", "THISISPROTECTED000",
    "##AT##-##AT##", "&amp; &lt; &#124;", "5,300", "a,b,c,d", ",a", "a,", "5,", "5 ,", ",5",
    "1,5,", "a,,b", ",,,", "3,14 und 2.5", "1.000.000,00 €",
    "l'homme", "Je l'ai dit.'", "C'est 'bien'.", "aujourd'hui", "'", "''", "'a'", "a'",
    "qu'il", "l'a'b", "1'2", "x.'", "x.' ", "M. Dupont et Mme Durand.", "p.ex. ça", "etc. Ok",
    "&<>|\"'[]", "[a]", "<b>", "a|b", "\"quoted\"", "``double''", "„Anführung“", "«guillemets»",
    "‚einfach‘", "‹x›", "…", "·", "•", "½ ² ٣ Ⅻ १२", "\ufeffBOM am Anfang",
    "e\u0301t\u0301e\u0301", "Σ-Ϛ", "ǅ", "ß-ẞ", "İstanbul", "ﬁnal", "日本語-テキスト。",
    "😀-😃", "a\u00adb", "a\u200bb", "tab\tseparated\twords", "cr\rin the middle",
    "control\x01char\x1fs", "\x7fdel", "ende mit komma,", "Sätze. Noch einer. Und. ja.",
    "Am 1. 2. und 3. Januar.", "Sie sagte „Nein.“", "(Klammer.)", "Ende.)", "a.b.c.",
    "E.ON-Chef", "0.5-fach", "10-20", "1990er-Jahre", "2014-11-07", "Preis: 5 $.",
    " leading space", "trailing space ", "  many   spaces  inside  ",
    " ".join(["Wort"] * 300),
]

WORDS = [
    "Haus", "Straße", "Müller", "über", "ÄÖÜ", "groß", "und", "der", "die", "das", "wort",
    "Wort", "Regierung", "Bundes-Kanzlerin", "e-Mail", "E-Mail-Adresse", "rich-text",
    "Nord-Süd", "A-", "-B", "l'homme", "aujourd'hui", "qu'il", "c'est", "J'ai", "l'",
    "homme", "à", "été", "Œuvre", "ça", "naïve", "İ", "ß", "Σ", "ǅ", "ⓐ", "ᵃ", "ﬁ",
    "日本語", "😀", "e\u0301", "a\u0308",
]
ABBREVIATIONS = [
    "z.B.", "d.h.", "usw.", "Nr.", "Dr.", "Prof.", "ca.", "bzw.", "vgl.", "Art.", "No.",
    "St.", "5.", "1.", "99.", "100.", "III.", "XX.", "c.-à-d.", "M.", "Mme.", "p.ex.",
    "etc.", "U.S.", "e.g.", "a.", "B.", "x.", "Mio.",
]
NUMBERS = ["5,300", "1.000", "3,14", "12,5", "1,", ",5", "2014", "10-20", "1.2.3", "½",
           "²", "٣", "Ⅻ", "१२", "0", "42"]
PUNCTUATION = [
    ".", "..", "...", "....", ",", ",,", ";", ":", "!", "?", "!?", "(", ")", "[", "]", "{",
    "}", "<", ">", "&", "&amp;", "|", "\"", "'", "`", "``", "''", "„", "“", "”", "‚", "‘",
    "’", "«", "»", "‹", "›", "…", "·", "•", "/", "\\", "@", "#", "$", "%", "^", "*", "+",
    "=", "~", "_", "€", "£", "§", "-", "--", "‐", "–", "—", ".'", "'.",
]
HOSTILE = [
    "DOTMULTI", "DOTDOTMULTI", "DOTMULTI.", "THISISPROTECTED000", "##AT##", "&#124;",
    "&quot;", "\u00ad", "\u200b", "\ufeff", "\u00a0", "\u3000", "\u2028", "\u0085",
    "\t", "\x0b", "\x0c", "\r", "\x01", "\x1b", "\x1c", "\x1f", "\x7f", "\u180e",
]
SEPARATORS = [" "] * 8 + ["", "  ", "\t", "\u00a0"]


def random_line(rng):
    pools = [WORDS] * 6 + [ABBREVIATIONS] * 3 + [NUMBERS] * 2 + [PUNCTUATION] * 4 + [HOSTILE]
    pieces = [rng.choice(rng.choice(pools)) for _ in range(rng.randint(0, 14))]
    line = ""
    for i, piece in enumerate(pieces):
        line += (rng.choice(SEPARATORS) if i else "") + piece
    return line + rng.choice(["", "", ".", ".'", ",", " 5,", " Nr.", "-", " -x"])


def inputs():
    rng = random.Random(SEED)
    lines = HAND_WRITTEN + [random_line(rng) for _ in range(RANDOM_LINES)]
    assert all("\n" not in line and "\0" not in line for line in lines)
    return lines


def perturbed(lines, rng, keep=0.3):
    """A hypothesis: each line's space-separated pieces dropped, swapped, repeated or
    replaced at random (some lines left as they are)."""
    out = []
    for line in lines:
        pieces = line.split(" ")
        if rng.random() >= keep and pieces:
            for _ in range(rng.randint(1, 3)):
                op = rng.randrange(4)
                i = rng.randrange(len(pieces))
                if op == 0 and len(pieces) > 1:
                    del pieces[i]
                elif op == 1 and i + 1 < len(pieces):
                    pieces[i], pieces[i + 1] = pieces[i + 1], pieces[i]
                elif op == 2:
                    pieces.insert(i, pieces[i])
                else:
                    pieces[i] = rng.choice(WORDS + ABBREVIATIONS + PUNCTUATION)
        out.append(" ".join(pieces))
    return out


def bleu_cases(lines):
    """name -> (hypothesis lines, [reference stream, ...])."""
    rng = random.Random(SEED + 1)
    ordinary = [line for line in lines if line.strip(" ")]
    half = [" ".join(line.split(" ")[: max(1, len(line.split(" ")) // 2)]) for line in ordinary]
    return {
        "all": (perturbed(lines, rng), [lines]),
        "two_refs": (perturbed(lines, rng), [lines, perturbed(lines, rng, keep=0.0)]),
        "three_refs": (perturbed(ordinary[:80], rng), [perturbed(ordinary[:80], rng),
                                                       ordinary[:80],
                                                       perturbed(ordinary[:80], rng)]),
        "identical": (ordinary[:40], [ordinary[:40]]),
        "short": (half, [ordinary]),
        "long": ([line + " und mehr ." for line in ordinary[:80]], [ordinary[:80]]),
        "no_bigram_matches": (["a b c d e", "x y z w v"], [["e d c b a", "v w z y x"]]),
        "no_fourgrams": (["a b c", "d e"], [["a b c", "d e f g h"]]),
        "one_token": (["Haus"], [["Haus"]]),
        # multi-bleu.perl starts its closest-length search at 9999: a reference 9999 or
        # more tokens away from the hypothesis is never chosen.
        "cap_9999": ([" ".join(["a"] * 10050) + " b c d", "a b c d"], [["a b c d", "a b c d"]]),
        "tie_two_refs": (["a b c d e f", "a b"], [["a b c d e f g h", "a b c"],
                                                  ["a b c d", "a"]]),
        "blank_unicode_tokens": (["\u3000", "\u0085 x", "Haus-Boot"],
                                 [["\u3000", "x", "Haus-Boot"]]),
        "empty_refs": (["a b c"], [[""]]),
        "blank_refs": (["a b c", "d"], [["  ", "\t"]]),
        "empty_hyp": (["", ""], [["a b c", "d e"]]),
    }


def write_case_files(out_dir, lines, cases):
    """Writes each distinct text once (inputs.txt is itself a reference) and returns
    name -> (hypothesis file, [reference files]), relative to out_dir."""
    written = {"\n".join(lines): "inputs.txt"}

    def file_for(text_lines, name):
        key = "\n".join(text_lines)
        if key not in written:
            written[key] = f"bleu/{name}"
            write_lines(os.path.join(out_dir, written[key]), text_lines)
        return written[key]

    return {name: (file_for(hyp, name + ".hyp"),
                   [file_for(ref, f"{name}.ref{k + 1}") for k, ref in enumerate(refs)])
            for name, (hyp, refs) in cases.items()}


# ---- running the Perl scripts ----

def write_lines(path, lines):
    with open(path, "w", encoding="utf-8", newline="\n") as out:
        out.write("".join(line + "\n" for line in lines))


def read_bytes(path):
    with open(path, "rb") as f:
        return f.read()


def extract(moses, revision, into):
    os.makedirs(into)
    archive = subprocess.run(
        ["git", "-C", moses, "archive", revision, "scripts/tokenizer/tokenizer.perl",
         "scripts/share/nonbreaking_prefixes", "scripts/generic/multi-bleu.perl"],
        check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", into], input=archive, check=True)
    return into


def perl(arguments, stdin):
    return subprocess.run(["perl"] + arguments, input=stdin, capture_output=True)


def tokenize(scripts, language, data):
    result = perl([os.path.join(scripts, "scripts/tokenizer/tokenizer.perl"), "-l", language,
                   "-q"], data)
    assert result.returncode == 0, result.stderr
    return result.stdout


def split_compounds(data):
    result = perl(["-ple", COMPOUND], data)
    assert result.returncode == 0, result.stderr
    return result.stdout


def multi_bleu(work, scripts, hypothesis, references):
    """multi-bleu.perl's line, or 'exit N' where it prints none."""
    paths = []
    for k, reference in enumerate(references):
        path = os.path.join(work, "ref_" + "abcdefgh"[k])
        with open(path, "wb") as out:
            out.write(reference)
        paths.append(path)
    result = perl([os.path.join(scripts, "scripts/generic/multi-bleu.perl")] + paths,
                  hypothesis)
    lines = result.stdout.decode("utf-8").splitlines()
    if result.returncode != 0 or len(lines) != 1 or not lines[0].startswith("BLEU = "):
        return f"exit {result.returncode}"
    return lines[0]


def pipeline(scripts, language, data, compound):
    tokens = tokenize(scripts, language, data)
    return split_compounds(tokens) if compound else tokens


# Git must keep every byte: lone carriage returns and control characters are test data.
GITATTRIBUTES = ("# The vectors are byte-exact outputs of the Moses Perl scripts "
                 "(tools/gen_moses_vectors.py):\n"
                 "# lone carriage returns and control characters in them are test data, "
                 "not line endings.\n* -text\n")

CONFIGS = [("de", "current", True), ("de", "2017", True), ("de", "current", False),
           ("fr", "current", False), ("fr", "2017", False)]


def generate(moses, out_dir, data_dir, work):
    scripts = {name: extract(moses, rev, os.path.join(work, name)) for name, rev in VERSIONS.items()}
    os.makedirs(os.path.join(out_dir, "bleu"))
    with open(os.path.join(out_dir, ".gitattributes"), "w") as out:
        out.write(GITATTRIBUTES)
    lines = inputs()
    write_lines(os.path.join(out_dir, "inputs.txt"), lines)
    raw = read_bytes(os.path.join(out_dir, "inputs.txt"))
    for version, directory in scripts.items():
        for language in LANGUAGES:
            tokens = tokenize(directory, language, raw)
            with open(os.path.join(out_dir, f"tok.{language}.{version}.txt"), "wb") as out:
                out.write(tokens)
            if language == "de":
                with open(os.path.join(out_dir, f"atat.de.{version}.txt"), "wb") as out:
                    out.write(split_compounds(tokens))

    rows = []
    for name, (hyp_file, ref_files) in write_case_files(out_dir, lines, bleu_cases(lines)).items():
        hyp_raw = read_bytes(os.path.join(out_dir, hyp_file))
        ref_raw = [read_bytes(os.path.join(out_dir, f)) for f in ref_files]
        for language, version, compound in CONFIGS:
            directory = scripts[version]
            line = multi_bleu(work, scripts["current"],
                              pipeline(directory, language, hyp_raw, compound),
                              [pipeline(directory, language, r, compound) for r in ref_raw])
            rows.append((name, hyp_file, ",".join(ref_files), language, version,
                         "yes" if compound else "no", line))
    with open(os.path.join(out_dir, "bleu_expected.tsv"), "w", encoding="utf-8") as out:
        out.write("# case\thypothesis\treferences\tlanguage\tversion\tcompound\t"
                  "multi-bleu.perl (tools/gen_moses_vectors.py)\n")
        for row in rows:
            out.write("\t".join(row) + "\n")

    if data_dir:
        write_real_data(scripts, data_dir, out_dir, work)


def write_real_data(scripts, data_dir, out_dir, work):
    references = ["wmt14_test/newstest2013.de", "wmt14_test/newstest2014.de",
                  "sacrebleu_tests/wmt17_en-de/newstest2017-ende-ref.de"]
    rows = []
    for relative in references:
        raw = read_bytes(os.path.join(data_dir, relative))
        for version in VERSIONS:
            tokens = tokenize(scripts[version], "de", raw)
            rows.append(("tok_sha256", relative, "", version, "no", hashlib.sha256(tokens).hexdigest()))
            rows.append(("tok_sha256", relative, "", version, "yes",
                         hashlib.sha256(split_compounds(tokens)).hexdigest()))
    # Hypotheses: the 16 WMT17 systems, and newstest2014's reference shifted by one line
    # (line i scored against line i+1, the last against the first).
    wmt17 = os.path.join(data_dir, "sacrebleu_tests/wmt17_en-de")
    systems = sorted(f for f in os.listdir(wmt17) if f.startswith("newstest2017.") and f.endswith(".en-de"))
    pairs = [(f"sacrebleu_tests/wmt17_en-de/{system}", references[2]) for system in systems]
    pairs.append(("shifted:" + references[1], references[1]))
    for hypothesis, reference in pairs:
        ref_raw = read_bytes(os.path.join(data_dir, reference))
        if hypothesis.startswith("shifted:"):
            ref_lines = ref_raw.decode("utf-8").split("\n")[:-1]
            hyp_raw = "".join(line + "\n" for line in ref_lines[1:] + ref_lines[:1]).encode("utf-8")
        else:
            hyp_raw = read_bytes(os.path.join(data_dir, hypothesis))
        for version in VERSIONS:
            for compound in (True, False):
                line = multi_bleu(work, scripts["current"],
                                  pipeline(scripts[version], "de", hyp_raw, compound),
                                  [pipeline(scripts[version], "de", ref_raw, compound)])
                rows.append(("bleu", hypothesis, reference, version, "yes" if compound else "no", line))
    with open(os.path.join(out_dir, "real_data_expected.tsv"), "w", encoding="utf-8") as out:
        out.write("# kind\thypothesis or file\treference\tversion\tcompound\texpected "
                  "(relative to THPC_DATA; tools/gen_moses_vectors.py --data)\n")
        for row in rows:
            out.write("\t".join(row) + "\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("moses", help="a git clone of mosesdecoder")
    parser.add_argument("--data", help="a THPC_DATA folder (wmt14_test, sacrebleu_tests)")
    parser.add_argument("--check", action="store_true",
                        help="compare with tests/moses_bleu/ instead of writing it")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as work:
        out_dir = os.path.join(work, "moses_bleu")
        generate(args.moses, out_dir, args.data, os.path.join(work, "scripts"))
        if not args.data and os.path.exists(os.path.join(VECTOR_DIR, "real_data_expected.tsv")):
            shutil.copy(os.path.join(VECTOR_DIR, "real_data_expected.tsv"), out_dir)
        if args.check:
            comparison = filecmp.dircmp(out_dir, VECTOR_DIR)
            differing = []

            def collect(cmp, prefix):
                differing.extend(prefix + name for name in
                                 cmp.diff_files + cmp.left_only + cmp.right_only)
                for sub, sub_cmp in cmp.subdirs.items():
                    collect(sub_cmp, prefix + sub + "/")
            collect(comparison, "")
            if differing:
                print("differ from tests/moses_bleu/:", " ".join(sorted(differing)))
                return 1
            print("tests/moses_bleu/ is what the Perl scripts give")
            return 0
        if os.path.exists(VECTOR_DIR):
            shutil.rmtree(VECTOR_DIR)
        shutil.copytree(out_dir, VECTOR_DIR)
        print(f"wrote {VECTOR_DIR}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
