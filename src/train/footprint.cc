#include "train/footprint.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <sstream>

#include "backend/factory.h"


namespace thpc {
namespace {

// "3.8e+18 bytes (3.8 EB)" style: bytes in the units a user reads.
std::string readable_bytes(long double bytes) {
  const char* units[] = {"bytes", "KB", "MB", "GB", "TB", "PB", "EB"};
  int unit = 0;
  long double value = bytes;
  while (value >= 1000 && unit < 6) {
    value /= 1000;
    ++unit;
  }
  char text[64];
  if (unit == 6 && value >= 1000) {
    std::snprintf(text, sizeof text, "%.2Le bytes", bytes);
  } else {
    std::snprintf(text, sizeof text, "%.1Lf %s", value, units[unit]);
  }
  return text;
}

}  // namespace

TrainingFootprint training_footprint(const ModelConfig& model, int vocab,
                                     const TrainConfig& train, int ranks, int source_vocab) {
  using Real = long double;
  const Real d = model.d_model, ff = model.d_ff, h = model.heads;
  const Real dk = model.head_dim_k(), dv = model.head_dim_v();
  const Real self_attention = d * h * (2 * dk + dv) + h * dv * d;   // fused Q|K|V, output
  const Real cross_attention = d * h * dk + d * h * (dk + dv) + h * dv * d;
  const Real feed_forward = 2 * d * ff;
  TrainingFootprint footprint;
  footprint.parameters = Real(vocab) * d + Real(source_vocab) * d +
                         (model.positions == "learned" ? Real(model.max_positions) * d : 0) +
                         Real(model.layers) * (self_attention + feed_forward) +
                         Real(model.layers) * (self_attention + cross_attention + feed_forward);
  const bool bf16_copy = train.backend == "cuda" && train.precision == "bf16";
  footprint.bytes = footprint.parameters * (bf16_copy ? 18 : 16);
  // The sinusoidal table of §3.5: computed in double on the host, uploaded as fp32.
  if (model.positions != "learned") footprint.bytes += Real(model.max_positions) * d * (8 + 4);
  const bool on_the_cpu =
      train.backend == "cpu" || (train.backend == "auto" && !cuda_unavailable_reason().empty());
  if (on_the_cpu) {
    const Real tokens = std::max<Real>(
        1, Real(train.tokens_per_step) / (Real(std::max(1, train.accumulate)) * std::max(1, ranks)));
    footprint.tokens_per_micro_batch = tokens;
    // The logits: a micro-batch's rows, or train.loss_chunk_rows of them at a time.
    const Real logit_rows =
        train.loss_chunk_rows > 0 ? std::min<Real>(tokens, Real(train.loss_chunk_rows)) : tokens;
    footprint.logit_bytes = 4 * logit_rows * Real(vocab);
    // Per token and layer, the widths the projections make (h d_k and h d_v, d_model each
    // with the paper's d_k = d_v = d_model / h): the encoder's Q|K|V and the heads'
    // concatenated context, the decoder's too and its cross-attention's Q and context.
    const Real encoder_layer = h * (2 * dk + dv) + h * dv + ff;
    const Real decoder_layer = h * (2 * dk + dv) + h * dv + h * dk + h * dv + ff;
    footprint.activation_bytes =
        4 * tokens * Real(model.layers) * (encoder_layer + decoder_layer) + footprint.logit_bytes;
    footprint.bytes += footprint.activation_bytes;
  }
  return footprint;
}

long double host_memory_bytes() {
  const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
  return pages > 0 && page > 0 ? static_cast<long double>(pages) * page : 0;
}

std::string training_does_not_fit(const Config& config, int vocab, long double available_bytes,
                                  int ranks, int source_vocab) {
  const TrainingFootprint footprint =
      training_footprint(config.model, vocab, config.train, ranks, source_vocab);
  if (available_bytes <= 0 || footprint.bytes <= available_bytes) return "";
  const ModelConfig& m = config.model;
  char parameters[32];
  std::snprintf(parameters, sizeof parameters, "%.3Lg", footprint.parameters);
  std::ostringstream message;
  message << config.source_file
            << ": the model is too large to train here: model.layers = " << m.layers
            << ", d_model = " << m.d_model << ", d_ff = " << m.d_ff << ", heads = " << m.heads
            << " (d_k " << m.head_dim_k() << ", d_v " << m.head_dim_v()
            << ") and a vocabulary of " << vocab
            << " make at least " << parameters << " parameters, whose values, gradients and "
            << "Adam moments (and the positions' table of model.max_positions = "
            << m.max_positions << " rows) need "
            << readable_bytes(footprint.bytes - footprint.activation_bytes);
  if (footprint.activation_bytes > 0) {
    char tokens[32];
    std::snprintf(tokens, sizeof tokens, "%.0Lf", footprint.tokens_per_micro_batch);
    message << ", and the activations backward reads, for a micro-batch of " << tokens
            << " tokens a side (train.tokens_per_step = " << config.train.tokens_per_step
            << " / (train.accumulate = " << config.train.accumulate << " x " << ranks
            << " rank" << (ranks > 1 ? "s" : "") << ")), at least "
            << readable_bytes(footprint.activation_bytes);
  }
  message << " on every rank, and this machine has " << readable_bytes(available_bytes)
          << " of memory: make the model smaller, or model.max_positions"
          << (footprint.activation_bytes > 0 ? ", or the micro-batch (raise train.accumulate)"
                                             : "");
  // The logits of a large vocabulary can be most of a micro-batch's activations: where they
  // are a tenth or more, say how to make them a chunk at a time.
  if (config.train.loss_chunk_rows == 0 && footprint.logit_bytes > 0 &&
      footprint.logit_bytes >= 0.1L * footprint.activation_bytes) {
    message << ", or make the vocabulary's logits in chunks (train.loss_chunk_rows = 1024: "
            << "they take " << readable_bytes(footprint.logit_bytes) << " of it whole)";
  }
  return message.str();
}

}  // namespace thpc
