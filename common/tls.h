// TLS material for drover's gRPC connections, read from PEM files named by the
// --tls-cert / --tls-key / --tls-ca flags of every program, and the loopback test that
// decides when a plaintext connection is acceptable.
//
// Who needs what (README.md, "Security"):
//   coordinator  its server certificate and key, and the cluster CA that signs agents';
//   worker       a cluster certificate and key (mutual TLS) and the CA to check the server;
//   CLI          the CA to check the server; a certificate only if the operator wants one.
// Files are read once at start-up; a missing or malformed file is InvalidArgument naming
// the flag, so a typo fails at once instead of as a handshake error at the first call.
#pragma once

#include <string>
#include <string_view>

#include "common/status.h"

namespace drover {

// The flags as given: paths, each empty when not given.
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;
  bool any() const { return !cert.empty() || !key.empty() || !ca.empty(); }
};

// The PEM text of those files. `enabled` false: plaintext (no flag was given).
struct TlsCredentials {
  bool enabled = false;
  std::string cert_pem;  // empty when no certificate is presented (a CLI without one)
  std::string key_pem;
  std::string ca_pem;
};

enum class CertNeed {
  kRequired,  // coordinator and worker: --tls-cert and --tls-key must come with --tls-ca
  kOptional,  // CLI: --tls-ca alone is enough; --tls-cert and --tls-key go together
};

// No flag given: TLS off. Otherwise --tls-ca is always needed, the certificate as `need`
// says, and each file must be readable PEM of the right kind.
StatusOr<TlsCredentials> LoadTlsCredentials(const TlsFiles& files, CertNeed need);

// The host part of "host:port" ("[::1]:7600" -> "::1").
std::string HostOfAddress(std::string_view address);

// True for localhost, 127.0.0.0/8 and ::1: addresses no other machine can reach.
bool IsLoopbackHost(std::string_view host);

}  // namespace drover
