// sacreBLEU's multi-system tables (metrics/text_table.h), -f text (fancy_grid) and -f latex
// (latex_booktabs): pinned tables printed by tabulate 0.10.0 as sacreBLEU 2.6 calls it, so
// the suite checks without Python; then, when the interpreter has tabulate, hand-picked
// awkward cells and a few hundred random tables like sacreBLEU's, in both formats, compared
// byte for byte with tabulate itself (tests/tabulate_tables.py).
#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "metrics/text_table.h"
#include "program.h"
#include "scratch_directory.h"

namespace {

using thpc::metrics::fancy_grid_table;
using thpc::metrics::latex_booktabs_table;

struct Table {
  std::vector<std::string> headers;
  std::vector<std::vector<std::string>> columns;
  int width = 1;
};

// sacreBLEU's -f text and -f latex; the names are tabulate's (tabulate_tables.py takes them).
enum class Format { kFancyGrid, kLatexBooktabs };

const char* format_name(Format format) {
  return format == Format::kFancyGrid ? "fancy_grid" : "latex_booktabs";
}

std::string print(const Table& table, Format format = Format::kFancyGrid) {
  return format == Format::kFancyGrid
             ? fancy_grid_table(table.headers, table.columns, table.width)
             : latex_booktabs_table(table.headers, table.columns, table.width);
}

std::string latex(const Table& table) { return print(table, Format::kLatexBooktabs); }

TEST(TextTable, PlainScoresAndTheBaseline) {
  // "1e5" is a number: the column is re-printed with one decimal.
  const Table table{{"System", "BLEU", "chrF2"},
                    {{"newstest.a.txt", "Baseline: sys/b.txt"}, {"28.3", "1e5"}, {"55.1", "55.0"}},
                    1};
  EXPECT_EQ(print(table), R"(╒═════════════════════╤══════════╤═════════╕
│              System │   BLEU   │  chrF2  │
╞═════════════════════╪══════════╪═════════╡
│      newstest.a.txt │   28.3   │  55.1   │
├─────────────────────┼──────────┼─────────┤
│ Baseline: sys/b.txt │ 100000.0 │  55.0   │
╘═════════════════════╧══════════╧═════════╛)");
}

TEST(TextTable, NumericLookingCellsAsTabulateTypesThem) {
  // System names "1.5" and "007" make a float column: printed with 0 decimals, "1.5"
  // rounds half to even. "1,000" with "True" is an int column (kept); "28,3" is text;
  // "  28.3" loses its spaces.
  const Table table{{"System", "BLEU", "chrF2", "TER"},
                    {{"1.5", "007"}, {"28", "nan"}, {"1,000", "True"}, {"28,3", "  28.3"}},
                    0};
  EXPECT_EQ(print(table), R"(╒══════════╤════════╤═════════╤═══════╕
│   System │  BLEU  │  chrF2  │  TER  │
╞══════════╪════════╪═════════╪═══════╡
│        2 │   28   │  1,000  │ 28,3  │
├──────────┼────────┼─────────┼───────┤
│        7 │  nan   │  True   │ 28.3  │
╘══════════╧════════╧═════════╧═══════╛)");
}

TEST(TextTable, PairedCellsOnTwoLinesCountCodePoints) {
  // μ, ±, ä and the CJK characters are one column each (tabulate without wcwidth).
  const Table table{{"System", "BLEU (μ ± 95% CI)", "chrF2"},
                    {{"Baseline: système_ä.txt", "中文.txt", "b"},
                     {"28.3 (28.3 ± 0.6)", "28.1 (28.0 ± 0.7)\n(p = 0.0010)*",
                      "27.9 (28.0 ± 0.5)\n(p = 0.3170)"},
                     {"60", "61", "62"}},
                    1};
  EXPECT_EQ(print(table), R"(╒═════════════════════════╤═════════════════════╤═════════╕
│                  System │  BLEU (μ ± 95% CI)  │  chrF2  │
╞═════════════════════════╪═════════════════════╪═════════╡
│ Baseline: système_ä.txt │  28.3 (28.3 ± 0.6)  │   60    │
├─────────────────────────┼─────────────────────┼─────────┤
│                  中文.txt │  28.1 (28.0 ± 0.7)  │   61    │
│                         │    (p = 0.0010)*    │         │
├─────────────────────────┼─────────────────────┼─────────┤
│                       b │  27.9 (28.0 ± 0.5)  │   62    │
│                         │    (p = 0.3170)     │         │
╘═════════════════════════╧═════════════════════╧═════════╛)");
}

TEST(TextTable, EmptyTablesAndCells) {
  // Without rows every header is centred.
  EXPECT_EQ(print({{"System", "BLEU"}, {{}, {}}, 2}), R"(╒══════════╤════════╕
│  System  │  BLEU  │
╞══════════╪════════╡
╘══════════╧════════╛)");
  // An int column keeps "007"; an all-empty column is blank.
  EXPECT_EQ(print({{"System", "TER"}, {{"007", "12"}, {"", ""}}, 3}), R"(╒══════════╤═══════╕
│   System │  TER  │
╞══════════╪═══════╡
│      007 │       │
├──────────┼───────┤
│       12 │       │
╘══════════╧═══════╛)");
  // In a multi-line table an empty cell is blank lines; a row of empty cells no line.
  EXPECT_EQ(print({{"System", "BLEU"}, {{"x", ""}, {"", "a\nb"}}, 2}), R"(╒══════════╤════════╕
│   System │  BLEU  │
╞══════════╪════════╡
│        x │        │
├──────────┼────────┤
│          │   a    │
│          │   b    │
╘══════════╧════════╛)");
  EXPECT_EQ(print({{"System", "BLEU"}, {{"x", ""}, {"a\nb", ""}}, 2}), R"(╒══════════╤════════╕
│   System │  BLEU  │
╞══════════╪════════╡
│        x │   a    │
│          │   b    │
├──────────┼────────┤
╘══════════╧════════╛)");
}

// ---- -f latex ------------------------------------------------------------------------

TEST(LatexTable, PairedScoresWithAPValueAfterASpace) {
  // Widths are those of the text before escaping: "ours\&co\%.txt" pads as "ours&co%.txt".
  const Table table{{"System", "BLEU (μ ± 95% CI)", "chrF2"},
                    {{"Baseline: sys/base_1.txt", "ours&co%.txt", "x~y^2$#{z}.de"},
                     {"28.3 (28.3 ± 0.6)", "28.1 (28.0 ± 0.7) (p = 0.0010)*",
                      "27.9 (28.0 ± 0.5) (p = 0.3170)"},
                     {"60", "61", "62"}},
                    1};
  EXPECT_EQ(latex(table), R"tex(\begin{tabular}{rcc}
\toprule
                   System &        BLEU (μ ± 95\% CI)        &  chrF2  \\
\midrule
 Baseline: sys/base\_1.txt &        28.3 (28.3 ± 0.6)        &   60    \\
             ours\&co\%.txt & 28.1 (28.0 ± 0.7) (p = 0.0010)* &   61    \\
            x\textasciitilde{}y\^{}2\$\#\{z\}.de & 27.9 (28.0 ± 0.5) (p = 0.3170)  &   62    \\
\bottomrule
\end{tabular})tex");
}

TEST(LatexTable, NumericLookingCellsAndBackslashes) {
  // As in fancy_grid: "1.5" and "007" make a float column, at 0 decimals "2" and "7".
  const Table table{
      {"System", "BLEU", "TER"}, {{"1.5", "007"}, {"28", "nan"}, {"  28.3", "a\\b<c>"}}, 0};
  EXPECT_EQ(latex(table), R"tex(\begin{tabular}{rcc}
\toprule
   System &  BLEU  &  TER   \\
\midrule
        2 &   28   &  28.3  \\
        7 &  nan   & a\textbackslash{}b\ensuremath{<}c\ensuremath{>} \\
\bottomrule
\end{tabular})tex");
}

TEST(LatexTable, NoRowsAndLineBreaks) {
  // Without rows tabulate has no column alignments: an empty column specification.
  EXPECT_EQ(latex({{"System", "BLEU"}, {{}, {}}, 2}), R"tex(\begin{tabular}{}
\toprule
  System  &  BLEU  \\
\midrule
\bottomrule
\end{tabular})tex");
  // Not a multi-line format: "\n" is one character of the name, printed inside the row.
  EXPECT_EQ(latex({{"System", "BLEU"}, {{"a\nb_c", "x"}, {"1e5", ""}}, 1}),
            R"tex(\begin{tabular}{rc}
\toprule
   System &   BLEU   \\
\midrule
    a
b\_c & 100000.0 \\
        x &          \\
\bottomrule
\end{tabular})tex");
}

// ---- Against Python's tabulate -------------------------------------------------------

std::string hex(const std::string& bytes) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (const unsigned char b : bytes) {
    out += digits[b >> 4];
    out += digits[b & 15];
  }
  return out;
}

