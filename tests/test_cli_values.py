"""Values on the command line as a user types them: keys as arguments (negative ones too), shard numbers that
start with '-', and a dry run's exit status with a database unreachable."""
from __future__ import annotations

from pathlib import Path

from click.testing import CliRunner, Result

from pgidgen.cli import main
from pgidgen.config import Config, write_config
from pgidgen.init import init
from pgidgen.sandbox import free_port


def cli(config_file: Path, *args: str) -> Result:
    return CliRunner().invoke(main, ["--config", str(config_file), *args])  # (the program is "main" under CliRunner)


def test_locate_takes_keys_as_arguments_and_values_that_start_with_a_dash(config: Config, config_file: Path) -> None:
    assert all(o.ok for o in init(config, 8))
    res = cli(config_file, "locate", "13", "-7", "--key", "2")
    assert res.exit_code == 0, res.output
    assert res.output == ("key 13: shard 5 on db2 (schema shard_5, active)\n"
                          "key -7: shard 1 on db1 (schema shard_1, active)\n"  # the Router's rule: -7 mod 8 is 1
                          "key 2: shard 2 on db1 (schema shard_2, active)\n")
    res = cli(config_file, "locate", "x")
    assert (res.exit_code, res.output) == (1, "Error: key 'x' is not a whole number: locate takes integer keys like a user_id;"
                                              " an ID goes with --id, a shard number with --shard\n")
    res = cli(config_file, "locate", "13", "--bogus")  # an unknown option is still one
    assert (res.exit_code, res.output) == (1, "Error: No such option '--bogus'. (main locate): see 'main locate --help'\n")


def test_move_shard_takes_a_negative_shard_as_a_value(config: Config, config_file: Path) -> None:
    assert all(o.ok for o in init(config, 8))
    res = cli(config_file, "move-shard", "-1", "db2")
    assert (res.exit_code, res.output) == (1, "Error: '-1' is not a shard number or range: write shards like 0-99,120\n")
    res = cli(config_file, "move-shard", "--frob", "1", "db2")
    assert (res.exit_code, res.output) == (1, "Error: No such option '--frob'. (main move-shard): see 'main move-shard --help'\n")


def test_cleanup_dry_run_fails_as_cleanup_does_with_a_database_unreachable(config: Config, tmp_path: Path) -> None:
    assert all(o.ok for o in init(config, 8))
    path = tmp_path / "with-a-down-one.toml"
    write_config(path, config.layout, {**config.databases, "db9": f"postgresql://nobody@127.0.0.1:{free_port()}/nothing"})
    dry, real = cli(path, "cleanup", "--dry-run"), cli(path, "cleanup")
    assert (dry.exit_code, real.exit_code) == (1, 1), (dry.output, real.output)
    assert "would drop 0 retired copies" in dry.output and "db9" in dry.output
