// deploy/k8s/*.yaml, checked offline: no cluster and no schemas can be fetched where the
// tests run, so this pins the invariants that make the manifests work together. The port
// the coordinator listens on is its container port, its probes' port and its Service's
// target; the workers dial that Service by its cluster DNS name and port; the coordinator's
// state dir lies on a PersistentVolumeClaim (one writer: one replica, Recreate); every
// mount names a volume and every claim a PVC in the manifests; the programs they start are
// the ones deploy/Dockerfile installs.
#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <filesystem>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include "tests/unit/deploy/dockerfile.h"

namespace drover::testing {
namespace {

const std::string kSource = DROVER_SOURCE_DIR;

class K8sManifestsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const auto& e : std::filesystem::directory_iterator(kSource + "/deploy/k8s")) {
      if (e.path().extension() != ".yaml") continue;
      for (const YAML::Node& doc : YAML::LoadAllFromFile(e.path().string())) {
        if (!doc.IsMap()) continue;
        docs_.push_back({e.path().filename().string(), doc});
      }
    }
    ASSERT_FALSE(docs_.empty());
  }

  // The object of `kind` named `name`; fails the test when there is not exactly one.
  YAML::Node Get(const std::string& kind, const std::string& name) {
    std::vector<YAML::Node> found;
    for (const auto& [file, doc] : docs_) {
      if (doc["kind"].as<std::string>("") == kind &&
          doc["metadata"]["name"].as<std::string>("") == name) {
        found.push_back(doc);
      }
    }
    EXPECT_EQ(found.size(), 1u) << kind << "/" << name;
    return found.empty() ? YAML::Node() : found[0];
  }

  // A workload's pod spec, or an undefined node for objects without one (yaml-cpp throws
  // when indexing below a missing key, so each level is checked).
  static YAML::Node PodSpec(const YAML::Node& doc) {
    const YAML::Node spec = doc["spec"];
    if (!spec || !spec.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    const YAML::Node pod_template = spec["template"];
    if (!pod_template || !pod_template.IsMap()) return YAML::Node(YAML::NodeType::Undefined);
    return pod_template["spec"];
  }

  static YAML::Node Container(const YAML::Node& workload, const std::string& name) {
    for (const YAML::Node& c : PodSpec(workload)["containers"]) {
      if (c["name"].as<std::string>("") == name) return c;
    }
    ADD_FAILURE() << "no container " << name;
    return YAML::Node();
  }

  // The value of flag `flag` in a container's args, as "--flag=value" or "--flag value",
  // with $(VAR) references to the container's env expanded as Kubernetes does.
  static std::optional<std::string> Flag(const YAML::Node& container, const std::string& flag) {
    std::vector<std::string> args;
    for (const YAML::Node& a : container["args"]) args.push_back(a.as<std::string>());
    for (size_t i = 0; i < args.size(); ++i) {
      std::string value;
      if (args[i].rfind(flag + "=", 0) == 0) {
        value = args[i].substr(flag.size() + 1);
      } else if (args[i] == flag && i + 1 < args.size()) {
        value = args[i + 1];
      } else {
        continue;
      }
      for (const YAML::Node& e : container["env"]) {
        if (!e["value"]) continue;
        const std::string ref = "$(" + e["name"].as<std::string>() + ")";
        for (size_t at; (at = value.find(ref)) != std::string::npos;) {
          value.replace(at, ref.size(), e["value"].as<std::string>());
        }
      }
      return value;
    }
    return std::nullopt;
  }

  // A probe's or Service's port (a number or a container port's name) as a number.
  static int ResolvePort(const YAML::Node& container, const YAML::Node& port) {
    for (const YAML::Node& p : container["ports"]) {
      if (p["name"].as<std::string>("") == port.as<std::string>()) {
        return p["containerPort"].as<int>();
      }
    }
    return port.as<int>(-1);
  }

  // The PVC claim behind the mount that holds `path` in `workload`'s container, or "".
  static std::string ClaimHolding(const YAML::Node& workload, const YAML::Node& container,
                                  const std::string& path) {
    std::string volume;
    size_t best = 0;
    for (const YAML::Node& m : container["volumeMounts"]) {
      const std::string mount = m["mountPath"].as<std::string>();
      if ((path == mount || path.rfind(mount + "/", 0) == 0) && mount.size() > best) {
        volume = m["name"].as<std::string>();
        best = mount.size();
      }
    }
    for (const YAML::Node& v : PodSpec(workload)["volumes"]) {
      if (v["name"].as<std::string>() == volume && v["persistentVolumeClaim"]) {
        return v["persistentVolumeClaim"]["claimName"].as<std::string>();
      }
    }
    return "";
  }

  std::vector<std::pair<std::string, YAML::Node>> docs_;  // (file, document)
};

