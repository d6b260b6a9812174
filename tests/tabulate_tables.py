"""Prints the tables sacreBLEU's print_results_table prints for a list of tables, with the
installed tabulate (the reference for src/metrics/text_table.cc; test_text_table compares):
FORMAT fancy_grid for sacreBLEU's -f text, latex_booktabs for its -f latex.

Input (the file named on the command line): one table a line, "WIDTH|COLUMN;COLUMN;...",
each column "HEADER,CELL,CELL,..." in hex-encoded UTF-8 (bytes that are not UTF-8 are
surrogate-escaped, as sacreBLEU's command-line file names are). Output: each table
followed by a NUL byte.

usage: tabulate_tables.py TABLES_FILE {fancy_grid,latex_booktabs}
"""
import sys

from tabulate import tabulate


def text(hex_bytes):
    return bytes.fromhex(hex_bytes).decode('utf-8', 'surrogateescape')


def main():
    if len(sys.argv) != 3 or sys.argv[2] not in ('fancy_grid', 'latex_booktabs'):
        sys.exit(__doc__.strip().splitlines()[-1])
    tablefmt = sys.argv[2]
    out = sys.stdout.buffer
    with open(sys.argv[1], encoding='ascii') as tables:
        for line in tables:
            width, columns = line.rstrip('\n').split('|')
            new_dict = {}
            for column in columns.split(';'):
                header, *cells = column.split(',')
                new_dict[text(header)] = [text(cell) for cell in cells]
            # sacrebleu/utils.py print_results_table, colours off
            table = tabulate(new_dict, headers='keys', tablefmt=tablefmt, colalign=('right',),
                             stralign='center', numalign='center', floatfmt=f'.{width}f')
            out.write(table.encode('utf-8', 'surrogateescape') + b'\0')


if __name__ == '__main__':
    main()
