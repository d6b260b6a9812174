// What a training run must hold in memory before its first step, computed from the
// configuration in long double (no product of keys can overflow), so that sizes that
// cannot be allocated are refused with the keys that make them, before any allocation
// (issue 34: a d_model of 10^9 ended in "check failed ... out of host memory allocating
// 3766288047452246016 bytes" after --dry-run had passed it).
#pragma once

#include <string>

#include "config/config.h"

namespace thpc {

// Which sizes a training run lowers when memory runs out (set_out_of_memory_advice, by
// the trainer and transformer_bench_step).
inline constexpr char kTrainingMemoryAdvice[] =
    "lower train.tokens_per_step or raise train.accumulate, make the logits in chunks with "
    "train.loss_chunk_rows, lower model.max_positions or the model's sizes";

struct TrainingFootprint {
  // Weights of the model's matrices (embedding, learned positions, attention projections,
  // feed-forward layers): biases, norms and alignment left out, so a lower bound of what
  // add_transformer_parameters lays out.
  long double parameters = 0;
  // The parameter buffers every rank allocates: fp32 parameters, gradients and Adam's two
  // moments (16 bytes a parameter), plus a bf16 compute copy on the GPU (2 more), and
  // the sinusoidal position table (max_positions x d_model, in double and in fp32).
  long double bytes = 0;
  // On the CPU backend, whose activations share the host memory: a lower bound of what
  // one micro-batch's forward keeps for its backward, train.tokens_per_step /
  // (train.accumulate x ranks) padded tokens a side. Per token and layer: the encoder's
  // attention projections and its feed-forward hidden layer (h (2 d_k + d_v) + h d_v + d_ff:
  // 4 d_model + d_ff with the paper's widths), the decoder's two attentions' and its
  // feed-forward's (h (3 d_k + 3 d_v) + d_ff: 6 d_model + d_ff); and the logits
  // (the vocabulary per target token; train.loss_chunk_rows of them at a time when set),
  // all fp32. Attention probabilities, norms and residual sums are left out. 0 on the GPU
  // (not in host memory).
  long double activation_bytes = 0;
  long double logit_bytes = 0;  // the logits' part of activation_bytes
  long double tokens_per_micro_batch = 0;
};

// The footprint of training `model` with a vocabulary of `vocab` on `train`'s backend,
// on `ranks` ranks.
// `source_vocab`: a separate source vocabulary's size (the encoder's own table), 0 with one.
TrainingFootprint training_footprint(const ModelConfig& model, int vocab,
                                     const TrainConfig& train, int ranks = 1,
                                     int source_vocab = 0);

// Physical memory of this machine (sysconf), the most any rank's buffers can use.
long double host_memory_bytes();

// "" when the footprint fits `available_bytes`, else why not: one line naming the model
// keys, what they need and what there is (a configuration error, exit 2; every rank
// reaches it alike).
std::string training_does_not_fit(const Config& config, int vocab, long double available_bytes,
                                  int ranks = 1, int source_vocab = 0);

}  // namespace thpc
