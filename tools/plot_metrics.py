#!/usr/bin/env python3
"""Training curves as PNG files, from the metrics.jsonl of one or several runs.

    plot_metrics.py RUN [RUN ...] [--out DIR] [--size WxH]
    plot_metrics.py RUN [RUN ...] --table

RUN is a run directory holding metrics.jsonl (train.metrics_dir, else checkpoint.dir;
a job's runs/NAME) or the file itself. For each curve that some run has, two PNG files
of W x H pixels (default 1200x800) go to DIR (default RUN/plots of the first RUN):
NAME_step.png against the optimizer step and NAME_time.png against training wall time,
every run overlaid in its own colour, training values as lines, validation values as
dashed lines with markers:

    loss        training loss (label-smoothed) and validation loss
    ppl         training and validation perplexity (log scale)
    lr          learning rate
    grad_norm   gradient norm before clipping
    tokens_per_s  target tokens per second
    bleu        validation BLEU (only when a run logged valid_bleu)
    chrf        validation chrF (only when a run logged valid_chrf: train.valid_metric)
    f1          validation bracket F1 of a parser (only when a run logged valid_f1)

A resumed run appends to its metrics.jsonl, so a step may appear twice: the later record
is the one that continued and is the one plotted. Where the run went back (a resume from an
older checkpoint, a rollback), the records of the line of training it ended on are plotted:
each "run" and "branch" record names its lineage (the lines of training that led to it, as
its checkpoints record them), and a record belongs to the line its process was on; a
return to a branch left before plots that branch again. Training wall time adds up wall_s
over the processes of a run (a record whose wall_s is smaller than the one before starts a
new process), so the time a job waited in the queue between them is not counted. Where a
process validates on other validation pairs than the one before (its run record's
valid_sha256: a fine-tuning's new data), the validation curves break there: the values
before and after are of two sets.

--table prints instead one line per run, to compare a sweep's runs without reading their
logs: its steps, how its last process ended (the summary's "ended", "running" without
one), its best validation perplexity and BLEU (or chrF) with their steps (the last
summary's, the run's own account, which best.h5 holds; else the best of the line
plotted), and each setting in which the runs' configurations differ (their run records'
"config" on the line of training plotted; a value a resume changed shows each value in
turn, "1->2"; the keys that name a run's own directories left out). It needs no
matplotlib. A RUN that is no readable metrics file (a shell pattern caught a file of
notes) is left out of the table, named on a line of its own, and the exit code is 1.

Needs matplotlib (tools/install_deps.sh puts it into ~/.cache/thpc-venv). Exit codes: 0
done, 2 a bad command line, 1 an unreadable or malformed metrics file (one line naming it;
with --table the other runs' lines are printed).
"""
import argparse
import json
import math
import os
import sys

# Each curve: file name, y label, log scale, and its series: (record kind, key, label).
CURVES = [
    ("loss", "loss per target token", False,
     [("train", "loss", "train"), ("valid", "valid_loss", "valid")]),
    ("ppl", "perplexity", True, [("train", "ppl", "train"), ("valid", "valid_ppl", "valid")]),
    ("lr", "learning rate", False, [("train", "lr", "")]),
    ("grad_norm", "gradient norm (before clipping)", False, [("train", "grad_norm", "")]),
    ("tokens_per_s", "target tokens/s", False, [("train", "tgt_tokens_per_s", "")]),
    ("bleu", "validation BLEU", False, [("valid", "valid_bleu", "")]),
    ("chrf", "validation chrF", False, [("valid", "valid_chrf", "")]),
    ("f1", "validation bracket F1", False, [("valid", "valid_f1", "")]),
]


class MetricsError(Exception):
    """A metrics file that cannot be read or parsed; the message names it."""


def metrics_file(run):
    return os.path.join(run, "metrics.jsonl") if os.path.isdir(run) else run


def parse_lineage(text):
    """[(step, line id), ...] of a record's "lineage" ("STEP:ID STEP:ID ..."), or None."""
    if not isinstance(text, str) or not text:
        return None
    try:
        return [(int(word.split(":")[0]), word.split(":")[1]) for word in text.split()]
    except (ValueError, IndexError):
        return None


def on_lineage(line, step, lineage):
    """Whether a record at `step` of line `line` is on `lineage`: its line is one of the
    lineage's, and the step lies before the next line began (the last line goes on)."""
    ids = [line_id for _, line_id in lineage]
    if line not in ids:
        return False
    index = ids.index(line)
    return index + 1 == len(lineage) or step <= lineage[index + 1][0]


