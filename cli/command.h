// Subcommand registry for the `drover` CLI.
//
// Each subcommand lives in its own cli/<name>.cc and registers itself at static-init time
// with DROVER_REGISTER_COMMAND. The `drover` executable compiles every cli/*.cc directly
// (not through a static library) so that no registration is dropped by the linker.
//
// A command's Setup adds its options to `app` and returns the function to run after
// parsing. Exit codes: 0 success, 1 runtime failure, 2 usage or invalid input.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "common/exit_codes.h"
#include "common/tls.h"

namespace CLI {
class App;
}

namespace drover::cli {

struct GlobalOptions {
  std::string coordinator;  // --coordinator, else $DROVER_COORDINATOR, else 127.0.0.1:7600
  bool json = false;        // --json where a command supports it
  // --retry-for: how long calls that are safe to repeat keep retrying an unreachable
  // coordinator (cli/retry.h), in seconds.
  double retry_for_s = 15;
  // --tls-ca (and, when the coordinator should see one, --tls-cert/--tls-key): TLS to the
  // coordinator. --token-file, else $DROVER_TOKEN: the bearer token JobService calls send.
  TlsFiles tls_files;
  std::string token_file;
  // What those name, filled in by ResolveCredentials (cli/rpc_client.h) before a command runs.
  TlsCredentials tls;
  std::string token;
};

inline constexpr char kDroverVersion[] = "0.1.0";

using CommandRun = std::function<int()>;
using CommandSetup = std::function<CommandRun(CLI::App* app, GlobalOptions* globals)>;

struct CommandDef {
  std::string name;
  std::string help;
  CommandSetup setup;
};

bool RegisterCommand(CommandDef def);
const std::vector<CommandDef>& RegisteredCommands();

}  // namespace drover::cli

#define DROVER_CLI_CONCAT_INNER(a, b) a##b
#define DROVER_CLI_CONCAT(a, b) DROVER_CLI_CONCAT_INNER(a, b)
// DROVER_REGISTER_COMMAND("submit", "Submit a job spec", [](CLI::App* app, GlobalOptions* g)
//     -> CommandRun { ...; return [=] { return 0; }; });
#define DROVER_REGISTER_COMMAND(name, help, setup)                           \
  static const bool DROVER_CLI_CONCAT(kDroverCommandRegistered_, __LINE__) = \
      ::drover::cli::RegisterCommand({name, help, setup})
