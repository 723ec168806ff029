// Certificates for the TLS tests, made at test time with the openssl command-line tool:
// a cluster CA; a coordinator certificate for 127.0.0.1 and localhost signed by it; an
// agent (client) certificate signed by it; and a stranger CA with a client certificate of
// its own, which the cluster must refuse. P-256 keys: fast to make.
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

namespace drover::testing {

struct TestCerts {
  std::string ca, server_cert, server_key, agent_cert, agent_key, stranger_cert, stranger_key;
};

// Writes the files into `dir` (which must exist); false when openssl failed (its output
// is in dir/openssl.log).
inline bool MakeTestCerts(const std::filesystem::path& dir, TestCerts* out) {
  const std::string d = dir.string();
  const std::string script = R"(set -e
cd ")" + d + R"("
key="-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes"
openssl req -x509 $key -keyout ca.key -out ca.pem -days 2 -subj /CN=drover-test-ca
openssl req -x509 $key -keyout stranger-ca.key -out stranger-ca.pem -days 2 -subj /CN=stranger-ca
printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n' > server.ext
printf 'extendedKeyUsage=clientAuth\n' > client.ext
openssl req $key -keyout server.key -out server.csr -subj /CN=drover-coordinator
openssl x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile server.ext -out server.pem
openssl req $key -keyout agent.key -out agent.csr -subj /CN=drover-agent
openssl x509 -req -in agent.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 \
  -extfile client.ext -out agent.pem
openssl req $key -keyout stranger.key -out stranger.csr -subj /CN=drover-agent
openssl x509 -req -in stranger.csr -CA stranger-ca.pem -CAkey stranger-ca.key \
  -CAcreateserial -days 2 -extfile client.ext -out stranger.pem
)";
  const std::filesystem::path sh = dir / "make_certs.sh";
  {
    FILE* f = fopen(sh.c_str(), "w");
    if (f == nullptr) return false;
    fputs(script.c_str(), f);
    fclose(f);
  }
  const std::string cmd = "bash '" + sh.string() + "' > '" + d + "/openssl.log' 2>&1";
  if (std::system(cmd.c_str()) != 0) return false;
  *out = {d + "/ca.pem",    d + "/server.pem",   d + "/server.key",  d + "/agent.pem",
          d + "/agent.key", d + "/stranger.pem", d + "/stranger.key"};
  return true;
}

}  // namespace drover::testing
