#!/usr/bin/env bash
# Makes tests/fixtures/v6_at_deploy_gate.sql again: the database an older pgmend leaves at the
# gate deploy-new-application, frozen for tests/schema_version.rs.
#
#   scripts/freeze-deploy-gate-fixture.sh [COMMIT]      (default e46869a, schema version 6)
#
# Builds the pgmend binary of COMMIT in a temporary git worktree (its own target directory,
# removed on exit), or takes PGMEND_FREEZE_BINARY when set (a binary built from COMMIT), then
# runs this checkout's ignored test freeze_the_deploy_gate_fixture with it: the harness's data
# for 200 members, `migrate baseline --yes` and `apply --yes` by that binary, five coupons from
# the old application, and pg_dump (PGMEND_FREEZE_PG_DUMP, else the tests' server binaries).
# Review the diff before committing: the fixture stands for what that release left in
# production, and the tests that read it expect its figures.
set -euo pipefail
cd "$(dirname "$0")/.."
commit=$(git rev-parse --short "${1:-e46869a}^{commit}")
if [ -z "${PGMEND_FREEZE_BINARY:-}" ]; then
  tree=$(mktemp -d /tmp/pgmend-freeze.XXXXXX)
  trap 'git worktree remove --force "$tree"; rm -rf "$tree"' EXIT
  git worktree add --detach "$tree" "$commit" >&2
  CARGO_TARGET_DIR="$tree/target" cargo build --manifest-path "$tree/Cargo.toml" --bin pgmend >&2
  PGMEND_FREEZE_BINARY="$tree/target/debug/pgmend"
fi
PGMEND_FREEZE_BINARY=$PGMEND_FREEZE_BINARY PGMEND_FREEZE_COMMIT=$commit \
  cargo test --test schema_version -- --ignored --exact freeze_the_deploy_gate_fixture --nocapture
echo "wrote tests/fixtures/v6_at_deploy_gate.sql ($(wc -c < tests/fixtures/v6_at_deploy_gate.sql) bytes) from pgmend $commit" >&2
