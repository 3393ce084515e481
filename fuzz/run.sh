#!/usr/bin/env bash
# Runs every fuzz target (or the ones named) to N inputs each, one after the other, and prints
# one line per target: inputs run, exec/s, seconds, crashes. Exits non-zero if any target
# crashed; the crashing input is in fuzz/artifacts/<target>/.
#
#   fuzz/run.sh [N] [target...]        N defaults to 10^7
#
# Needs cargo-fuzz (`cargo install cargo-fuzz --locked`). Works on a stable toolchain:
# RUSTC_BOOTSTRAP=1 lets it take the nightly-only flags cargo-fuzz passes. Environment:
#   FUZZ_SANITIZER   none (default: the code is safe Rust, and it runs several times faster)
#                    or address
#   FUZZ_BUILD       extra `cargo fuzz build` flags, e.g. --dev (faster to build, slower to run)
#   FUZZ_FLAGS       extra libFuzzer flags, e.g. -max_total_time=600 to bound each target's time
# New inputs a run finds go to a temporary directory, deleted afterwards; the checked-in seeds
# (fuzz/corpus/<target>/seed-*) and, for `topology`, examples/*.yaml are read, never written.
# The `xds` seeds are every resource of the example topologies, encoded as the control plane
# does; regenerate them with
#   FERRY_FUZZ_WRITE_SEEDS=fuzz/corpus/xds fuzz/target/x86_64-unknown-linux-gnu/release/xds -runs=0
set -euo pipefail
cd "$(dirname "$0")"
export RUSTC_BOOTSTRAP=1
export CARGO_INCREMENTAL=0

runs=${1:-10000000}
shift || true
sanitizer=${FUZZ_SANITIZER:-none}
read -r -a build_flags <<<"${FUZZ_BUILD:-}"
read -r -a fuzz_flags <<<"${FUZZ_FLAGS:-}"
if (($#)); then
  targets=("$@")
else
  mapfile -t targets < <(cargo fuzz list)
fi

cargo fuzz build --sanitizer "$sanitizer" "${build_flags[@]}" >&2

failed=0
for t in "${targets[@]}"; do
  work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-fuzz-$t.XXXXXX")
  log="$work.log"
  dirs=("$work" "corpus/$t")
  [[ $t == topology ]] && dirs+=(../examples)
  start=$(date +%s)
  set +e
  cargo fuzz run --sanitizer "$sanitizer" "${build_flags[@]}" "$t" "${dirs[@]}" -- \
    -runs="$runs" -print_final_stats=1 "${fuzz_flags[@]}" >"$log" 2>&1
  status=$?
  set -e
  secs=$(($(date +%s) - start))
  done_runs=$(awk '/^stat::number_of_executed_units/ { print $2 }' "$log")
  rate=$(awk '/^stat::average_exec_per_sec/ { print $2 }' "$log")
  crashes=0
  if ((status != 0)); then
    crashes=1
    failed=1
    grep -E "panicked|ERROR: libFuzzer|SUMMARY|Test unit written|Running:" "$log" >&2 || tail -n 30 "$log" >&2
  fi
  printf '%-16s %12s inputs %9s exec/s %6ss crashes: %s (sanitizer %s)\n' \
    "$t" "${done_runs:-?}" "${rate:-?}" "$secs" "$crashes" "$sanitizer"
  rm -rf "$work" "$log"
done
exit "$failed"
