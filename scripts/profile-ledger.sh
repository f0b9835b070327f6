#!/usr/bin/env bash
# What a void run's ledger records cost to write, by the form they are stored in (issue 16:
# the ledger as a row per record, or a batch's records in one row).
#
#   scripts/profile-ledger.sh [RECORDS] [ROUNDS]    (default 300000 records, 2 rounds)
#
# The same throwaway cluster and settings as scripts/profile-void.sh. A table of RECORDS
# changed coupons (key, kept key, void time) stands for what a void batch's UPDATE returns;
# each variant writes one ledger record per coupon from it, after a CHECKPOINT:
#
#   L1  a row per record, jsonb arrays (schema version 6's ledger_compact: what pgmend writes)
#   L2  a row per 6,000 records, jsonb arrays of those arrays (jsonb_agg)
#   L3  a row per 6,000 records, jsonb[] (array_agg of the per-record arrays)
#   L4  a row per 12 records, jsonb[] (small enough to stay out of TOAST)
#   L5  a row per 6,000 records, one typed array per column (uuid[], boolean[], timestamptz[])
#
# and prints seconds and WAL in MB. Nothing here is a test; see docs/benchmark.md.
set -euo pipefail
records=${1:-300000}
rounds=${2:-2}
port=${PGPORT_PROFILE:-5496}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/profile-cluster.sh
. "$here/scripts/profile-cluster.sh"

psql -v records="$records" <<'SQL'
CREATE TABLE changed AS
  SELECT g, gen_random_uuid() AS k, gen_random_uuid() AS kept, now() AS voided_at
    FROM generate_series(1, :records) g;
CREATE SEQUENCE ids;
CREATE TABLE l1 (ledger_id bigint DEFAULT nextval('ids'), run_id bigint, shape smallint, row_key jsonb,
  before jsonb, after jsonb, args jsonb, at timestamptz DEFAULT now(), PRIMARY KEY (run_id, ledger_id));
CREATE TABLE l2 (run_id bigint, first_id bigint, last_id bigint, shape smallint, ids bigint[], row_keys jsonb,
  befores jsonb, afters jsonb, args jsonb, at timestamptz DEFAULT now(), PRIMARY KEY (run_id, first_id));
CREATE TABLE l3 (run_id bigint, first_id bigint, last_id bigint, shape smallint, ids bigint[], row_keys jsonb[],
  befores jsonb[], afters jsonb[], args jsonb[], at timestamptz DEFAULT now(), PRIMARY KEY (run_id, first_id));
CREATE TABLE l4 (LIKE l3 INCLUDING ALL);
CREATE TABLE l5 (run_id bigint, first_id bigint, last_id bigint, ids bigint[], keys uuid[], before_marks boolean[],
  before_voids timestamptz[], after_marks boolean[], after_voids timestamptz[], ranks int[], kept uuid[],
  at timestamptz DEFAULT now(), PRIMARY KEY (run_id, first_id));
SQL

numbered="(SELECT nextval('ids') AS id, c.* FROM changed c) x"
jsonb_cols="jsonb_build_array(k), jsonb_build_array(false, null, null), jsonb_build_array(true, voided_at, null), jsonb_build_array(2, kept)"
declare -A sql=(
  [L1]="INSERT INTO l1 (run_id, shape, row_key, before, after, args) SELECT 1, 1, $jsonb_cols FROM changed"
  [L2]="INSERT INTO l2 (run_id, first_id, last_id, shape, ids, row_keys, befores, afters, args)
        SELECT 1, min(id), max(id), 1, array_agg(id), jsonb_agg(jsonb_build_array(k)), jsonb_agg(jsonb_build_array(false, null, null)),
               jsonb_agg(jsonb_build_array(true, voided_at, null)), jsonb_agg(jsonb_build_array(2, kept)) FROM $numbered GROUP BY g / 6000"
  [L3]="INSERT INTO l3 (run_id, first_id, last_id, shape, ids, row_keys, befores, afters, args)
        SELECT 1, min(id), max(id), 1, array_agg(id), array_agg(jsonb_build_array(k)), array_agg(jsonb_build_array(false, null, null)),
               array_agg(jsonb_build_array(true, voided_at, null)), array_agg(jsonb_build_array(2, kept)) FROM $numbered GROUP BY g / 6000"
  [L4]="INSERT INTO l4 (run_id, first_id, last_id, shape, ids, row_keys, befores, afters, args)
        SELECT 1, min(id), max(id), 1, array_agg(id), array_agg(jsonb_build_array(k)), array_agg(jsonb_build_array(false, null, null)),
               array_agg(jsonb_build_array(true, voided_at, null)), array_agg(jsonb_build_array(2, kept)) FROM $numbered GROUP BY g / 12"
  [L5]="INSERT INTO l5 (run_id, first_id, last_id, ids, keys, before_marks, before_voids, after_marks, after_voids, ranks, kept)
        SELECT 1, min(id), max(id), array_agg(id), array_agg(k), array_agg(false), array_agg(NULL::timestamptz), array_agg(true),
               array_agg(voided_at), array_agg(2), array_agg(kept) FROM $numbered GROUP BY g / 6000"
)
for round in $(seq 1 "$rounds"); do
  for v in L1 L2 L3 L4 L5; do
    psql -c "CHECKPOINT"
    lsn=$(psql -At -c "SELECT pg_current_wal_insert_lsn()")
    start=$(date +%s%N)
    psql -c "${sql[$v]}"
    ms=$((($(date +%s%N) - start) / 1000000))
    mb=$(psql -At -c "SELECT round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), '$lsn') / 1e6, 1)")
    echo "round $round $v: $ms ms, WAL $mb MB"
  done
  psql -c "TRUNCATE l1, l2, l3, l4, l5"
done
