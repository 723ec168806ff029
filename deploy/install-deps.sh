#!/usr/bin/env bash
# Installs the Debian packages drover builds against, only those that are missing.
# Uses sudo when not root. Nothing else is downloaded.
set -euo pipefail
pkgs=(cmake g++ make pkg-config
      libgrpc++-dev protobuf-compiler-grpc libprotobuf-dev protobuf-compiler
      libspdlog-dev libcli11-dev libyaml-cpp-dev libgtest-dev libgmock-dev
      libgloo-dev libopenblas-dev libsqlite3-dev nlohmann-json3-dev
      libcpp-httplib-dev prometheus-cpp-dev)
# `make fuzz` also needs clang and its libFuzzer runtime.
[ "${1:-}" = fuzz ] && pkgs+=(clang libclang-rt-14-dev)
# `make test` also needs what the deployment tests start or call: a one-node Slurm with
# munge (tests/integration/slurm_test.sh), systemd-analyze, and python3 for tests/tools/;
# promtool to check /metrics (it comes with the Prometheus server package, the only Debian
# package that ships it; on a systemd host that package also enables a prometheus.service)
# and headless Chromium to render the dashboard; clang for the thread-safety analysis
# (tests/tools/thread_safety_check.py); iproute2 for the cluster of network namespaces
# (tests/integration/netns_cluster_test.sh), nftables for its lossy network, and openssl for
# the TLS tests' certificates.
# `make demo` needs none of them.
[ "${1:-}" = test ] && pkgs+=(munge slurm-wlm systemd python3 prometheus chromium clang
  iproute2 nftables openssl)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
[ ${#missing[@]} -eq 0 ] && exit 0
echo "drover: installing missing packages: ${missing[*]}"
sudo=""
[ "$(id -u)" -ne 0 ] && sudo="sudo"
$sudo apt-get update -q
DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -q --no-install-recommends "${missing[@]}"
