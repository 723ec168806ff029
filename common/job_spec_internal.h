// Internals shared by job_spec.cc (decoding) and job_spec_validate.cc (rules). Not for use
// outside common/job_spec*.cc.
#pragma once

#include <map>
#include <set>
#include <string>

#include "common/job_spec.h"
#include "common/status.h"

namespace drover::spec_internal {

// Where each field's value came from, so that an error can point at it.
class SourceMap {
 public:
  void SetLine(const std::string& path, int line) {
    if (line > 0) lines_[path] = line;
  }
  void MarkOverride(const std::string& path) { overrides_.insert(path); }

  // " (line 12)", " (from --set)", or "" for a value nobody wrote (a default).
  std::string Where(const std::string& path) const;

 private:
  std::map<std::string, int> lines_;
  std::set<std::string> overrides_;
};

// JobSpec::Validate, with the source of each field for the messages.
Status ValidateSpec(const JobSpec& spec, const SourceMap& sources);

}  // namespace drover::spec_internal
