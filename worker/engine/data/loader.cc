#include "worker/engine/data/loader.h"

#include <algorithm>
#include <chrono>
#include <string>

namespace drover::engine {

StatusOr<std::unique_ptr<DataLoader>> DataLoader::Create(
    std::shared_ptr<const TokenDataset> dataset, const DataLoaderOptions& options,
    const SamplerState& start) {
  DROVER_CHECK(dataset != nullptr);
  RETURN_IF_ERROR(options.layout.Validate());
  if (options.prefetch < 1 || options.prefetch > 16) {
    return InvalidArgumentError("data loader prefetch = " + std::to_string(options.prefetch) +
                                "; must be in [1, 16]");
  }
  std::unique_ptr<DataLoader> loader(new DataLoader(std::move(dataset), options));
  {
    MutexLock lock(&loader->mu_);  // no other thread yet; the analysis asks for it all the same
    RETURN_IF_ERROR(loader->sampler_.Restore(start));
    loader->handed_out_ = loader->sampler_.state();
  }
  loader->StartThread();
  return loader;
}

DataLoader::DataLoader(std::shared_ptr<const TokenDataset> dataset,
                       const DataLoaderOptions& options)
    : dataset_(std::move(dataset)),
      options_(options),
      sampler_(dataset_->num_windows(), options.seed, options.shuffle, options.layout) {}

DataLoader::~DataLoader() { StopThread(); }

void DataLoader::StartThread() {
  {
    MutexLock lock(&mu_);
    stop_ = false;
  }
  thread_ = std::thread([this] { Run(); });
}

void DataLoader::StopThread() {
  {
    MutexLock lock(&mu_);
    stop_ = true;
  }
  cv_.SignalAll();
  if (thread_.joinable()) thread_.join();
}

std::vector<uint64_t> DataLoader::Reserve(SamplerState* after) {
  ++next_ticket_;
  std::vector<uint64_t> windows = sampler_.NextMicroBatch();
  *after = sampler_.state();
  return windows;
}

Status DataLoader::Assemble(const std::vector<uint64_t>& windows, int32_t* inputs,
                            int32_t* targets) const {
  const size_t T = static_cast<size_t>(dataset_->seq_len());
  for (size_t b = 0; b < windows.size(); ++b) {
    size_t shard = 0;
    uint64_t first = 0;
    dataset_->WindowStart(windows[b], &shard, &first);
    RETURN_IF_ERROR(dataset_->CheckTokens(shard, first, T + 1, options_.vocab_size));
    dataset_->ReadWindow(windows[b], inputs + b * T, targets + b * T);
  }
  return OkStatus();
}

void DataLoader::Run() {
  const size_t n = size_t(options_.layout.micro_batch) * size_t(dataset_->seq_len());
  while (true) {
    uint64_t ticket = 0;
    Batch batch;
    std::vector<uint64_t> windows;
    {
      MutexLock lock(&mu_);
      cv_.Wait(&mu_, [this]() REQUIRES(mu_) {
        return stop_ || next_ticket_ - next_hand_ < uint64_t(options_.prefetch);
      });
      if (stop_) return;
      ticket = next_ticket_;
      windows = Reserve(&batch.after);
    }
    // Assemble outside the lock: page faults on the mapping may take a while, and the
    // training thread must be able to pop a ready batch meanwhile.
    batch.inputs.resize(n);
    batch.targets.resize(n);
    batch.status = Assemble(windows, batch.inputs.data(), batch.targets.data());
    {
      MutexLock lock(&mu_);
      ready_.emplace(ticket, std::move(batch));
    }
    cv_.SignalAll();
  }
}

Status DataLoader::Next(int32_t* inputs, int32_t* targets) {
  const auto t0 = std::chrono::steady_clock::now();
  Status status;
  {
    MutexLock lock(&mu_);
    while (true) {
      auto it = ready_.find(next_hand_);
      if (it != ready_.end()) {
        std::copy(it->second.inputs.begin(), it->second.inputs.end(), inputs);
        std::copy(it->second.targets.begin(), it->second.targets.end(), targets);
        handed_out_ = it->second.after;
        status = it->second.status;
        ready_.erase(it);
        break;
      }
      if (next_ticket_ == next_hand_) {
        // Not even reserved: the prefetch thread is behind. Do it here.
        SamplerState after;
        const std::vector<uint64_t> windows = Reserve(&after);
        lock.Unlock();
        status = Assemble(windows, inputs, targets);
        lock.Lock();
        handed_out_ = after;
        break;
      }
      cv_.Wait(&mu_);  // reserved by the prefetch thread and being assembled
    }
    ++next_hand_;
  }
  cv_.SignalAll();  // room in the queue: wake the prefetch thread
  last_wait_s_ = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  total_wait_s_ += last_wait_s_;
  ++batches_;
  return status;
}

SamplerState DataLoader::state() const {
  MutexLock lock(&mu_);
  return handed_out_;
}

Status DataLoader::SkipTo(uint64_t consumed_samples) {
  SamplerState s;
  {
    MutexLock lock(&mu_);
    const uint64_t n = sampler_.num_windows();
    s.epoch = consumed_samples / n;
    s.offset = consumed_samples % n;
  }
  s.consumed_samples = consumed_samples;
  return Restore(s);
}

Status DataLoader::Restore(const SamplerState& state) {
  StopThread();
  Status status;
  {
    MutexLock lock(&mu_);
    ready_.clear();
    next_ticket_ = next_hand_ = 0;
    status = sampler_.Restore(state);
    // On failure the loader continues from where it stood, with nothing prefetched.
    if (status.ok()) {
      handed_out_ = state;
    } else {
      DROVER_CHECK_OK(sampler_.Restore(handed_out_));
    }
  }
  StartThread();
  return status;
}

StatusOr<std::unique_ptr<EvalLoader>> EvalLoader::Create(
    std::shared_ptr<const TokenDataset> dataset, int B, int T, int vocab_size) {
  DROVER_CHECK(dataset != nullptr);
  if (B < 1 || T < 1) {
    return InvalidArgumentError("eval batch " + std::to_string(B) + " x seq " + std::to_string(T) +
                                ": both must be >= 1");
  }
  std::unique_ptr<EvalLoader> loader(new EvalLoader(std::move(dataset), B, T, vocab_size));
  const uint64_t chunk = uint64_t(B) * uint64_t(T);
  uint64_t largest = 0;
  for (size_t s = 0; s < loader->dataset_->num_shards(); ++s) {
    const uint64_t count = loader->dataset_->shard_tokens(s);
    largest = std::max(largest, count);
    loader->first_batch_.push_back(loader->num_batches_);
    // Chunks of B*T + 1 tokens starting at 0, B*T, 2*B*T, ... that fit in the shard.
    if (count >= 1) loader->num_batches_ += static_cast<int64_t>((count - 1) / chunk);
  }
  if (loader->num_batches_ == 0) {
    return InvalidArgumentError("eval data holds no batch of " + std::to_string(B) + " x " +
                                std::to_string(T) + ": a batch needs " + std::to_string(chunk + 1) +
                                " consecutive tokens, the largest shard has " +
                                std::to_string(largest));
  }
  return loader;
}

Status EvalLoader::Batch(int64_t i, int32_t* inputs, int32_t* targets) const {
  DROVER_CHECK(i >= 0 && i < num_batches_);
  // The last shard whose first batch is <= i; empty shards share their successor's index.
  const auto it = std::upper_bound(first_batch_.begin(), first_batch_.end(), i) - 1;
  const auto s = static_cast<size_t>(it - first_batch_.begin());
  const uint64_t chunk = uint64_t(B_) * uint64_t(T_);
  const uint64_t first = uint64_t(i - *it) * chunk;
  RETURN_IF_ERROR(dataset_->CheckTokens(s, first, chunk + 1, vocab_size_));
  const uint16_t* tok = dataset_->shard_data(s) + first;
  for (uint64_t k = 0; k < chunk; ++k) {
    inputs[k] = tok[k];
    targets[k] = tok[k + 1];
  }
  return OkStatus();
}

}  // namespace drover::engine