def read_text(run):
    """The text of a run's metrics file; MetricsError naming it when it cannot be read."""
    if not os.path.exists(run):
        raise MetricsError(f"{run}: no such run directory or metrics file")
    path = metrics_file(run)
    try:
        with open(path, encoding="utf-8") as stream:
            return stream.read()
    except OSError as error:
        raise MetricsError(f"{path}: cannot read the metrics file ({error.strerror})") from None
    except UnicodeDecodeError:
        raise MetricsError(f"{path}: not a metrics file (not UTF-8 text)") from None


def read_run(run, text=None):
    """{(kind, key): [(step, training seconds, value), ...]} of one run, sorted by step;
    `text` is its metrics file's when already read."""
    path = metrics_file(run)
    if text is None:
        text = read_text(run)
    lines = text.splitlines()
    latest = {}  # (kind, step) -> (training seconds, record); a later record replaces
    offset, previous_wall = 0.0, None
    # With lineages (every run record has one): every record with its line, in file order.
    lined, current_line, final_lineage, with_lineages = [], None, None, True
    valid_set = None  # the validation pairs of the process's run record, when it names them
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
            kind, step, wall = record["kind"], int(record["step"]), float(record["wall_s"])
        except (ValueError, KeyError, TypeError, OverflowError) as error:
            if number == len(lines) and not text.endswith("\n"):
                break  # a record being written (a live run), or cut short by a crash
            raise MetricsError(f"{path}: line {number}: not a metrics record ({error})") from None
        if kind == "run":
            valid_set = record.get("valid_sha256")
        if kind == "valid":
            record = dict(record, valid_set=valid_set)  # (text: no curve of its own)
        if kind in ("run", "branch"):
            lineage = parse_lineage(record.get("lineage"))
            if kind == "run" and lineage is None:
                with_lineages = False
            if lineage is not None:
                # The clock goes on from the time of the step it went back to, on the line
                # it continues (the records of that line up to that step).
                offset = max((seconds for (_, at, seconds, _, on) in lined
                              if at <= step and on_lineage(on, at, lineage)),
                             default=0.0) if kind == "run" else offset
                current_line, final_lineage = lineage[-1][1], lineage
            if kind == "run":
                # A process's start at the step it resumed from: what earlier processes
                # recorded past it is a branch left (a resume from an older checkpoint,
                # whose later steps the trainer marks superseded) or steps done again;
                # dropped, and the clock goes on from that step's time.
                latest = {key: value for key, value in latest.items() if key[1] <= step}
                if lineage is None:
                    offset = max((seconds for seconds, _ in latest.values()), default=0.0)
                previous_wall = None
            continue
        if previous_wall is not None and wall < previous_wall:
            offset += previous_wall  # a new process without a run record starts at 0
        previous_wall = wall
        latest[(kind, step)] = (offset + wall, record)
        lined.append((kind, step, offset + wall, record, current_line))
    if with_lineages and final_lineage is not None:
        latest = {}
        for kind, step, seconds, record, on in lined:  # a later record replaces
            if on_lineage(on, step, final_lineage):
                latest[(kind, step)] = (seconds, record)
    if not latest:
        raise MetricsError(f"{path}: no records")
    series, sets = {}, {}
    for (kind, step), (seconds, record) in sorted(latest.items(), key=lambda item: item[0][1]):
        for key, value in record.items():
            if isinstance(value, (int, float)) and not isinstance(value, bool) and \
                    math.isfinite(value):
                points = series.setdefault((kind, key), [])
                now = record.get("valid_set")
                if points and now is not None and sets.get((kind, key)) not in (None, now):
                    points.append((step, seconds, math.nan))  # another set: the line breaks
                if now is not None:
                    sets[(kind, key)] = now
                points.append((step, seconds, value))
    return series


# Settings that name a run's own directories or how it started: they differ between any
# two runs, and say nothing of how they were trained.
OWN_KEYS = {"checkpoint.dir", "train.metrics_dir", "checkpoint.resume", "checkpoint.overwrite"}


