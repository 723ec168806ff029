// A reader of deploy/Dockerfile for the deploy tests: the instructions with their
// continuation lines joined, grouped by build stage. Enough of the Dockerfile grammar for
// drover's file (no parser directives, no heredocs); what it does not know it keeps as text.
#pragma once

#include <algorithm>
#include <cctype>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace drover::testing {

struct DockerInstruction {
  std::string keyword;  // upper case: FROM, RUN, COPY, ...
  std::string args;     // the rest, continuation lines joined with spaces
  int line = 0;         // where it starts (1-based)
};

struct DockerStage {
  std::string image;                            // FROM's image
  std::string name;                             // the AS name, or empty
  std::vector<DockerInstruction> instructions;  // the FROM line first
};

inline std::vector<std::string> SplitWords(const std::string& s) {
  std::istringstream in(s);
  std::vector<std::string> words;
  for (std::string w; in >> w;) words.push_back(w);
  return words;
}

inline std::vector<DockerStage> ReadDockerfile(const std::string& path) {
  std::ifstream in(path);
  std::vector<DockerStage> stages;
  std::string line, pending;
  int n = 0, start = 0;
  while (std::getline(in, line)) {
    ++n;
    const size_t first = line.find_first_not_of(" \t");
    if (first == std::string::npos || line[first] == '#') continue;  // also inside a RUN
    if (pending.empty()) start = n;
    const bool continued = !line.empty() && line.back() == '\\';
    if (!pending.empty()) pending += ' ';
    pending.append(line, first, line.size() - first - (continued ? 1 : 0));
    if (continued) continue;
    const std::vector<std::string> words = SplitWords(pending);
    DockerInstruction ins;
    for (char c : words[0]) ins.keyword += static_cast<char>(std::toupper(c));
    ins.args = pending.substr(std::min(pending.size(), words[0].size() + 1));
    ins.line = start;
    if (ins.keyword == "FROM") {
      DockerStage stage;
      stage.image = words.size() > 1 ? words[1] : "";
      if (words.size() > 3) stage.name = words[3];
      stages.push_back(stage);
    }
    if (!stages.empty()) stages.back().instructions.push_back(ins);
    pending.clear();
  }
  return stages;
}

// The programs the image's last stage copies into /usr/local/bin: the base names of
// `COPY --from=... SRC... /usr/local/bin/`.
inline std::set<std::string> ImageBinaries(const std::vector<DockerStage>& stages) {
  std::set<std::string> bins;
  if (stages.empty()) return bins;
  for (const DockerInstruction& ins : stages.back().instructions) {
    if (ins.keyword != "COPY") continue;
    std::vector<std::string> w = SplitWords(ins.args);
    if (w.empty() || w.back() != "/usr/local/bin/") continue;
    for (size_t i = 0; i + 1 < w.size(); ++i) {
      if (w[i].rfind("--", 0) == 0) continue;
      bins.insert(w[i].substr(w[i].find_last_of('/') + 1));
    }
  }
  return bins;
}

}  // namespace drover::testing
