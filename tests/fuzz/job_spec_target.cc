#include <cstdio>
#include <cstdlib>
#include <string>

#include "common/job_spec.h"
#include "tests/fuzz/targets.h"

namespace drover::fuzz {

int FuzzJobSpec(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  StatusOr<JobSpec> spec = ParseJobSpec(text);
  if (!spec.ok()) return 0;
  (void)spec->FeasibleWorldSizes();
  // The coordinator stores specs and trainers re-read them: what was accepted once must
  // serialize to YAML that is accepted again.
  const std::string yaml = JobSpecToYaml(*spec);
  StatusOr<JobSpec> again = ParseJobSpec(yaml);
  if (!again.ok()) {
    std::fprintf(stderr, "accepted spec does not round-trip: %s\n%s\n",
                 again.status().ToString().c_str(), yaml.c_str());
    std::abort();
  }
  return 0;
}

}  // namespace drover::fuzz