// Prints every table with tests/tabulate_tables.py; empty when the interpreter has no
// tabulate and was not named (the caller skips), a failure when it was.
std::vector<std::string> tabulate_in_python(const std::vector<Table>& tables, Format format,
                                            const std::string& scratch, bool* skipped) {
  *skipped = false;
  const thpc::Interpreter python = thpc::python_interpreter();
  const thpc::ProcessResult probe =
      thpc::run_process("'" + python.path + "' -c 'import tabulate'");
  if (probe.exit_code != 0) {
    if (!python.named) {
      *skipped = true;
      return {};
    }
    ADD_FAILURE() << "tabulate is not importable by " << python.path << ": " << probe.output;
    return {};
  }
  {
    std::ofstream input(scratch + "/tables.txt");
    for (const Table& table : tables) {
      input << table.width << '|';
      for (size_t c = 0; c < table.headers.size(); ++c) {
        input << (c > 0 ? ";" : "") << hex(table.headers[c]);
        for (const std::string& cell : table.columns[c]) input << ',' << hex(cell);
      }
      input << '\n';
    }
  }
  const thpc::ProcessResult result = thpc::run_process(
      "'" + python.path + "' " THPC_SOURCE_DIR "/tests/tabulate_tables.py " + scratch +
      "/tables.txt " + format_name(format) + " > " + scratch + "/printed.bin");
  EXPECT_EQ(result.exit_code, 0) << result.output;
  const std::string printed = thpc::read_file(scratch + "/printed.bin");
  std::vector<std::string> out;
  size_t start = 0;
  for (size_t end; (end = printed.find('\0', start)) != std::string::npos; start = end + 1) {
    out.push_back(printed.substr(start, end - start));
  }
  EXPECT_EQ(out.size(), tables.size()) << result.output;
  return out;
}

