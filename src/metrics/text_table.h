// The table sacreBLEU 2.6 prints when it scores several systems in one call (`sacrebleu
// -i A B ... -f text`, utils.print_results_table with colours off), reproduced byte for
// byte without Python. sacreBLEU hands its columns to the `tabulate` package (0.10.0 in
// the reference environment, installed without the optional `wcwidth`):
//
//   tabulate(columns, headers='keys', tablefmt='fancy_grid', colalign=('right',),
//            stralign='center', numalign='center', floatfmt=f'.{width}f')
//
// What that call does, which this file follows:
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
//  - When any cell or header holds "\r" or "\n" the whole table is multi-line: a row is
//    as tall as its tallest cell, shorter cells get blank lines below.
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

}  // namespace thpc::metrics
