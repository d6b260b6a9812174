// Settings that do nothing in a run (idle_settings.h).
#include "train/idle_settings.h"

#include <algorithm>
#include <initializer_list>
#include <sstream>

namespace thpc {

std::string why_without_effect(const std::string& key, const Config& config,
                               const RunShape& run) {
  const auto in = [&key](std::initializer_list<const char*> keys) {
    for (const char* one : keys) {
      if (key == one) return true;
    }
    return false;
  };
  // (The checkpoint stores them all the same: transformer_decode on a GPU reads its
  // train.precision and train.cuda_kernels.)
  const bool on_the_cpu = run.gpu_known && !run.on_gpu;
  if (on_the_cpu &&
      in({"train.precision", "train.cuda_kernels", "train.short_attention_max_len"})) {
    return "the CPU computes in fp32 with its own kernels";
  }
  if (on_the_cpu && key == "dist.device") return "the CPU backend uses no GPU";
  // One rank sums no gradients (GradientSums), unless it times NCCL's buckets on a GPU
  // (or may, where the GPU is not known).
  const bool times_one_rank = config.dist.log_buckets && (run.on_gpu || !run.gpu_known) &&
                              config.dist.reducer != "mpi";
  if (run.ranks == 1 && !times_one_rank &&
      in({"dist.reducer", "dist.reduce_dtype", "dist.bucket_mb", "dist.embedding_sum",
          "dist.log_buckets"})) {
    return "one rank: there are no gradients to sum";
  }
  if (config.data.dir.empty() && in({"data.train", "data.valid", "data.memory_mb"})) {
    return "data.dir is empty: the synthetic task";
  }
  if (!config.data.dir.empty() && key.rfind("data.synthetic", 0) == 0) {
    return "data.dir is set: its shards, not the synthetic task";
  }
  if (!config.train.valid_bleu &&
      in({"train.valid_metric", "train.valid_beam", "train.valid_bleu_tokenize"})) {
    return "train.valid_bleu = false: validation scores perplexity alone (true translates, or "
           "parses, the validation set and scores it)";
  }
  if (key == "train.valid_bleu_tokenize" && config.train.valid_metric == "chrf") {
    return "train.valid_metric = chrf scores characters, untokenized";
  }
  if (key == "train.valid_bleu_tokenize" && config.train.valid_metric == "f1") {
    return "train.valid_metric = f1 scores trees' brackets, not tokens";
  }
  if (key == "train.divergence_lr_factor" && config.train.divergence != "rollback") {
    return "only train.divergence = rollback lowers the learning rate";
  }
  if (key == "train.divergence_limit" && config.train.divergence == "stop") {
    return "train.divergence = stop ends the run at the first divergence";
  }
  if (key == "train.divergence_warmup" && config.train.divergence_gnorm_factor == 0) {
    return "train.divergence_gnorm_factor = 0 judges no gradient norm";
  }
  return "";
}

std::string idle_settings_note(const Config& config, const RunShape& run,
                               const std::vector<std::string>& said_already) {
  std::ostringstream note;
  int count = 0;
  const Config defaults;
  for (const ConfigDifference& difference :
       config_differences(config.to_ini(), defaults.to_ini())) {
    const std::string why = why_without_effect(difference.key, config, run);
    if (why.empty() || std::find(said_already.begin(), said_already.end(), difference.key) !=
                           said_already.end()) {
      continue;
    }
    note << (count++ == 0 ? "note: set, but without effect in this run: " : ", ")
         << difference.key << " = " << (difference.value.empty() ? "empty" : difference.value)
         << " (" << why << ")";
  }
  return note.str();
}

}  // namespace thpc