class TextTableVsTabulate : public thpc::ScratchDirectoryTest {
 protected:
  void compare(const std::vector<Table>& tables, Format format) {
    bool skipped = false;
    const std::vector<std::string> expected =
        tabulate_in_python(tables, format, path("."), &skipped);
    if (skipped) {
      GTEST_SKIP() << "Python's tabulate (sacreBLEU's dependency) is not importable by "
                   << thpc::python_interpreter().path << ", which was not named ($THPC_PYTHON)";
    }
    for (size_t i = 0; i < expected.size() && i < tables.size(); ++i) {
      std::ostringstream cells;
      for (size_t c = 0; c < tables[i].headers.size(); ++c) {
        cells << "\n  [" << tables[i].headers[c] << "]";
        for (const std::string& cell : tables[i].columns[c]) cells << " [" << cell << "]";
      }
      EXPECT_EQ(print(tables[i], format), expected[i])
          << format_name(format) << " table " << i << ", width " << tables[i].width << ":"
          << cells.str();
    }
  }
};

// Cells and names that tabulate might read as numbers, or split, or measure oddly.
TEST_F(TextTableVsTabulate, AwkwardCells) {
  const std::vector<std::string> awkward = {
      "nan", "NaN", "-nan", "inf", "-inf", "+inf", "Infinity", "1e5", "1E-400", "1e400",
      "  28.3", "28.3  ", "28,3", "1,000", "1,000.5", "1,0000", "+1,000", ".5", "5.", ".",
      "1_000", "1__0", "_1", "0x10", "007", "-0", "-0.04", "2.5", "0.125", "True", "False",
      "١٢٣", "１.５", "\u2003 42\u3000", "\x1c" "5", "\n", "1,000\n", "12\n", "a\rb", "a\r\nb",
      "x\vy\nz", "\xff\xfe.txt", "a\xe4\xb8" "b", "", " ", "système_ä.txt", "中文 文件.txt",
      "(p = 0.0010)*", "28.3 (28.3 ± 0.6)\n(p = 0.0010)*", "1.5", "1e5", "12",
      // LaTeX's specials, escaped by latex_booktabs after padding
      "a_b%c&d#e$f", "{x}~^\\", "<sys>.txt", "\\textbf{x}", "~/out_1.de", "^", "\\",
      "28.1 (28.0 ± 0.7) (p = 0.0010)*"};
  std::vector<Table> tables;
  for (int width = 0; width <= 6; ++width) {
    for (size_t a = 0; a < awkward.size(); ++a) {
      const std::string& other = awkward[(a * 7 + static_cast<size_t>(width)) % awkward.size()];
      // One awkward cell among numbers, and one column all awkward.
      tables.push_back({{"System", "BLEU", "chrF2++"},
                        {{awkward[a], "sys/b.txt"}, {"28.3", awkward[a]}, {awkward[a], other}},
                        width});
      tables.push_back({{"System", awkward[a] + " (μ ± 95% CI)"},
                        {{"1.5", other}, {"12.25", "007"}},
                        width});
    }
  }
  compare(tables, Format::kFancyGrid);
  compare(tables, Format::kLatexBooktabs);
}

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

