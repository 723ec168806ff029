#include "common/parallel_mesh.h"

namespace drover {
namespace {

std::string Num(int64_t v) { return std::to_string(v); }

}  // namespace

StatusOr<ParallelMesh> ParallelMesh::Create(const JobSpec& spec, int world_size) {
  const int64_t pp = spec.parallel.pp;
  const int64_t tp = spec.parallel.tp;
  const int64_t mb = spec.train.micro_batch;
  const std::string ws = std::to_string(world_size);
  if (world_size < 1) return InvalidArgumentError("world_size " + ws + " must be at least 1");
  if (pp < 1 || tp < 1 || mb < 1) {
    return InvalidArgumentError("parallel.pp (" + Num(pp) + "), parallel.tp (" + Num(tp) +
                                ") and train.micro_batch (" + Num(mb) + ") must be at least 1");
  }
  RETURN_IF_ERROR(StageLayers(spec.model.n_layer, static_cast<int>(pp), spec.parallel.pp_layers,
                              spec.parallel.Chunks())
                      .status());
  if (spec.model.n_head % tp != 0) {
    return InvalidArgumentError("model.n_head (" + Num(spec.model.n_head) +
                                ") is not divisible by tp (" + Num(tp) + ")");
  }
  int64_t dp = spec.parallel.dp;
  if (dp <= 0) {  // auto
    if (world_size % (pp * tp) != 0) {
      return InvalidArgumentError("world_size " + ws + " is not divisible by pp (" + Num(pp) +
                                  ") x tp (" + Num(tp) + ") = " + Num(pp * tp));
    }
    dp = world_size / (pp * tp);
  } else if (dp * pp * tp != world_size) {
    return InvalidArgumentError("dp (" + Num(dp) + ") x pp (" + Num(pp) + ") x tp (" + Num(tp) +
                                ") = " + Num(dp * pp * tp) + " does not equal world_size " + ws +
                                "; set parallel.dp to auto or to " + ws + " / (pp x tp)");
  }
  if (spec.train.global_batch % (dp * mb) != 0) {
    return InvalidArgumentError("train.global_batch (" + Num(spec.train.global_batch) +
                                ") is not divisible by dp (" + Num(dp) + ") x train.micro_batch (" +
                                Num(mb) + ") = " + Num(dp * mb) + " at world_size " + ws);
  }
  if (spec.parallel.zero_stage >= 2 && pp > 1) {
    return InvalidArgumentError("parallel.zero_stage " + Num(spec.parallel.zero_stage) +
                                " with pp (" + Num(pp) +
                                ") > 1: ZeRO-2/3 would reduce-scatter every stage's gradients "
                                "once per micro-batch; use zero_stage 0 or 1 with pipelines");
  }
  const int64_t dp_shard = spec.parallel.dp_shard > 0 ? spec.parallel.dp_shard : dp;
  if (dp % dp_shard != 0) {
    return InvalidArgumentError("dp (" + Num(dp) + ") at world_size " + ws +
                                " is not divisible by parallel.dp_shard (" + Num(dp_shard) +
                                "): hybrid sharding needs whole replicas of dp_shard ranks");
  }
  const int64_t micro_batches = spec.train.global_batch / (dp * mb);
  if (spec.parallel.Chunks() > 1 && pp < 2) {
    return InvalidArgumentError("parallel.pp_schedule interleaved needs pp (" + Num(pp) +
                                ") of at least 2");
  }
  if (spec.parallel.Chunks() > 1 && micro_batches % pp != 0) {
    return InvalidArgumentError(
        "the interleaved schedule needs the micro-batches per step, train.global_batch (" +
        Num(spec.train.global_batch) + ") / (dp (" + Num(dp) + ") x train.micro_batch (" + Num(mb) +
        ")) = " + Num(micro_batches) + " at world_size " + ws + ", to be a multiple of pp (" +
        Num(pp) + ")");
  }
  ParallelMesh mesh;
  mesh.dp_ = static_cast<int>(dp);
  mesh.pp_ = static_cast<int>(pp);
  mesh.tp_ = static_cast<int>(tp);
  mesh.zero_stage_ = spec.parallel.zero_stage;
  mesh.dp_shard_ = static_cast<int>(dp_shard);
  mesh.micro_batches_ = static_cast<int>(micro_batches);
  mesh.pp_chunks_ = spec.parallel.Chunks();
  mesh.pp_schedule_ = spec.parallel.pp_schedule;
  mesh.pp_layers_ = spec.parallel.pp_layers;
  return mesh;
}

StatusOr<std::vector<int>> StageLayers(int n_layer, int pp, const std::vector<int>& pp_layers,
                                       int chunks) {
  if (pp < 1) return InvalidArgumentError("pp (" + Num(pp) + ") must be at least 1");
  if (chunks < 1) return InvalidArgumentError("pp_chunks (" + Num(chunks) + ") must be at least 1");
  const int stages = pp * chunks;
  // "pp (2)", or "pp (2) x parallel.pp_chunks (2) = 4 virtual stages"
  const std::string what = chunks == 1 ? "pp (" + Num(pp) + ")"
                                       : "pp (" + Num(pp) + ") x parallel.pp_chunks (" +
                                             Num(chunks) + ") = " + Num(stages) + " virtual stages";
  if (pp_layers.empty()) {
    if (n_layer % stages != 0) {
      return InvalidArgumentError("model.n_layer (" + Num(n_layer) + ") is not divisible by " +
                                  what + "; give parallel.pp_layers for an uneven split");
    }
    return std::vector<int>(stages, n_layer / stages);
  }
  if (static_cast<int>(pp_layers.size()) != stages) {
    return InvalidArgumentError("parallel.pp_layers has " + Num(pp_layers.size()) +
                                " entries for " + what + "; give one per " +
                                (chunks == 1 ? "stage" : "virtual stage"));
  }
  int64_t sum = 0;
  for (int n : pp_layers) {
    if (n < 1) {
      return InvalidArgumentError("parallel.pp_layers has a stage of " + Num(n) +
                                  " layers; every stage needs at least 1");
    }
    sum += n;
  }
  if (sum != n_layer) {
    return InvalidArgumentError("parallel.pp_layers adds up to " + Num(sum) +
                                " layers, but model.n_layer is " + Num(n_layer));
  }
  return pp_layers;
}

ParallelMesh::Coord ParallelMesh::CoordOf(int rank) const {
  DROVER_CHECK(rank >= 0 && rank < world_size());
  Coord c;
  c.tp = rank % tp_;
  c.dp = (rank / tp_) % dp_;
  c.pp = rank / (tp_ * dp_);
  return c;
}

std::vector<int> ParallelMesh::DpGroup(int rank) const {
  Coord c = CoordOf(rank);
  std::vector<int> ranks;
  for (c.dp = 0; c.dp < dp_; ++c.dp) ranks.push_back(RankOf(c));
  return ranks;
}

std::vector<int> ParallelMesh::DpShardGroup(int rank) const {
  Coord c = CoordOf(rank);
  const int first = c.dp / dp_shard_ * dp_shard_;
  std::vector<int> ranks;
  for (c.dp = first; c.dp < first + dp_shard_; ++c.dp) ranks.push_back(RankOf(c));
  return ranks;
}

std::vector<int> ParallelMesh::DpReplicaGroup(int rank) const {
  Coord c = CoordOf(rank);
  std::vector<int> ranks;
  for (c.dp = c.dp % dp_shard_; c.dp < dp_; c.dp += dp_shard_) ranks.push_back(RankOf(c));
  return ranks;
}

std::vector<int> ParallelMesh::PpGroup(int rank) const {
  Coord c = CoordOf(rank);
  std::vector<int> ranks;
  for (c.pp = 0; c.pp < pp_; ++c.pp) ranks.push_back(RankOf(c));
  return ranks;
}

std::vector<int> ParallelMesh::TpGroup(int rank) const {
  Coord c = CoordOf(rank);
  std::vector<int> ranks;
  for (c.tp = 0; c.tp < tp_; ++c.tp) ranks.push_back(RankOf(c));
  return ranks;
}

std::string ParallelMesh::Describe() const {
  std::string s = "dp" + Num(dp_) + " x pp" + Num(pp_) + " x tp" + Num(tp_);
  if (zero_stage_ > 0) s += ", ZeRO-" + Num(zero_stage_);
  if (dp_replicas() > 1) {
    s += " in " + Num(dp_replicas()) + " replicas of dp" + Num(dp_shard_);
  }
  if (pp_ > 1) s += ", " + pp_schedule_;
  if (pp_chunks_ > 1) s += " x" + Num(pp_chunks_);
  if (!pp_layers_.empty()) {
    s += ", layers ";
    for (size_t i = 0; i < pp_layers_.size(); ++i) {
      if (i > 0) s += '+';
      s += Num(pp_layers_[i]);
    }
  }
  s +=
      ", " + Num(micro_batches_) + " micro-batch" + (micro_batches_ == 1 ? "" : "es") + " per step";
  return s;
}

}  // namespace drover