def run_records(text):
    """The "run" records of a metrics file's text on the line of training the run ended on
    (as read_run keeps its values), oldest first, and the summary of its last process (None
    when that process wrote none: killed, or still running)."""
    records, summary, final_lineage = [], None, None
    for line in text.splitlines():
        if not line.startswith(('{"kind": "run", ', '{"kind": "summary", ',
                                '{"kind": "branch", ')):
            continue
        try:
            record = json.loads(line)
        except ValueError:
            continue  # (a line cut short: read_run has judged the file)
        if record["kind"] == "summary":
            summary = record
            continue
        lineage = parse_lineage(record.get("lineage"))
        if lineage is not None:
            final_lineage = lineage
        if record["kind"] == "run":
            summary = None  # an earlier process's is not this one's end
            records.append((record, lineage))
    if final_lineage is not None:
        records = [(record, lineage) for record, lineage in records
                   if lineage is None or
                   on_lineage(lineage[-1][1], int(record["step"]), final_lineage)]
    return [record for record, _ in records], summary


def settings_of(config_text):
    """{"section.key": value} of a stored configuration's ini text."""
    settings, section = {}, ""
    for line in (config_text or "").splitlines():
        line = line.split("#", 1)[0].strip()
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1]
        elif "=" in line:
            key, value = line.split("=", 1)
            settings[f"{section}.{key.strip()}"] = value.strip()
    return settings


def best_of(points, lower_is_better):
    """(value, step) of the best finite value, the earlier step of equal ones; None if none."""
    finite = [(value, step) for step, _, value in points if math.isfinite(value)]
    if not finite:
        return None
    return min(finite, key=lambda item: (item[0] if lower_is_better else -item[0], item[1]))


def table(runs):
    """The --table text: a header line and a line per run, columns aligned; and a message
    for each run that cannot be read (a shell pattern catching a file that is no metrics
    file leaves the others' lines)."""
    rows, settings, problems = [], [], []
    readable = []
    for run in runs:
        try:
            text = read_text(run)
            readable.append((run, text, read_run(run, text)))
        except MetricsError as error:
            problems.append(str(error))
    for (run, text, series), label in zip(readable, run_labels([run for run, _, _ in readable])):
        records, summary = run_records(text)
        # Each key's values over the processes of the line, in order, repeats merged.
        values = {}
        for record in records:
            for key, value in settings_of(record.get("config")).items():
                seen = values.setdefault(key, [])
                if not seen or seen[-1] != value:
                    seen.append(value)
        settings.append(values)
        # The steps trained: the last process's summary's, else the last training or
        # validation record's (a divergence record's step was not applied).
        steps = summary["step"] if summary else max(
            (step for (kind, _), points in series.items() if kind in ("train", "valid")
             for step, _, _ in points), default=0)
        row = [label, str(steps), (summary or {}).get("ended", "running")]
        for key, lower in (("ppl", True), ("bleu", False), ("chrf", False), ("f1", False)):
            # The summary's: the run's best, best.h5's (after a rollback, the branch left's
            # count too); else the best of the line plotted.
            if summary and f"best_valid_{key}_step" in summary:
                value, step = summary.get(f"best_valid_{key}"), summary[f"best_valid_{key}_step"]
                best = None if value is None else (value, step)
            else:
                best = best_of(series.get(("valid", f"valid_{key}"), []), lower)
            row.append("n/a" if best is None else f"{best[0]:.2f} ({best[1]})")
        rows.append(row)
    header = ["run", "steps", "ended", "best valid ppl (step)", "best valid bleu (step)",
              "best valid chrf (step)", "best valid f1 (step)"]
    # Without any F1 (or chrF, or BLEU) among the runs, its column says nothing.
    for column in (6, 5, 4):
        if all(row[column] == "n/a" for row in rows):
            header.pop(column)
            for row in rows:
                row.pop(column)
    # Compared among the runs that record their configuration (a file of a version before
    # 2026-12-07 records none: every key would differ); "n/a" in theirs. A setting a resume
    # changed shows each value in turn ("1->2"): the run is no clean variant of either.
    recorded = [values for values in settings if values]
    keys = [key for key in dict.fromkeys(k for values in recorded for k in values)
            if key not in OWN_KEYS and
            len({"->".join(values.get(key, [])) for values in recorded}) > 1]
    header += keys
    for row, values in zip(rows, settings):
        row += ["->".join(values[key]) if key in values else "n/a" for key in keys]
    widths = [max(len(line[i]) for line in [header] + rows) for i in range(len(header))]
    lines = "\n".join("  ".join(cell.ljust(width) for cell, width in zip(line, widths)).rstrip()
                      for line in [header] + rows) + "\n" if rows else ""
    return lines, problems


