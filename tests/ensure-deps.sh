#!/usr/bin/env bash
# Installs what pgidgen's tests and demo need from Debian's packages when it is missing:
# PostgreSQL's server programs, libfaketime, and spin (with gcc) for the model check. Needs root (or passwordless sudo) only when something is missing.
set -euo pipefail
have_pg() {
  command -v pg_ctl >/dev/null 2>&1 && command -v initdb >/dev/null 2>&1 && return 0
  compgen -G '/usr/lib/postgresql/*/bin/pg_ctl' >/dev/null && return 0
  return 1
}
have_faketime() { compgen -G '/usr/lib/*/faketime/libfaketime.so.1' >/dev/null || compgen -G '/usr/lib/faketime/libfaketime.so.1' >/dev/null; }
need=()
have_pg || need+=(postgresql postgresql-client)
have_faketime || need+=(faketime)
command -v runuser >/dev/null 2>&1 || need+=(util-linux)
command -v spin >/dev/null 2>&1 || need+=(spin)   # the model check of next_id (tests/test_next_id_model.py)
command -v gcc >/dev/null 2>&1 || need+=(gcc)
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
# Debian's postgresql package starts a cluster of its own; pgidgen does not use it.
