"""What the commands share: the config, progress on a terminal, how results and SQL are printed, option values
(durations, ages). It imports no command, and no command module imports another."""
from __future__ import annotations

import json
import re
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..config import Config, load_config
from ..errors import InputError


class TakesNegatives(click.Command):
    """A command whose arguments may start with '-' (a negative key, `-1` as a shard: refused as out of range
    with the range, not as an unknown option). Unknown options are still refused: an argument that looks like an
    option and not like a number is one."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        kwargs["context_settings"] = {**kwargs.get("context_settings", {}), "ignore_unknown_options": True}
        super().__init__(*args, **kwargs)

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        for word in args:
            if word == "--":
                break
            if word.startswith("-") and not _NUMBERISH.match(word) and not any(word.split("=")[0] in (*p.opts, *p.secondary_opts) for p in self.get_params(ctx)):
                raise click.NoSuchOption(word.split("=")[0], ctx=ctx)
        return super().parse_args(ctx, args)


def parse_key(text: str) -> int:
    """A shard key given as an argument: a whole number (a user_id), negative ones included."""
    try:
        return int(text)
    except ValueError:
        raise InputError(f"key {text!r} is not a whole number",
                         hint="locate takes integer keys like a user_id; an ID goes with --id, a shard number with --shard") from None


_NUMBERISH = re.compile(r"^-\d[\d,\-]*$")


def get_config(ctx: click.Context, *, required: bool = True) -> Config:
    return load_config(ctx.obj.get("config_path"), required=required)


def interactive(as_json: bool) -> bool:
    return not as_json and sys.stderr.isatty()


class Bar:
    """A progress bar on a terminal; silent with --json or when stderr is not a tty."""

    def __init__(self, enabled: bool, label: str) -> None:
        self.enabled = enabled
        self.label = label
        self._bar: Any = None

    def start(self, total: int) -> None:
        if self.enabled and total > 0:
            self._bar = click.progressbar(length=total, label=self.label, file=sys.stderr, show_pos=True)
            self._bar.__enter__()

    def advance(self, n: int) -> None:
        if self._bar is not None:
            self._bar.update(n)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.__exit__(None, None, None)
            self._bar = None


def report(outcomes: list[Any], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps([o.as_dict() for o in outcomes], indent=2))
    else:
        for o in outcomes:
            line = f"{o.database}: {o.summary}"
            if o.error:
                line += f": {o.error}"
            click.echo(line)
    failed = [o.database for o in outcomes if not o.ok and o.error]  # not those rolled back because another failed
    if any(not o.ok for o in outcomes):
        rest = "" if len(failed) == len(outcomes) else "; the others are as reported above"
        raise click.ClickException(f"{len(failed)} of {len(outcomes)} databases failed ({', '.join(failed)}){rest}")


def print_sql(per_database: dict[str, str], *, transaction: bool = True) -> None:
    """Each database's SQL, in a transaction unless it runs statement by statement (apply-ddl's online files)."""
    for name, text in per_database.items():
        click.echo(f"-- ===== database {name} =====")
        if transaction:
            click.echo("BEGIN;")
        click.echo(text.rstrip("\n"))
        if transaction:
            click.echo("COMMIT;")


MAX_PAUSE_S = (2**31 - 1) // 1000


def parse_duration(text: str, option: str = "--max-pause") -> float:
    """Seconds from '1s', '500ms', '2.5' (seconds), for option (a lock_timeout: whole ms, at most 2^31-1)."""
    t = text.strip().lower()
    try:
        if t.endswith("ms"):
            value = float(t[:-2]) / 1000
        elif t.endswith("s"):
            value = float(t[:-1])
        else:
            value = float(t)
    except ValueError:
        raise InputError(f"{text!r} is not a duration", hint="write it like 1s, 500ms or 2.5") from None
    if not value > 0:
        raise InputError(f"{option} must be more than 0, not {text!r}")
    if value < 0.001:  # journaled, and given to lock_timeout, in whole ms (a journaled 0 reads as 'not given')
        raise InputError(f"{option} must be at least 1ms, not {text!r}", hint="write it like 1s or 500ms")
    if value > MAX_PAUSE_S:  # infinity too: the pause is a lock_timeout, at most 2^31 - 1 ms
        raise InputError(f"{option} must be at most {MAX_PAUSE_S}s, not {text!r}", hint="write it like 1s or 500ms")
    return value


def parse_wait(text: str, option: str) -> float:
    """parse_duration for a wait that may be none: '0' (or '0s', '0ms') is no wait at all."""
    try:
        number = float(text.strip().lower().removesuffix("ms").removesuffix("s"))
    except ValueError:
        number = 1.0  # parse_duration says what is wrong with it
    if number == 0:
        return 0.0
    if number < 0:
        raise InputError(f"{option} must be 0 or more, not {text!r}", hint="write it like 60s, or 0 for no wait")
    return parse_duration(text, option)


def typed(ctx: click.Context, name: str) -> bool:
    """Whether the option was given on the command line (else its default: a resumed move keeps its journal's)."""
    return ctx.get_parameter_source(name) == click.core.ParameterSource.COMMANDLINE


F = TypeVar("F", bound=Callable[..., Any])


def lock_options(what: str = "a shard's tables") -> Callable[[F], F]:
    """--lock-timeout and --lock-wait, for the commands that take locks on tables the application uses."""
    return lambda f: _lock_options(f, what)


def _lock_options(f: F, what: str) -> F:
    f = click.option("--lock-wait", default="3m", show_default=True, metavar="DURATION",
                     help="How long tries go on (rolled back, paused, tried again) while a session keeps a lock; then exit 1 naming it.")(f)
    return click.option("--lock-timeout", default="200ms", show_default=True, metavar="DURATION",
                        help=f"Longest one try waits for a lock on {what} (so the longest the application's queries queue behind it).")(f)


def lock_policy(lock_timeout: str, lock_wait: str) -> Any:
    from ..lockwait import LockPolicy

    return LockPolicy(lock_timeout=parse_duration(lock_timeout, "--lock-timeout"), wait=parse_duration(minutes(lock_wait), "--lock-wait"))


def minutes(text: str) -> str:
    """'3m' as seconds ('180s'); what parse_duration takes otherwise as it is."""
    t = text.strip().lower()
    try:
        return f"{float(t[:-1]) * 60}s" if t.endswith("m") and not t.endswith("ms") else text
    except ValueError:
        return text


class LockWaits:
    """A line on stderr when a database's transaction waited for a lock (its first wait, then every 5 s of it):
    who held it, so an operator can act before the deadline."""

    def __init__(self, bar: Bar) -> None:
        self.bar = bar
        self.said: dict[str, float] = {}
        self.online = False  # apply-ddl's online statements (CONCURRENTLY) wait without the application queueing

    def say(self, name: str, shards: list[int], holders: list[Any], waited: float) -> None:
        if name in self.said and waited - self.said[name] < 5:
            return
        self.said[name] = waited
        who = "; ".join(h.describe() for h in holders[:2]) or "a session that has since let go"
        first = f"shard_{shards[0]}" + (f" (and {len(shards) - 1} more)" if len(shards) > 1 else "") if shards else "the catalog"
        if self.online:
            line = f"{name}: {first} waits for {who}; the application's queries do not queue behind it ({waited:.0f} s so far)"
        else:
            line = f"{name}: {first} waits for a lock held by {who}; rolled back, trying again ({waited:.0f} s so far)"
        click.echo(("\n" if self.bar._bar is not None else "") + line, err=True)
