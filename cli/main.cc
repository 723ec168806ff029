// drover: the command-line interface. Subcommands register themselves (cli/command.h).
#include <CLI/CLI.hpp>
#include <algorithm>
#include <cstdlib>
#include <iostream>
#include <map>

#include "cli/command.h"
#include "cli/rpc_client.h"
#include "cli/suggest.h"
#include "common/logging.h"

namespace drover::cli {

namespace {
std::vector<CommandDef>& Registry() {
  static std::vector<CommandDef> commands;
  return commands;
}
}  // namespace

bool RegisterCommand(CommandDef def) {
  Registry().push_back(std::move(def));
  return true;
}

const std::vector<CommandDef>& RegisteredCommands() { return Registry(); }

}  // namespace drover::cli

int main(int argc, char** argv) {
  using namespace drover::cli;
  using drover::kExitOk, drover::kExitUsage;
  CLI::App app{"drover: train GPT-style models across machines and keep them training"};
  app.require_subcommand(1);
  GlobalOptions globals;
  const char* env = std::getenv("DROVER_COORDINATOR");
  globals.coordinator = env != nullptr && *env != '\0' ? env : "127.0.0.1:7600";
  app.add_option("--coordinator", globals.coordinator,
                 "coordinator address (default $DROVER_COORDINATOR or 127.0.0.1:7600)");
  app.add_option("--retry-for", globals.retry_for_s,
                 "seconds to keep retrying a coordinator that cannot be reached, for calls "
                 "that are safe to repeat (0: fail at once)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  app.add_option("--tls-ca", globals.tls_files.ca,
                 "PEM certificate of the cluster CA: dial the coordinator with TLS and check "
                 "its certificate against it");
  app.add_option("--tls-cert", globals.tls_files.cert,
                 "PEM client certificate to present (optional; with --tls-key)");
  app.add_option("--tls-key", globals.tls_files.key, "PEM private key of --tls-cert");
  app.add_option("--token-file", globals.token_file,
                 "file holding the bearer token sent to the coordinator (default: "
                 "$DROVER_TOKEN)");

  std::vector<CommandDef> commands = RegisteredCommands();
  std::sort(commands.begin(), commands.end(),
            [](const CommandDef& a, const CommandDef& b) { return a.name < b.name; });
  std::map<CLI::App*, CommandRun> runs;
  for (const CommandDef& def : commands) {
    CLI::App* sub = app.add_subcommand(def.name, def.help);
    runs[sub] = def.setup(sub, &globals);
  }
  app.set_version_flag("--version", std::string("drover ") + kDroverVersion);
  // A mistyped command gets the nearest one, not CLI11's "A subcommand is required".
  std::vector<std::string> names;
  for (const CommandDef& def : commands) names.push_back(def.name);
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--coordinator" || arg == "--retry-for" || arg == "--tls-ca" ||
        arg == "--tls-cert" || arg == "--tls-key" || arg == "--token-file") {
      ++i;
      continue;
    }
    if (arg.empty() || arg[0] == '-') continue;
    if (std::find(names.begin(), names.end(), arg) != names.end()) break;
    const std::string near = NearestName(arg, names);
    std::cerr << "drover: '" << arg << "' is not a drover command"
              << (near.empty() ? "" : "; did you mean '" + near + "'?")
              << " (drover --help lists them)\n";
    return kExitUsage;
  }
  // On stderr, as every drover program logs: what the engine's readers log (a broken
  // checkpoint skipped for an older one) must never mix into the output of sample or eval.
  (void)drover::InitLogging("drover");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? kExitOk : kExitUsage;
  }
  if (drover::Status st = ResolveCredentials(&globals); !st.ok()) return ReportError(st);
  for (auto& [sub, run] : runs) {
    if (sub->parsed()) return run();
  }
  return kExitUsage;
}
