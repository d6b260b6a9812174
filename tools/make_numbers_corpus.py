#!/usr/bin/env python3
"""A small, deterministic, real transduction corpus generated on the spot: numbers
written out in English words -> the same numbers in German words.

    three hundred forty-two thousand one hundred seven
    dreihundertzweiundvierzigtausendeinhundertsieben

German writes numbers below a million as one word and says the units before the tens
(zweiundvierzig = "two-and-forty"), so the model has to reorder and segment, not copy.
The main job (tools/run_default_job.sh) trains on it; nothing is downloaded.

    python3 tools/make_numbers_corpus.py --out DIR [--train 30000] [--valid 500]
                                         [--test 500] [--seed 1]

writes DIR/{train,valid,test}.{en,de}. The splits hold distinct numbers, drawn with a
fixed 64-bit generator, so the same seed gives the same files on every machine.
"""
import argparse
import os

EN_UNITS = ["zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine",
            "ten", "eleven", "twelve", "thirteen", "fourteen", "fifteen", "sixteen",
            "seventeen", "eighteen", "nineteen"]
EN_TENS = ["", "", "twenty", "thirty", "forty", "fifty", "sixty", "seventy", "eighty", "ninety"]
DE_UNITS = ["null", "eins", "zwei", "drei", "vier", "fünf", "sechs", "sieben", "acht", "neun",
            "zehn", "elf", "zwölf", "dreizehn", "vierzehn", "fünfzehn", "sechzehn", "siebzehn",
            "achtzehn", "neunzehn"]
DE_TENS = ["", "", "zwanzig", "dreißig", "vierzig", "fünfzig", "sechzig", "siebzig", "achtzig",
           "neunzig"]


def english_below_1000(n):
    hundreds, rest = divmod(n, 100)
    words = []
    if hundreds:
        words.append(EN_UNITS[hundreds] + " hundred")
    if rest:
        tens, units = divmod(rest, 10)
        if rest < 20:
            words.append(EN_UNITS[rest])
        else:
            words.append(EN_TENS[tens] + ("-" + EN_UNITS[units] if units else ""))
    return " ".join(words)


def english(n):
    if n == 0:
        return "zero"
    thousands, rest = divmod(n, 1000)
    words = []
    if thousands:
        words.append(english_below_1000(thousands) + " thousand")
    if rest:
        words.append(english_below_1000(rest))
    return " ".join(words)


def german_below_1000(n, last):
    """`last`: the number ends here, so a final 1 is 'eins' rather than the 'ein' of
    'eintausend' or 'einundzwanzig'."""
    hundreds, rest = divmod(n, 100)
    word = ""
    if hundreds:
        word += ("ein" if hundreds == 1 else DE_UNITS[hundreds]) + "hundert"
    if rest == 1:
        word += "eins" if last else "ein"
    elif rest < 20 and rest:
        word += DE_UNITS[rest]
    elif rest:
        tens, units = divmod(rest, 10)
        if units:
            word += ("ein" if units == 1 else DE_UNITS[units]) + "und"
        word += DE_TENS[tens]
    return word


def german(n):
    if n == 0:
        return "null"
    thousands, rest = divmod(n, 1000)
    word = ""
    if thousands:
        word += german_below_1000(thousands, last=False) + "tausend"
    if rest:
        word += german_below_1000(rest, last=True)
    return word


class Generator:
    """64-bit linear congruential generator (Knuth's MMIX constants): the same numbers
    from the same seed everywhere, independent of Python's random module."""

    def __init__(self, seed):
        self.state = (seed * 0x9E3779B97F4A7C15 + 1) % 2**64

    def below(self, bound):
        self.state = (self.state * 6364136223846793005 + 1442695040888963407) % 2**64
        return (self.state >> 33) % bound


def draw_numbers(count, generator, taken):
    """Distinct numbers not in `taken`: a digit count uniform in 1..6, then a number of
    that many digits, so short and long numbers are equally common."""
    numbers = []
    while len(numbers) < count:
        digits = 1 + generator.below(6)
        low = 0 if digits == 1 else 10 ** (digits - 1)
        n = low + generator.below(10 ** digits - low)
        if n not in taken:
            taken.add(n)
            numbers.append(n)
    return numbers


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", required=True, help="output directory")
    parser.add_argument("--train", type=int, default=30000, help="training pairs")
    parser.add_argument("--valid", type=int, default=500, help="validation pairs")
    parser.add_argument("--test", type=int, default=500, help="test pairs")
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)
    generator = Generator(args.seed)
    taken = set()
    for split in ("train", "valid", "test"):
        numbers = draw_numbers(getattr(args, split), generator, taken)
        for lang, spell in (("en", english), ("de", german)):
            with open(os.path.join(args.out, split + "." + lang), "w", encoding="utf-8") as out:
                out.writelines(spell(n) + "\n" for n in numbers)
    print("wrote %d train, %d valid, %d test pairs to %s"
          % (args.train, args.valid, args.test, args.out))


if __name__ == "__main__":
    main()
