// TLS, mutual TLS and bearer tokens on a real coordinator, agents, trainers and CLI, with
// certificates made by openssl at test time (test_certs.h): agents without a cluster
// certificate and CLIs without a token are refused with a status that says what is
// missing, a read-only token reads but cannot change, plaintext clients fail cleanly, a
// job trains to the end over TLS, and a coordinator will not listen beyond loopback
// unprotected unless told --insecure.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>

#include <fstream>
#include <random>

#include "common/tls.h"
#include "common/token_shard.h"
#include "tests/integration/cluster.h"
#include "tests/integration/test_certs.h"

namespace drover::testing {
namespace {

using ::testing::HasSubstr;

constexpr char kAdminToken[] = "admin-0123456789abcdef";
constexpr char kReaderToken[] = "reader-0123456789abcdef";

class SecurityTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    dir_ = std::filesystem::temp_directory_path() /
           ("drover_security_" + std::to_string(getpid()) + "_" + name);
    std::filesystem::remove_all(dir_);
    std::filesystem::create_directories(dir_);
    ASSERT_TRUE(MakeTestCerts(dir_, &certs_)) << ReadAll((dir_ / "openssl.log").string());
    tokens_ = (dir_ / "tokens").string();
    std::ofstream(tokens_) << "# drover test tokens\n"
                           << kAdminToken << " admin alice\n"
                           << kReaderToken << " read-only grafana\n";
    admin_file_ = (dir_ / "admin.token").string();
    reader_file_ = (dir_ / "reader.token").string();
    std::ofstream(admin_file_) << kAdminToken << "\n";
    std::ofstream(reader_file_) << kReaderToken << "\n";
    auto tls = LoadTlsCredentials({"", "", certs_.ca}, CertNeed::kOptional);
    ASSERT_TRUE(tls.ok()) << tls.status();
    ca_only_ = *tls;
  }
  void TearDown() override {
    cluster_.reset();
    if (std::getenv("DROVER_KEEP_TEST_DIRS") == nullptr) std::filesystem::remove_all(dir_);
  }

  // A coordinator with mutual TLS and tokens, agents with cluster certificates, and a test
  // client holding the CA and the admin token.
  void StartCluster(int agents, const std::string& trainer = "drover-fake-trainer") {
    ClusterOptions o;
    o.agents = agents;
    o.trainer = trainer;
    o.name = ::testing::UnitTest::GetInstance()->current_test_info()->name();
    o.coordinator_args = {"--tls-cert", certs_.server_cert, "--tls-key", certs_.server_key,
                          "--tls-ca",   certs_.ca,          "--tokens",  tokens_};
    o.agent_flags = {"--tls-cert",     certs_.agent_cert, "--tls-key",
                     certs_.agent_key, "--tls-ca",        certs_.ca};
    o.client_tls = ca_only_;
    o.client_token = kAdminToken;
    cluster_ = std::make_unique<Cluster>(o);
    ASSERT_TRUE(cluster_->Start(20000)) << "workers did not register\n" << cluster_->DebugLogs();
  }

  // The CLI over TLS, with `token_file` when not empty.
  CliResult Cli(const std::string& token_file, std::vector<std::string> args) {
    std::vector<std::string> all = {"--coordinator", cluster_->address(), "--tls-ca", certs_.ca};
    if (!token_file.empty()) all.insert(all.end(), {"--token-file", token_file});
    all.insert(all.end(), args.begin(), args.end());
    return RunCli(cluster_->root(), all);
  }

  std::string FakeJobSpec(const std::string& name, int steps, int step_ms) {
    const std::string path = (cluster_->root() / (name + ".yaml")).string();
    std::ofstream(path) << cluster_->JobYaml(name, 1, 1, steps, 10, 3, 30,
                                             "step_ms=" + std::to_string(step_ms) + "\n");
    return path;
  }

  std::filesystem::path dir_;
  TestCerts certs_;
  std::string tokens_, admin_file_, reader_file_;
  TlsCredentials ca_only_;
  std::unique_ptr<Cluster> cluster_;
};

