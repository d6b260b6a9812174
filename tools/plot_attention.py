#!/usr/bin/env python3
"""Draws the attention weights `transformer_decode --dump-attention` stored, as the
paper's Figures 3-5 show them.

  tools/plot_attention.py FILE.h5 [--line N] [--layer L] [--word W] [--out DIR]

For each dumped input line (or only --line N) and each layer (or only --layer L,
counted from 1 as the paper does: "layer 5 of 6"), writes into DIR (default: FILE
without .h5):

  line_N_layer_L_encoder_self.png   one heatmap per head, source tokens on both axes
  line_N_layer_L_decoder_self.png   target tokens (the decoder's input) on both axes
  line_N_layer_L_cross.png          target tokens down, source tokens across
  line_N_layer_L_word_K.png         Figures 3 and 4: the encoder self-attention of one
                                    source token K, all heads, one colour per head: a
                                    line from the token (left) to every token (right),
                                    its opacity the weight

Row q of a heatmap is the weights query q gives the keys (it sums to 1). --word picks the
token of the last view by position (0-based) or by piece (the first equal one); default:
the longest piece, usually a content word. Prints one line per file with its size in
pixels. Needs matplotlib, h5py and numpy (tools/install_deps.sh puts them into its
virtual environment). Exit codes: 0 done, 2 a bad command line or a line/layer/word the
file lacks, 1 an unreadable file.
"""
import argparse
import os
import sys

try:
    import h5py
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    import numpy as np
except ImportError as missing:
    sys.exit(f"plot_attention.py: needs matplotlib, h5py and numpy ({missing}); "
             "bash tools/install_deps.sh installs them into ~/.cache/thpc-venv")

DPI = 100
KINDS = (
    # (dataset, title, rows are target tokens, columns are target tokens)
    ("encoder_self", "encoder self-attention", False, False),
    ("decoder_self", "decoder self-attention", True, True),
    ("cross", "encoder-decoder attention", True, False),
)


class UsageError(Exception):
    """A line, layer or word the file does not have: exit code 2."""


def strings(dataset):
    return [str(s) for s in dataset.asstr()[()]]


def read_line(group):
    """The tokens and weights of one /line_N group."""
    return {
        "source_tokens": strings(group["source_tokens"]),
        "target_tokens": strings(group["target_tokens"]),
        "source_text": group["source_text"].asstr()[()],
        "target_text": group["target_text"].asstr()[()],
        **{name: np.asarray(group[name][()], dtype=np.float32) for name, *_ in KINDS},
    }


def save(figure, path):
    figure.savefig(path, dpi=DPI)
    width, height = figure.canvas.get_width_height()
    plt.close(figure)
    print(f"wrote {path} ({width}x{height} px)")


def heatmaps(weights, rows, columns, title, path):
    """One heatmap per head of weights [heads, len(rows), len(columns)]."""
    heads = weights.shape[0]
    grid_columns = min(4, heads)
    grid_rows = (heads + grid_columns - 1) // grid_columns
    # About 0.2 inch per token, so that the labels stay legible, and at least 2.5 inches.
    cell_w = max(2.5, 0.2 * len(columns) + 1.0)
    cell_h = max(2.5, 0.2 * len(rows) + 1.0)
    figure, axes = plt.subplots(grid_rows, grid_columns, squeeze=False, layout="constrained",
                                figsize=(cell_w * grid_columns + 0.8, cell_h * grid_rows + 0.6))
    image = None
    for head in range(grid_rows * grid_columns):
        axis = axes[head // grid_columns][head % grid_columns]
        if head >= heads:
            axis.axis("off")
            continue
        image = axis.imshow(weights[head], cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto",
                            interpolation="nearest")
        axis.set_title(f"head {head + 1}", fontsize=9)
        axis.set_xticks(range(len(columns)))
        axis.set_xticklabels(columns, rotation=90, fontsize=7)
        axis.set_yticks(range(len(rows)))
        axis.set_yticklabels(rows, fontsize=7)
    figure.colorbar(image, ax=axes, shrink=0.8, label="weight")
    figure.suptitle(f"{title} (row: query, column: key)", fontsize=10)
    save(figure, path)


def word_view(weights, tokens, word, title, path):
    """Figures 3/4: token `word` attending to every token, one colour per head."""
    heads, count = weights.shape[0], len(tokens)
    colours = plt.get_cmap("tab10" if heads <= 10 else "tab20")
    figure, axis = plt.subplots(figsize=(4.5, max(3.0, 0.28 * count + 1.2)))
    for head in range(heads):
        for key in range(count):
            weight = float(weights[head, word, key])
            if weight <= 0.0:
                continue
            axis.plot([0.0, 1.0], [word, key], color=colours(head % colours.N),
                      alpha=min(1.0, weight), linewidth=2.0)
    for position, token in enumerate(tokens):
        emphasis = "bold" if position == word else "normal"
        axis.text(-0.02, position, token, ha="right", va="center", fontsize=8,
                  fontweight=emphasis)
        axis.text(1.02, position, token, ha="left", va="center", fontsize=8)
    for head in range(heads):
        axis.plot([], [], color=colours(head % colours.N), linewidth=2.0,
                  label=f"head {head + 1}")
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.01), ncol=min(4, heads),
                fontsize=7, frameon=False)
    axis.set_xlim(-0.6, 1.6)
    axis.set_ylim(count - 0.5, -0.5)  # first token on top
    axis.axis("off")
    axis.set_title(title, fontsize=9)
    figure.tight_layout()
    save(figure, path)


