"""The phases of a move, one module each; engine.py's Mover walks them in the journal's order.

- base.py         what every phase shares: options, the report, connections, the crash-test points
- prepare.py      prepare (the source marks the shard moving), schema (offline), the target's catalog
- copy.py         copy: the slot and its snapshot, the schema and rows into one target transaction
- replication.py  publication, subscription, catchup (heartbeats, clock skew), teardown of all three
- cutover.py      cutover: the write pause, the schema compared, the source retired
- activate.py     activate: the target serves the shard, its generator state carried over
- verify.py       verify: the copies compared at the cutover point
- rollback.py     rollback of a move not yet past activate
- failover.py     the source's slot gone when a step that streams from it runs again (a failover): copy again
- ride.py         a lost connection during any step: waited for (--fault-wait), the step run again as --resume would
"""