TEST_F(SecurityTest, JobTrainsToSucceededOverMutualTlsWithTokens) {
  StartCluster(2, "drover-trainer");
  // Two real trainers: both find each other through the coordinator's rendezvous, which
  // they dial with the agent's cluster certificate, and hold their attempt lease there.
  std::mt19937_64 rng(3);
  std::vector<uint16_t> tokens(4000);
  for (size_t i = 0; i < tokens.size(); ++i)
    tokens[i] = static_cast<uint16_t>((i * 7 + rng() % 3) % 29);
  const std::string shard = (cluster_->root() / "train.bin").string();
  ASSERT_TRUE(WriteTokenShard(shard, tokens).ok());
  const std::string spec = (cluster_->root() / "tls.yaml").string();
  std::ofstream(spec) << "name: tls\noutput_dir: " << (cluster_->root() / "out").string()
                      << "\nmodel: {n_layer: 1, n_head: 2, n_embd: 16, block_size: 16, "
                         "vocab_size: 32}\n"
                      << "data: {train: " << shard << "}\n"
                      << "train: {steps: 6, global_batch: 4, micro_batch: 2, seq_len: 16, "
                         "warmup_steps: 1, eval_every: 0}\n"
                      << "resources: {world_size: {min: 2, max: 2}}\n"
                      << "checkpoint: {every_steps: 3}\n"
                      << "fault_tolerance: {max_restarts: 0}\n";
  CliResult submit = Cli(admin_file_, {"submit", spec});
  ASSERT_EQ(submit.code, 0) << submit.out << cluster_->DebugLogs();
  const std::string id = submit.out.substr(0, submit.out.find('\n'));
  // `wait` is a read: the read-only token, from the environment, is enough.
  std::vector<std::string> wait_args = {
      "--coordinator", cluster_->address(), "--tls-ca", certs_.ca, "wait", id, "--timeout", "120"};
  CliResult wait = RunCli(cluster_->root(), wait_args, {{"DROVER_TOKEN", kReaderToken}});
  EXPECT_EQ(wait.code, 0) << wait.out << cluster_->DebugLogs();
  EXPECT_THAT(wait.out, HasSubstr("SUCCEEDED"));
  auto info = cluster_->GetJob(id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_EQ(info->job().state(), v1::SUCCEEDED) << info->job().reason();
  EXPECT_EQ(info->attempts_size(), 1);
}

TEST_F(SecurityTest, AgentCallsWithoutAClientCertificateAreUnauthenticated) {
  StartCluster(0);
  // TLS that checks the coordinator but presents no certificate: what a stranger that
  // trusts the cluster CA can do.
  auto channel = MakeChannel(cluster_->address(), ca_only_);
  auto workers = v1::WorkerService::NewStub(channel);
  auto expect_refused = [](const grpc::Status& st, const std::string& method) {
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED)
        << method << ": " << st.error_message();
    EXPECT_THAT(st.error_message(), HasSubstr(method + " needs a cluster client certificate"));
  };
  {
    v1::RegisterRequest req;
    req.set_name("intruder");
    req.set_agent_id("intruder-1");
    req.add_slots()->set_index(0);
    v1::RegisterResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 5000);
    expect_refused(workers->Register(&ctx, req, &resp), "Register");
  }
  {
    v1::HeartbeatRequest req;
    req.set_name("intruder");
    v1::HeartbeatResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 5000);
    expect_refused(workers->Heartbeat(&ctx, req, &resp), "Heartbeat");
  }
  {
    v1::AppendLogsRequest req;
    v1::AppendLogsResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 5000);
    expect_refused(workers->AppendLogs(&ctx, req, &resp), "AppendLogs");
  }
  {
    v1::WatchRequest req;
    req.set_name("intruder");
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 5000);
    auto reader = workers->Watch(&ctx, req);
    v1::WatchEvent event;
    EXPECT_FALSE(reader->Read(&event));
    expect_refused(reader->Finish(), "Watch");
  }
  {
    auto kv = v1::RendezvousService::NewStub(channel);
    v1::KvSetRequest req;
    req.mutable_key()->set_job_id("j");
    req.mutable_key()->set_key("k");
    v1::KvSetResponse resp;
    grpc::ClientContext ctx;
    SetDeadlineMs(&ctx, 5000);
    expect_refused(kv->Set(&ctx, req, &resp), "Set");
  }
  auto listed = cluster_->ListWorkers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->workers_size(), 0);
}