def choose_word(tokens, word):
    """The position --word names among the source tokens (eos excluded)."""
    candidates = tokens[:-1] if len(tokens) > 1 else tokens
    if word is None:
        return max(range(len(candidates)), key=lambda i: len(candidates[i].lstrip("\u2581")))
    if word.isdigit():
        position = int(word)
        if position >= len(candidates):
            raise UsageError(f"--word {word}: the source has tokens 0..{len(candidates) - 1}")
        return position
    if word in candidates:
        return candidates.index(word)
    raise UsageError(f"--word '{word}' is none of the source tokens {candidates}")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("file", help="an HDF5 file of transformer_decode --dump-attention")
    parser.add_argument("--line", type=int, help="the input line to draw (default: every one)")
    parser.add_argument("--layer", type=int,
                        help="the layer to draw, from 1 (default: every one)")
    parser.add_argument("--word", help="the source token of the one-word view: its "
                        "position from 0 or its piece (default: the longest piece)")
    parser.add_argument("--out", help="output directory (default: FILE without .h5; "
                        "FILE.plots for a FILE without it)")
    args = parser.parse_args()
    out = args.out or os.path.splitext(args.file)[0]
    if out == args.file:  # a dump named without .h5: beside it, not in its own name
        out = args.file + ".plots"
    try:
        dump = h5py.File(args.file, "r")
    except OSError as error:
        print(f"plot_attention.py: cannot read {args.file}: {error}", file=sys.stderr)
        return 1
    try:
        with dump:
            layers = int(dump.attrs["layers"])
            available = sorted(int(dump[name].attrs["line"]) for name in dump)
            lines = available if args.line is None else [args.line]
            if args.line is not None and args.line not in available:
                raise UsageError(f"--line {args.line}: {args.file} holds lines {available}")
            if args.layer is not None and not 1 <= args.layer <= layers:
                raise UsageError(f"--layer {args.layer}: the model has layers 1..{layers}")
            chosen_layers = range(1, layers + 1) if args.layer is None else [args.layer]
            os.makedirs(out, exist_ok=True)
            for line in lines:
                data = read_line(dump[f"line_{line}"])
                word = choose_word(data["source_tokens"], args.word)
                for layer in chosen_layers:
                    stem = os.path.join(out, f"line_{line}_layer_{layer}")
                    for name, title, target_rows, target_columns in KINDS:
                        rows = data["target_tokens" if target_rows else "source_tokens"]
                        columns = data["target_tokens" if target_columns else "source_tokens"]
                        heatmaps(data[name][layer - 1], rows, columns,
                                 f"line {line}, layer {layer}: {title}", f"{stem}_{name}.png")
                    word_view(data["encoder_self"][layer - 1], data["source_tokens"], word,
                              f"line {line}, layer {layer}: encoder self-attention of "
                              f"'{data['source_tokens'][word]}'", f"{stem}_word_{word}.png")
    except UsageError as error:
        print(f"plot_attention.py: {error}", file=sys.stderr)
        return 2
    except (KeyError, OSError) as error:
        print(f"plot_attention.py: {args.file}: not an attention dump ({error})",
              file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
