"""pglast's SQL printer, fixed where it writes SQL that does not mean what was parsed (imported for its effect).

- An index column's qualified collation, `(title COLLATE public.byte_order)`, comes out as `COLLATE public,
  byte_order` (pglast 8 joins the name's parts with a comma): pg_dump writes every collation outside
  pg_catalog qualified, so every such index in a dump would fail.
"""
from __future__ import annotations

from typing import Any

from pglast import ast, enums
from pglast.printers import node_printer


@node_printer(ast.IndexElem, override=True)
def index_elem(node: Any, output: Any) -> None:
    if node.name is not None:
        output.print_name(node.name)
    else:
        with output.expression(True):
            output.print_node(node.expr)
    if node.collation:
        output.swrite("COLLATE ")
        output.print_name(node.collation, ".")
    if node.opclass:
        output.write(" ")
        output.print_name(node.opclass, ".")
        if node.opclassopts:
            output.write(" ")
            with output.expression(True):
                output.print_list(node.opclassopts)
    if node.ordering != enums.SortByDir.SORTBY_DEFAULT:
        output.swrite("ASC" if node.ordering == enums.SortByDir.SORTBY_ASC else "DESC")
    if node.nulls_ordering != enums.SortByNulls.SORTBY_NULLS_DEFAULT:
        output.swrite("NULLS ")
        output.write("LAST" if node.nulls_ordering == enums.SortByNulls.SORTBY_NULLS_LAST else "FIRST")


@node_printer(ast.CreateOpClassStmt, override=True)
def create_opclass_stmt(node: Any, output: Any) -> None:
    """pglast 8 leaves out FAMILY: the class would go into a new family of its own name, not the one named."""
    output.write("CREATE OPERATOR CLASS ")
    output.print_name(node.opclassname)
    if node.isDefault:
        output.write("DEFAULT ")
    output.write("FOR TYPE ")
    output.print_name(node.datatype)
    output.write("USING ")
    output.print_name(node.amname)
    if node.opfamilyname:
        output.write("FAMILY ")
        output.print_name(node.opfamilyname)
    output.write("AS ")
    output.print_list(node.items, ",")


def _names_list(output: Any, lists: Any) -> None:
    for i, parts in enumerate(lists):
        if i:
            output.write(", ")
        output.print_list(parts if isinstance(parts, tuple) else (parts,), ".", standalone_items=False, are_names=True)


@node_printer(ast.AlterTSConfigurationStmt, override=True)
def alter_ts_configuration_stmt(node: Any, output: Any) -> None:
    """pglast 8 writes a dictionary's name unquoted and without its schema (`WITH public.plain_words` as `WITH public`)."""
    kind = enums.AlterTSConfigType
    output.write("ALTER TEXT SEARCH CONFIGURATION ")
    output.print_name(node.cfgname)
    if node.kind == kind.ALTER_TSCONFIG_ADD_MAPPING:
        output.write(" ADD MAPPING FOR ")
    elif node.kind == kind.ALTER_TSCONFIG_DROP_MAPPING:
        output.write(" DROP MAPPING " + ("IF EXISTS " if node.missing_ok else "") + "FOR ")
    else:
        output.write(" ALTER MAPPING ")
        if node.tokentype:
            output.write("FOR ")
    if node.tokentype:
        _names_list(output, node.tokentype)
    if node.kind in (kind.ALTER_TSCONFIG_REPLACE_DICT, kind.ALTER_TSCONFIG_REPLACE_DICT_FOR_TOKEN):
        old, new = node.dicts
        output.write(" REPLACE ")
        _names_list(output, (old,))
        output.write(" WITH ")
        _names_list(output, (new,))
    elif node.dicts:
        output.write(" WITH ")
        _names_list(output, node.dicts)
