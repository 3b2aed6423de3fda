"""Where an unsharded database comes into the shards: `pgidgen import`.

- source.py: the source read (tables, key, replica identity, sequences) and every refusal, before anything is written;
- sqltext.py: the SQL, rendered as text (staging tables partitioned by shard, publications, subscriptions, the
  cutover's trigger), which the engine runs and --dry-run prints;
- keyof.py: --key-of, tables that reach the key through a foreign key, read and refused;
- settle.py: those tables' rows routed on each target by their parent's shard (staging, trigger, settle function);
- prepared.py: a source whose tables the import's role does not own, prepared once by their owner (--owner-sql):
  the publications, identities and the gate that stops writes at the cutover;
- replication.py: the targets' fan-out, and the replication taken down (teardown, rollback);
- engine.py: the named steps, journaled in the source, resumed or rolled back.
"""
from __future__ import annotations

from .engine import ImportResult, plan_import, resume_import, rollback_import, start_import
from .source import ImportPlan

__all__ = ["ImportPlan", "ImportResult", "plan_import", "resume_import", "rollback_import", "start_import"]
