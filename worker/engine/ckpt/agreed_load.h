// LoadAgreedCheckpoint: the ranks of a job resume from one checkpoint, read by all of them
// at once, each only its part of it.
//
// Rank 0 picks the newest checkpoint whose shape is sound without reading any shard
// (CheckCheckpointShape) and announces it through the attempt's store; every rank then
// reads and verifies the shard files that hold what it needs (ReadCheckpointPart: sizes and
// CRC32C, files in parallel) and reports; rank 0 collects the reports and announces the
// verdict. If some rank found the checkpoint broken, every rank drops it and rank 0 picks
// the next one, so a corrupt checkpoint costs a round, never a crash or ranks that disagree.
// If some rank refused it (a checkpoint of another model), every rank returns that refusal.
// Start-up thus reads the checkpoint in parallel on every rank, each rank only the files
// that hold its part, instead of once on rank 0 and then again on the others.
//
// Store keys, under `key`: <key>/<round> (rank 0's choice), <key>/<round>/r<rank> (each
// rank's report), <key>/<round>/verdict. 3 x world_size operations per round.
#pragma once

#include <chrono>
#include <string>

#include "worker/engine/ckpt/checkpoint.h"
#include "worker/engine/parallel/kv_store.h"

namespace drover::engine::ckpt {

struct AgreedLoadOptions {
  std::string dir;  // the checkpoint directory (checkpoint.dir)
  int rank = 0;
  int world_size = 1;
  parallel::KvStore* store = nullptr;  // needed when world_size > 1
  std::string key;                     // unique per restore within one attempt
  std::chrono::milliseconds timeout{std::chrono::minutes(5)};  // for each wait on the store
  ReadProgressFn progress;  // optional: told how this rank's read of the chosen one goes
};

// What LoadLatestCheckpointPart returns for one process, on every rank: this rank's part of
// the checkpoint (and its directory in `path`), NotFound when `dir` holds no checkpoint,
// FailedPrecondition when checkpoints exist and none is usable (rank 0's message names each
// and why), want's refusal (InvalidArgument), or the store's error.
StatusOr<CheckpointPart> LoadAgreedCheckpoint(const AgreedLoadOptions& options,
                                              const PartRequestFn& want, std::string* path);

}  // namespace drover::engine::ckpt
