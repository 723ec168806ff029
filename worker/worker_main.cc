// drover-worker: the node agent. Registers the node's slots with the coordinator and
// supervises one trainer process per assigned rank (worker/agent.h).
#include <signal.h>
#include <spdlog/spdlog.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <optional>
#include <thread>

#include "common/net.h"
#include "common/tls.h"
#include "worker/agent.h"
#include "worker/call_within.h"
#include "worker/gpu_health.h"
#include "worker/gpu_probe.h"
#include "worker/node_identity.h"
#include "worker/process.h"

int main(int argc, char** argv) {
  CLI::App app{"drover-worker: runs trainers on this node for a drover coordinator"};
  drover::AgentOptions options;
  std::string device = "cpu";
  app.add_option("--coordinator", options.coordinator, "coordinator address host:port")
      ->capture_default_str();
  app.add_option("--name", options.name, "node name (unique in the cluster)")->required();
  app.add_option("--slots", options.slots,
                 "trainer slots on this node (with --device cuda: default one per visible GPU)")
      ->check(CLI::Range(1, 4096))
      ->capture_default_str();
  app.add_option("--device", device, "cpu | cuda")->capture_default_str();
  app.add_option("--work-dir", options.work_dir, "job specs and trainer logs go here")->required();
  app.add_option("--trainer", options.trainer_path,
                 "trainer executable (default: drover-trainer next to this binary)");
  app.add_option("--heartbeat-interval-ms", options.heartbeat_interval_ms,
                 "heartbeat period (default: the coordinator's)")
      ->check(CLI::Range(1, 600000));
  app.add_option("--gpu-health-interval-ms", options.gpu_health.interval_ms,
                 "with --device cuda: how often the GPUs' health is checked through NVML "
                 "(libnvidia-ml.so.1); a GPU found unfit is taken out of use until it passes "
                 "again. 0: never")
      ->check(CLI::Range(0, 3600000))
      ->capture_default_str();
  app.add_option("--gpu-health-timeout-ms", options.gpu_health.timeout_ms,
                 "with --device cuda: a GPU whose NVML query has not returned within this is "
                 "reported unfit (a wedged driver); the queries never hold up heartbeats")
      ->check(CLI::Range(1, 3600000))
      ->capture_default_str();
  std::string ignored_xids;  // shown as the default: GpuHealthMonitor::Options'
  for (int xid : options.gpu_health.ignored_xids) {
    ignored_xids += (ignored_xids.empty() ? "" : ",") + std::to_string(xid);
  }
  app.add_option("--gpu-ignored-xids", ignored_xids,
                 "with --device cuda: the Xids (NVML events) that do not take a GPU out of use, "
                 "those an application's own error causes; any other Xid keeps its GPU out "
                 "until drover uncordon puts it back or the agent restarts. Numbers separated by "
                 "commas, or none")
      ->capture_default_str();
  app.add_option("--address", options.address,
                 "this node's address: shown to people, and where its trainers accept their "
                 "peers (default: the address of the interface toward --coordinator; with a "
                 "coordinator on loopback, a one-machine cluster, trainers accept peers on "
                 "127.0.0.1 and the node shows its host name)");
  app.add_option("--stop-grace-ms", options.shutdown_grace_ms,
                 "on SIGTERM: how long the trainers have to drain (save their job's checkpoint "
                 "and exit) before they are killed")
      ->check(CLI::Range(0, 600000))
      ->capture_default_str();
  app.add_option("--tls-cert", options.tls_files.cert,
                 "PEM certificate of this node, signed by the cluster CA (mutual TLS); its "
                 "trainers present it too");
  app.add_option("--tls-key", options.tls_files.key, "PEM private key of --tls-cert");
  app.add_option("--tls-ca", options.tls_files.ca,
                 "PEM certificate of the cluster CA, which the coordinator's certificate must "
                 "be signed by");
  bool insecure = false;
  app.add_flag("--insecure", insecure,
               "dial a coordinator beyond loopback without TLS (anyone on the path could "
               "impersonate it and order trainers started here)");
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    int rc = app.exit(e);
    return rc == 0 ? 0 : 2;
  }
  auto kind = drover::ParseDeviceKind(device);
  if (!kind.ok()) {
    std::cerr << "drover-worker: " << kind.status().message() << "\n";
    return 2;
  }
  options.device = *kind;
  auto xids = drover::ParseXidList(ignored_xids);
  if (!xids.ok()) {
    std::cerr << "drover-worker: " << xids.status().message() << "\n";
    return 2;
  }
  options.gpu_health.ignored_xids = std::move(*xids);
  // Absolute: trainers, which run in other directories, read the same files.
  for (std::string* path :
       {&options.tls_files.cert, &options.tls_files.key, &options.tls_files.ca}) {
    if (!path->empty()) *path = std::filesystem::absolute(*path).string();
  }
  auto tls = drover::LoadTlsCredentials(options.tls_files, drover::CertNeed::kRequired);
  if (!tls.ok()) {
    std::cerr << "drover-worker: " << tls.status().message() << "\n";
    return 2;
  }
  options.tls = std::move(*tls);
  if (!options.tls.enabled && !insecure &&
      !drover::IsLoopbackHost(drover::HostOfAddress(options.coordinator))) {
    std::cerr << "drover-worker: --coordinator " << options.coordinator
              << " is beyond loopback and no TLS is given: add --tls-cert, --tls-key and "
                 "--tls-ca, or pass --insecure to dial it in plaintext\n";
    return 2;
  }
  if (!options.address.empty() &&
      !drover::IsLoopbackHost(drover::HostOfAddress(options.coordinator))) {
    // Trainers bind --address and publish what it resolves to: a loopback address there is
    // one only this machine can dial, so any job with ranks on another node fails to connect.
    auto resolved = drover::ResolveHost(options.address);
    if (resolved.ok() && drover::IsLoopbackHost(*resolved)) {
      spdlog::warn(
          "--address {} resolves to {}, a loopback address: trainers on other nodes cannot "
          "connect to this node's trainers (give the address of this node on the cluster's "
          "network, or leave --address out to use the interface toward {})",
          options.address, *resolved, options.coordinator);
    }
  }
  if (options.device == drover::v1::CUDA) {
    // A GPU node registers its GPUs: refused here, with the reason, when it has none to use.
    // A wedged driver can hold cuInit for minutes: the agent says so, not hangs silently.
    using Probe = drover::StatusOr<std::vector<drover::GpuInfo>>;
    std::optional<Probe> probe = drover::CallWithin<Probe>([] { return drover::ProbeGpus(); },
                                                           options.gpu_health.timeout_ms);
    if (!probe) {
      std::cerr << "drover-worker: --device cuda: the NVIDIA driver has not answered within "
                << options.gpu_health.timeout_ms
                << " ms (--gpu-health-timeout-ms) while the GPUs were listed (cuInit and its "
                   "queries): a wedged driver or GPU; reset the GPUs (nvidia-smi -r) or reboot "
                   "the node\n";
      std::_Exit(1);  // the probe's thread is stuck in the driver: exit without waiting for it
    }
    Probe& gpus = *probe;
    if (!gpus.ok()) {
      std::cerr << "drover-worker: --device cuda: " << gpus.status().message() << "\n";
      return 2;
    }
    if (drover::Status usable = drover::CheckComputeCapability(*gpus); !usable.ok()) {
      std::cerr << "drover-worker: --device cuda: " << usable.message() << "\n";
      return 2;
    }
    // A driver too old for this build's runtime: refused here, where it would register its
    // GPUs and fail every trainer placed on them (each slot cordoned in turn, each job's
    // restarts spent).
    if (drover::Status served = drover::CheckDriverServesRuntime(drover::DriverCudaVersion(),
                                                                 drover::BuildCudaRuntimeVersion());
        !served.ok()) {
      std::cerr << "drover-worker: --device cuda: " << served.message() << "\n";
      return 2;
    }
    const int visible = static_cast<int>(gpus->size());
    if (app.count("--slots") == 0) {
      options.slots = visible;
    } else if (options.slots > visible) {
      std::cerr << "drover-worker: --slots " << options.slots << " but only " << visible
                << " GPU(s) are visible; use at most " << visible << " (one trainer per GPU)\n";
      return 2;
    }
    options.gpus = std::move(*gpus);
  }
  // The trainer sits next to this binary unless --trainer says otherwise.
  if (options.trainer_path.empty())
    options.trainer_path = drover::SiblingExecutable("drover-trainer");
  if (access(options.trainer_path.c_str(), X_OK) != 0) {
    std::cerr << "drover-worker: trainer executable '" << options.trainer_path
              << "' is missing or not executable (see --trainer)\n";
    return 2;
  }
  std::error_code ec;
  std::filesystem::create_directories(options.work_dir, ec);
  if (ec) {
    std::cerr << "drover-worker: cannot create --work-dir '" << options.work_dir
              << "': " << ec.message() << "\n";
    return 1;
  }
  options.work_dir = std::filesystem::absolute(options.work_dir).string();
  if (drover::Status locked = drover::LockWorkDir(options.work_dir); !locked.ok()) {
    std::cerr << "drover-worker: " << locked.message() << "\n";
    return 2;
  }
  auto uid = drover::LoadOrCreateNodeUid(options.work_dir);
  if (!uid.ok()) {
    std::cerr << "drover-worker: node id: " << uid.status().ToString() << "\n";
    return 1;
  }
  options.node_uid = *uid;

  // Signals are taken by one thread with sigwait, so no handler runs inside gRPC or the
  // supervisor. Blocked before any thread starts, so every thread inherits the mask
  // (trainers get a clean mask in worker/process.cc).
  signal(SIGPIPE, SIG_IGN);
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);

  drover::Agent agent(options);
  std::thread signals([&agent, set] {
    int sig = 0;
    sigwait(&set, &sig);
    spdlog::info("got signal {}", sig);
    agent.Shutdown();
  });
  drover::Status st = agent.Run();
  // Unblock the signal thread if Run ended for another reason.
  pthread_kill(signals.native_handle(), SIGTERM);
  signals.join();
  if (!st.ok()) {
    std::cerr << "drover-worker: " << st.ToString() << "\n";
    return 1;
  }
  return 0;
}
