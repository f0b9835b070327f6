#!/usr/bin/env bash
# What the void-duplicate-coupons step's guarantees cost, one at a time (issue 16's profile).
#
#   scripts/profile-void.sh [MEMBERS] [ROUNDS]        (default 300000 members, 2 rounds)
#
# Starts a throwaway PostgreSQL 15 cluster (PGBIN, default /usr/lib/postgresql/15/bin; run as
# root it runs the server as the postgres user) in a temporary directory, with the settings of
# examples/bench_release.rs (fsync and synchronous_commit off, full_page_writes on,
# max_wal_size 4GB, checkpoint_timeout 1h). It loads the benchmark's Silver Week data (90% of
# members take each campaign, 7% of groups with three coupons and 23% with two), applies V2,
# builds V3's index, and then, each on a fresh TEMPLATE copy after a CHECKPOINT, times the void
# as ONE statement over every group, in these variants:
#
#   A0  the one-shot's ranked UPDATE, without V3's index
#   A   the same with V3's index (what pgmend's batches face)
#   E   A plus a compact ledger record per changed row (key, before/after voided_at, the
#       redeemed_at that decided, rank, kept key: the reason derived when read)
#   B   rows locked FOR UPDATE and ranked on the locked versions (pgmend's write-time ranking)
#   D   B plus the compact ledger record
#   C   B plus a jsonb ledger record with its reason string (what pgmend wrote until schema 6)
#   D6  B plus pgmend's ledger_compact record since schema 6 (jsonb arrays against a shape)
#   F   B plus one record per 5,000 changed rows: the same values as D, as typed arrays
#   G   D6 with V3's index partial (WHERE voided_at IS NULL): a voided row's new version
#       is not inserted into it
#   H   rows ranked as the statement's snapshot saw them; only each group's kept row locked
#       FOR UPDATE; every later row locked by the UPDATE itself, which writes it only if the
#       values the ranking used are still its values (READ COMMITTED rechecks the WHERE on
#       the latest version), no ledger
#   H6  H plus pgmend's ledger_compact record
#   K   without V3's index (built after the void): the coupons of every group with more than
#       one unmarked row frozen first (one scan), then batches of 5,000 groups that lock them
#       through the primary key, rank the locked versions, mark, void and write D6's record
#   K3  K with V3's index in place (what V3 costs the batches)
#
# VARIANTS="B D6 H H6" runs only those (default: all).
# and prints seconds, WAL in MB and the number of coupons marked (298,826 at 300,000 members:
# every variant must mark the same rows). Nothing here is a test; see docs/benchmark.md.
set -euo pipefail
members=${1:-300000}
rounds=${2:-2}
port=${PGPORT_PROFILE:-5499}
here=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=scripts/profile-cluster.sh
. "$here/scripts/profile-cluster.sh"

psql -c "CREATE DATABASE base"
psql -d base -f "$here/migrations/V1__legacy_baseline.sql"
psql -d base -v members="$members" <<'SQL'
INSERT INTO campaigns (campaign_id, discount_yen, budget_yen, issued_yen)
SELECT id, 1000, (budget::bigint * :members / 300)::int, 0
  FROM (VALUES ('SW-A', 100000), ('SW-B', 300000), ('SW-C', 300000)) v(id, budget);
INSERT INTO issued_coupons (coupon_id, campaign_id, member_id, month, amount_yen, issued_at, redeemed_at)
SELECT gen_random_uuid(), c.campaign_id, 'm' || lpad(m::text, 7, '0'), '2026-09', c.discount_yen,
       timestamptz '2026-09-19 09:00+09' + (h.r % 432000) * interval '1 second' + k * interval '180 milliseconds',
       CASE WHEN (h.r / 7 + k * 13) % 100 < 35 THEN timestamptz '2026-09-25 12:00+09' + (h.r % 1000) * interval '1 minute' END
  FROM generate_series(1, :members) m
 CROSS JOIN campaigns c
 CROSS JOIN LATERAL (SELECT hashtext(c.campaign_id || ':' || m)::bigint & 2147483647 AS r) h
 CROSS JOIN LATERAL generate_series(1, CASE WHEN h.r % 100 < 7 THEN 3 WHEN h.r % 100 < 30 THEN 2 ELSE 1 END) k
 WHERE (h.r / 100) % 100 < 90;