// Tables like sacreBLEU's: system names (digits only, "007", "12.5", paths with Unicode and
// LaTeX's specials, now and then a line break), scores, bootstrap intervals, p-values: on
// their own line for -f text, after a space for -f latex (_format_score_lines' multiline).
std::vector<Table> random_sacrebleu_tables(Format format, unsigned seed) {
  std::mt19937 random(seed);
  auto pick = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  const std::vector<std::string> metrics = {"BLEU", "chrF2", "chrF2++", "TER"};
  const std::vector<std::string> name_parts = {
      "newstest2017", "sys", "out", "système_ä", "中文", "データ", "Ünïcödé", "ölçü", "Ωμέγα",
      "my system", "a b", "run-3", "ckpt_avg", "x", "50%_&_more", "#1$", "{a}", "~user",
      "x^2", "back\\slash", "<b>", "two\nlines"};
  auto system_name = [&]() -> std::string {
    switch (pick(0, 5)) {
      case 0: return std::to_string(pick(0, 99999));                  // digits only
      case 1: return std::string(static_cast<size_t>(pick(1, 3)), '0') +
                     std::to_string(pick(1, 9));                      // "007"
      case 2: return fixed(pick(0, 10000) / 100.0, pick(0, 3));       // "12.5"
      default: {
        std::string name = pick(0, 1) ? "/data/" : "";
        const int parts = pick(1, 3);
        for (int p = 0; p < parts; ++p) {
          const int part = pick(0, static_cast<int>(name_parts.size()) - 1);
          name += (p > 0 ? "/" : "") + name_parts[static_cast<size_t>(part)];
        }
        return name + (pick(0, 1) ? ".txt" : ".de");
      }
    }
  };
  std::vector<Table> tables;
  for (int t = 0; t < 400; ++t) {
    Table table;
    table.width = pick(0, 6);
    const int num_metrics = pick(1, 4);
    const int rows = pick(1, 6);
    const bool paired = pick(0, 1) == 1;
    const bool baseline = paired || pick(0, 1) == 1;
    std::vector<std::string> pool = metrics;
    std::shuffle(pool.begin(), pool.end(), random);
    table.headers.push_back("System");
    table.columns.emplace_back();
    for (int r = 0; r < rows; ++r) {
      table.columns[0].push_back((r == 0 && baseline ? "Baseline: " : "") + system_name());
    }
    for (int m = 0; m < num_metrics; ++m) {
      const bool bootstrap = paired && pick(0, 2) > 0;
      table.headers.push_back(pool[static_cast<size_t>(m)] + (bootstrap ? " (μ ± 95% CI)" : ""));
      std::vector<std::string> cells;
      for (int r = 0; r < rows; ++r) {
        // Mostly the table's width, as sacreBLEU formats; sometimes another (0..4).
        const int decimals = pick(0, 3) == 0 ? pick(0, 4) : table.width;
        std::string cell = fixed(pick(0, 1000000) / 10000.0, decimals);
        if (bootstrap) {
          cell += " (" + fixed(pick(0, 1000000) / 10000.0, decimals) + " ± " +
                  fixed(pick(0, 30000) / 10000.0, decimals) + ")";
        }
        if (paired && r > 0) {
          const double p = pick(1, 10000) / 10000.0;
          cell += (format == Format::kFancyGrid ? "\n(p = " : " (p = ") + fixed(p, 4) + ")" +
                  (p <= 0.05 ? "*" : "");
        }
        cells.push_back(cell);
      }
      table.columns.push_back(cells);
    }
    tables.push_back(table);
  }
  return tables;
}

