#include "common/tls.h"

#include "common/files.h"

namespace drover {
namespace {

// Reads `path` (given as `flag`) and checks that it holds a PEM block whose label ends
// with `label` ("CERTIFICATE", "PRIVATE KEY"): a key passed as --tls-cert is caught here.
StatusOr<std::string> ReadPem(const std::string& path, std::string_view flag,
                              std::string_view label) {
  auto text = ReadFileToString(path);
  if (!text.ok()) {
    return InvalidArgumentError(std::string(flag) + " '" + path + "': " + text.status().message());
  }
  const size_t begin = text->find("-----BEGIN ");
  const size_t end_of_label = begin == std::string::npos ? begin : text->find("-----", begin + 11);
  if (end_of_label == std::string::npos ||
      !std::string_view(*text).substr(0, end_of_label).ends_with(label)) {
    return InvalidArgumentError(std::string(flag) + " '" + path + "' holds no PEM " +
                                std::string(label) + " (-----BEGIN ..." + std::string(label) +
                                "-----)");
  }
  return text;
}

}  // namespace

StatusOr<TlsCredentials> LoadTlsCredentials(const TlsFiles& files, CertNeed need) {
  TlsCredentials creds;
  if (!files.any()) return creds;
  if (files.ca.empty()) {
    return InvalidArgumentError(
        "--tls-ca is missing: TLS needs the cluster CA certificate to check the peer");
  }
  if (files.cert.empty() != files.key.empty()) {
    return InvalidArgumentError(files.cert.empty()
                                    ? "--tls-key is given without --tls-cert; give both"
                                    : "--tls-cert is given without --tls-key; give both");
  }
  if (need == CertNeed::kRequired && files.cert.empty()) {
    return InvalidArgumentError(
        "--tls-cert and --tls-key are missing: with --tls-ca this program needs its own "
        "certificate signed by the cluster CA");
  }
  creds.enabled = true;
  ASSIGN_OR_RETURN(creds.ca_pem, ReadPem(files.ca, "--tls-ca", "CERTIFICATE"));
  if (!files.cert.empty()) {
    ASSIGN_OR_RETURN(creds.cert_pem, ReadPem(files.cert, "--tls-cert", "CERTIFICATE"));
    ASSIGN_OR_RETURN(creds.key_pem, ReadPem(files.key, "--tls-key", "PRIVATE KEY"));
  }
  return creds;
}

std::string HostOfAddress(std::string_view address) {
  std::string_view host = address.substr(0, address.rfind(':'));
  if (host.size() >= 2 && host.front() == '[' && host.back() == ']') {
    host = host.substr(1, host.size() - 2);
  }
  return std::string(host);
}

bool IsLoopbackHost(std::string_view host) {
  if (host == "localhost" || host == "::1") return true;
  // 127.0.0.0/8 as an IPv4 literal; "127.example.com" is a name like any other.
  if (!host.starts_with("127.")) return false;
  for (char c : host) {
    if (c != '.' && (c < '0' || c > '9')) return false;
  }
  return true;
}

}  // namespace drover