TEST_F(SecurityTest, AgentWithACertificateFromAnotherCaNeverRegisters) {
  StartCluster(0);
  const std::string log = (cluster_->root() / "stranger.log").string();
  Process stranger(
      Cluster::Bin("drover-worker"),
      {"--coordinator", cluster_->address(), "--name", "stranger", "--work-dir",
       (cluster_->root() / "stranger").string(), "--trainer", Cluster::Bin("drover-fake-trainer"),
       "--tls-cert", certs_.stranger_cert, "--tls-key", certs_.stranger_key, "--tls-ca", certs_.ca},
      log);
  // The coordinator's handshake rejects the certificate, so the agent's Register fails
  // (as UNAVAILABLE: gRPC does not tell a client why its handshake was cut).
  ASSERT_TRUE(
      WaitUntil([&] { return ReadAll(log).find("Register with") != std::string::npos; }, 20000))
      << ReadAll(log);
  auto listed = cluster_->ListWorkers();
  ASSERT_TRUE(listed.ok()) << listed.status();
  EXPECT_EQ(listed->workers_size(), 0) << ReadAll(log);
  EXPECT_TRUE(ProcessAlive(cluster_->coordinator()->pid()));
}

TEST_F(SecurityTest, WorkerWithACaButNoCertificateOfItsOwnRefusesToStart) {
  const std::string log = (dir_ / "worker.log").string();
  Process worker(Cluster::Bin("drover-worker"),
                 {"--coordinator", "127.0.0.1:1", "--name", "w", "--work-dir",
                  (dir_ / "w").string(), "--tls-ca", certs_.ca},
                 log);
  int ws = 0;
  ASSERT_TRUE(worker.Wait(10000, &ws));
  ASSERT_TRUE(WIFEXITED(ws));
  EXPECT_EQ(WEXITSTATUS(ws), 2);
  EXPECT_THAT(ReadAll(log), HasSubstr("--tls-cert and --tls-key are missing"));
}

TEST_F(SecurityTest, CliWithoutATokenIsRefusedWithWhatIsMissing) {
  StartCluster(0);
  CliResult r = Cli("", {"jobs"});
  EXPECT_EQ(r.code, 1) << r.out;
  EXPECT_THAT(r.out, HasSubstr("this call needs a token: give --token-file or $DROVER_TOKEN"));
  CliResult wrong = RunCli(cluster_->root(),
                           {"--coordinator", cluster_->address(), "--tls-ca", certs_.ca, "jobs"},
                           {{"DROVER_TOKEN", "not-a-token-of-this-cluster"}});
  EXPECT_EQ(wrong.code, 1) << wrong.out;
  EXPECT_THAT(wrong.out, HasSubstr("not valid on this coordinator"));
  CliResult missing = Cli((dir_ / "no-such-token").string(), {"jobs"});
  EXPECT_EQ(missing.code, 2) << missing.out;
  EXPECT_THAT(missing.out, HasSubstr("--token-file"));
}

TEST_F(SecurityTest, ReadOnlyTokenListsButCannotSubmitOrCancelAndAdminCan) {
  StartCluster(1);
  const std::string spec = FakeJobSpec("long", 100000, 50);
  CliResult refused_submit = Cli(reader_file_, {"submit", spec});
  EXPECT_EQ(refused_submit.code, 1) << refused_submit.out;
  EXPECT_THAT(refused_submit.out, HasSubstr("the token of 'grafana' is read-only"));
  CliResult submit = Cli(admin_file_, {"submit", spec});
  ASSERT_EQ(submit.code, 0) << submit.out << cluster_->DebugLogs();
  const std::string id = submit.out.substr(0, submit.out.find('\n'));

  CliResult jobs = Cli(reader_file_, {"jobs"});
  EXPECT_EQ(jobs.code, 0) << jobs.out;
  EXPECT_THAT(jobs.out, HasSubstr(id));
  CliResult workers = Cli(reader_file_, {"workers"});
  EXPECT_EQ(workers.code, 0) << workers.out;
  EXPECT_THAT(workers.out, HasSubstr("w0"));
  CliResult status = Cli(reader_file_, {"status", id});
  EXPECT_EQ(status.code, 0) << status.out;

  CliResult cancel = Cli(reader_file_, {"cancel", id});
  EXPECT_EQ(cancel.code, 1) << cancel.out;
  EXPECT_THAT(cancel.out, HasSubstr("the token of 'grafana' is read-only; CancelJob needs an "
                                    "admin token"));
  auto info = cluster_->GetJob(id);
  ASSERT_TRUE(info.ok()) << info.status();
  EXPECT_NE(info->job().state(), v1::CANCELLED);
  CliResult rm = Cli(reader_file_, {"rm", id});
  EXPECT_EQ(rm.code, 1) << rm.out;
  EXPECT_THAT(rm.out, HasSubstr("read-only"));

  CliResult admin_cancel = Cli(admin_file_, {"cancel", id});
  EXPECT_EQ(admin_cancel.code, 0) << admin_cancel.out;
  EXPECT_TRUE(cluster_->WaitJob(
      id, [](const v1::JobInfo& i) { return i.job().state() == v1::CANCELLED; }, 10000));
}

