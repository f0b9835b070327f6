#!/usr/bin/env bash
# How long `pgmend repair undo` of the void run takes to answer after the whole release, when
# the unique index makes it refuse (every group would get a second live coupon).
#
#   scripts/profile-undo.sh [MEMBERS] [PGMEND]    (default 10000 members, target/release/pgmend)
#
# The throwaway cluster and data of scripts/profile-void.sh; pgmend baselines V1, applies the
# release through the gate, then undoes run 1 and the time to its answer (exit 1) is printed.
# Nothing here is a test; see docs/benchmark.md.
set -euo pipefail
members=${1:-10000}
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${2:-$here/target/release/pgmend}
port=${PGPORT_PROFILE:-5497}
# shellcheck source=scripts/profile-cluster.sh
. "$here/scripts/profile-cluster.sh"

psql -c "CREATE DATABASE base"
psql -d base -f "$here/migrations/V1__legacy_baseline.sql"
sed -n '/^INSERT INTO campaigns/,/^SQL$/p' "$here/scripts/profile-void.sh" | sed '$d' |
  psql -d base -v members="$members"
export DATABASE_URL="postgres://postgres@localhost:$port/base?host=$dir"
cd "$here"
"$bin" migrate baseline --yes >/dev/null
"$bin" apply --yes --confirm deploy-new-application >/dev/null 2>"$dir/apply.log"
echo "ledger records of run 1: $(psql -d base -At -c "SELECT count(*) FROM pgmend.ledger_records WHERE run_id = 1")"
start=$(date +%s%N)
set +e
"$bin" repair undo 1 --yes >/dev/null 2>"$dir/undo.log"
code=$?
set -e
echo "undo: exit $code after $((($(date +%s%N) - start) / 1000000)) ms"
head -c 200 "$dir/undo.log"
echo
