#include "worker/engine/parallel/zero_sharded.h"

#include <algorithm>

namespace drover::engine::parallel {

std::shared_ptr<Buffer> ShardedMemory::Pool::TakeFree(size_t n) {
  MutexLock lock(&mu_);
  for (size_t i = 0; i < free_.size(); ++i) {
    if (free_[i]->size() == n) {
      std::shared_ptr<Buffer> b = std::move(free_[i]);
      free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
      return b;
    }
  }
  return nullptr;
}

std::shared_ptr<Buffer> ShardedMemory::Pool::Allocate(size_t n) {
  {
    MutexLock lock(&mu_);
    held_ += n;
    high_water_ = std::max(high_water_, held_);
  }
  return std::make_shared<Buffer>(ops_->Allocate(n));
}

void ShardedMemory::Pool::Give(std::shared_ptr<Buffer> b) {
  MutexLock lock(&mu_);
  free_.push_back(std::move(b));
}

size_t ShardedMemory::Pool::high_water() const {
  MutexLock lock(&mu_);
  return high_water_;
}

ShardedMemory::ShardedMemory(const GptLayout* layout, Ops* ops, Communicator* dp,
                             Communicator* replica, int zero_stage)
    : layout_(layout),
      ops_(ops),
      dp_(dp),
      replica_(replica),
      zero_stage_(zero_stage),
      tied_ready_after_head_(TiedUnitReadyAfterHeadOn(ops)),
      marks_(dp->MarkCompute() != nullptr),
      partition_(layout->num_params(), dp->size()),
      shares_(replica, partition_.begin(dp->rank()), partition_.end(dp->rank())),
      params_(ops->Allocate(zero_stage == 3
                                ? partition_.end(dp->rank()) - partition_.begin(dp->rank())
                                : layout->num_params())),
      owned_grads_(ops->Allocate(partition_.end(dp->rank()) - partition_.begin(dp->rank()))),
      pool_(ops),
      param_slots_(layout->units().size()),
      grad_slots_(layout->units().size()),
      stream_("zero-" + std::to_string(zero_stage) + " dp", ops) {
  DROVER_CHECK(zero_stage == 2 || zero_stage == 3);
}

ShardedMemory::~ShardedMemory() { (void)stream_.WaitAll(); }

float* ShardedMemory::owned_params() {
  return zero_stage_ == 3 ? params_.data() : params_.data() + owned_begin();
}

StatusOr<std::shared_ptr<Buffer>> ShardedMemory::TakeBuffer(size_t n) {
  while (true) {
    if (std::shared_ptr<Buffer> b = pool_.TakeFree(n)) return b;
    if (!warm_ || grads_in_flight_.empty()) return pool_.Allocate(n);
    // Its buffer is back in the pool once the work is done (GradsReady's Give).
    RETURN_IF_ERROR(stream_.Wait(grads_in_flight_.front()));
    grads_in_flight_.pop_front();
  }
}

Status ShardedMemory::StartGather(int unit) {
  ParamSlot& slot = param_slots_[unit];
  if (slot.buffer != nullptr) return OkStatus();  // resident, or its gather is queued
  const Unit& u = layout_->units()[unit];
  ASSIGN_OR_RETURN(slot.buffer, TakeBuffer(u.numel));
  float* data = slot.buffer->data();
  const size_t lo = std::max(u.offset, owned_begin());
  const size_t hi = std::min(u.offset + u.numel, owned_end());
  const float* own = hi > lo ? params_.data() + owned_offset(lo) : nullptr;
  const size_t dst = lo - std::min(lo, u.offset), n = hi > lo ? hi - lo : 0;
  std::shared_ptr<const ComputeMark> mark;
  if (marks_) {
    if (n > 0) ops_->Copy(data + dst, own, n);
    mark = dp_->MarkCompute();
  }
  slot.ready = stream_.Submit([this, data, own, dst, n, mark = std::move(mark),
                               counts = partition_.Counts(u.offset, u.offset + u.numel)] {
    if (!marks_ && n > 0) ops_->Copy(data + dst, own, n);
    dp_->FollowMark(mark);
    return dp_->AllGather(data, counts, DataType::kFloat32);
  });
  return OkStatus();
}

StatusOr<const float*> ShardedMemory::AcquireParams(int unit) {
  if (zero_stage_ == 2) {
    return static_cast<const float*>(params_.data() + layout_->units()[unit].offset);
  }
  RETURN_IF_ERROR(StartGather(unit));
  ParamSlot& slot = param_slots_[unit];
  if (slot.refs == 0) RETURN_IF_ERROR(stream_.Wait(slot.ready));
  ++slot.refs;
  return static_cast<const float*>(slot.buffer->data());
}

Status ShardedMemory::ReleaseParams(int unit) {
  if (zero_stage_ == 2) return OkStatus();
  ParamSlot& slot = param_slots_[unit];
  DROVER_CHECK_MSG(slot.refs > 0, "ReleaseParams without AcquireParams");
  if (--slot.refs == 0) pool_.Give(std::move(slot.buffer));
  return OkStatus();
}

void ShardedMemory::PrefetchParams(int unit) {
  // A hint: a failure shows again at the unit's acquisition (the stream's errors stick).
  if (zero_stage_ == 3) (void)StartGather(unit);
}

StatusOr<float*> ShardedMemory::AcquireGrads(int unit, bool* accumulate) {
  std::shared_ptr<Buffer>& slot = grad_slots_[unit];
  if (slot != nullptr) {
    *accumulate = true;
    return slot->data();
  }
  // Bound the transient memory: wait for the oldest reduction rather than allocate more.
  while (static_cast<int>(grads_in_flight_.size()) >= kMaxGradsInFlight) {
    RETURN_IF_ERROR(stream_.Wait(grads_in_flight_.front()));
    grads_in_flight_.pop_front();
  }
  ASSIGN_OR_RETURN(slot, TakeBuffer(layout_->units()[unit].numel));
  *accumulate = false;
  return slot->data();
}

Status ShardedMemory::GradsReady(int unit) {
  std::shared_ptr<Buffer> buffer = std::move(grad_slots_[unit]);
  DROVER_CHECK_MSG(buffer != nullptr, "GradsReady without AcquireGrads");
  const Unit& u = layout_->units()[unit];
  const size_t lo = std::max(u.offset, owned_begin());
  const size_t hi = std::min(u.offset + u.numel, owned_end());
  float* own = hi > lo ? owned_grads_.data() + owned_offset(lo) : nullptr;
  // After the unit's gradient kernels, not the rest of backward (communicator.h, MarkCompute).
  std::shared_ptr<const ComputeMark> mark = dp_->MarkCompute();
  // The tied unit made ready before its rows (AddEmbeddingGrads) is averaged after them.
  const bool rows_follow = RowsFollowReady(*layout_, tied_ready_after_head_, unit);
  grads_in_flight_.push_back(stream_.Submit(
      [this, buffer, own, src = lo - std::min(lo, u.offset), n = hi > lo ? hi - lo : 0,
       counts = partition_.Counts(u.offset, u.offset + u.numel), mark = std::move(mark),
       last = last_micro_batch_ && !rows_follow]() mutable {
        dp_->FollowMark(mark);
        Status st =
            dp_->ReduceScatter(buffer->data(), counts, DataType::kFloat32, ReduceOp::kAverage);
        if (st.ok() && n > 0) ops_->Add(own, buffer->data() + src, n);
        pool_.Give(std::move(buffer));
        if (st.ok()) st = AverageOverReplicas(own, n, last);
        return st;
      }));
  return OkStatus();
}

Status ShardedMemory::AverageOverReplicas(float* own, size_t n, bool last) {
  // Every replica holds the same shard, so all skip (or make) the same calls.
  if (replica_ == nullptr || !last || n == 0) return OkStatus();
  return replica_->AllReduce(own, n, DataType::kFloat32, ReduceOp::kAverage);
}

Status ShardedMemory::AddEmbeddingGrads(int unit, const int32_t* inputs, const float* dout, int B,
                                        int T) {
  const int C = layout_->config().channels;
  const Unit& u = layout_->units()[unit];
  if (grad_slots_[unit] != nullptr) {  // not reduced yet: into the transient gradient
    float* g = grad_slots_[unit]->data();
    ops_->EncoderBackward(g, g + layout_->wpe_offset(), dout, inputs, B, T, C);
    return OkStatus();
  }
  // Reduced (and its buffer gone) already: every rank's rows, averaged, into the own shard.
  const int ranks = dp_->size();
  auto gathered = std::make_shared<std::vector<float>>();
  {
    std::vector<float> packed =
        PackEmbeddingRows(ops_, inputs, dout, B, T, C, 1.0f / static_cast<float>(ranks));
    gathered->resize(packed.size() * ranks);
    std::copy(packed.begin(), packed.end(), gathered->begin() + packed.size() * dp_->rank());
  }
  const size_t n = gathered->size() / ranks;
  const size_t lo = std::max(u.offset, owned_begin());
  const size_t hi = std::max(lo, std::min(u.offset + u.numel, owned_end()));
  stream_.Submit([this, gathered, n, B, T, C, lo, hi, offset = u.offset, last = last_micro_batch_] {
    RETURN_IF_ERROR(
        dp_->AllGather(gathered->data(), std::vector<size_t>(dp_->size(), n), DataType::kFloat32));
    for (int r = 0; r < dp_->size() && hi > lo; ++r) {
      AddEmbeddingRows(ops_, gathered->data() + n * r, B, T, C, layout_->wpe_offset(),
                       owned_grads_.data() + owned_offset(lo), lo - offset, hi - offset,
                       &rows_scratch_);
    }
    return AverageOverReplicas(owned_grads_.data() + owned_offset(lo), hi - lo, last);
  });
  return OkStatus();
}

void ShardedMemory::BeginStep() {
  ops_->Fill(owned_grads_.data(), 0.0f, owned_grads_.size());
  stream_.ResetTimes();
}

Status ShardedMemory::FinishGradients(const std::function<Status(float* grads)>& sync_deferred) {
  DROVER_CHECK_MSG(!sync_deferred, "ZeRO-2/3 has no deferred units (no pipelines)");
  grads_in_flight_.clear();
  RETURN_IF_ERROR(stream_.WaitAll());
  warm_ = true;
  for (size_t u = 0; u < param_slots_.size(); ++u) {
    DROVER_CHECK_MSG(param_slots_[u].refs == 0, "a unit's parameters outlived the step");
    DROVER_CHECK_MSG(grad_slots_[u] == nullptr, "a unit's gradient was never made ready");
  }
  return OkStatus();
}

size_t ShardedMemory::share_begin() const { return shares_.begin(); }

size_t ShardedMemory::share_end() const { return shares_.end(); }

Status ShardedMemory::GatherShares(float* whole) {
  // The replicas' shares make this rank's owned range; the shard group's owned ranges the rest.
  shares_.SubmitGather(&stream_, whole);
  return GatherOwned(whole);
}

Status ShardedMemory::PublishParams() {
  if (zero_stage_ == 3) return OkStatus();  // gathered at the next use
  stream_.Submit([this, counts = partition_.Counts(0, partition_.n)] {
    return dp_->AllGather(params_.data(), counts, DataType::kFloat32);
  });
  return stream_.WaitAll();
}

Status ShardedMemory::ExportParams(float* local) {
  if (zero_stage_ == 2) {
    ops_->ToHost(local, params_.data(), layout_->num_params());
    return OkStatus();
  }
  ops_->ToHost(local + owned_begin(), params_.data(), owned_end() - owned_begin());
  return GatherOwned(local);
}

Status ShardedMemory::GatherOwned(float* whole) {
  stream_.Submit([this, whole, counts = partition_.Counts(0, partition_.n)] {
    return dp_->AllGather(whole, counts, DataType::kFloat32);
  });
  return stream_.WaitAll();
}

void ShardedMemory::ImportParams(const float* local) {
  if (zero_stage_ == 2) {
    ops_->FromHost(params_.data(), local, layout_->num_params());
  } else {
    ops_->FromHost(params_.data(), local + owned_begin(), owned_end() - owned_begin());
  }
}

}  // namespace drover::engine::parallel