TEST_F(SecurityTest, PlaintextClientsFailCleanlyAgainstATlsCoordinator) {
  StartCluster(0);
  auto plain = v1::JobService::NewStub(MakeChannel(cluster_->address()));
  v1::ListJobsRequest req;
  v1::ListJobsResponse resp;
  grpc::ClientContext ctx;
  SetDeadlineMs(&ctx, 5000);
  AddBearerToken(&ctx, kAdminToken);
  grpc::Status st = plain->ListJobs(&ctx, req, &resp);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAVAILABLE) << st.error_message();

  CliResult cli = RunCli(cluster_->root(), {"--coordinator", cluster_->address(), "--token-file",
                                            admin_file_, "--retry-for", "0", "jobs"});
  EXPECT_EQ(cli.code, 1) << cli.out;
  EXPECT_THAT(cli.out, HasSubstr("cannot reach the coordinator"));
  EXPECT_THAT(cli.out, HasSubstr("if it serves TLS, give --tls-ca"));

  // The coordinator shrugged both off and still serves TLS clients.
  EXPECT_TRUE(ProcessAlive(cluster_->coordinator()->pid()));
  auto listed = cluster_->ListJobs();
  EXPECT_TRUE(listed.ok()) << listed.status();
}

// Starts drover-coordinator with `flags`; returns its exit status, or -1 while it still
// runs once its log says it listens (then it is killed).
int RunCoordinator(const std::filesystem::path& dir, const std::string& tag,
                   std::vector<std::string> flags, std::string* log_text) {
  const std::string log = (dir / (tag + ".log")).string();
  flags.insert(flags.end(), {"--state-dir", (dir / ("state-" + tag)).string()});
  Process p(Cluster::Bin("drover-coordinator"), flags, log);
  int ws = 0;
  int result = -2;
  WaitUntil(
      [&] {
        if (ReadAll(log).find("coordinator listening on") != std::string::npos) {
          result = -1;
          return true;
        }
        if (p.Wait(0, &ws)) {
          result = WIFEXITED(ws) ? WEXITSTATUS(ws) : 128 + WTERMSIG(ws);
          return true;
        }
        return false;
      },
      20000);
  *log_text = ReadAll(log);
  return result;
}

TEST_F(SecurityTest, CoordinatorBeyondLoopbackNeedsTlsAndTokensOrInsecure) {
  const std::string listen = "0.0.0.0:" + std::to_string(FreePort());
  std::string log;
  EXPECT_EQ(RunCoordinator(dir_, "bare", {"--listen", listen}, &log), 2) << log;
  EXPECT_THAT(log, HasSubstr("is reachable from other machines"));
  EXPECT_THAT(log, HasSubstr("--insecure"));

  EXPECT_EQ(RunCoordinator(dir_, "tokens-only", {"--listen", listen, "--tokens", tokens_}, &log), 2)
      << log;
  EXPECT_THAT(log, HasSubstr("TLS (--tls-cert, --tls-key, --tls-ca) is missing"));

  EXPECT_EQ(RunCoordinator(dir_, "insecure", {"--listen", listen, "--insecure"}, &log), -1) << log;
  EXPECT_THAT(log, HasSubstr("--insecure: serving"));

  EXPECT_EQ(RunCoordinator(dir_, "protected",
                           {"--listen", listen, "--tls-cert", certs_.server_cert, "--tls-key",
                            certs_.server_key, "--tls-ca", certs_.ca, "--tokens", tokens_},
                           &log),
            -1)
      << log;
  EXPECT_THAT(log, HasSubstr("(mutual TLS), JobService needs a token"));
}

TEST_F(SecurityTest, WorkerDialsACoordinatorBeyondLoopbackOnlyWithTlsOrInsecure) {
  const std::string log = (dir_ / "worker.log").string();
  Process worker(
      Cluster::Bin("drover-worker"),
      {"--coordinator", "10.255.255.1:7600", "--name", "w", "--work-dir", (dir_ / "w").string()},
      log);
  int ws = 0;
  ASSERT_TRUE(worker.Wait(10000, &ws));
  ASSERT_TRUE(WIFEXITED(ws));
  EXPECT_EQ(WEXITSTATUS(ws), 2);
  EXPECT_THAT(ReadAll(log), HasSubstr("is beyond loopback and no TLS is given"));
}

}  // namespace
}  // namespace drover::testing
