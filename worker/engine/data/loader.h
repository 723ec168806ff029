// Batches of int32 token ids for the training loop and for evaluation.
//
// DataLoader: a Sampler (sampler.h) over a TokenDataset, with a background thread that
// assembles up to `prefetch` micro-batches ahead into a bounded queue, so a training step
// does not wait on memory-mapped reads. Next() hands batches out in the sampler's order;
// state() is the sampler position after the last batch handed out (what a checkpoint
// saves), not after the ones still queued. Each batch is reserved (ticket + sampler
// advance) under the lock and assembled outside it; when Next() finds its batch neither
// ready nor reserved (the prefetch thread starved of CPU by busy compute threads), it
// reserves and assembles the batch itself rather than wait for the thread to be scheduled.
//
// EvalLoader: llm.c's sequential loader for validation and `drover eval`: batch i is the
// i-th chunk of B*T + 1 consecutive tokens, chunks advancing by B*T and moving to the next
// shard when a chunk no longer fits; inputs are the first B*T tokens, targets the last.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <thread>
#include <utility>
#include <vector>

#include "common/mutex.h"
#include "common/status.h"
#include "worker/engine/data/sampler.h"
#include "worker/engine/data/token_dataset.h"

namespace drover::engine {

struct DataLoaderOptions {
  BatchLayout layout;  // B = layout.micro_batch
  uint64_t seed = 1337;
  bool shuffle = true;
  int prefetch = 2;    // micro-batches assembled ahead, 1..16
  int vocab_size = 0;  // > 0: every batch's token ids are checked against it
};

class DataLoader {
 public:
  // Starts the prefetch thread at position `start`. InvalidArgument for a bad layout,
  // prefetch or start position.
  static StatusOr<std::unique_ptr<DataLoader>> Create(std::shared_ptr<const TokenDataset> dataset,
                                                      const DataLoaderOptions& options,
                                                      const SamplerState& start = {});

  // Stops and joins the prefetch thread.
  ~DataLoader();
  DataLoader(const DataLoader&) = delete;
  DataLoader& operator=(const DataLoader&) = delete;

  int batch_size() const { return options_.layout.micro_batch; }
  int seq_len() const { return dataset_->seq_len(); }

  // Fills inputs and targets, each (B, T) int32 row-major, with the next micro-batch;
  // blocks until it is ready. InvalidArgument (naming shard and position) when a token id
  // of the batch is not below options.vocab_size. Call from one thread (the training loop).
  Status Next(int32_t* inputs, int32_t* targets);

  // The sampler position after the last batch Next() returned.
  SamplerState state() const;

  // Drops prefetched batches and continues from `state` (see Sampler::Restore).
  Status Restore(const SamplerState& state);
  // Continues at the first micro-batch of the global batch that starts after
  // `consumed_samples` samples of the global stream (skipping data, or going back to it).
  Status SkipTo(uint64_t consumed_samples);

  // Time the caller spent blocked in Next(): in total, and in the last call.
  double total_wait_s() const { return total_wait_s_; }
  double last_wait_s() const { return last_wait_s_; }
  int64_t batches() const { return batches_; }

 private:
  struct Batch {
    std::vector<int32_t> inputs;
    std::vector<int32_t> targets;
    SamplerState after;  // sampler position once this batch is consumed
    Status status;       // a token out of the vocabulary
  };

  DataLoader(std::shared_ptr<const TokenDataset> dataset, const DataLoaderOptions& options);
  void StartThread();
  void StopThread();
  void Run();
  // Takes the next ticket and its windows from the sampler.
  std::vector<uint64_t> Reserve(SamplerState* after) REQUIRES(mu_);
  // Checks and copies the windows' tokens into (B, T) inputs and targets. No lock needed.
  Status Assemble(const std::vector<uint64_t>& windows, int32_t* inputs, int32_t* targets) const;

  std::shared_ptr<const TokenDataset> dataset_;
  DataLoaderOptions options_;

  mutable Mutex mu_;
  CondVar cv_;
  Sampler sampler_ GUARDED_BY(mu_);
  uint64_t next_ticket_ GUARDED_BY(mu_) = 0;         // next batch to reserve
  uint64_t next_hand_ GUARDED_BY(mu_) = 0;           // next batch Next() returns
  std::map<uint64_t, Batch> ready_ GUARDED_BY(mu_);  // assembled batches by ticket
  bool stop_ GUARDED_BY(mu_) = false;
  SamplerState handed_out_ GUARDED_BY(mu_);
  std::thread thread_;

  // Touched only by the caller of Next().
  double total_wait_s_ = 0;
  double last_wait_s_ = 0;
  int64_t batches_ = 0;
};

class EvalLoader {
 public:
  // Eval reads raw tokens, so T need not equal dataset->seq_len(). InvalidArgument if B or
  // T < 1, or if no shard holds a complete chunk of B*T + 1 tokens (the message says how
  // many tokens the largest shard has). vocab_size > 0: Batch checks token ids against it.
  static StatusOr<std::unique_ptr<EvalLoader>> Create(std::shared_ptr<const TokenDataset> dataset,
                                                      int B, int T, int vocab_size = 0);

  // Number of complete batches in the dataset (at most this many distinct batches).
  int64_t num_batches() const { return num_batches_; }

  // Fills inputs/targets (B, T) with batch i. CHECKs 0 <= i < num_batches(). Thread-safe.
  // InvalidArgument (naming shard and position) for a token id out of the vocabulary.
  Status Batch(int64_t i, int32_t* inputs, int32_t* targets) const;

 private:
  EvalLoader(std::shared_ptr<const TokenDataset> dataset, int B, int T, int vocab_size)
      : dataset_(std::move(dataset)), B_(B), T_(T), vocab_size_(vocab_size) {}

  std::shared_ptr<const TokenDataset> dataset_;
  int B_;
  int T_;
  int vocab_size_;
  std::vector<int64_t> first_batch_;  // per shard: global index of its first batch
  int64_t num_batches_ = 0;
};

}  // namespace drover::engine
