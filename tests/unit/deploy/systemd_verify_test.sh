#!/usr/bin/env bash
# deploy/systemd/*.service through `systemd-analyze verify`, which parses each unit as
# systemd would load it (unknown keys, bad values, missing dependencies, ExecStart that is
# not an executable file) without a running systemd, which neither this machine nor CI has.
#
#   systemd_verify_test.sh BUILD/bin SOURCE_DIR
#
# The units start /usr/local/bin/drover-*, so verification runs against a scratch root
# (--root): the host's unit directory (for targets such as network-online.target), the
# units in etc/systemd/system/ and this build's programs at the paths the units name.
# systemd-analyze exits 0 on many findings it only prints (an unknown key is "ignoring"),
# so any output at all fails the test.
set -euo pipefail
bin=$(cd "${1:?usage: systemd_verify_test.sh BUILD/bin SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: systemd_verify_test.sh BUILD/bin SOURCE_DIR}" && pwd)
command -v systemd-analyze >/dev/null || { echo "FAIL: systemd-analyze not found (Debian package systemd)"; exit 1; }

root=$(mktemp -d "${TMPDIR:-/tmp}/drover-systemd.XXXXXX")
trap 'rm -rf "$root"' EXIT
mkdir -p "$root/usr/lib/systemd" "$root/etc/systemd/system" "$root/usr/local/bin"
host_units=/usr/lib/systemd/system
[ -d "$host_units" ] || host_units=/lib/systemd/system
cp -a "$host_units" "$root/usr/lib/systemd/system"
units=()
for unit in "$src"/deploy/systemd/*.service; do
  cp "$unit" "$root/etc/systemd/system/"
  units+=("$(basename "$unit")")
  # The program each ExecStart names, from this build (a hard link when the file system
  # allows, else a copy).
  exe=$(sed -n 's|^ExecStart=\(/[^ ]*\).*|\1|p' "$unit")
  [ -n "$exe" ] || { echo "FAIL: $unit has no absolute ExecStart"; exit 1; }
  [ -x "$bin/$(basename "$exe")" ] || { echo "FAIL: $unit starts $exe; this build has no $(basename "$exe")"; exit 1; }
  mkdir -p "$root$(dirname "$exe")"
  ln -f "$bin/$(basename "$exe")" "$root$exe" 2>/dev/null || cp "$bin/$(basename "$exe")" "$root$exe"
done
[ ${#units[@]} -ge 2 ] || { echo "FAIL: expected the coordinator and worker units"; exit 1; }

out=$(systemd-analyze verify --root="$root" --man=no "${units[@]}" 2>&1) && rc=0 || rc=$?
if [ "$rc" -ne 0 ] || [ -n "$out" ]; then
  echo "FAIL: systemd-analyze verify (exit $rc):"
  echo "$out"
  exit 1
fi
# On stop the worker drains its trainers for --stop-grace-ms; systemd's SIGKILL at
# TimeoutStopSec must come after (README.md: a node shut down on purpose loses no training).
worker="$src/deploy/systemd/drover-worker.service"
grace_ms=$(sed -n 's/.*--stop-grace-ms \([0-9]*\).*/\1/p' "$worker")
stop_s=$(sed -n 's/^TimeoutStopSec=\([0-9]*\)$/\1/p' "$worker")
[ -n "$grace_ms" ] || { echo "FAIL: $worker passes no --stop-grace-ms: trainers get 5 s to drain"; exit 1; }
[ -n "$stop_s" ] || { echo "FAIL: $worker sets no TimeoutStopSec in seconds"; exit 1; }
if [ $((grace_ms + 5000)) -gt $((stop_s * 1000)) ]; then
  echo "FAIL: --stop-grace-ms $grace_ms leaves the agent under 5 s of TimeoutStopSec=$stop_s"
  exit 1
fi
echo "PASS: systemd-analyze verify ${units[*]} (systemd $(systemd-analyze --version | awk 'NR==1{print $2}'))"
