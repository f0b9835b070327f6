# Sourced by scripts/profile-void.sh and scripts/profile-counters.sh (set `port` first): starts
# a throwaway PostgreSQL cluster (PGBIN, default /usr/lib/postgresql/15/bin; as root the server
# runs as the postgres user) with examples/bench_release.rs's settings in a temporary
# directory, removed on exit, and defines `psql` for it.
pgbin=${PGBIN:-/usr/lib/postgresql/15/bin}
dir=$(mktemp -d /tmp/pgmend-profile.XXXXXX)
as_server() { if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi; }
[ "$(id -u)" = 0 ] && chown postgres "$dir"
as_server "$pgbin/initdb" -D "$dir/data" -A trust >/dev/null
as_server "$pgbin/pg_ctl" -D "$dir/data" -l "$dir/log" -w -o "-p $port -k $dir -c fsync=off \
  -c synchronous_commit=off -c full_page_writes=on -c max_wal_size=4GB -c checkpoint_timeout=1h" \
  start >/dev/null
trap 'as_server "$pgbin/pg_ctl" -D "$dir/data" -m immediate stop >/dev/null; rm -rf "$dir"' EXIT
psql() { PGOPTIONS="-c client_min_messages=warning" "$pgbin/psql" -h "$dir" -p "$port" -U postgres -q -v ON_ERROR_STOP=1 "$@"; }
