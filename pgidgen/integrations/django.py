"""Django: one database alias per pgidgen database (`databases()` builds DATABASES from pgidgen.toml), a unit of
work per shard (`shard_atomic`, `run_on_shard`) and a router for DATABASE_ROUTERS that sends the sharded models'
queries to the shard block they run in.

    # settings.py
    from pgidgen.integrations.django import databases
    DATABASES = databases()                     # pgidgen.toml, or PGIDGEN_CONFIG
    DATABASE_ROUTERS = ["pgidgen.integrations.django.ShardRouter"]
    PGIDGEN_SHARDED_APPS = ["photos"]           # their tables live in every shard_N schema

    # anywhere
    photo = run_on_shard(shard_for(user_id), lambda: Photo.objects.create(user_id=user_id))

A query on a sharded model outside a shard block is refused: it would run without the claim that keeps it off a
database the shard has left, and without the shard's schema on search_path."""
from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, TypeVar

import psycopg
from django.conf import settings
from django.db import DatabaseError, connections, transaction
from psycopg.pq import TransactionStatus

from ..config import Config, load_config
from ..db import timeout_for
from ..errors import DatabaseUnavailableError, InputError, RoutingError
from ..routing import Router
from ..routing.breaker import CONNECT_TIMEOUT
from ..routing.fanmerge import Combine
from ..routing.unit import aborted
from .retrying import failed_error, retry

T = TypeVar("T")
#: The shard blocks open in this thread or task, innermost last: (shard, alias).
_blocks: ContextVar[tuple[tuple[int, str], ...]] = ContextVar("pgidgen_shard_blocks", default=())
_router: Router | None = None
_lock = threading.Lock()
_DSN_KEYS = {"dbname": "NAME", "user": "USER", "password": "PASSWORD", "host": "HOST", "port": "PORT"}


def databases(
    config: Config | None = None, *, default: str | None = None, conn_max_age: int = 60, connect_timeout: int = CONNECT_TIMEOUT
) -> dict[str, dict[str, Any]]:
    """Django's DATABASES: an alias per database of pgidgen.toml, under the same name, with the DSN applications
    use (app_dsn: through a pooler when one is configured), and "default" (a copy of the database named default,
    else of the first). Persistent connections are fine: a shard block sets search_path for its transaction only.
    Through a transaction pooler (named, or an app_dsn whose pooler is not: the safe side) no server-side cursors.
    connect_timeout: the Router's, unless the DSN or PGCONNECT_TIMEOUT gives one: a database that is down fails a
    request within it (then at once: the Router's breaker), not after the system's TCP timeout."""
    config = config or load_config()
    out: dict[str, dict[str, Any]] = {}
    for name in config.databases:
        dsn = config.app_dsn(name)
        params = {**timeout_for(dsn, connect_timeout), **psycopg.conninfo.conninfo_to_dict(dsn)}
        out[name] = {
            "ENGINE": "django.db.backends.postgresql",
            **{_DSN_KEYS[k]: str(v) for k, v in params.items() if k in _DSN_KEYS},
            "OPTIONS": {k: v for k, v in params.items() if k not in _DSN_KEYS},
            "CONN_MAX_AGE": conn_max_age,
        }
        if config.poolers.get(name, "transaction" if name in config.app_dsns else "none") == "transaction":
            # iterator() outside a transaction keeps a WITH HOLD cursor on the server connection, which the pooler
            # hands to other clients between transactions (Django's advice for transaction pooling)
            out[name]["DISABLE_SERVER_SIDE_CURSORS"] = True
    if "default" not in out:
        out["default"] = dict(out[default or config.select(None)[0]])
    return out


def get_router() -> Router:
    """The process's Router (its map only: Django keeps the connections), from settings.PGIDGEN_CONFIG or
    pgidgen.toml on first use; use_router() installs another."""
    global _router
    with _lock:
        if _router is None:
            _router = Router.from_config(getattr(settings, "PGIDGEN_CONFIG", None), min_size=0, max_size=2)
        return _router


def use_router(router: Router | None) -> None:
    global _router
    with _lock:
        _router = router