SQL
psql -d base -f "$here/migrations/V2__expand_for_repair.sql"
psql -d base -c "CREATE INDEX issued_coupons_by_member ON issued_coupons (member_id, campaign_id)" \
  -c "VACUUM ANALYZE"
echo "coupons, duplicates: $(psql -d base -At -c "SELECT count(*), count(*) - count(DISTINCT (campaign_id, member_id)) FROM issued_coupons")"

rank="PARTITION BY campaign_id, member_id ORDER BY (redeemed_at IS NULL), issued_at, coupon_id"
returning="RETURNING t.coupon_id AS k, r.before_void, t.voided_at AS after_void, r.rn, r.kept, r.keep_value"
set_void="SET legacy_duplicate = true, voided_at = CASE WHEN r.keep_value IS NULL THEN coalesce(t.voided_at, now()) ELSE t.voided_at END"
no_lock="WITH ranked AS (
  SELECT t.coupon_id AS k, t.voided_at AS before_void, t.redeemed_at AS keep_value,
         row_number() OVER w AS rn, first_value(t.coupon_id) OVER w AS kept
    FROM issued_coupons t WHERE NOT t.legacy_duplicate WINDOW w AS ($rank)),
 changed AS (UPDATE issued_coupons t $set_void FROM ranked r WHERE t.coupon_id = r.k AND r.rn > 1 $returning)"
locked="WITH g AS MATERIALIZED (
  SELECT campaign_id, member_id FROM issued_coupons WHERE NOT legacy_duplicate GROUP BY 1, 2 HAVING count(*) > 1),
 locked AS (SELECT t.* FROM issued_coupons t JOIN g USING (campaign_id, member_id)
             WHERE NOT t.legacy_duplicate ORDER BY t.coupon_id FOR UPDATE OF t),
 ranked AS (SELECT l.coupon_id AS k, l.voided_at AS before_void, l.redeemed_at AS keep_value,
                   row_number() OVER w AS rn, first_value(l.coupon_id) OVER w AS kept
              FROM locked l WINDOW w AS ($rank)),
 changed AS (UPDATE issued_coupons t $set_void FROM ranked r WHERE t.coupon_id = r.k AND r.rn > 1 $returning)"
# H: the ranking's values are rechecked on the version the UPDATE locks (and on the kept row's).
seen="WITH g AS MATERIALIZED (
  SELECT campaign_id, member_id FROM issued_coupons WHERE NOT legacy_duplicate GROUP BY 1, 2 HAVING count(*) > 1),
 seen AS (SELECT t.coupon_id AS k, t.campaign_id, t.member_id, t.issued_at, t.voided_at AS before_void,
                 t.redeemed_at AS keep_value, row_number() OVER w AS rn, first_value(t.coupon_id) OVER w AS kept
            FROM issued_coupons t JOIN g USING (campaign_id, member_id) WHERE NOT t.legacy_duplicate WINDOW w AS ($rank)),
 held AS (SELECT t.coupon_id FROM issued_coupons t JOIN seen s ON t.coupon_id = s.k
           WHERE s.rn = 1 AND NOT t.legacy_duplicate AND (t.campaign_id, t.member_id, t.issued_at) = (s.campaign_id, s.member_id, s.issued_at)
             AND t.redeemed_at IS NOT DISTINCT FROM s.keep_value AND t.voided_at IS NOT DISTINCT FROM s.before_void
           ORDER BY t.coupon_id FOR UPDATE OF t),
 changed AS (UPDATE issued_coupons t $set_void FROM seen r JOIN held h ON h.coupon_id = r.kept
              WHERE t.coupon_id = r.k AND r.rn > 1 AND NOT t.legacy_duplicate
                AND (t.campaign_id, t.member_id, t.issued_at) = (r.campaign_id, r.member_id, r.issued_at)
                AND t.redeemed_at IS NOT DISTINCT FROM r.keep_value AND t.voided_at IS NOT DISTINCT FROM r.before_void
              $returning)"
