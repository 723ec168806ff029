#include "coordinator/auth.h"

#include <gmock/gmock.h>
#include <google/protobuf/descriptor.h>
#include <gtest/gtest.h>

#include "proto/drover.pb.h"

namespace drover::coordinator {
namespace {

using ::testing::HasSubstr;

constexpr char kAdminToken[] = "admin-token-0123456789";
constexpr char kReaderToken[] = "reader-token-0123456789";

AuthPolicy FullPolicy() {
  AuthPolicy p;
  p.require_client_cert = true;
  p.tokens = {{kAdminToken, Role::kAdmin, "alice"}, {kReaderToken, Role::kReadOnly, "grafana"}};
  return p;
}

// The credentials view `header`, which must outlive them.
CallCredentials Bearer(std::string_view header) {
  CallCredentials c;
  c.authorization = header;
  return c;
}

const std::string kAdminHeader = std::string("Bearer ") + kAdminToken;
const std::string kReaderHeader = std::string("Bearer ") + kReaderToken;

TEST(AuthorizeTest, NothingConfiguredLetsEveryCallThrough) {
  const AuthPolicy open;
  for (const char* m : {"/drover.v1.JobService/CancelJob", "/drover.v1.WorkerService/Register",
                        "/drover.v1.RendezvousService/Set", "/some.Other/Method"}) {
    EXPECT_TRUE(Authorize(open, m, {}).ok()) << m;
  }
}

TEST(AuthorizeTest, AgentCallWithoutClientCertificateIsUnauthenticated) {
  Status st = Authorize(FullPolicy(), "/drover.v1.WorkerService/Register", {});
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(st.message(), HasSubstr("Register needs a cluster client certificate"));
  EXPECT_THAT(st.message(), HasSubstr("--tls-cert"));
}

TEST(AuthorizeTest, AgentCallWithClientCertificateNeedsNoToken) {
  CallCredentials cert;
  cert.client_cert = true;
  for (const char* m : {"/drover.v1.WorkerService/Heartbeat", "/drover.v1.WorkerService/Watch",
                        "/drover.v1.RendezvousService/Wait"}) {
    EXPECT_TRUE(Authorize(FullPolicy(), m, cert).ok()) << m;
  }
}

TEST(AuthorizeTest, AdminTokenCannotStandInForAClientCertificate) {
  Status st = Authorize(FullPolicy(), "/drover.v1.RendezvousService/Set", Bearer(kAdminHeader));
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated);
}

TEST(AuthorizeTest, JobServiceCallWithoutTokenSaysHowToGiveOne) {
  Status st = Authorize(FullPolicy(), "/drover.v1.JobService/ListJobs", {});
  EXPECT_EQ(st.code(), StatusCode::kUnauthenticated);
  EXPECT_EQ(st.message(), "this call needs a token: give --token-file or $DROVER_TOKEN");
}

TEST(AuthorizeTest, ClientCertificateCannotStandInForAToken) {
  CallCredentials cert;
  cert.client_cert = true;
  EXPECT_EQ(Authorize(FullPolicy(), "/drover.v1.JobService/SubmitJob", cert).code(),
            StatusCode::kUnauthenticated);
}

TEST(AuthorizeTest, UnknownOrMalformedTokenIsUnauthenticated) {
  Status unknown = Authorize(FullPolicy(), "/drover.v1.JobService/GetJob",
                             Bearer("Bearer not-a-token-of-this-cluster"));
  EXPECT_EQ(unknown.code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(unknown.message(), HasSubstr("not valid on this coordinator"));
  Status scheme = Authorize(FullPolicy(), "/drover.v1.JobService/GetJob",
                            Bearer(std::string("Basic ") + kAdminToken));
  EXPECT_EQ(scheme.code(), StatusCode::kUnauthenticated);
  EXPECT_THAT(scheme.message(), HasSubstr("'Bearer TOKEN'"));
  // The bare token, without the scheme, is not accepted either.
  EXPECT_EQ(Authorize(FullPolicy(), "/drover.v1.JobService/GetJob", Bearer(kAdminToken)).code(),
            StatusCode::kUnauthenticated);
}

TEST(AuthorizeTest, ReadOnlyTokenReadsButCannotChangeJobs) {
  const CallCredentials reader = Bearer(kReaderHeader);
  for (const char* m : {"/drover.v1.JobService/GetJob", "/drover.v1.JobService/ListJobs",
                        "/drover.v1.JobService/ListWorkers", "/drover.v1.JobService/ReadLogs"}) {
    EXPECT_TRUE(Authorize(FullPolicy(), m, reader).ok()) << m;
  }
  for (const char* m : {"/drover.v1.JobService/SubmitJob", "/drover.v1.JobService/CancelJob",
                        "/drover.v1.JobService/DeleteJob", "/drover.v1.JobService/Uncordon"}) {
    Status st = Authorize(FullPolicy(), m, reader);
    EXPECT_EQ(st.code(), StatusCode::kPermissionDenied) << m;
    EXPECT_THAT(st.message(), HasSubstr("the token of 'grafana' is read-only")) << m;
    EXPECT_THAT(st.message(), HasSubstr("needs an admin token")) << m;
  }
}

TEST(AuthorizeTest, AdminTokenMayDoEveryJobServiceCall) {
  const CallCredentials admin = Bearer(kAdminHeader);
  for (const char* m : {"/drover.v1.JobService/SubmitJob", "/drover.v1.JobService/CancelJob",
                        "/drover.v1.JobService/DeleteJob", "/drover.v1.JobService/GetJob"}) {
    EXPECT_TRUE(Authorize(FullPolicy(), m, admin).ok()) << m;
  }
}

TEST(AuthorizeTest, UnknownMethodNeedsAnAdminToken) {
  EXPECT_EQ(Authorize(FullPolicy(), "/drover.v1.JobService/Future", Bearer(kReaderHeader)).code(),
            StatusCode::kPermissionDenied);
  EXPECT_TRUE(Authorize(FullPolicy(), "/drover.v1.JobService/Future", Bearer(kAdminHeader)).ok());
}

TEST(AuthorizeTest, TokensAloneLeaveAgentsUncheckedAndCertificatesAloneLeaveJobServiceOpen) {
  AuthPolicy tokens_only;
  tokens_only.tokens = FullPolicy().tokens;
  EXPECT_TRUE(Authorize(tokens_only, "/drover.v1.WorkerService/Register", {}).ok());
  EXPECT_FALSE(Authorize(tokens_only, "/drover.v1.JobService/GetJob", {}).ok());
  AuthPolicy certs_only;
  certs_only.require_client_cert = true;
  EXPECT_TRUE(Authorize(certs_only, "/drover.v1.JobService/CancelJob", {}).ok());
  EXPECT_FALSE(Authorize(certs_only, "/drover.v1.WorkerService/Register", {}).ok());
}

// A method added to the proto is classified on purpose, not by the fallback.
TEST(ClassifyMethodTest, EveryMethodOfTheProtoIsClassified) {
  const auto* file = v1::JobInfo::descriptor()->file();
  int services = 0;
  for (int s = 0; s < file->service_count(); ++s) {
    const google::protobuf::ServiceDescriptor* service = file->service(s);
    ++services;
    for (int m = 0; m < service->method_count(); ++m) {
      const std::string name = "/" + service->full_name() + "/" + service->method(m)->name();
      auto kind = ClassifyMethod(name);
      ASSERT_TRUE(kind.has_value()) << name << " is missing from coordinator/auth.cc";
      const bool agent_service = service->name() != "JobService";
      EXPECT_EQ(*kind == MethodClass::kAgent, agent_service) << name;
    }
  }
  EXPECT_GE(services, 3);
  EXPECT_FALSE(ClassifyMethod("/drover.v1.JobService/Nope").has_value());
}

TEST(CheckExposureTest, LoopbackNeedsNothing) {
  for (const char* host : {"127.0.0.1", "127.3.4.5", "localhost", "::1"}) {
    EXPECT_TRUE(CheckExposure(host, false, false, false).ok()) << host;
  }
}

TEST(CheckExposureTest, BeyondLoopbackNeedsTlsAndTokensOrInsecure) {
  Status neither = CheckExposure("0.0.0.0", false, false, false);
  EXPECT_EQ(neither.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(neither.message(), HasSubstr("--tls-cert"));
  EXPECT_THAT(neither.message(), HasSubstr("--tokens"));
  EXPECT_THAT(neither.message(), HasSubstr("--insecure"));
  Status no_tokens = CheckExposure("10.0.0.5", true, false, false);
  EXPECT_FALSE(no_tokens.ok());
  EXPECT_THAT(no_tokens.message(), HasSubstr("tokens (--tokens FILE) is missing"));
  EXPECT_THAT(no_tokens.message(), ::testing::Not(HasSubstr("--tls-cert")));
  EXPECT_FALSE(CheckExposure("node7", false, true, false).ok());
  EXPECT_TRUE(CheckExposure("0.0.0.0", true, true, false).ok());
  EXPECT_TRUE(CheckExposure("0.0.0.0", false, false, true).ok());
}

// The dashboard has no authentication, so TLS and tokens on the gRPC port do not open it up.
TEST(CheckDashboardExposureTest, BeyondLoopbackOnlyWithInsecure) {
  EXPECT_TRUE(CheckDashboardExposure("127.0.0.1", false).ok());
  EXPECT_TRUE(CheckDashboardExposure("localhost", false).ok());
  Status exposed = CheckDashboardExposure("0.0.0.0", false);
  EXPECT_EQ(exposed.code(), StatusCode::kInvalidArgument);
  EXPECT_THAT(exposed.message(), HasSubstr("--http 0.0.0.0"));
  EXPECT_THAT(exposed.message(), HasSubstr("--insecure"));
  EXPECT_TRUE(CheckDashboardExposure("0.0.0.0", true).ok());
}

}  // namespace
}  // namespace drover::coordinator
