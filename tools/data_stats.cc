// transformer_data_stats: what the trainer's reader makes of a preprocessed corpus at a
// given budget: batches per epoch, padding waste, how fast one rank assembles its
// batches (the reader must outrun the GPU it feeds), and how many of its passes CUDA
// graphs would replay (train.cuda_kernels step_graphs keys a graph by the batch's shape,
// and the batches are padded to their longest sentence: model/capture_schedule.h).
//
//   transformer_data_stats DIR [--prefix train] [--tokens-per-step 25000] [--ranks 1]
//                              [--accumulate 1] [--epochs 1] [--memory-mb 4096]
//                              [--max-positions 1024]
#include <boost/program_options.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <vector>

#include "common/error.h"
#include "config/config.h"
#include "data/shard_reader.h"
#include "model/capture_schedule.h"
#include "model/transformer.h"
#include "train/training_setup.h"
#include "train/validation.h"
#include "tools/tool_main.h"

namespace po = boost::program_options;

namespace {

struct Arguments {
  std::string dir, prefix = "train";
  int64_t tokens_per_step = 25000;
  int ranks = 1, accumulate = 1, epochs = 1, memory_mb = 4096;
  int max_positions = thpc::ModelConfig{}.max_positions;  // the trainer's default
  bool help = false;
};

int run(const Arguments& arguments) {
  const std::string& dir = arguments.dir;
  const std::string& prefix = arguments.prefix;
  const int64_t tokens_per_step = arguments.tokens_per_step;
  const int ranks = arguments.ranks, accumulate = arguments.accumulate;
  thpc::ShardReaderSpec spec;
  spec.files = thpc::find_shards(dir, prefix, "--prefix " + prefix);
  spec.ranks = ranks;
  spec.memory_budget_bytes = static_cast<int64_t>(arguments.memory_mb) << 20;
  // The pairs the trainer drops for model.max_positions are dropped here too (a corpus
  // with a pair longer than the positions was refused here as too long for a batch, and
  // trained on): the same spec as the trainer's (training_setup.cc).
  spec.max_sentence_tokens = arguments.max_positions - 1;
  // This tool's words for train.tokens_per_step, data.memory_mb and model.max_positions.
  spec.setting_names = {"--tokens-per-step", "--memory-mb", "--max-positions"};
  thpc::ShardReader reader(spec);
  reader.print_notes(std::cout, dir + "/" + prefix);
  // The trainer's own division of the step's budget (train/validation.h).
  const int64_t budget = thpc::micro_batch_budget(tokens_per_step, accumulate, ranks);
  // The least budget that holds the longest pair, as the trainer says it (a pair that
  // did not fit was named with its tokens less eos/bos, "16 tokens does not fit 16", and
  // the user raised the value pair by pair; a helper's trial).
  if (reader.longest_padded_side() > budget) {
    THPC_FAIL("--tokens-per-step " << tokens_per_step
              << thpc::budget_below_the_longest_pair(
                     accumulate, ranks, budget, "data", reader.longest_padded_side(),
                     reader.longest_pair_file(), "--tokens-per-step",
                     "or preprocess with a smaller --max-len"));
  }
  // The trainer reads the validation shards at the same budget and refuses a run whose
  // longest validation pair does not fit it (training_setup.cc): said here too, as a
  // warning (only a run that validates, train.valid_every > 0, reads them), so that a
  // budget this tool passes is not refused by the trainer at start-up.
  // (the trainer's data.valid, whatever its data.train is called)
  const std::string valid_prefix = thpc::DataConfig{}.valid;
  if (prefix != valid_prefix &&
      std::filesystem::exists(dir + "/" + valid_prefix + ".00000.h5")) {
    // Shards the trainer would refuse for another reason (damaged, of another run, all
    // pairs over --max-positions) are a warning too: this tool's subject is --prefix's.
    try {
      thpc::ShardReaderSpec valid_spec = spec;
      valid_spec.files = thpc::find_shards(dir, valid_prefix, "data.valid = " + valid_prefix);
      valid_spec.shuffle = false;
      const thpc::ShardReader valid(valid_spec);
      if (valid.longest_padded_side() > budget) {
        std::cerr << "transformer_data_stats: warning: --tokens-per-step " << tokens_per_step
                  << thpc::budget_below_the_longest_pair(
                         accumulate, ranks, budget,
                         "validation shards (" + valid_prefix + ", read at that budget by a "
                         "run with train.valid_every > 0)",
                         valid.longest_padded_side(), valid.longest_pair_file(),
                         "--tokens-per-step", "or preprocess with a smaller --valid-max-len")
                  << "\n";
      }
    } catch (const thpc::Error& refused) {
      std::cerr << "transformer_data_stats: warning: the validation shards (" << valid_prefix
                << ") would be refused by a run with train.valid_every > 0: " << refused.what()
                << "\n";
    }
  }
  const auto plan_start = std::chrono::steady_clock::now();
  const int64_t batches = reader.batches_per_epoch(budget);
  const double plan_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - plan_start).count();
  int64_t src_padded = 0, tgt_padded = 0, src_real = 0, tgt_real = 0, assembled = 0;
  int64_t longer_sides = 0;
  std::vector<thpc::PassShape> shapes;  // run through the graphs' schedule after the timing
  const auto start = std::chrono::steady_clock::now();
  for (int epoch = 0; epoch < arguments.epochs; ++epoch) {
    reader.seek(thpc::DataPosition{epoch, 0});
    while (std::optional<thpc::Batch> batch = reader.next_in_epoch(budget)) {
      src_padded += static_cast<int64_t>(batch->src.size());
      tgt_padded += static_cast<int64_t>(batch->tgt_in.size());
      src_real += batch->src_tokens();
      tgt_real += batch->tgt_tokens();
      longer_sides += static_cast<int64_t>(std::max(batch->src.size(), batch->tgt_in.size()));
      // A step's last micro-batch starts the sums over the ranks, if there are several.
      const bool summed = ranks > 1 && assembled % accumulate == accumulate - 1;
      shapes.push_back(thpc::PassShape{batch->size, batch->src_len, batch->tgt_len, summed});
      ++assembled;
    }
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const auto waste = [](int64_t padded, int64_t real) {
    return 100.0 * static_cast<double>(padded - real) / static_cast<double>(padded);
  };
  std::cout << std::fixed << std::setprecision(2) << dir << "/" << prefix << ": "
            << reader.pairs() << " pairs, "
            << (reader.source_vocab_size() > 0
                    ? "source vocabulary " + std::to_string(reader.source_vocab_size()) +
                          ", target vocabulary "
                    : std::string("vocabulary "))
            << reader.vocab_size() << "\n"
            // The digest a checkpoint and a run's metrics records name (corpus_sha256 for the
            // training shards, valid_sha256 for the validation ones): what tells a
            // reviewer that these are the shards a run read.
            << "pairs sha256 " << reader.corpus_sha256() << "\n"
            << "budget " << budget << " tokens per side per rank (" << tokens_per_step
            << " / (" << ranks << " ranks x " << accumulate << ")): " << batches
            << (batches == 1 ? " batch" : " batches") << " per epoch, planned in " << std::setprecision(3) << plan_seconds
            << " s\n"
            << std::setprecision(2) << "fill (rank 0's batches): longer side "
            << 100.0 * static_cast<double>(longer_sides) /
                   static_cast<double>(std::max<int64_t>(1, assembled) * budget)
            << "% of the budget on average\n"
            << "padding (rank 0's batches): source " << waste(src_padded, src_real)
            << "%, target " << waste(tgt_padded, tgt_real) << "%, both "
            << waste(src_padded + tgt_padded, src_real + tgt_real) << "% of padded tokens\n"
            << "reader: " << assembled << " batches in " << seconds << " s, "
            << std::setprecision(1)
            << static_cast<double>(src_padded + tgt_padded) / seconds / 1e6
            << "M padded tokens/s (" << static_cast<double>(src_real + tgt_real) / seconds / 1e6
            << "M real) on one rank\n";
  thpc::CaptureSchedule graphs(thpc::Transformer::kMaxCapturedPasses);
  for (const thpc::PassShape& shape : shapes) graphs.next(shape);
  const thpc::CaptureSchedule::Tally& tally = graphs.tally();
  const auto share = [&](int64_t passes) {
    const int64_t all = std::max<int64_t>(1, tally.passes());
    return 100.0 * static_cast<double>(passes) / static_cast<double>(all);
  };
  std::cout << std::setprecision(1) << "CUDA graphs (step_graphs, rank 0's passes, "
            << thpc::Transformer::kMaxCapturedPasses << " shapes kept): " << tally.shapes
            << " shapes in " << tally.passes() << " passes; " << share(tally.replayed)
            << "% replay a graph, " << share(tally.captured) << "% capture one, "
            << share(tally.uncaptured) << "% run uncaptured (a shape's first pass, or again "
            << "after " << tally.evicted << " shapes were dropped for the limit)\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Arguments arguments;
  po::options_description description(
      "usage: transformer_data_stats DIR [options]\n\nBatches of one rank at the trainer's "
      "per-rank budget tokens-per-step / (ranks x accumulate): padding waste, reader "
      "throughput, and the share of passes CUDA graphs would replay.\n\noptions");
  description.add_options()("help,h", "print this text and exit")(
      "version", "print the git commit the program was built from and exit")(
      "dir", po::value(&arguments.dir)->required(),
      "directory of shards (transformer_preprocess --destdir)")(
      "prefix", po::value(&arguments.prefix)->default_value(arguments.prefix),
      "shard prefix: train | valid | test")(
      "tokens-per-step",
      po::value(&arguments.tokens_per_step)->default_value(arguments.tokens_per_step),
      "train.tokens_per_step (global, per side)")(
      "ranks", po::value(&arguments.ranks)->default_value(arguments.ranks),
      "MPI ranks the budget is divided over")(
      "accumulate", po::value(&arguments.accumulate)->default_value(arguments.accumulate),
      "train.accumulate")(
      "epochs", po::value(&arguments.epochs)->default_value(arguments.epochs),
      "epochs to read (the timing; the graphs' shapes come back epoch after epoch)")(
      "memory-mb", po::value(&arguments.memory_mb)->default_value(arguments.memory_mb),
      "data.memory_mb")(
      "max-positions",
      po::value(&arguments.max_positions)->default_value(arguments.max_positions),
      "model.max_positions: longer pairs are dropped, as the trainer drops them");
  po::positional_options_description positional;
  positional.add("dir", 1);
  const auto parse = [&](int count, char** values) {
    arguments.help =
        thpc::tools::parse_options(description, count, values, positional).count("help") > 0;
    if (arguments.help) return arguments;
    // The trainer's ranges for the same keys (train.tokens_per_step, accumulate >= 1,
    // data.memory_mb >= 1; ranks as mpirun -np): a rank count of 0 divided by zero.
    using thpc::tools::require_at_least;
    require_at_least("--tokens-per-step", arguments.tokens_per_step, 1);
    require_at_least("--ranks", arguments.ranks, 1);
    require_at_least("--accumulate", arguments.accumulate, 1);
    require_at_least("--epochs", arguments.epochs, 1);
    // Each epoch's batch shapes are kept for the graphs' schedule: --epochs 1000000000 read
    // for minutes without a word while its memory grew (a helper's trial). The shapes come
    // back epoch after epoch, so a few tell what many would.
    constexpr int kMostEpochs = 1000;
    if (arguments.epochs > kMostEpochs) {
      THPC_FAIL("--epochs must be <= " << kMostEpochs << " (each epoch is read and its batch "
                << "shapes kept; they repeat from one epoch to the next), got "
                << arguments.epochs);
    }
    require_at_least("--memory-mb", arguments.memory_mb, 1);
    require_at_least("--max-positions", arguments.max_positions, 2);
    if (arguments.tokens_per_step < int64_t{arguments.ranks} * arguments.accumulate) {
      THPC_FAIL("--tokens-per-step " << arguments.tokens_per_step << " is less than one token "
                << "per rank and micro-batch (--ranks " << arguments.ranks << " x --accumulate "
                << arguments.accumulate << "); raise it or lower those");
    }
    return arguments;
  };
  return thpc::tools::tool_main("transformer_data_stats", thpc::tools::usage_text(description),
                                argc, argv, parse, run);
}
