"""Prints every scalar of the TensorBoard event files in a run directory, as TensorBoard
itself reads them (its EventAccumulator, all values kept): one JSON object per line,
{"tag": ..., "step": ..., "value": ..., "wall_time": ...}. Used by test_run_outputs to
compare the event files with metrics.jsonl.

usage: tensorboard_scalars.py RUN_DIR
"""
import json
import sys

from tensorboard.backend.event_processing.event_accumulator import SCALARS, EventAccumulator


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__.strip().splitlines()[-1])
    accumulator = EventAccumulator(sys.argv[1], size_guidance={SCALARS: 0})  # 0 = keep all
    accumulator.Reload()
    for tag in accumulator.Tags()[SCALARS]:
        for event in accumulator.Scalars(tag):
            print(json.dumps({"tag": tag, "step": event.step, "value": event.value,
                              "wall_time": event.wall_time}))


if __name__ == "__main__":
    main()