TEST_F(K8sManifestsTest, EveryObjectIsNamedAndLivesInTheDroverNamespace) {
  Get("Namespace", "drover");
  for (const auto& [file, doc] : docs_) {
    ASSERT_TRUE(doc["apiVersion"] && doc["kind"] && doc["metadata"]["name"]) << file;
    if (doc["kind"].as<std::string>() == "Namespace") continue;
    EXPECT_EQ(doc["metadata"]["namespace"].as<std::string>(""), "drover")
        << file << ": " << doc["kind"] << "/" << doc["metadata"]["name"];
  }
}

TEST_F(K8sManifestsTest, CoordinatorPortAgreesAcrossFlagsContainerProbesAndService) {
  YAML::Node c = Container(Get("Deployment", "drover-coordinator"), "coordinator");
  auto listen = Flag(c, "--listen");
  ASSERT_TRUE(listen) << "coordinator args have no --listen";
  std::smatch m;
  ASSERT_TRUE(std::regex_match(*listen, m, std::regex(R"(0\.0\.0\.0:(\d+))")))
      << "--listen " << *listen << ": must be 0.0.0.0:PORT to be reachable through a Service";
  const int port = std::stoi(m[1]);
  ASSERT_EQ(c["ports"].size(), 1u);
  EXPECT_EQ(c["ports"][0]["containerPort"].as<int>(), port);
  for (const char* probe : {"readinessProbe", "livenessProbe"}) {
    ASSERT_TRUE(c[probe]) << "the coordinator has no " << probe;
    ASSERT_TRUE(c[probe]["tcpSocket"]) << probe;
    EXPECT_EQ(ResolvePort(c, c[probe]["tcpSocket"]["port"]), port) << probe;
  }
  YAML::Node svc = Get("Service", "drover-coordinator");
  ASSERT_EQ(svc["spec"]["ports"].size(), 1u);
  EXPECT_EQ(ResolvePort(c, svc["spec"]["ports"][0]["targetPort"]), port);
}

TEST_F(K8sManifestsTest, ServiceSelectsTheCoordinatorPods) {
  YAML::Node labels =
      Get("Deployment", "drover-coordinator")["spec"]["template"]["metadata"]["labels"];
  YAML::Node selector = Get("Service", "drover-coordinator")["spec"]["selector"];
  ASSERT_TRUE(selector.IsMap() && selector.size() > 0);
  for (const auto& kv : selector) {
    EXPECT_EQ(labels[kv.first.as<std::string>()].as<std::string>(""), kv.second.as<std::string>())
        << "selector " << kv.first;
  }
  // And the worker pods do not match it.
  YAML::Node worker = Get("DaemonSet", "drover-worker")["spec"]["template"]["metadata"]["labels"];
  bool all_match = true;
  for (const auto& kv : selector) {
    all_match &=
        worker[kv.first.as<std::string>()].as<std::string>("") == kv.second.as<std::string>();
  }
  EXPECT_FALSE(all_match) << "the coordinator Service would also route to worker pods";
}

TEST_F(K8sManifestsTest, CoordinatorStateLiesOnAPersistentVolumeClaimWithOneWriter) {
  YAML::Node d = Get("Deployment", "drover-coordinator");
  YAML::Node c = Container(d, "coordinator");
  auto state = Flag(c, "--state-dir");
  ASSERT_TRUE(state) << "coordinator args have no --state-dir";
  const std::string claim = ClaimHolding(d, c, *state);
  ASSERT_FALSE(claim.empty()) << "--state-dir " << *state << " is not on a PVC mount";
  YAML::Node pvc = Get("PersistentVolumeClaim", claim);
  ASSERT_TRUE(pvc["spec"]["accessModes"]);
  EXPECT_EQ(pvc["spec"]["accessModes"][0].as<std::string>(), "ReadWriteOnce");
  // SQLite in WAL mode takes one process: never two pods on the state at once.
  EXPECT_EQ(d["spec"]["replicas"].as<int>(), 1);
  EXPECT_EQ(d["spec"]["strategy"]["type"].as<std::string>(""), "Recreate");
}

TEST_F(K8sManifestsTest, WorkersDialTheCoordinatorServiceByItsDnsName) {
  YAML::Node svc = Get("Service", "drover-coordinator");
  const int port = svc["spec"]["ports"][0]["port"].as<int>();
  YAML::Node c = Container(Get("DaemonSet", "drover-worker"), "worker");
  auto coordinator = Flag(c, "--coordinator");
  ASSERT_TRUE(coordinator) << "worker args have no --coordinator";
  const std::string host = svc["metadata"]["name"].as<std::string>() + "." +
                           svc["metadata"]["namespace"].as<std::string>() + ".svc";
  EXPECT_TRUE(*coordinator == host + ":" + std::to_string(port) ||
              *coordinator == host + ".cluster.local:" + std::to_string(port))
      << "--coordinator " << *coordinator << ", the Service is " << host << ":" << port;
}

