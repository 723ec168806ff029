#include "worker/engine/parallel/data_parallel.h"

#include <algorithm>
#include <span>

namespace drover::engine::parallel {

DataParallelMemory::DataParallelMemory(const GptLayout* layout, Ops* ops, Communicator* dp,
                                       int zero_stage, size_t bucket_floats,
                                       std::vector<int> deferred, Communicator* replica)
    : layout_(layout),
      ops_(ops),
      dp_(dp),
      replica_(replica),
      zero_stage_(dp == nullptr ? 0 : zero_stage),
      tied_ready_after_head_(TiedUnitReadyAfterHeadOn(ops)),
      params_(ops->Allocate(layout->num_params())),
      grads_(ops->Allocate(layout->num_params())),
      flat_(layout, ops, params_.data(), grads_.data()),
      partition_(layout->num_params(), dp == nullptr ? 1 : dp->size()),
      shares_(replica, partition_.begin(dp == nullptr ? 0 : dp->rank()),
              partition_.end(dp == nullptr ? 0 : dp->rank())),
      deferred_(std::move(deferred)) {
  DROVER_CHECK(zero_stage == 0 || zero_stage == 1);
  DROVER_CHECK_MSG(replica == nullptr || (dp != nullptr && zero_stage == 1),
                   "hybrid sharding at stage 1 over a shard group only");
  if (dp_ == nullptr) return;
  std::vector<int> alone;
  if (layout->first_stage() && layout->head_unit() == layout->embedding_unit()) {
    alone.push_back(layout->embedding_unit());  // ready after the head, before every layer
  }
  buckets_ = PlanBuckets(layout->units(), bucket_floats, deferred_, alone);
  bucket_of_unit_.assign(layout->units().size(), -1);
  for (size_t b = 0; b < buckets_.size(); ++b) {
    for (int u : buckets_[b].units) bucket_of_unit_[u] = static_cast<int>(b);
  }
  pending_units_.resize(buckets_.size());
  stream_ = std::make_unique<CommStream>("dp reduction", ops);
}

DataParallelMemory::~DataParallelMemory() {
  // Reductions in flight write into grads_: finish them before the arena goes.
  if (stream_ != nullptr) (void)stream_->WaitAll();
}

void DataParallelMemory::BeginStep() {
  flat_.ZeroGrad();
  for (size_t b = 0; b < buckets_.size(); ++b) {
    pending_units_[b] = static_cast<int>(buckets_[b].units.size());
  }
  if (stream_ != nullptr) stream_->ResetTimes();
}

void DataParallelMemory::Reduce(size_t begin, size_t end, bool rows_follow) {
  float* data = grads_.data() + begin;
  // Marked here, after the bucket's gradient kernels were enqueued: on a GPU the reduction
  // follows them, not the rest of backward enqueued by the time the stream's thread makes
  // the call (communicator.h, MarkCompute).
  std::shared_ptr<const ComputeMark> mark = dp_->MarkCompute();
  if (zero_stage_ == 0) {
    stream_->Submit([this, data, n = end - begin, mark = std::move(mark)] {
      dp_->FollowMark(mark);
      return dp_->AllReduce(data, n, DataType::kFloat32, ReduceOp::kAverage);
    });
  } else {
    stream_->Submit([this, data, counts = partition_.Counts(begin, end), mark = std::move(mark),
                     begin, end, average = replica_ != nullptr && !rows_follow] {
      dp_->FollowMark(mark);
      RETURN_IF_ERROR(dp_->ReduceScatter(data, counts, DataType::kFloat32, ReduceOp::kAverage));
      return average ? AverageOverReplicas(begin, end) : OkStatus();
    });
  }
}

Status DataParallelMemory::AverageOverReplicas(size_t lo, size_t hi) {
  // This rank's part of [lo, hi): what it owns. Every replica owns the same, so all skip
  // (or make) the same calls.
  lo = std::max(lo, owned_begin());
  hi = std::min(hi, owned_end());
  if (hi <= lo) return OkStatus();
  return replica_->AllReduce(grads_.data() + lo, hi - lo, DataType::kFloat32, ReduceOp::kAverage);
}

int DataParallelMemory::owned_replica() const {
  if (dp_ == nullptr) return 0;
  if (zero_stage_ == 0) return dp_->rank();
  return replica_ != nullptr ? replica_->rank() : 0;
}

Status DataParallelMemory::GradsReady(int unit) {
  if (dp_ == nullptr || !last_micro_batch_) return OkStatus();
  const int b = bucket_of_unit_[unit];
  if (b < 0) return OkStatus();  // deferred: FinishGradients reduces it
  if (--pending_units_[b] == 0) {
    // The tied unit made ready after the head, alone in its bucket: its rows follow.
    const bool rows_follow = RowsFollowReady(*layout_, tied_ready_after_head_, unit);
    Reduce(buckets_[b].begin, buckets_[b].end, rows_follow);
  }
  return OkStatus();
}

Status DataParallelMemory::AddEmbeddingGrads(int unit, const int32_t* inputs, const float* dout,
                                             int B, int T) {
  const int b = dp_ == nullptr ? -1 : bucket_of_unit_[unit];
  const bool reducing = b >= 0 && last_micro_batch_ && pending_units_[b] == 0;
  if (!reducing) return flat_.AddEmbeddingGrads(unit, inputs, dout, B, T);
  // The unit's reduction is under way: every rank's rows, averaged, go on top of it.
  const Unit& u = layout_->units()[unit];
  const int C = layout_->config().channels;
  const int ranks = dp_->size();
  const std::vector<float> packed =
      PackEmbeddingRows(ops_, inputs, dout, B, T, C, 1.0f / static_cast<float>(ranks));
  const size_t n = packed.size();
  auto gathered = std::make_shared<std::vector<float>>(n * ranks);
  std::copy(packed.begin(), packed.end(), gathered->begin() + n * dp_->rank());
  // Stage 1 keeps only its shard of the reduced gradient; stage 0 all of it.
  const size_t lo = std::max(u.offset, owned_begin());
  const size_t hi = std::max(lo, std::min(u.offset + u.numel, owned_end()));
  stream_->Submit([this, gathered, n, B, T, C, lo, hi, offset = u.offset] {
    RETURN_IF_ERROR(
        dp_->AllGather(gathered->data(), std::vector<size_t>(dp_->size(), n), DataType::kFloat32));
    for (int r = 0; r < dp_->size() && hi > lo; ++r) {
      AddEmbeddingRows(ops_, gathered->data() + n * r, B, T, C, layout_->wpe_offset(),
                       grads_.data() + lo, lo - offset, hi - offset, &rows_scratch_);
    }
    return replica_ != nullptr ? AverageOverReplicas(lo, hi) : OkStatus();
  });
  return OkStatus();
}

Status DataParallelMemory::FinishGradients(
    const std::function<Status(float* grads)>& sync_deferred) {
  // A unit the stage never touched this step still holds the promise of zeros.
  flat_.MaterializeZeros();
  if (dp_ == nullptr) {
    return sync_deferred ? sync_deferred(grads_.data()) : OkStatus();
  }
  for (size_t b = 0; b < buckets_.size(); ++b) {
    DROVER_CHECK_MSG(pending_units_[b] == 0, "a bucket's units were not all made ready");
  }
  if (sync_deferred) RETURN_IF_ERROR(sync_deferred(grads_.data()));
  for (int u : deferred_) {
    const Unit& unit = layout_->units()[u];
    Reduce(unit.offset, unit.offset + unit.numel);
  }
  return stream_->WaitAll();
}

size_t DataParallelMemory::owned_begin() const {
  return zero_stage_ == 0 ? 0 : partition_.begin(dp_->rank());
}

size_t DataParallelMemory::owned_end() const {
  return zero_stage_ == 0 ? layout_->num_params() : partition_.end(dp_->rank());
}

Status DataParallelMemory::PublishParams() {
  if (zero_stage_ == 0) return OkStatus();
  stream_->Submit([this, counts = partition_.Counts(0, partition_.n)] {
    return dp_->AllGather(params_.data(), counts, DataType::kFloat32);
  });
  return stream_->WaitAll();
}

Status DataParallelMemory::ExportParams(float* local) {
  ops_->ToHost(local, params_.data(), layout_->num_params());
  return OkStatus();
}

void DataParallelMemory::ImportParams(const float* local) {
  ops_->FromHost(params_.data(), local, layout_->num_params());
}

Status DataParallelMemory::GatherOwned(float* whole) {
  if (zero_stage_ == 0) return OkStatus();
  return GatherPartition(whole);
}

Status DataParallelMemory::GatherPartition(float* whole) {
  if (dp_ == nullptr || dp_->size() == 1) return OkStatus();
  stream_->Submit([this, whole, counts = partition_.Counts(0, partition_.n)] {
    return dp_->AllGather(whole, counts, DataType::kFloat32);
  });
  return stream_->WaitAll();
}

size_t DataParallelMemory::share_begin() const {
  if (replica_ != nullptr) return shares_.begin();
  return partition_.begin(dp_ != nullptr ? dp_->rank() : 0);
}

size_t DataParallelMemory::share_end() const {
  if (replica_ != nullptr) return shares_.end();
  return partition_.end(dp_ != nullptr ? dp_->rank() : 0);
}

Status DataParallelMemory::GatherShares(float* whole) {
  // The replicas' shares make this rank's owned range; the group's owned ranges the rest.
  if (stream_ != nullptr) shares_.SubmitGather(stream_.get(), whole);
  return GatherPartition(whole);
}

double DataParallelMemory::comm_busy_seconds() const {
  return stream_ == nullptr ? 0 : stream_->busy_seconds();
}

double DataParallelMemory::comm_overlapped_waits_seconds() const {
  return stream_ == nullptr ? 0 : stream_->overlapped_waits_seconds();
}

double DataParallelMemory::comm_blocked_seconds() const {
  return stream_ == nullptr ? 0 : stream_->blocked_seconds();
}

}  // namespace drover::engine::parallel