def run_labels(runs):
    """Legend names: each run's directory name, the whole path where names repeat."""
    names = [os.path.basename(os.path.dirname(os.path.abspath(metrics_file(run)))) or run
             for run in runs]
    labels = [name if names.count(name) == 1 else run for name, run in zip(names, runs)]
    # A path's bytes that are not UTF-8 come as surrogates (os.fsdecode), which the fonts
    # cannot draw (matplotlib failed on the legend): shown as U+FFFD.
    return [label.encode("utf-8", "surrogateescape").decode("utf-8", "replace")
            for label in labels]


def time_axis(seconds_max):
    """The unit that keeps the wall-time axis readable: (divisor, label)."""
    if seconds_max < 120:
        return 1.0, "training wall time (s)"
    if seconds_max < 2 * 3600:
        return 60.0, "training wall time (min)"
    return 3600.0, "training wall time (h)"


def plot(runs, out_dir, width, height):
    """Writes the PNG files; returns their paths."""
    import matplotlib
    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    data = [read_run(run) for run in runs]
    labels = run_labels(runs)
    colours = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    seconds_max = max(point[1] for series in data for points in series.values()
                      for point in points)
    divisor, time_label = time_axis(seconds_max)
    os.makedirs(out_dir, exist_ok=True)
    written = []
    dpi = 100
    for name, y_label, log_scale, curve in CURVES:
        if not any((kind, key) in series for series in data for kind, key, _ in curve):
            continue
        for x_name, x_label in (("step", "step"), ("time", time_label)):
            figure, axes = plt.subplots(figsize=(width / dpi, height / dpi), dpi=dpi,
                                        layout="constrained")
            for index, (series, label) in enumerate(zip(data, labels)):
                for kind, key, part in curve:
                    points = series.get((kind, key))
                    if not points:
                        continue
                    xs = [step if x_name == "step" else seconds / divisor
                          for step, seconds, _ in points]
                    style = dict(linestyle="--", marker="o", markersize=3) if kind == "valid" \
                        else dict(linestyle="-")
                    axes.plot(xs, [value for _, _, value in points],
                              color=colours[index % len(colours)],
                              label=f"{label} {part}".strip(), **style)
            axes.set_xlabel(x_label)
            axes.set_ylabel(y_label)
            if log_scale:
                axes.set_yscale("log")
            axes.grid(True, alpha=0.3)
            axes.legend()
            path = os.path.join(out_dir, f"{name}_{x_name}.png")
            figure.savefig(path, dpi=dpi)
            plt.close(figure)
            written.append(path)
    return written


def size(text):
    try:
        width, height = (int(part) for part in text.lower().split("x"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"'{text}' is not WIDTHxHEIGHT in pixels") from None
    if not (16 <= width <= 10000 and 16 <= height <= 10000):
        raise argparse.ArgumentTypeError(f"'{text}': each side must be 16 to 10000 pixels")
    return width, height


def main():
    parser = argparse.ArgumentParser(
        description="PNG training curves from the metrics.jsonl of one or several runs.")
    parser.add_argument("runs", nargs="+", metavar="RUN",
                        help="run directory holding metrics.jsonl, or the file itself")
    parser.add_argument("--out", metavar="DIR",
                        help="where the PNG files go (default: RUN/plots of the first RUN)")
    parser.add_argument("--size", type=size, default=(1200, 800), metavar="WxH",
                        help="pixels of each PNG (default 1200x800)")
    parser.add_argument("--table", action="store_true",
                        help="print a line per run instead (steps, how it ended, best "
                             "validation values with their steps, the settings that differ)")
    args = parser.parse_args()
    if args.table:
        lines, problems = table(args.runs)
        sys.stdout.write(lines)
        sys.stdout.flush()
        for problem in problems:
            print(f"plot_metrics.py: {problem} (left out of the table)", file=sys.stderr)
        if problems:
            sys.exit(1)
        return
    out_dir = args.out or os.path.join(
        os.path.dirname(os.path.abspath(metrics_file(args.runs[0]))), "plots")
    try:
        import matplotlib  # noqa: F401  (only to say what is missing before any work)
    except ImportError:
        sys.exit("plot_metrics.py: needs matplotlib: bash tools/install_deps.sh, then run "
                 "this with ~/.cache/thpc-venv/bin/python")
    try:
        written = plot(args.runs, out_dir, *args.size)
    except MetricsError as error:
        sys.exit(f"plot_metrics.py: {error}")
    for path in written:
        print(path)


if __name__ == "__main__":
    main()
