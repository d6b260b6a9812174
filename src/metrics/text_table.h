// The tables sacreBLEU 2.6 prints when it scores several systems in one call
// (utils.print_results_table, colours off), reproduced byte for byte without Python:
// `-f text` draws a box around the cells, `-f latex` a booktabs tabular to paste into a
// paper. sacreBLEU hands its columns to the `tabulate` package (0.10.0 in the reference
// environment, installed without the optional `wcwidth`):
//
//   tabulate(columns, headers='keys', tablefmt='fancy_grid', colalign=('right',),
//            stralign='center', numalign='center', floatfmt=f'.{width}f')
//
// with tablefmt='latex_booktabs' for -f latex. What that call does, which this file
// follows (both formats alike, except where said):
//  - Widths are Python's len(): code points, not terminal cells, because wcwidth is
//    absent (with it installed tabulate would count CJK as two columns: a different table).
//  - Every column is typed from its cells: a column whose non-empty cells all read as
//    Python numbers (int(), float(), "1,000"-style thousands) is numeric. Of numeric
//    columns only the float ones change: each cell is re-printed with '.{width}f'
//    (system "1.5" at -w 0 prints as "2"); int columns keep their text ("007").
//  - Cells lose surrounding whitespace (str.strip()); headers keep theirs.
//  - The first column is right-aligned, the others centred with the odd space on the
//    right; headers follow their column (all centred when there are no rows). A column is
//    its widest cell line or its header plus 2, whichever is wider.
//  - fancy_grid: when any cell or header holds "\r" or "\n" the whole table is multi-line:
//    a row is as tall as its tallest cell, shorter cells get blank lines below.
//  - latex_booktabs is not one of tabulate's multi-line formats: a "\r" or "\n" is one
//    more character of its cell, counted in the width and printed as it is, inside the
//    row. (sacreBLEU itself puts a p-value after a space in -f latex, not on a new line.)
//  - latex_booktabs: "\begin{tabular}{rcc}" (one letter a column: r for the first, c for
//    the others; "{}" when there are no rows, as tabulate then has no alignments),
//    "\toprule", the header row, "\midrule", a row a line, "\bottomrule",
//    "\end{tabular}". A row is its padded cells with a space either side, joined by "&",
//    then "\\". Each cell is escaped after padding, so widths are those of the plain
//    text: & % $ # _ { } get a backslash, ^ is \^{}, ~ \textasciitilde{}, \ is
//    \textbackslash{}, < and > \ensuremath{<} and \ensuremath{>}; the rest is kept.
// Not reproduced (sacreBLEU never produces them; file names could): ANSI escape
// sequences in a cell (tabulate would not count them in widths) and a first or second
// cell that is "\x01" (tabulate's separating-line marker).
#pragma once

#include <string>
#include <vector>

namespace thpc::metrics {

// headers[i] names columns[i]; the first column is "System". Columns may differ in length
// (the missing cells are empty, as tabulate's izip_longest makes them). UTF-8 in and out;
// bytes that are not UTF-8 pass through as one character each (Python's surrogateescape,
// as sacreBLEU reads file names from its command line). No trailing newline. `width` >= 0.
std::string fancy_grid_table(const std::vector<std::string>& headers,
                             const std::vector<std::vector<std::string>>& columns, int width);

// The same table as `sacrebleu -f latex` prints it (tablefmt='latex_booktabs'); the same
// arguments, UTF-8 in and out, no trailing newline.
std::string latex_booktabs_table(const std::vector<std::string>& headers,
                                 const std::vector<std::vector<std::string>>& columns,
                                 int width);

}  // namespace thpc::metrics
