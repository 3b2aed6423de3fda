"""Sharded DDL: a schema file written once, unqualified, deployed to every shard, recorded in a ledger.

- `rewrite.py`: parsing with pglast and rewriting a file into a per-shard template (no database involved);
  `names.py`: what a name in a statement may be, by kind; `printfix.py`: pglast's printer where it is wrong;
- `dumpfile.py`: `apply-ddl --from-schema`, a schema dump (pg_dump, Rails' structure.sql) read into the same
  template: what it takes, turns into what, and leaves out; `extensions.py`: its extensions checked first;
- `ledger.py`: the ledger in each database's catalog, and replaying it for new shards;
- `apply.py`: `pgidgen apply-ddl` (plan, render, execute);
- `locks.py`: how many shards one apply-ddl transaction takes, from the server's lock table;
- `lockplan.py`: what each statement of a file will lock, rewrite or scan (`apply-ddl --dry-run`);
- `drift.py`: comparing the shards' schemas (`pgidgen status --drift`).
"""
from __future__ import annotations

from .rewrite import ShardedFile, parse_file, render_template

__all__ = ["ShardedFile", "parse_file", "render_template"]
