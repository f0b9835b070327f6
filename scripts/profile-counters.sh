#!/usr/bin/env bash
# What the member-month counter's first pass costs, part by part (issue 16's profile, the
# counters' half; scripts/profile-void.sh is the void's).
#
#   scripts/profile-counters.sh [MEMBERS] [ROUNDS]    (default 300000 members, 1 round)
#
# The same throwaway cluster, settings and data as scripts/profile-void.sh. After V2 and V3's
# index, the duplicates are marked and voided by the one-shot's ranked UPDATE (the state the
# first counter pass starts from), and then, each on a fresh TEMPLATE copy after a CHECKPOINT,
# member_monthly_usage is filled from the non-voided coupons:
#
#   M0  the one-shot's CREATE TABLE AS, then its primary key
#   M1  one INSERT ... SELECT into V2's empty table (its primary key maintained row by row)
#   M2  M1 plus pgmend's ledger_compact record per created row (what pgmend writes)
#   M3  M1 plus one record per 10,000 created rows: the same values as typed arrays
#   M4  M2 range by range, 10,000 members a statement, each range's coupons found through
#       V3's index (the shape of pgmend's batches, without their locks and drift comparison)
#
# and prints seconds, WAL in MB and the rows created (every variant must create the same
# rows). Nothing here is a test; see docs/benchmark.md.
set -euo pipefail
members=${1:-300000}
rounds=${2:-1}
port=${PGPORT_PROFILE:-5498}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/profile-cluster.sh
. "$here/scripts/profile-cluster.sh"

psql -c "CREATE DATABASE base"
psql -d base -f "$here/migrations/V1__legacy_baseline.sql"
# The data of scripts/profile-void.sh (the benchmark's Silver Week).
sed -n '/^INSERT INTO campaigns/,/^SQL$/p' "$here/scripts/profile-void.sh" | sed '$d' |
  psql -d base -v members="$members"
psql -d base -f "$here/migrations/V2__expand_for_repair.sql"
psql -d base <<'SQL'
CREATE INDEX issued_coupons_by_member ON issued_coupons (member_id, campaign_id);
WITH ranked AS (
  SELECT coupon_id, redeemed_at,
         row_number() OVER (PARTITION BY campaign_id, member_id
                            ORDER BY redeemed_at IS NULL, issued_at, coupon_id) AS rn
    FROM issued_coupons)
UPDATE issued_coupons i
   SET voided_at = CASE WHEN r.redeemed_at IS NULL THEN now() END, legacy_duplicate = true
  FROM ranked r
 WHERE i.coupon_id = r.coupon_id AND r.rn > 1;
VACUUM ANALYZE;
SQL
echo "coupons, voided: $(psql -d base -At -c "SELECT count(*), count(voided_at) FROM issued_coupons")"

truth="SELECT member_id, month, coalesce(sum(amount_yen) FILTER (WHERE voided_at IS NULL), 0)::int AS used_yen
  FROM issued_coupons"
v6_table="CREATE TABLE ledger (ledger_id bigserial, run_id bigint NOT NULL, shape smallint NOT NULL,
  row_key jsonb NOT NULL, before jsonb, after jsonb, args jsonb, at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, ledger_id))"
v6_insert="INSERT INTO ledger (run_id, shape, row_key, after)
  SELECT 1, 2, jsonb_build_array(member_id, month), jsonb_build_array(member_id, month, used_yen) FROM ins"
array_table="CREATE TABLE ledger (run_id bigint NOT NULL, chunk bigint NOT NULL, member_id text[] NOT NULL,
  month text[] NOT NULL, used_yen int[] NOT NULL, PRIMARY KEY (run_id, chunk))"
array_insert="INSERT INTO ledger (run_id, chunk, member_id, month, used_yen)
  SELECT 1, n / 10000, array_agg(member_id), array_agg(month), array_agg(used_yen)
    FROM (SELECT i.*, row_number() OVER () AS n FROM ins i) i GROUP BY n / 10000"
insert="WITH ins AS (INSERT INTO member_monthly_usage (member_id, month, used_yen) $truth GROUP BY 1, 2
  RETURNING member_id, month, used_yen)"
ranges="DO \$\$
DECLARE lo text; hi text;
BEGIN
  FOR i IN 0 .. $members / 10000 LOOP
    lo := 'm' || lpad((i * 10000)::text, 7, '0');
    hi := 'm' || lpad(((i + 1) * 10000)::text, 7, '0');
    WITH ins AS (INSERT INTO member_monthly_usage (member_id, month, used_yen)
                 $truth WHERE member_id > lo AND member_id <= hi GROUP BY 1, 2
                 RETURNING member_id, month, used_yen)
    INSERT INTO ledger (run_id, shape, row_key, after)
    SELECT 1, 2, jsonb_build_array(member_id, month), jsonb_build_array(member_id, month, used_yen) FROM ins;
  END LOOP;
END \$\$"

# M5: M4 with the ON CONFLICT pgmend's batches write with (a counter row created meanwhile
# is merged); M6: M4 with one typed-array record per range instead of a row per key.
ranges_upsert=${ranges/RETURNING member_id/ON CONFLICT (member_id, month) DO UPDATE SET used_yen = member_monthly_usage.used_yen + excluded.used_yen
                 RETURNING member_id}
ranges_array=${ranges/"INSERT INTO ledger (run_id, shape, row_key, after)
    SELECT 1, 2, jsonb_build_array(member_id, month), jsonb_build_array(member_id, month, used_yen) FROM ins;"/"INSERT INTO ledger (run_id, chunk, member_id, month, used_yen)
    SELECT 1, i, array_agg(member_id), array_agg(month), array_agg(used_yen) FROM ins HAVING count(*) > 0;"}

variant() {
  case " ${VARIANTS:-$1} " in *" ${1%% *} "*) ;; *) return 0 ;; esac
  local name=$1 setup=$2 statement=$3
  psql -c "DROP DATABASE IF EXISTS copy" -c "CREATE DATABASE copy TEMPLATE base"
  [ -n "$setup" ] && psql -d copy -c "$setup"
  psql -d copy -c CHECKPOINT
  psql -d copy -At <<SQL | tail -1 | { IFS='|' read -r s mb rows; printf '%-44s %7s s %6s MB WAL %8s rows\n' "$name" "$s" "$mb" "$rows"; }
SET work_mem = '256MB';
SELECT pg_current_wal_insert_lsn() AS lsn \gset
SELECT clock_timestamp() AS t0 \gset
$statement;
SELECT round(extract(epoch FROM clock_timestamp() - :'t0'::timestamptz)::numeric, 2),
       round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'lsn') / 1e6),
       (SELECT count(*) FROM member_monthly_usage);
SQL
}
for round in $(seq "$rounds"); do
  echo "round $round of $rounds, $members members"
  variant "M0 CREATE TABLE AS, then its primary key" "DROP TABLE member_monthly_usage" \
    "CREATE TABLE member_monthly_usage AS $truth WHERE true GROUP BY 1, 2;
     ALTER TABLE member_monthly_usage ADD PRIMARY KEY (member_id, month)"
  variant "M1 INSERT ... SELECT" "" "$insert SELECT count(*) FROM ins"
  variant "M2 M1, ledger_compact per row" "$v6_table" "$insert $v6_insert"
  variant "M3 M1, array record per 10,000" "$array_table" "$insert $array_insert"
  variant "M4 M2 by ranges of 10,000 members" "$v6_table" "$ranges"
  variant "M5 M4 with ON CONFLICT DO UPDATE" "$v6_table" "$ranges_upsert"
  variant "M6 M4 with an array record per range" "$array_table" "$ranges_array"
done
