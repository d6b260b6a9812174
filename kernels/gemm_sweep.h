// What cuBLASLt's other algorithms would make of the GPU's products: for each product
// shape a run used, the heuristic's first choice (the one linear.cu's plans take) timed
// against the next ones it offers (transformer_bench_step --gemm-sweep).
//
// Why: at one rank's 3,125 tokens the base step's GEMMs ran at 382 TFLOP/s against 628
// at 25,000 (H200, 2026-12-04, bench/RESULTS.md), 3.07 of its 7.10 ms profiled: small
// products ([3,125 x 512] x [512 x 512] fills 100 of 132 SMs for a few microseconds), where
// a tile or split-K the heuristic did not rank first may be faster. How much is a
// measurement before it is a kernel choice: timing algorithms while training would make
// the choice, and so the roundings, depend on the run (a resumed run could choose
// differently), so a faster choice would have to be fixed ahead, per shape class.
#pragma once

#include <cstdint>
#include <string>

namespace thpc {

struct GemmSweepRow {
  std::string product;  // "m=.. n=.. k=.. op=NT ab=bf16 c=bf16 epilogue=bias ..."
  int64_t uses = 0;     // times it ran since count_gemm_uses()
  double flops = 0.0;   // 2 m n k
  int algorithms = 0;   // the heuristic's offers timed (the first is the plans' choice)
  int best = 0;         // the fastest of them (0: the heuristic's first)
  // One product, the best of three timings of products queued behind a held stream (run
  // back to back, as in a step: not at the pace the host queues them).
  double heuristic_us = 0.0, best_us = 0.0;
  // Timings whose products the host had not all queued when the device reached them,
  // with the longest hold: they may hold the host's gaps (expected 0).
  int unheld_timings = 0;
  // The largest |D - D_first| over the offers, over the largest |D_first|: each algorithm
  // checked against the first on the same inputs (fp32 accumulation everywhere, so
  // differences of the output's rounding, ~eps(output type)); on 4M evenly spaced
  // elements of a larger output, and a BGRADA product's row sums beside them. algorithms
  // = 0: the heuristic had none for the shape (not expected: the step planned it).
  double max_relative_difference = 0.0;
};

}  // namespace thpc
