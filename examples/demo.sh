#!/usr/bin/env bash
# make demo: two throwaway servers, 2000 logical shards on db1, the example app's tables in every shard (as
# README's step 2), IDs made in shard_5 and decoded, the app, and a shard moved under a writer.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
work=$(mktemp -d)
trap 'cd "$work" && pgidgen sandbox down >/dev/null 2>&1 || true; rm -rf "$work"' EXIT
cd "$work"
echo "== pgidgen sandbox up --databases 2"
pgidgen sandbox up --databases 2
echo; echo "== pgidgen layout"
pgidgen layout
echo; echo "== pgidgen init --shards 2000 --databases db1"
pgidgen init --shards 2000 --databases db1
echo; echo "== pgidgen map"
pgidgen map
echo; echo "== the example app's tables (examples/schema.sql) in every shard: pgidgen apply-ddl"
pgidgen apply-ddl "$repo/examples/schema.sql"
echo; echo "== rows in shard_5.photos by hand (pgidgen psql db1): ids from shard_5.next_id()"
pgidgen psql db1 -q -v ON_ERROR_STOP=1 <<'SQL'
INSERT INTO shard_5.photos (user_id, caption)
SELECT 5 + 2000 * g, 'photo ' || g FROM generate_series(1, 5) g;
SQL
pgidgen psql db1 -q -A -t -c "SELECT id FROM shard_5.photos ORDER BY id" > ids.txt
cat ids.txt
echo; echo "== pgidgen decode (IDs on stdin)"
pgidgen decode < ids.txt
echo; echo "== the same in SQL: pgidgen.decode(id)"
pgidgen psql db1 -c "SELECT p.id, d.* FROM shard_5.photos p, pgidgen.decode(p.id) d ORDER BY p.id"

echo; echo "== the example app (examples/photos.py) on the same tables: insert, list, fetch by ID alone, like, a time range on the primary key"
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
