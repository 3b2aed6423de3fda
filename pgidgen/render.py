"""Where SQL is rendered: jinja2 templates from templates/ and static files from sql/, as plain text.

Rendering never connects anywhere, so every command can print exactly what it would run (--sql).
Identifiers go through psycopg.sql (the `ident` filter), values through `literal`.
"""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Any

import jinja2
from psycopg import sql

from .errors import TemplateError

_PKG = Path(__file__).resolve().parent


def data_dir(kind: str) -> Path:
    """templates/ or sql/: inside the installed wheel, else beside the package in a source checkout."""
    for candidate in (_PKG / "_data" / kind, _PKG.parent / kind):
        if candidate.is_dir():
            return candidate
    raise TemplateError(f"pgidgen's {kind}/ directory is missing", hint="reinstall pgidgen")


def ident(*parts: str) -> str:
    return sql.Identifier(*parts).as_string(None)


def literal(value: Any) -> str:
    return sql.Literal(value).as_string(None)


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_dir("templates"))),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
        trim_blocks=True,
        lstrip_blocks=True,
        autoescape=False,
    )
    env.filters["ident"] = lambda value: ident(*value) if isinstance(value, (tuple, list)) else ident(value)
    env.filters["literal"] = literal
    return env


def render(template: str, **context: Any) -> str:
    try:
        return environment().get_template(template).render(**context)
    except jinja2.TemplateSyntaxError as e:
        raise TemplateError(f"template {e.name or template} line {e.lineno}: {e.message}") from None
    except jinja2.TemplateError as e:
        raise TemplateError(f"template {template}: {e}") from None


def static_sql(name: str) -> str:
    path = data_dir("sql") / name
    try:
        return path.read_text(encoding="utf-8")
    except OSError as e:
        raise TemplateError(f"cannot read {path}: {e.strerror}", hint="reinstall pgidgen") from None
