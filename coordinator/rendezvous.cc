#include "coordinator/rendezvous.h"

#include <algorithm>
#include <charconv>
#include <chrono>

namespace drover::coordinator {

void RendezvousStore::OpenAttempt(const std::string& job_id, int64_t attempt) {
  {
    MutexLock lock(&mu_);
    Namespace& ns = jobs_[job_id];
    if (ns.attempt > attempt) return;  // never reopen an older attempt
    if (ns.attempt < attempt && (ns.attempt > 0 || attempt > 1)) {
      const int64_t now = clock_->NowMs();
      // When the earlier attempt's leases were last confirmed; a tenth more for a trainer
      // that found its lease current just before it lapsed, and then wrote.
      const int64_t earlier_until = ns.open || ns.attempt == 0 ? now : ns.served_until_ms;
      ns.leases_from_ms = earlier_until + lease_ms_ + lease_ms_ / 10;
    }
    ns.attempt = attempt;
    ns.open = true;
    ns.kv.clear();
  }
  changed_.SignalAll();
}

void RendezvousStore::CloseAttempt(const std::string& job_id, int64_t attempt) {
  {
    MutexLock lock(&mu_);
    auto it = jobs_.find(job_id);
    if (it == jobs_.end() || it->second.attempt != attempt) return;
    if (it->second.open) it->second.served_until_ms = clock_->NowMs();
    it->second.open = false;
    it->second.kv.clear();  // free the namespace; the attempt number stays as the fence
  }
  changed_.SignalAll();
}

StatusOr<RendezvousStore::Namespace*> RendezvousStore::Served(const std::string& job_id,
                                                              int64_t attempt) {
  auto it = jobs_.find(job_id);
  if (it == jobs_.end()) return NotFoundError("rendezvous: job " + job_id + " has no attempt");
  Namespace& ns = it->second;
  if (attempt != ns.attempt || !ns.open) {
    return FailedPreconditionError("rendezvous: attempt " + std::to_string(attempt) + " of job " +
                                   job_id + " is not the running attempt (current " +
                                   std::to_string(ns.attempt) + (ns.open ? ")" : ", ended)"));
  }
  return &ns;
}

Status RendezvousStore::Set(const std::string& job_id, int64_t attempt, const std::string& key,
                            std::string value) {
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Namespace * ns, Served(job_id, attempt));
    ns->kv[key] = std::move(value);
  }
  changed_.SignalAll();
  return OkStatus();
}

StatusOr<std::optional<std::string>> RendezvousStore::Get(const std::string& job_id,
                                                          int64_t attempt, const std::string& key) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Namespace * ns, Served(job_id, attempt));
  auto it = ns->kv.find(key);
  if (it == ns->kv.end()) return std::optional<std::string>();
  return std::optional<std::string>(it->second);
}

Status RendezvousStore::Wait(const std::string& job_id, int64_t attempt,
                             const std::vector<std::string>& keys, int64_t timeout_ms) {
  timeout_ms = std::clamp<int64_t>(timeout_ms, 0, kMaxWaitMs);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  MutexLock lock(&mu_);
  while (true) {
    ASSIGN_OR_RETURN(Namespace * ns, Served(job_id, attempt));
    std::string missing;
    for (const auto& k : keys) {
      if (!ns->kv.count(k)) missing += (missing.empty() ? "" : ", ") + k;
    }
    if (missing.empty()) return OkStatus();
    if (!changed_.WaitUntil(&mu_, deadline)) {
      // One last look: the wake-up and the deadline may have raced.
      ASSIGN_OR_RETURN(Namespace * again, Served(job_id, attempt));
      bool all = std::all_of(keys.begin(), keys.end(),
                             [&](const std::string& k) { return again->kv.count(k) > 0; });
      if (all) return OkStatus();
      return DeadlineExceededError("rendezvous: keys not set within " + std::to_string(timeout_ms) +
                                   " ms: " + missing);
    }
  }
}

StatusOr<int64_t> RendezvousStore::Add(const std::string& job_id, int64_t attempt,
                                       const std::string& key, int64_t delta) {
  int64_t value = 0;
  {
    MutexLock lock(&mu_);
    ASSIGN_OR_RETURN(Namespace * ns, Served(job_id, attempt));
    std::string& stored = ns->kv[key];
    if (!stored.empty()) {
      auto [ptr, ec] = std::from_chars(stored.data(), stored.data() + stored.size(), value);
      if (ec != std::errc() || ptr != stored.data() + stored.size()) {
        return InvalidArgumentError("rendezvous: key " + key + " does not hold an integer");
      }
    }
    value += delta;
    stored = std::to_string(value);
  }
  changed_.SignalAll();
  return value;
}

Status RendezvousStore::ConfirmLease(const std::string& job_id, int64_t attempt) {
  MutexLock lock(&mu_);
  ASSIGN_OR_RETURN(Namespace * ns, Served(job_id, attempt));
  const int64_t wait_ms = ns->leases_from_ms - clock_->NowMs();
  if (wait_ms > 0) {
    return UnavailableError("rendezvous: attempt " + std::to_string(attempt) + " of job " + job_id +
                            " may confirm its lease in " + std::to_string(wait_ms) +
                            " ms, once the earlier attempt's leases have lapsed");
  }
  return OkStatus();
}

}  // namespace drover::coordinator