// A pod's SIGTERM (kubectl drain, an eviction, a rollout) makes the agent drain its
// trainers for --stop-grace-ms; the kubelet's SIGKILL at terminationGracePeriodSeconds must
// come after, or every drain is cut short and the job loses what it trained since its last
// checkpoint. The agent's own default (5 s) is too short for a real model's checkpoint.
TEST_F(K8sManifestsTest, TheWorkersDrainFitsWithinThePodsTerminationGrace) {
  YAML::Node ds = Get("DaemonSet", "drover-worker");
  YAML::Node c = Container(ds, "worker");
  auto grace_ms = Flag(c, "--stop-grace-ms");
  ASSERT_TRUE(grace_ms) << "worker args have no --stop-grace-ms: trainers get 5 s to drain";
  ASSERT_TRUE(PodSpec(ds)["terminationGracePeriodSeconds"]);
  const int64_t pod_ms = PodSpec(ds)["terminationGracePeriodSeconds"].as<int64_t>() * 1000;
  EXPECT_GE(std::stoll(*grace_ms), 30000) << "a checkpoint of a large model takes tens of seconds";
  EXPECT_LE(std::stoll(*grace_ms) + 5000, pod_ms)
      << "--stop-grace-ms " << *grace_ms << " leaves the agent under 5 s of the pod's " << pod_ms
      << " ms to report the exits and leave";
}

TEST_F(K8sManifestsTest, WorkerHasAReadinessProbeThroughTheCoordinator) {
  YAML::Node c = Container(Get("DaemonSet", "drover-worker"), "worker");
  ASSERT_TRUE(c["readinessProbe"]) << "the worker has no readiness probe";
  ASSERT_TRUE(c["readinessProbe"]["exec"]) << "the worker's readiness probe is not a command";
  std::string command;
  for (const YAML::Node& w : c["readinessProbe"]["exec"]["command"]) {
    command += w.as<std::string>() + " ";
  }
  // It asks the coordinator (the CLI reads $DROVER_COORDINATOR) for this node by name.
  EXPECT_NE(command.find("drover "), std::string::npos) << command;
  EXPECT_NE(command.find("workers"), std::string::npos) << command;
  EXPECT_NE(command.find("$NODE_NAME"), std::string::npos) << command;
  bool has_env = false;
  for (const YAML::Node& e : c["env"])
    has_env |= e["name"].as<std::string>() == "DROVER_COORDINATOR";
  EXPECT_TRUE(has_env) << "the probe's drover CLI needs DROVER_COORDINATOR in the env";
}

TEST_F(K8sManifestsTest, EveryMountNamesAVolumeAndEveryClaimAPvc) {
  for (const auto& [file, doc] : docs_) {
    const YAML::Node pod = PodSpec(doc);
    if (!pod || !pod.IsMap()) continue;
    std::set<std::string> volumes;
    for (const YAML::Node& v : pod["volumes"]) {
      volumes.insert(v["name"].as<std::string>());
      if (v["persistentVolumeClaim"]) {
        Get("PersistentVolumeClaim", v["persistentVolumeClaim"]["claimName"].as<std::string>());
      }
    }
    for (const YAML::Node& c : pod["containers"]) {
      for (const YAML::Node& m : c["volumeMounts"]) {
        EXPECT_TRUE(volumes.count(m["name"].as<std::string>()))
            << file << ": mount " << m["name"] << " names no volume";
      }
    }
  }
  // The workers' relative paths (data/, runs/) resolve on the shared RWX claim.
  YAML::Node ds = Get("DaemonSet", "drover-worker");
  YAML::Node c = Container(ds, "worker");
  const std::string shared = ClaimHolding(ds, c, c["workingDir"].as<std::string>(""));
  ASSERT_FALSE(shared.empty()) << "the worker's workingDir is not on a PVC";
  EXPECT_EQ(Get("PersistentVolumeClaim", shared)["spec"]["accessModes"][0].as<std::string>(),
            "ReadWriteMany");
}

TEST_F(K8sManifestsTest, ContainersRunProgramsTheImageInstalls) {
  const std::set<std::string> bins = ImageBinaries(ReadDockerfile(kSource + "/deploy/Dockerfile"));
  ASSERT_FALSE(bins.empty()) << "no COPY into /usr/local/bin in deploy/Dockerfile";
  int containers = 0;
  for (const auto& [file, doc] : docs_) {
    const YAML::Node pod = PodSpec(doc);
    if (!pod || !pod.IsMap()) continue;
    for (const YAML::Node& c : pod["containers"]) {
      ++containers;
      EXPECT_EQ(c["image"].as<std::string>(""), "drover:latest")
          << file << ": the image deploy/Dockerfile's header says to build";
      ASSERT_TRUE(c["command"] && c["command"].size() >= 1) << file;
      EXPECT_TRUE(bins.count(c["command"][0].as<std::string>()))
          << file << ": runs " << c["command"][0] << ", which the image does not install";
    }
  }
  EXPECT_EQ(containers, 2);
}

}  // namespace
}  // namespace drover::testing
