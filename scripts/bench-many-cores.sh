#!/usr/bin/env bash
# Runs examples/bench_release on a bare many-core machine (x86-64 Linux, no network), in two
# halves: `prepare` here, where cargo and the network are, and `run` there, in a copy of this
# working tree that holds what `prepare` printed to carry.
#
#   scripts/bench-many-cores.sh prepare [MAJOR]   # default major 15
#   scripts/bench-many-cores.sh run [MEMBERS...]  # default 300000 1000000
#
# prepare: builds the release binary and the benchmark (`cargo build --release --bins
#   --examples`), fetches the PostgreSQL server of MAJOR with scripts/fetch-postgres.sh into
#   .bench/postgres (ignored by git) without its static libraries and headers (the server
#   needs neither), writes .bench/manifest (the directory the binaries were built in, the
#   server's bin directory, a digest of the sources) and packs the binaries and the server
#   into .bench/carry.tar.xz (about 19 MB; unpacked they are over the 64 MiB a device call
#   carries), and prints the two paths to carry.
# run: unpacks .bench/carry.tar.xz; checks that the tree's sources are the ones the binaries
#   were built from (the digest: a copied tree has new modification times, so bench_release's
#   own "binary older than the sources" check would refuse it, and is satisfied by touching
#   the binaries only after the digest matched); points bench_release at this tree
#   (PGMEND_BENCH_TREE: it reads src/ and migrations/ there, not under the path it was built
#   in); as root, makes the postgres user exist and copies the
#   server where that user can reach it; then, for each member count, runs bench_release
#   with pgmend's defaults (`--jobs auto`) against the one-shot SQL and, on a third copy,
#   `--jobs ${PGMEND_BENCH_JOBS_TOO:-8}`, three times (PGMEND_BENCH_ROUNDS), and prints
#   nproc, the memory, the server's version and the tables. Every run compares the end
#   states row for row and the two pgmend runs ledger for ledger, and fails on a difference.
#   Logs: .bench/out/ (bench_release's stdout per round, pgmend's stderr from /tmp).
set -euo pipefail
shopt -s inherit_errexit
cd "$(dirname "$0")/.."

log() { echo "bench-many-cores: $*" >&2; }
die() { log "error: $*"; exit 2; }

digest() { # the sources bench_release and pgmend were built from
  find src migrations repairs release.toml examples -type f -print0 | LC_ALL=C sort -z |
    xargs -0 sha256sum | sha256sum | cut -d' ' -f1
}

prepare() {
  local major=${1:-15} bin
  cargo build --release --bins --examples
  mkdir -p .bench
  bin=$(PGMEND_PG_CACHE=$PWD/.bench/postgres scripts/fetch-postgres.sh "$major" | cut -d' ' -f2)
  # The server runs without the static libraries and headers: drop them to carry less.
  find .bench/postgres -name '*.a' -delete
  find .bench/postgres -type d -name include -prune -exec rm -rf {} +
  {
    echo "built_in=$PWD"
    echo "pgbin=${bin#"$PWD"/}"
    echo "sources=$(digest)"
  } >.bench/manifest
  # One compressed file to carry: the server's ICU data alone is 26 MB unpacked, and a
  # device's carry is 64 MiB in all (about 19 MB packed).
  tar -cJf .bench/carry.tar.xz .bench/postgres target/release/pgmend target/release/examples/bench_release
  log "carry: .bench/carry.tar.xz .bench/manifest ($(du -h .bench/carry.tar.xz | cut -f1))"
  echo .bench/carry.tar.xz .bench/manifest
}

run() {
  [ -f .bench/manifest ] || die ".bench/manifest is missing: run '$0 prepare' where cargo is, and carry what it prints"
  local built_in pgbin sources
  built_in=$(sed -n 's/^built_in=//p' .bench/manifest)
  pgbin=$(sed -n 's/^pgbin=//p' .bench/manifest)
  sources=$(sed -n 's/^sources=//p' .bench/manifest)
  [ "$(digest)" = "$sources" ] || die "the sources here differ from those the binaries were built from: run '$0 prepare' again"
  [ -f .bench/carry.tar.xz ] || die ".bench/carry.tar.xz is missing: carry what '$0 prepare' printed"
  tar -xJf .bench/carry.tar.xz
  for f in target/release/pgmend target/release/examples/bench_release "$pgbin/postgres"; do
    [ -x "$f" ] || die "$f is missing: carry what '$0 prepare' printed"
  done
  touch target/release/pgmend target/release/examples/bench_release
  # bench_release reads src/ (to refuse a stale binary) and migrations/ here, not where it was
  # built.
  export PGMEND_BENCH_TREE=$PWD
  [ "$built_in" = "$PWD" ] || log "built in $built_in, run in $PWD"
  if [ "$(id -u)" = 0 ]; then
    id postgres >/dev/null 2>&1 || useradd --system --home-dir /var/lib/postgresql --shell /bin/bash postgres
    # The postgres user must reach the server's files: /root, say, is closed to it.
    rm -rf /var/tmp/pgmend-postgres
    cp -a "$(dirname "$pgbin")" /var/tmp/pgmend-postgres
    chmod -R a+rX /var/tmp/pgmend-postgres
    export PGBIN=/var/tmp/pgmend-postgres/bin
  else
    PGBIN=$PWD/$pgbin
    export PGBIN
  fi
  mkdir -p .bench/out
  log "$(nproc) cores, $(awk '/MemTotal/ { printf "%.0f GiB", $2 / 1048576 }' /proc/meminfo), $("$PGBIN/postgres" --version)"
  local rounds=${PGMEND_BENCH_ROUNDS:-3} round
  [ $# -gt 0 ] || set -- 300000 1000000
  for round in $(seq 1 "$rounds"); do
    log "round $round of $rounds: $*"
    PGMEND_BENCH_JOBS=auto PGMEND_BENCH_JOBS_TOO=${PGMEND_BENCH_JOBS_TOO:-8} \
      target/release/examples/bench_release "$@" | tee ".bench/out/round-$round.md"
    cp /tmp/bench-pgmend-*.log .bench/out/ 2>/dev/null || true
  done
}

case ${1:-} in
  prepare) shift; prepare "$@" ;;
  run) shift; run "$@" ;;
  *) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2; exit 2 ;;
esac
