// drover-coordinator: one per cluster. Accepts jobs, schedules them onto worker slots,
// watches heartbeats and restarts jobs from checkpoints; state lives in --state-dir.
#include <signal.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>
#include <tuple>

#include "common/duration.h"
#include "common/logging.h"
#include "common/tls.h"
#include "coordinator/auth.h"
#include "coordinator/coordinator.h"
#include "coordinator/http_server.h"
#include "coordinator/server.h"
#include "coordinator/tokens.h"

int main(int argc, char** argv) {
  CLI::App app{"drover-coordinator: schedules and supervises drover training jobs"};
  drover::coordinator::CoordinatorOptions options;
  std::string listen = "127.0.0.1:7600";
  std::string log_level = "info";
  app.add_option("--listen", listen,
                 "host:port to serve on (another host than 127.0.0.1 "
                 "exposes the coordinator to the network)")
      ->capture_default_str();
  std::string advertise;
  app.add_option("--advertise", advertise,
                 "host:port trainers dial for rendezvous (default: the --listen address, or, "
                 "when it is a wildcard, the address each agent reaches the coordinator by)");
  app.add_option("--state-dir", options.state_dir, "durable state (state.db, logs/)")->required();
  app.add_option("--heartbeat-interval-ms", options.heartbeat_interval_ms,
                 "heartbeat period agents are told to use")
      ->check(CLI::Range(10, 600000))
      ->capture_default_str();
  app.add_option("--heartbeat-timeout-ms", options.heartbeat_timeout_ms,
                 "a node is dead after this long without a heartbeat")
      ->check(CLI::Range(20, 3600000))
      ->capture_default_str();
  app.add_option("--connection-grace-ms", options.connection_grace_ms,
                 "after an agent's connection closes, a node is dead unless its agent "
                 "heartbeats within this")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--stop-grace-ms", options.stop_grace_ms,
                 "SIGTERM to SIGKILL grace when stopping trainers")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  app.add_option("--restart-backoff-ms", options.restart_backoff.base_ms,
                 "delay before a failing job's second restart in a row; each further one "
                 "waits twice as long (the first restart is immediate)")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--restart-backoff-max-ms", options.restart_backoff.max_ms,
                 "the longest delay before a failing job's next restart")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--cordon-ms", options.nodes.cordon_base_ms,
                 "how long a node that failed repeatedly (or that a job's ranks could not "
                 "reach) is kept out of scheduling; twice as long at each further failure")
      ->check(CLI::Range(0, 86400000))
      ->capture_default_str();
  app.add_option("--slot-cordon-ms", options.nodes.slot_cordon_base_ms,
                 "how long a slot whose GPU failed under a trainer is kept out of scheduling "
                 "(the rest of its node stays in use); twice as long at each further failure "
                 "of that slot, up to a day")
      ->check(CLI::Range(0, 86400000))
      ->capture_default_str();
  app.add_option("--max-cordoned-share", options.nodes.max_cordoned_share,
                 "at most this share of the nodes (never fewer than one) is cordoned for "
                 "node failures at once; beyond it a failing node stays in use, as so many "
                 "failing together points at the network or the coordinator; 1: no cap")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  std::string node_memory = "1h";
  app.add_option("--node-failure-memory", node_memory,
                 "a node that goes this long without failing (and is not cordoned) has its "
                 "failures forgotten: its next one counts as its first and earns the shortest "
                 "cordon, e.g. 1h, 30m; 0 remembers them until drover uncordon")
      ->capture_default_str();
  std::string slot_memory = "7d";
  app.add_option("--slot-failure-memory", slot_memory,
                 "the same for a slot whose GPU failed (or whose rank straggled)")
      ->capture_default_str();
  std::string retention = "0";
  app.add_option("--job-retention", retention,
                 "delete a finished job from the state (record, attempts, logs; not its "
                 "output_dir) this long after it finished, e.g. 7d, 12h; 0 keeps every job "
                 "until drover rm")
      ->capture_default_str();
  app.add_option("--max-pending-per-submitter", options.max_pending_per_submitter,
                 "jobs one submitter (user@host) may have pending at once; 0: no limit")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  drover::TlsFiles tls_files;
  app.add_option("--tls-cert", tls_files.cert,
                 "PEM certificate of this coordinator (its SAN must name the address agents "
                 "and the CLI dial); with --tls-key and --tls-ca the port speaks TLS only");
  app.add_option("--tls-key", tls_files.key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", tls_files.ca,
                 "PEM certificate of the cluster CA: agents and their trainers must present "
                 "a certificate it signed (mutual TLS)");
  std::string tokens_file;
  app.add_option("--tokens", tokens_file,
                 "bearer tokens for JobService calls (the CLI), one 'TOKEN ROLE NAME' a line, "
                 "ROLE admin or read-only (README.md, Security); without it JobService is open");
  bool insecure = false;
  app.add_flag("--insecure", insecure,
               "serve an address beyond loopback without TLS and tokens (anyone who reaches "
               "the port may run and cancel jobs)");
  std::string http;
  app.add_option("--http", http,
                 "host:port to serve the dashboard (/) and Prometheus metrics (/metrics) on, "
                 "read-only and unauthenticated (default: off)");
  app.add_option("--log-level", log_level, "trace|debug|info|warn|error")->capture_default_str();
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  for (auto [text, flag, ms_out] :
       {std::tuple{&retention, "--job-retention", &options.job_retention_ms},
        std::tuple{&node_memory, "--node-failure-memory", &options.nodes.failure_memory_ms},
        std::tuple{&slot_memory, "--slot-failure-memory", &options.nodes.slot_failure_memory_ms}}) {
    auto ms = drover::ParseDurationMs(*text, flag);
    if (!ms.ok()) {
      std::cerr << "drover-coordinator: " << ms.status().message() << "\n";
      return 2;
    }
    *ms_out = *ms;
  }
  if (options.heartbeat_timeout_ms <= options.heartbeat_interval_ms) {
    std::cerr << "drover-coordinator: --heartbeat-timeout-ms (" << options.heartbeat_timeout_ms
              << ") must be larger than --heartbeat-interval-ms (" << options.heartbeat_interval_ms
              << ")\n";
    return 2;
  }
  if (auto st = drover::InitLogging("drover-coordinator", log_level); !st.ok()) {
    std::cerr << "drover-coordinator: " << st.message() << "\n";
    return 2;
  }
  drover::coordinator::ServerSecurity security;
  if (auto tls = drover::LoadTlsCredentials(tls_files, drover::CertNeed::kRequired); tls.ok()) {
    security.tls = std::move(*tls);
  } else {
    std::cerr << "drover-coordinator: " << tls.status().message() << "\n";
    return 2;
  }
  if (!tokens_file.empty()) {
    auto tokens = drover::coordinator::LoadTokenFile(tokens_file);
    if (!tokens.ok()) {
      std::cerr << "drover-coordinator: " << tokens.status().message() << "\n";
      return 2;
    }
    security.tokens = std::move(*tokens);
  }
  const std::string host = drover::HostOfAddress(listen);
  if (drover::Status exposed = drover::coordinator::CheckExposure(
          host, security.tls.enabled, !security.tokens.empty(), insecure);
      !exposed.ok()) {
    std::cerr << "drover-coordinator: " << exposed.message() << "\n";
    return 2;
  }
  if (!http.empty()) {
    if (drover::Status exposed =
            drover::coordinator::CheckDashboardExposure(drover::HostOfAddress(http), insecure);
        !exposed.ok()) {
      std::cerr << "drover-coordinator: " << exposed.message() << "\n";
      return 2;
    }
  }
  if (insecure && !drover::IsLoopbackHost(host) &&
      !(security.tls.enabled && !security.tokens.empty())) {
    spdlog::warn("--insecure: serving {} without {}", listen,
                 security.tls.enabled ? "tokens" : "TLS (agents are not authenticated)");
  }

  // Block the stop signals before any thread starts, then wait for one in this thread.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);

  auto coordinator = drover::coordinator::Coordinator::Open(options, drover::SystemClock::Get());
  if (!coordinator.ok()) {
    spdlog::error("{}", coordinator.status().ToString());
    return 1;
  }
  // Metrics count every RPC from the first, so they exist before the gRPC server; the
  // HTTP server, which reads the coordinator, starts after it.
  std::unique_ptr<drover::coordinator::CoordinatorMetrics> metrics;
  if (!http.empty()) metrics = std::make_unique<drover::coordinator::CoordinatorMetrics>();
  auto server = drover::coordinator::CoordinatorServer::Start(coordinator->get(), listen,
                                                              /*tick_ms=*/100, metrics.get(),
                                                              std::move(security));
  if (!server.ok()) {
    spdlog::error("{}", server.status().ToString());
    return server.status().code() == drover::StatusCode::kInvalidArgument ? 2 : 1;
  }
  std::unique_ptr<drover::coordinator::DashboardSource> source;
  std::unique_ptr<drover::coordinator::HttpServer> http_server;
  if (!http.empty()) {
    source = drover::coordinator::DashboardSourceOf(coordinator->get());
    auto started = drover::coordinator::HttpServer::Start(source.get(), metrics.get(), http);
    if (!started.ok()) {
      spdlog::error("{}", started.status().ToString());
      return started.status().code() == drover::StatusCode::kInvalidArgument ? 2 : 1;
    }
    http_server = std::move(*started);
  }
  if (!advertise.empty()) (*coordinator)->SetAdvertisedAddress(advertise);
  int sig = 0;
  sigwait(&stop_signals, &sig);
  spdlog::info("signal {}: shutting down", sig);
  if (http_server) http_server->Shutdown();
  (*server)->Shutdown();
  drover::Status flushed = (*coordinator)->Flush();
  if (!flushed.ok()) {
    spdlog::error("final state write failed: {}", flushed.ToString());
    return 1;
  }
  return 0;
}