@contextmanager
def shard_atomic(shard: int, *, read_only: bool = False) -> Iterator[str]:
    """transaction.atomic on the database serving shard (yields its alias), the shard claimed there and its schema
    first on search_path. Raises ShardMovedError (nothing was written) when that database no longer serves the
    shard: a `with` block cannot be run again, run_on_shard can. read_only: claim without the claim lock, in a
    READ ONLY transaction (nested in a writable one: with the lock). Raises DatabaseUnavailableError, not retried by
    run_on_shard, when that database cannot be connected to (at once while the Router's breaker holds it down)."""
    router = get_router()
    alias = router.database_for(shard)
    router.check_reachable(alias)  # a database found down fails at once (the Router's breaker), not at connect
    # inside any atomic block on the alias (another shard's, or a plain transaction.atomic: ATOMIC_REQUESTS), this
    # block is a savepoint, and the search_path it sets would outlive it in the enclosing transaction
    nested = connections[alias].in_atomic_block
    # read_only claims without the lock, so a write must not get through (as Router's): the transaction is made
    # READ ONLY, or, in an enclosing one that must stay writable after it, the claim takes the lock if it could write
    lock = "%s"
    tail = ", pg_catalog.set_config('transaction_read_only', 'on', true)" if read_only else ""
    if read_only and connections[alias].in_atomic_block:
        lock, tail = "%s OR pg_catalog.current_setting('transaction_read_only') OPERATOR(pg_catalog.=) 'off'", ""
    claim = (f"SELECT pg_catalog.current_setting('search_path'), pgidgen.claim_shard(%s, {lock}),"
             f" pg_catalog.set_config('search_path', %s, true){tail}")
    try:
        with transaction.atomic(using=alias):
            with connections[alias].cursor() as cursor:
                cursor.execute(claim, [shard, not read_only, router.search_path_for(shard)])
                outer = cursor.fetchone()[0]
            token = _blocks.set((*_blocks.get(), (shard, alias)))
            try:
                yield alias
            finally:
                _blocks.reset(token)
            if not read_only and _aborted(connections[alias]):
                raise aborted(shard)  # rolled back by the atomic block (its savepoint's, nested)
            if nested:  # a savepoint's release keeps set_config: give the enclosing block its search_path back
                with connections[alias].cursor() as cursor:
                    cursor.execute("SELECT pg_catalog.set_config('search_path', %s, true)", [outer])
    except DatabaseError as e:
        failed = failed_error(router, shard, alias, e)
        if failed is None:
            raise
        raise failed from e


def _aborted(connection: Any) -> bool:
    """Whether the block's transaction cannot commit: an error Django saw and the work caught (needs_rollback), or
    one the server saw (a raw cursor's): Django's atomic would roll it back without an error (unit.aborted)."""
    pg = connection.connection
    return bool(connection.needs_rollback) or (pg is not None and pg.info.transaction_status == TransactionStatus.INERROR)


def run_on_shard(shard: int, work: Callable[[], T], *, read_only: bool = False, retry_for: float = 10.0) -> T:
    """work() in shard_atomic(shard), run again on the shard's new database when a move flips it (for up to
    retry_for seconds). work must be safe to run again: every failed attempt rolled back."""

    def attempt() -> T:
        with shard_atomic(shard, read_only=read_only):
            return work()

    return retry(get_router(), shard, attempt, retry_for=retry_for)


def current_shard() -> int | None:
    """The shard of the innermost shard block, if any."""
    blocks = _blocks.get()
    return blocks[-1][0] if blocks else None


def sharded(model: Any) -> bool:
    return model._meta.app_label in getattr(settings, "PGIDGEN_SHARDED_APPS", ())


class ShardRouter:
    """For DATABASE_ROUTERS. A sharded model (its app in settings.PGIDGEN_SHARDED_APPS) is read and written on the
    alias of the shard block its shard is in: hints shard=N (Model.objects.db_manager(hints={"shard": N})), else
    an instance's ID (its shard bits), else the innermost block. Other models are left to the next router."""

    def _alias(self, model: Any, hints: dict[str, Any]) -> str | None:
        if not sharded(model):
            return None
        blocks = _blocks.get()
        shard = hints.get("shard")
        instance = hints.get("instance")
        if shard is None and instance is not None and sharded(type(instance)) and isinstance(instance.pk, int):
            shard = get_router().shard_of(instance.pk)
        if shard is None and blocks:
            shard = blocks[-1][0]
        if shard is None:
            raise RoutingError(
                f"{model.__name__} is sharded, and no shard block is open",
                hint="run the query inside pgidgen.integrations.django.shard_atomic(shard) or run_on_shard(shard, ...)",
            )
        alias = next((a for s, a in reversed(blocks) if s == shard), None)
        innermost = next((s for s, a in reversed(blocks) if a == alias), None)
        if alias is None or innermost != shard:
            raise RoutingError(
                f"{model.__name__} of shard {shard} outside a block of shard {shard}",
                hint=f"open shard_atomic({shard}) around it (innermost on its database)",
            )
        return alias

    def db_for_read(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model, hints)

    def db_for_write(self, model: Any, **hints: Any) -> str | None:
        return self._alias(model, hints)

    def allow_relation(self, obj1: Any, obj2: Any, **hints: Any) -> bool | None:
        """Sharded objects relate within one shard (the same shard bits in their IDs)."""
        if not (sharded(type(obj1)) or sharded(type(obj2))):
            return None
        if not (sharded(type(obj1)) and sharded(type(obj2))):
            return False
        if isinstance(obj1.pk, int) and isinstance(obj2.pk, int):
            router = get_router()
            return router.shard_of(obj1.pk) == router.shard_of(obj2.pk)
        return bool(obj1._state.db == obj2._state.db)

    def allow_migrate(self, db: str, app_label: str, model_name: str | None = None, **hints: Any) -> bool | None:
        """Never for sharded models: their tables are in every shard schema, made by pgidgen apply-ddl."""
        if app_label in getattr(settings, "PGIDGEN_SHARDED_APPS", ()):
            return False
        return None


