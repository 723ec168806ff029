#!/usr/bin/env bash
# The runtime stage of deploy/Dockerfile installs the Debian packages that hold every shared
# library drover's programs load, so the image starts without a Docker daemon ever having
# run here: each library `ldd` finds for this build's drover, drover-coordinator,
# drover-worker and drover-trainer belongs (dpkg -S) to a package the stage's apt-get
# installs, to one of their dependencies (recursively, as apt would pull them in), or to
# an Essential package every Debian image has. Run on the Debian release the Dockerfile
# names (bookworm), since package names carry library versions.
#
#   image_libraries_test.sh BUILD/bin SOURCE_DIR
set -euo pipefail
bin=$(cd "${1:?usage: image_libraries_test.sh BUILD/bin SOURCE_DIR}" && pwd)
src=$(cd "${2:?usage: image_libraries_test.sh BUILD/bin SOURCE_DIR}" && pwd)
fail() { echo "FAIL: $*"; exit 1; }
command -v dpkg-query >/dev/null || fail "dpkg-query not found: this check needs a Debian host"

# The last stage's `apt-get install` package names (words after the options, up to &&).
runtime=$(awk '/^FROM /{stage++} {print stage "\t" $0}' "$src/deploy/Dockerfile" |
  awk -F'\t' -v last="$(grep -c '^FROM ' "$src/deploy/Dockerfile")" '$1 == last {print $2}' |
  sed -e ':a' -e '/\\$/N; s/\\\n//; ta' |
  grep -o 'apt-get install[^&]*' | tr ' ' '\n' | grep -v -e '^-' -e '^apt-get$' -e '^install$' -e '^$' || true)
[ -n "$runtime" ] || fail "no apt-get install in the Dockerfile's last stage"

# Every installed package's dependencies (Depends and Pre-Depends, every alternative), read
# once: the closure below is computed in memory.
declare -A deps=() essential=()
while read -r pkg ess rest; do
  deps[$pkg]=$rest
  [ "$ess" = yes ] && essential[$pkg]=1
done < <(dpkg-query -W -f='${Package}\t${Status}\t${Essential}\t${Depends}, ${Pre-Depends}\n' |
  awk -F'\t' '$2 ~ / installed$/ {
    gsub(/\([^)]*\)/, "", $4); gsub(/:any/, "", $4); gsub(/[,|]/, " ", $4)
    print $1, ($3 == "yes" ? "yes" : "no"), $4 }')
for p in $runtime; do
  [ -n "${deps[$p]+x}" ] || fail "runtime package $p is not installed here (is it a bookworm package name?)"
done
declare -A closure=()
queue=($runtime "${!essential[@]}")
while [ ${#queue[@]} -gt 0 ]; do
  p=${queue[-1]}
  unset 'queue[-1]'
  [ -n "${closure[$p]:-}" ] && continue
  closure[$p]=1
  for d in ${deps[$p]:-}; do
    [ -z "${closure[$d]:-}" ] && [ -n "${deps[$d]+x}" ] && queue+=("$d")
  done
done

# Every library the four programs load (once each), with the program that loads it.
declare -A loaded_by=()
for exe in drover drover-coordinator drover-worker drover-trainer; do
  [ -x "$bin/$exe" ] || fail "$bin/$exe is missing: build it first"
  ldd_out=$(ldd "$bin/$exe")
  if grep -q 'not found' <<<"$ldd_out"; then fail "$exe: $(grep 'not found' <<<"$ldd_out")"; fi
  for lib in $(awk '/=> \//{print $3} /^[[:space:]]*\/[^ ]+ \(/{print $1}' <<<"$ldd_out"); do
    loaded_by[$(readlink -f "$lib")]=$exe
  done
done
# One dpkg -S for all of them. With merged /usr a package may have registered the file
# under /lib rather than /usr/lib, so both spellings are asked and owners are keyed by the
# file name ("package[:arch]: /path" per path dpkg knows).
declare -A owner=()
paths=()
for lib in "${!loaded_by[@]}"; do
  paths+=("$lib")
  [[ $lib == /usr/lib/* ]] && paths+=("${lib#/usr}")
done
while IFS= read -r line; do
  owner[$(basename "${line#*: }")]=${line%%[:,]*}
done < <(dpkg -S "${paths[@]}" 2>/dev/null || true)
for lib in "${!loaded_by[@]}"; do
  o=${owner[$(basename "$lib")]:-}
  [ -n "$o" ] || fail "${loaded_by[$lib]} loads $lib, which no Debian package owns"
  [ -n "${closure[$o]:-}" ] ||
    fail "${loaded_by[$lib]} loads $lib from package $o, which the image's runtime stage does not install"
done
checked=${#loaded_by[@]}
echo "PASS: $checked libraries of 4 programs, all from the runtime stage's packages: $(echo $runtime)"
