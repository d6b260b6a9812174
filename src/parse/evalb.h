// EVALB (Sekine & Collins 1997, with D. Ellis's 2006 quote fix): labelled bracketing
// recall, precision and F-measure, complete match, crossing brackets and tagging
// accuracy of test trees against gold trees, one tree per line, with the same
// parameter file and the same report, so that a number printed here can stand next to
// one printed by `evalb -p COLLINS.prm`.
//
// The rules, as EVALB applies them to each pair of lines:
//   - a pre-terminal `(TAG word)` is a word; one whose TAG is a DELETE_LABEL is dropped
//     with its word; the length of a sentence (the Len. column, and <= CUTOFF_LEN)
//     counts the gold words whose TAG is not a DELETE_LABEL_FOR_LENGTH;
//   - a test line without words is skipped (status 2); different word counts are an
//     error (status 1) unless reinserting QUOTE_LABEL terminals that one side deleted
//     and the other did not makes them equal; different words (EQ_WORD pairs aside)
//     are an error;
//   - a constituent's label loses everything from its first '-' or '=' (NP-SBJ-1 → NP);
//     empty constituents and those labelled DELETE_LABEL are not counted;
//   - a gold constituent matches the first unmatched test constituent of the same
//     span and (LABELED 1) an equal label (EQ_LABEL pairs are equal);
//   - a test constituent crosses when some gold constituent overlaps it without nesting;
//   - a tag is correct when the labels are equal (EQ_LABEL too).
// Errors are written as EVALB writes them ("LINE : Length unmatch (G|T)"); the run
// stops, as EVALB's does, at the error that brings the count past MAX_ERROR + 1.
//
// The report reproduces EVALB's byte for byte with two documented choices where the
// published reference outputs disagree with each other (docs/parsing.md, "Scoring:
// transformer_evalb"): the Words column of an error or skipped sentence is the gold
// word count (sample.rsl), and the totals row is laid out as the bug-fixed EVALB's
// bug.rsl-new has it (its Cross column holds the number of sentences without crossing
// brackets, as both reference outputs print it).
#pragma once

#include <istream>
#include <ostream>
#include <string>
#include <utility>
#include <vector>

namespace thpc::parse {

struct EvalbParameters {
  int debug = 0;         // >= 1: the per-sentence word and bracket tables
  int max_error = 10;
  int cutoff_length = 40;
  bool labeled = true;
  std::vector<std::string> delete_labels;
  std::vector<std::string> delete_labels_for_length;
  std::vector<std::string> quote_labels;
  std::vector<std::pair<std::string, std::string>> equal_labels;
  std::vector<std::pair<std::string, std::string>> equal_words;
};

// Reads an EVALB .prm file. Unknown keywords and malformed EQ_ lines are reported to
// `warnings` and skipped, as EVALB does; a file that cannot be opened throws thpc::Error.
EvalbParameters read_evalb_parameters(const std::string& path, std::ostream& warnings);

// Sums over the sentences of one summary block (all, or length <= CUTOFF_LEN).
struct EvalbTotals {
  int sentences = 0;
  int error_sentences = 0;
  int skipped_sentences = 0;
  int gold_brackets = 0;
  int test_brackets = 0;
  int matched_brackets = 0;
  int complete_matches = 0;
  int words = 0;
  int correct_tags = 0;
  int crossings = 0;
  int no_crossing_sentences = 0;
  int two_or_less_crossing_sentences = 0;

  int valid_sentences() const { return sentences - error_sentences - skipped_sentences; }
  double recall() const;     // percent
  double precision() const;  // percent
  double f_measure() const;  // percent; NaN when recall and precision are both 0, as EVALB
};

struct EvalbResult {
  EvalbTotals all;
  EvalbTotals within_cutoff;
  int errors = 0;
  bool stopped = false;  // MAX_ERROR was exceeded: no summary was written
  // The first error EVALB printed, its line, and whose line it was read from, "gold" or
  // "test" ("" for a line-count error): what a user needs to find it.
  std::string first_error;
  int first_error_line = 0;
  std::string first_error_file;
  // The files' line counts as far as they were read (all of both, unless MAX_ERROR
  // stopped the run): EVALB scores pairs of lines and says little when they differ.
  int gold_lines = 0;
  int test_lines = 0;
  // Sentences whose outermost bracket has no label in one file and one in the other (a
  // raw treebank's "( (S ..." against "(TOP (S ..."), or is ROOT (the Stanford tools')
  // in one and TOP in the other: EVALB scores the unlabelled or ROOT one as a bracket and
  // deletes TOP (DELETE_LABEL), so such files score lower than files written alike, and
  // the first such line of the gold file.
  int unlabelled_root_against_labelled = 0;
  int first_unlabelled_root_line = 0;
};

// Scores `test` against `gold` (one tree per line), writing EVALB's report to `report`
// and its error lines to `errors`.
EvalbResult run_evalb(const EvalbParameters& parameters, std::istream& gold, std::istream& test,
                      std::ostream& report, std::ostream& errors);

// COLLINS.prm's parameters, the file EVALB ships for the Penn Treebank and the one
// docs/parsing.md scores with: punctuation (, : `` '' .), TOP and -NONE- deleted, ADVP
// equal to PRT, labelled, sentences up to 40 words in the second block. For a score
// computed where the file is not at hand: training's validation bracket F1.
EvalbParameters collins_parameters();

// The bracketing F-measure (percent) of EVALB's block of all sentences: `test` scored
// against `gold` with `parameters`, one tree per line in each (to_evalb_line's form), as
// `evalb -p` prints it but 0 where no bracket matched (EVALB prints nan). MAX_ERROR does
// not stop it. `first_error`, where given, gets EVALB's first error ("Words unmatch
// (is|was)"), "" when none.
double bracketing_f_measure(const EvalbParameters& parameters,
                            const std::vector<std::string>& gold,
                            const std::vector<std::string>& test, std::string* first_error);

}  // namespace thpc::parse