# K: frozen row keys, batches through the primary key (a DO loop of 5,000 groups each).
frozen_batches="CREATE TABLE frozen AS
  SELECT row_number() OVER (ORDER BY campaign_id, member_id) AS seq, array_agg(coupon_id) AS ids
    FROM issued_coupons WHERE NOT legacy_duplicate GROUP BY campaign_id, member_id HAVING count(*) > 1;
  CREATE INDEX ON frozen (seq);
  DO \$do\$ DECLARE lo bigint := 0; n bigint := (SELECT count(*) FROM frozen); BEGIN
    WHILE lo < n LOOP
      WITH locked AS (SELECT t.* FROM issued_coupons t
                       WHERE t.coupon_id IN (SELECT unnest(f.ids) FROM frozen f WHERE f.seq > lo AND f.seq <= lo + 5000)
                         AND NOT t.legacy_duplicate ORDER BY t.coupon_id FOR UPDATE OF t),
       ranked AS (SELECT l.coupon_id AS k, l.voided_at AS before_void, l.redeemed_at AS keep_value,
                         row_number() OVER w AS rn, first_value(l.coupon_id) OVER w AS kept
                    FROM locked l WINDOW w AS ($rank)),
       changed AS (UPDATE issued_coupons t $set_void FROM ranked r WHERE t.coupon_id = r.k AND r.rn > 1 $returning)
      INSERT INTO ledger (run_id, shape, row_key, before, after, args)
      SELECT 1, 1, jsonb_build_array(k), jsonb_build_array(false, before_void, keep_value),
             jsonb_build_array(true, after_void, keep_value), jsonb_build_array(rn, kept) FROM changed;
      lo := lo + 5000;
    END LOOP; END \$do\$"
jsonb_table="CREATE TABLE ledger (ledger_id bigserial, run_id bigint NOT NULL, target_table text NOT NULL,
  row_key jsonb NOT NULL, action text NOT NULL, before jsonb, after jsonb, reason text NOT NULL,
  at timestamptz NOT NULL DEFAULT now(), PRIMARY KEY (run_id, ledger_id))"
jsonb_insert="INSERT INTO ledger (run_id, target_table, row_key, action, before, after, reason)
  SELECT 1, 'issued_coupons', jsonb_build_object('coupon_id', k), 'update',
         jsonb_build_object('legacy_duplicate', false, 'voided_at', before_void, 'redeemed_at', keep_value),
         jsonb_build_object('legacy_duplicate', true, 'voided_at', after_void, 'redeemed_at', keep_value),
         format('rank %s in its group; %s %s is kept', rn, 'coupon_id', kept) FROM changed"
compact_table="CREATE TABLE ledger (ledger_id bigserial, run_id bigint NOT NULL, row_key text NOT NULL,
  before_void timestamptz, after_void timestamptz, keep_value timestamptz, rank smallint, kept text,
  PRIMARY KEY (run_id, ledger_id))"
compact_insert="INSERT INTO ledger (run_id, row_key, before_void, after_void, keep_value, rank, kept)
  SELECT 1, k::text, before_void, after_void, keep_value, rn, kept::text FROM changed"
no_ledger="SELECT count(*) FROM changed"
v6_table="CREATE TABLE ledger (ledger_id bigserial, run_id bigint NOT NULL, shape smallint NOT NULL,
  row_key jsonb NOT NULL, before jsonb, after jsonb, args jsonb, at timestamptz NOT NULL DEFAULT now(),
  PRIMARY KEY (run_id, ledger_id))"
