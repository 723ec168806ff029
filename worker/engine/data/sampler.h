// A deterministic sampler over the GLOBAL stream of training samples.
//
// A sample is a window of the dataset (see token_dataset.h). Epoch e visits every window
// once, in an order fixed by (seed, e): a pseudo-random permutation computed on the fly
// (a keyed Feistel network with cycle walking), so the order costs no memory and the
// window of any global sample index is O(1) to compute. With shuffle = false the order is
// sequential (llm.c's loader).
//
// Global sample g (0-based since the start of training) is window perm_{g / N}(g % N),
// N = num_windows. Each optimizer step consumes the next global batch of samples
// [c, c + G), c = consumed_samples, G = global_batch (so step k of a run that kept its
// global batch reads [k*G, (k+1)*G)). Within it, dp rank r of R takes the contiguous slice
// [r*G/R, (r+1)*G/R), as accum = G / (R * micro_batch) micro-batches of micro_batch
// samples each, in order. Hence every world size with the same global batch trains on the
// same samples per step, and a checkpoint taken at one world size resumes exactly at
// another: the position is just the number of samples consumed.
//
// Not thread-safe; the DataLoader drives one from its prefetch thread.
#pragma once

#include <cstdint>
#include <vector>

#include "common/status.h"

namespace drover::engine {

// How a global batch is split; mirrors train.global_batch / train.micro_batch and the dp
// coordinates of this rank.
struct BatchLayout {
  int global_batch = 1;
  int micro_batch = 1;
  int dp_rank = 0;
  int dp_size = 1;

  // Micro-batches per rank per optimizer step: global_batch / (dp_size * micro_batch).
  int accum_steps() const { return global_batch / (dp_size * micro_batch); }
  // InvalidArgument naming the field unless sizes are positive, dp_rank is in
  // [0, dp_size) and global_batch is divisible by dp_size * micro_batch.
  Status Validate() const;
};

// The sampler's position: saved in checkpoints. consumed_samples is authoritative (it is
// the same at every world size); epoch and offset are derived from it for readability
// (epoch = consumed / N, offset = consumed % N) and checked on restore. micro_step is the
// next micro-batch of this rank inside the current global batch (0 at step boundaries,
// which is where checkpoints are taken).
struct SamplerState {
  uint64_t epoch = 0;
  uint64_t offset = 0;
  uint64_t consumed_samples = 0;  // samples of completed global batches
  int micro_step = 0;
};

class Sampler {
 public:
  // CHECKs num_windows > 0 and layout.Validate().ok().
  Sampler(uint64_t num_windows, uint64_t seed, bool shuffle, const BatchLayout& layout);

  // The window of global sample g.
  uint64_t WindowOf(uint64_t global_sample) const;

  // The windows (micro_batch of them) of this rank's next micro-batch; advances the
  // position. After the rank's last micro-batch of a global batch, consumed_samples grows
  // by global_batch and micro_step returns to 0.
  std::vector<uint64_t> NextMicroBatch();

  SamplerState state() const;

  // Moves to `state`. InvalidArgument if epoch/offset disagree with consumed_samples for
  // this dataset (a different dataset or sequence length), or micro_step is out of range
  // for this layout (a mid-step position restores only into the same layout).
  Status Restore(const SamplerState& state);

  uint64_t num_windows() const { return num_windows_; }
  const BatchLayout& layout() const { return layout_; }

 private:
  uint64_t num_windows_;
  uint64_t seed_;
  bool shuffle_;
  BatchLayout layout_;
  int half_bits_ = 0;  // the Feistel domain is 2^(2*half_bits_) >= num_windows_
  uint64_t consumed_ = 0;
  int micro_step_ = 0;
};

}  // namespace drover::engine
