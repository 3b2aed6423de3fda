"""The command line: the `pgidgen` group (group.py) with every command registered on it, here and only here.
Each family of commands is a module of its own (ids, ddl, moves, importing, fleet, query, check, sandbox, psql); they share
common.py and import no other command module. A command parses its options, calls one library function and
prints what it returns."""
from __future__ import annotations

from . import check, ddl, fleet, ids, importing, moves, psql, query, sandbox
from .group import main

for _command in (
    ids.layout_cmd, ids.init_cmd, ids.decode_cmd, ids.locate_cmd,
    ddl.apply_ddl_cmd,
    moves.move_shard_cmd,
    importing.import_cmd,
    fleet.map_cmd, fleet.status_cmd, fleet.cleanup_cmd, fleet.rebalance_cmd,
    query.query_cmd,
    check.check_cmd,
    sandbox.sandbox_group,
    psql.psql_cmd,
):
    main.add_command(_command)

__all__ = ["main"]