v6_insert="INSERT INTO ledger (run_id, shape, row_key, before, after, args)
  SELECT 1, 1, jsonb_build_array(k), jsonb_build_array(false, before_void, keep_value),
         jsonb_build_array(true, after_void, keep_value), jsonb_build_array(rn, kept) FROM changed"
array_table="CREATE TABLE ledger (run_id bigint NOT NULL, chunk bigint NOT NULL, row_key text[] NOT NULL,
  before_void timestamptz[], after_void timestamptz[], keep_value timestamptz[], rank smallint[], kept text[],
  PRIMARY KEY (run_id, chunk))"
array_insert="INSERT INTO ledger (run_id, chunk, row_key, before_void, after_void, keep_value, rank, kept)
  SELECT 1, n / 5000, array_agg(k::text), array_agg(before_void), array_agg(after_void), array_agg(keep_value),
         array_agg(rn::smallint), array_agg(kept::text)
    FROM (SELECT c.*, row_number() OVER () AS n FROM changed c) c GROUP BY n / 5000"
partial_v3="DROP INDEX issued_coupons_by_member;
  CREATE INDEX issued_coupons_by_member ON issued_coupons (member_id, campaign_id) WHERE voided_at IS NULL;
  $v6_table"

variant() {
  local name=$1 setup=$2 statement=$3
  case " ${VARIANTS:-$name} " in *" ${name%% *} "*) ;; *) return 0 ;; esac
  psql -c "DROP DATABASE IF EXISTS copy" -c "CREATE DATABASE copy TEMPLATE base"
  [ -n "$setup" ] && psql -d copy -c "$setup"
  psql -d copy -c CHECKPOINT
  psql -d copy -At <<SQL | tail -1 | { IFS='|' read -r s mb marked; printf '%-44s %7s s %6s MB WAL %8s marked\n' "$name" "$s" "$mb" "$marked"; }
SET work_mem = '256MB';
SELECT pg_current_wal_insert_lsn() AS lsn \gset
SELECT clock_timestamp() AS t0 \gset
$statement;
SELECT round(extract(epoch FROM clock_timestamp() - :'t0'::timestamptz)::numeric, 2),
       round(pg_wal_lsn_diff(pg_current_wal_insert_lsn(), :'lsn') / 1e6),
       (SELECT count(*) FROM issued_coupons WHERE legacy_duplicate);
SQL
}
for round in $(seq "$rounds"); do
  echo "round $round of $rounds, $members members"
  variant "A0 ranked UPDATE, no V3 index" "DROP INDEX issued_coupons_by_member" "$no_lock $no_ledger"
  variant "A  ranked UPDATE" "" "$no_lock $no_ledger"
  variant "E  ranked UPDATE, compact ledger" "$compact_table" "$no_lock $compact_insert"
  variant "B  locked and ranked" "" "$locked $no_ledger"
  variant "D  locked and ranked, compact ledger" "$compact_table" "$locked $compact_insert"
  variant "C  locked and ranked, jsonb ledger (schema 5)" "$jsonb_table" "$locked $jsonb_insert"
  variant "D6 locked and ranked, ledger_compact" "$v6_table" "$locked $v6_insert"
  variant "F  locked and ranked, array per 5,000" "$array_table" "$locked $array_insert"
  variant "G  D6, V3 partial (voided_at IS NULL)" "$partial_v3" "$locked $v6_insert"
  variant "H  kept row locked, the rest rechecked" "" "$seen $no_ledger"
  variant "K  no V3, frozen keys, PK batches" "DROP INDEX issued_coupons_by_member; $v6_table" "$frozen_batches"
  variant "K3 K with V3" "$v6_table" "$frozen_batches"
  variant "H6 H, ledger_compact" "$v6_table" "$seen $v6_insert"
done
