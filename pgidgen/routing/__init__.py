"""The application side: which shard a key or an ID belongs to, which database serves that shard, and a
pooled connection there with the shard's schema first on `search_path`, so unqualified SQL works.

    router = Router.from_config()                  # or Router(config, shard_key=hashed)
    shard = router.shard_for(user_id)              # key % shard_count, or your function
    photo_id = router.run(shard, lambda conn: conn.execute(
        "INSERT INTO photos (user_id, caption) VALUES (%s, %s) RETURNING id", (user_id, "hi")).fetchone()[0])
    with router.transaction(router.shard_of(photo_id)) as conn:   # any ID names its shard
        conn.execute("SELECT * FROM photos WHERE id = %s", (photo_id,))
    rows = router.execute(shard, "SELECT * FROM photos WHERE user_id = %s", (user_id,), read_only=True)

Never writing to the wrong place. The map is only a cache (the union of every database's `pgidgen.shards`,
refreshed on `NOTIFY pgidgen_map` and whenever a route turns out stale); it decides where to *try*. What
decides whether a write may happen is the target database itself: every routed transaction starts with
`pgidgen.claim_shard(N)`, which takes shard N's claim lock on that database (an advisory lock in share mode,
held until the transaction ends), then reads that database's `pgidgen.shards` row of shard N and raises
SQLSTATE PGR01 unless it is 'active' (or 'moving'); a session skips that read while the database's map version
has not moved since one of its write claims found the shard served (sql/catalog.sql: pgidgen.claim, claim_fence
for why that stays true). A move retires the shard on the old database by UPDATE-ing
that row in a transaction that first takes the claim lock exclusively, which waits for every holder. So on any
one database:
- a transaction that passed the claim holds the lock until it ends: the flip commits after it, so its writes
  precede the flip in that database's commit order, and a move that copies everything committed before its
  flip carries them over (the move's side of the contract);
- a transaction that starts after the flip, or waited on the flip's lock, sees 'retired' and writes nothing:
  the row is read after the lock is granted, by a statement of its own, so under READ COMMITTED with a snapshot
  taken after the flip committed; under REPEATABLE READ the transaction's snapshot may be older, so the claim
  reads the row FOR SHARE as well, which fails with 40001 when the flip changed it since;
- a statement that reaches the old copy some other way finds the schema renamed (3F000/42P01) or, by its new
  name, move-shard's always-on trigger refusing writes (25006): the helper re-reads the row before blaming the
  move, so a genuinely missing table is still reported as such.
The error is ShardMovedError (retryable); `Router.run` re-reads the map and runs the work again on the database
that serves the shard now. move-shard's cutover takes the claim lock and the row (SELECT ... FOR UPDATE) before
it blocks the shard's tables, the same order as routed transactions; in the other order a routed writer caught
between the two would be cancelled by the deadlock detector (still nothing written in the wrong place).
(The lock is an advisory lock rather than the row FOR SHARE it was: no transaction ID, no WAL record, and no
MultiXact when many writers share it, a measurable part of a one-statement unit of work.)
Reads (read_only=True) skip the lock: a read that overlaps the flip reads the old copy as of the flip.
A cutover waiting for the lock queues new claims behind it (the row FOR SHARE let them pass, which could starve
the cutover): a write unit that waits for another of the same shard (nested, on another connection) stalls until
the cutover gives up at its lock_timeout (--max-pause); nothing unsafe, the move fails and is retried.

The claim costs no round trip of its own: it leaves in one pipeline with the work's first statement
(claiming.py), in the same order, so the argument above holds unchanged. It is sent as `CALL pgidgen.claim(N,
path)`, claim_shard's lock and check (claim_shard itself under REPEATABLE READ) and the transaction's
search_path in one routine the server does not plan (sql/catalog.sql says why and what it costs); a catalog
without it is claimed by `SELECT pgidgen.claim_shard(N), set_config(...)`, the same claim. `Router.execute` (one statement) adds COMMIT to that pipeline: BEGIN, the claim, the statement and COMMIT
leave together, one round trip. It is an explicit transaction block like Router.run's (not the extended
protocol's implicit transaction, in which PostgreSQL before 18 lets a procedure COMMIT and run on unclaimed),
and the statement always goes by the extended protocol, so a string of several is refused rather than run past
a COMMIT among them. What differs is that the COMMIT leaves with the statement: a write whose connection broke
after it was sent may have committed, and is reported rather than retried.

The package, a part per concern: keys.py (keys and IDs to shards), mapcache.py (the map, its reads, LISTEN and
polling), pools.py (the connection policy, e.g. behind PgBouncer, and the pools), breaker.py (a database that
cannot be connected to: its calls fail at once, not as a move's are retried), claiming.py (the pools'
connection class), ending.py (the statements that would end a unit's transaction, refused), unit.py (the
claimed unit of work and its retries), router.py (the Router that puts them together), fanout.py (one statement on
every shard, a round trip per database: the same claim, read for all of a database's shards at once, the argument
for moves in its docstring), fansql.py (that statement qualified for each shard, under UNION ALL), fanmerge.py (the
shards' rows merged, or combined).
"""
from __future__ import annotations

from .asyncrouter import AsyncRouter
from .fanmerge import FanOutResult
from .keys import ShardKey, hashed, modulo, shard_of_id
from .mapcache import Route, RoutingMap, build_routes, read_catalogs
from .router import APPLICATION_NAME, Router, locate, query
from .unit import MOVE_SYMPTOMS, NOT_SERVED

__all__ = [
    "APPLICATION_NAME", "AsyncRouter", "FanOutResult", "MOVE_SYMPTOMS", "NOT_SERVED", "Route", "Router", "RoutingMap", "ShardKey",
    "build_routes", "hashed", "locate", "modulo", "query", "read_catalogs", "shard_of_id",
]