class FanOutList(list):  # type: ignore[type-arg]
    """fan_out's rows; missing: the DatabaseUnavailableErrors of the databases not read (partial=True)."""

    missing: list[DatabaseUnavailableError]


def fan_out(queryset: Any, *, shards: Iterable[int] | None = None, combine: Combine = None, partial: bool = False) -> FanOutList:
    """A sharded model's queryset on every shard (or shards), by Router.fan_out: one round trip a database, the
    databases in parallel, the rows merged by the queryset's order_by (or the model's ordering) and cut at its
    slice ([:50]). Model instances (each on the alias of its shard's database, as a shard block would give it),
    dicts for values(), tuples for values_list() (flat: values). Read-only, outside any shard block.

    A queryset that groups or aggregates (values(...).annotate(n=Count(...)), distinct()) returns a row a shard (a
    group a shard): give combine as for Router.fan_out, one per column, to add them up. Not for: select_related,
    prefetch, only/defer, extra, an offset ([10:20]: page by the order key instead, id__lt=last_seen), ordering by
    anything but the model's fields and annotations."""
    from django.db.models.query import FlatValuesListIterable, ModelIterable, ValuesIterable, ValuesListIterable

    query = queryset.query
    iterable = queryset._iterable_class
    if iterable is ModelIterable and (query.select_related or query.deferred_loading[0] or queryset._prefetch_related_lookups):
        raise InputError("a fan-out of model instances takes every field of one model",
                         hint="drop select_related, prefetch_related, only and defer (or use values())")
    if iterable not in (ModelIterable, ValuesIterable, ValuesListIterable, FlatValuesListIterable) or query.extra:
        raise InputError("this queryset cannot be fanned out", hint="use a model's queryset, values() or values_list()")
    if query.low_mark:
        raise InputError("an offset cannot be fanned out: each shard would skip its own first rows",
                         hint="page by the order key instead (id__lt=the last ID seen)")
    router = get_router()
    alias = router.config.select(None)[0]
    compiler = query.get_compiler(using=alias)
    text, params = compiler.as_sql()
    names = [alias_ or getattr(getattr(col, "target", None), "column", None) or f"column{i}" for i, (col, _, alias_) in enumerate(compiler.select)]
    grouped = bool(query.group_by or query.distinct or any(getattr(a, "contains_aggregate", False) for a in query.annotations.values()))
    if grouped and combine is None:
        raise InputError("the queryset groups or aggregates: each shard returns its own groups",
                         hint="give combine, one for each column (None for the columns grouped by), e.g. (None, 'sum')")
    order = [_column(queryset.model, names, name) for name in (query.order_by or (query.default_ordering and queryset.model._meta.ordering) or ())]
    limit = None if query.high_mark is None else query.high_mark - query.low_mark
    res = router.fan_out(text, params, shards=shards, order_by=order or None, limit=limit, combine=combine,
                         with_shard=combine is None, partial=partial)
    rows = list(res)
    if combine is None:
        shard_of, rows = [r[0] for r in rows], [r[1:] for r in rows]
    if iterable is ModelIterable:
        model = queryset.model
        fields = compiler.klass_info["select_fields"] if compiler.klass_info else list(range(len(names)))
        attnames = [compiler.select[i][0].target.attname for i in fields]
        annotations = compiler.annotation_col_map or {}
        out: list[Any] = []
        for shard, row in zip(shard_of, rows, strict=True):
            obj = model.from_db(router.database_for(shard), attnames, [row[i] for i in fields])
            for attr, i in annotations.items():
                setattr(obj, attr, row[i])
            out.append(obj)
    elif iterable is ValuesIterable:
        keys = [*query.extra_select, *query.values_select, *query.annotation_select]
        out = [dict(zip(keys, row, strict=True)) for row in rows]
    elif iterable is FlatValuesListIterable:
        out = [row[0] for row in rows]
    else:
        out = [tuple(row) for row in rows]
    result = FanOutList(out)
    result.missing = res.missing
    return result


def _column(model: Any, names: list[str], name: Any) -> str:
    """An order_by item of a queryset ("-created_at", "pk", an annotation) as fan_out's: the output column's name."""
    if not isinstance(name, str):
        name = str(name)  # an expression: not an output column
    desc = name.startswith("-")
    field = name.lstrip("-+")
    if field == "pk":
        field = model._meta.pk.name
    column = field if field in names else None
    if column is None:
        try:
            column = model._meta.get_field(field).column
        except Exception:  # noqa: BLE001 - Django's FieldDoesNotExist, or a lookup through a relation
            column = None
    if column is None or column not in names:
        raise InputError(f"the queryset is ordered by {name}, which a fan-out cannot merge by",
                         hint="order by the model's own fields or annotations that the queryset selects")
    return f"-{column}" if desc else column


__all__ = ["FanOutList", "ShardRouter", "current_shard", "databases", "fan_out", "get_router", "run_on_shard", "shard_atomic", "use_router"]
