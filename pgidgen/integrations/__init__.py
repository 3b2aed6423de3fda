"""pgidgen inside ORMs: a Django database router (django.py) and a SQLAlchemy sharded session (sqlalchemy.py).

Both follow the Router's contract (pgidgen/routing/__init__.py): a unit of work is a transaction on the
database the map names that starts with `pgidgen.claim_shard(N)`; a refusal (SQLSTATE PGR01) or another error a
move explains means nothing was written there, and the unit of work runs again where the shard lives now
(retrying.py). Only the Router's public API is used: its map (database_for, shard_of, invalidate,
search_path_for); the ORMs keep their own connections."""
