"""`pgidgen query SQL`: one statement on every shard (or --shards), the rows merged, through the admin connections
(the Router's fan_out, pgidgen/routing/fanout.py): for operators' questions, "which shard holds this email",
"rows per shard"."""
from __future__ import annotations

import datetime as dt
import json
from decimal import Decimal
from typing import Any

import click

from .common import get_config

_NUMBERS = (int, float, Decimal)


def parse_combine(text: str | None) -> str | list[str | None] | None:
    """--combine: one of sum, min, max for every column, or one per column with 'group' for a column to group by."""
    if text is None:
        return None
    items = [t.strip().lower() for t in text.split(",")]
    if len(items) == 1 and items[0] != "group":
        return items[0]
    return [None if t == "group" else t for t in items]


def cell(value: Any) -> str:
    """As psql shows it: NULL empty, booleans t and f."""
    if isinstance(value, bool):
        return "t" if value else "f"
    return "" if value is None else str(value)


def table(columns: list[str], rows: list[tuple[Any, ...]]) -> list[str]:
    """psql's aligned format: numbers right-aligned, NULL empty, a row count."""
    cells = [[cell(v) for v in row] for row in rows]
    widths = [max([len(c), *(len(r[i]) for r in cells)]) for i, c in enumerate(columns)]
    right = [bool(rows) and all(isinstance(r[i], _NUMBERS) and not isinstance(r[i], bool) for r in rows if r[i] is not None)
             for i in range(len(columns))]
    lines = [" " + " | ".join(c.center(w) for c, w in zip(columns, widths, strict=True)).rstrip(),
             "-+-".join("-" * w for w in widths).join("--")]
    for r in cells:
        lines.append(" " + " | ".join(v.rjust(w) if right[i] else v.ljust(w) for i, (v, w) in enumerate(zip(r, widths, strict=True))).rstrip())
    lines.append(f"({len(rows)} row{'' if len(rows) == 1 else 's'})")
    return lines


def plain(value: Any) -> Any:
    """A value as JSON has it: numbers beyond a double's precision, times and the rest as text."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (dt.date, dt.time)):
        return value.isoformat()
    if isinstance(value, (bytes, memoryview)):
        return bytes(value).hex()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): plain(v) for k, v in value.items()}
    return str(value)


@click.command("query")
@click.argument("statement", metavar="SQL")
@click.option("--shards", metavar="RANGES", help="Only these shards, like 0-99,120 (default: every shard).")
@click.option("--order-by", "order_by", multiple=True, metavar="COLUMN",
              help="Merge the rows by this output column: id, -id or 'id DESC' for descending (repeat for more keys).")
@click.option("--limit", type=click.IntRange(min=0), metavar="N", help="At most N rows in all (and from each shard).")
@click.option("--combine", metavar="OPS", help="Combine the shards' rows: sum, min or max for every column, or one per column with"
              " 'group' for a column to group by (group,sum).")
@click.option("--with-shard", is_flag=True, help="Start each row with the shard it came from.")
@click.option("--partial", is_flag=True, help="Print what the databases that answered returned; name those that did not (exit 1).")
@click.option("--sql", "show_sql", is_flag=True, help="Print the SQL each database would be sent, and run nothing.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per row, per line.")
@click.pass_context
def query_cmd(ctx: click.Context, statement: str, shards: str | None, order_by: tuple[str, ...], limit: int | None, combine: str | None,
              with_shard: bool, partial: bool, show_sql: bool, as_json: bool) -> None:
    """Run one statement, written unqualified, on every shard, through the admin connections; print the rows merged."""
    from ..ranges import expand
    from ..routing import query

    options: dict[str, Any] = {"shards": expand(shards) if shards is not None else None, "order_by": list(order_by) or None,
                               "limit": limit, "combine": parse_combine(combine), "with_shard": with_shard, "partial": partial}
    found = query(get_config(ctx), statement, sql_only=show_sql, **options)
    if isinstance(found, dict):
        for name, lines in found.items():
            click.echo(f"-- ===== database {name} =====")
            click.echo("\n".join(lines))
        return
    rows = list(found)
    if as_json:
        for row in rows:
            click.echo(json.dumps({c: plain(v) for c, v in zip(found.columns, row, strict=True)}))
    else:
        click.echo("\n".join(table(found.columns, rows)))
    if found.missing:
        raise click.ClickException("not every shard was read: " + "; ".join(e.render() for e in found.missing))
