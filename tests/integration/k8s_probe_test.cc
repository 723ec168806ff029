// The worker's readiness probe in deploy/k8s/worker.yaml, run as the kubelet would run it
// (its exec command, with the pod's NODE_NAME and DROVER_COORDINATOR in the environment)
// against a live coordinator: ready while the coordinator lists the node ALIVE, not ready
// for a node it does not know or one whose agent died. No cluster is needed for that part
// of the manifests; tests/unit/deploy/k8s_manifests_test.cc checks the rest offline.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>
#include <yaml-cpp/yaml.h>

#include <csignal>
#include <cstdlib>
#include <string>
#include <vector>

#include "tests/integration/cluster.h"

namespace drover::testing {
namespace {

std::vector<std::string> WorkerProbeCommand() {
  for (const YAML::Node& doc :
       YAML::LoadAllFromFile(std::string(DROVER_SOURCE_DIR) + "/deploy/k8s/worker.yaml")) {
    if (!doc.IsMap() || doc["kind"].as<std::string>("") != "DaemonSet") continue;
    for (const YAML::Node& c : doc["spec"]["template"]["spec"]["containers"]) {
      std::vector<std::string> command;
      for (const YAML::Node& w : c["readinessProbe"]["exec"]["command"]) {
        command.push_back(w.as<std::string>());
      }
      return command;
    }
  }
  return {};
}

// Runs `command` with the pod's variables set and the build's programs first on PATH (the
// image has them in /usr/local/bin); returns its exit status, or -1 when it did not exit.
int RunProbe(const std::vector<std::string>& command, const std::string& node,
             const std::string& coordinator) {
  const std::string bin = Cluster::Bin("");
  const char* path = std::getenv("PATH");
  const pid_t pid = fork();
  if (pid == 0) {
    setenv("NODE_NAME", node.c_str(), 1);
    setenv("DROVER_COORDINATOR", coordinator.c_str(), 1);
    setenv("PATH", (bin + ":" + (path ? path : "/usr/bin:/bin")).c_str(), 1);
    std::vector<char*> argv;
    for (const std::string& a : command) argv.push_back(const_cast<char*>(a.c_str()));
    argv.push_back(nullptr);
    execvp(argv[0], argv.data());
    _exit(127);
  }
  int status = 0;
  if (pid < 0 || waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

TEST(K8sWorkerProbeTest, ReadyExactlyWhileTheCoordinatorListsTheNodeAlive) {
  const std::vector<std::string> probe = WorkerProbeCommand();
  ASSERT_FALSE(probe.empty()) << "deploy/k8s/worker.yaml has no exec readiness probe";
  ClusterOptions o;
  o.agents = 1;
  o.name = "k8s_probe";
  Cluster cluster(o);
  ASSERT_TRUE(cluster.Start()) << cluster.DebugLogs();
  const std::string node = cluster.AgentName(0);

  EXPECT_EQ(RunProbe(probe, node, cluster.address()), 0) << cluster.DebugLogs();
  EXPECT_NE(RunProbe(probe, "no-such-node", cluster.address()), 0);

  // The agent dies: once the coordinator declares the node dead, the probe says not ready.
  cluster.agent(node)->Kill(SIGKILL);
  EXPECT_TRUE(WaitUntil([&] { return RunProbe(probe, node, cluster.address()) != 0; }, 15000, 100))
      << "the probe still reports a dead node ready\n"
      << cluster.DebugLogs();
}

TEST(K8sWorkerProbeTest, NotReadyWhenTheCoordinatorCannotBeReached) {
  const std::vector<std::string> probe = WorkerProbeCommand();
  ASSERT_FALSE(probe.empty());
  EXPECT_NE(RunProbe(probe, "w0", "127.0.0.1:" + std::to_string(FreePort())), 0);
}

}  // namespace
}  // namespace drover::testing