TEST_F(TextTableVsTabulate, RandomTablesLikeSacrebleus) {
  compare(random_sacrebleu_tables(Format::kFancyGrid, 20260611), Format::kFancyGrid);
}

TEST_F(TextTableVsTabulate, RandomLatexTablesLikeSacrebleus) {
  compare(random_sacrebleu_tables(Format::kLatexBooktabs, 20260612), Format::kLatexBooktabs);
}

// Short random strings of number-like characters, line breaks, Unicode spaces and digits:
// tabulate's typing (int(), float(), its thousands pattern) and splitting at their edges.
// No "\x1b" (ANSI codes) and no "\x01" (separating lines): see text_table.h.
TEST_F(TextTableVsTabulate, RandomNumberLikeStrings) {
  std::mt19937 random(7);
  auto pick = [&](int low, int high) {
    return std::uniform_int_distribution<int>(low, high)(random);
  };
  const std::vector<std::string> alphabet = {
      "0", "1", "2", "5", "9", "0", "1", "7", ".", ",", "+", "-", "_", "e", "E", " ", "n",
      "a", "N", "i", "f", "\n", "\r", "\v", "\t", "\x1c", "\u00a0", "\u3000", "١", "５",
      "μ", "中", "x", "(", "*", "Tr", "ue", "nan", "inf", "%", "&", "\\", "{", "}", "~", "^",
      "<", ">", "$", "#"};
  auto random_text = [&](int longest) {
    std::string text;
    const int length = pick(0, longest);
    for (int i = 0; i < length; ++i) {
      text += alphabet[static_cast<size_t>(pick(0, static_cast<int>(alphabet.size()) - 1))];
    }
    return text;
  };
  std::vector<Table> tables;
  for (int t = 0; t < 300; ++t) {
    Table table;
    table.width = pick(0, 6);
    const int num_columns = pick(2, 5);
    const int rows = pick(0, 4);
    for (int c = 0; c < num_columns; ++c) {
      // Distinct headers (they are dict keys in Python), mostly plain.
      table.headers.push_back((pick(0, 3) == 0 ? random_text(4) : "") + "#" + std::to_string(c));
      table.columns.emplace_back();
      const bool numeric = pick(0, 1) == 1;  // mostly numbers, so the column may type as one
      for (int r = 0; r < rows; ++r) {
        table.columns.back().push_back(numeric && pick(0, 3) > 0
                                           ? std::to_string(pick(0, 5000)) + "." +
                                                 std::to_string(pick(0, 99))
                                           : random_text(6));
      }
    }
    tables.push_back(table);
  }
  compare(tables, Format::kFancyGrid);
  compare(tables, Format::kLatexBooktabs);
}

}  // namespace
