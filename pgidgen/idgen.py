"""Where IDs are made: rendering the catalog and each shard's schema, sequences and next_id()."""
from __future__ import annotations

from typing import Sequence

from . import __version__
from .errors import ConfigError
from .layout import Layout, iso_ms
from .render import literal, render, static_sql

#: Advisory-lock class of pgidgen's locks ('pgid'); the object id is the shard number (or 0 for init).
LOCK_CLASS = 1885825380
#: The generator templates; the layout and shard number are rendered into them.
GENERATORS = {"seqlock": "generators/seqlock.sql.j2"}
DEFAULT_GENERATOR = "seqlock"


def schema_name(shard: int) -> str:
    return f"shard_{shard}"


def render_catalog(layout: Layout, *, shard_count: int, generator: str = DEFAULT_GENERATOR) -> str:
    """The catalog schema, its layout row and the layout-specific SQL helpers."""
    row = (
        "INSERT INTO pgidgen.layout (epoch_ms, time_bits, shard_bits, sequence_bits, shard_count, generator, pgidgen_version)\n"
        f"VALUES ({layout.epoch_ms}, {layout.time_bits}, {layout.shard_bits}, {layout.sequence_bits}, {shard_count}, "
        f"{literal(generator)}, {literal(__version__)}) ON CONFLICT (singleton) DO NOTHING;\n"
    )
    return static_sql("catalog.sql") + "\n" + row + render(
        "catalog_functions.sql.j2", L=layout, lock_class=LOCK_CLASS, runs_out=iso_ms(layout.epoch_ms + (1 << layout.time_bits))
    )


def render_shard(layout: Layout, shard: int, *, grant_roles: Sequence[str] = (), generator: str = DEFAULT_GENERATOR) -> str:
    """Everything one shard needs: its schema, the generator's sequences and next_id(), its catalog row."""
    if generator not in GENERATORS:
        raise ConfigError(f"unknown generator {generator!r}", hint=f"use one of {', '.join(GENERATORS)}")
    return render(
        "shard.sql.j2",
        L=layout,
        shard=shard,
        schema=schema_name(shard),
        generator_template=GENERATORS[generator],
        grant_roles=list(grant_roles),
        lock_class=LOCK_CLASS,
        vmax=(layout.max_time << layout.sequence_bits) | (layout.ids_per_ms - 1),
        shard_bits_value=shard << layout.shard_shift,
        runs_out=iso_ms(layout.epoch_ms + (1 << layout.time_bits)),
    )


def render_catalog_grants(roles: Sequence[str]) -> str:
    return render("catalog_grants.sql.j2", roles=list(roles))
