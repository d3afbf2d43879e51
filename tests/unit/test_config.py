"""Config: one source of defaults, precedence flags > env > file, clear errors."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from vgpud.config import RESTART_KEYS, Config, ConfigError, changed_keys, load_config, parse_config
from vgpud.daemon import flags_of, parse_args

ETC = Path(__file__).resolve().parents[2] / "etc" / "vgpud.toml"


def test_etc_vgpud_toml_is_exactly_the_defaults() -> None:
    values = tomllib.loads(ETC.read_text())
    assert set(values) == set(Config().as_dict()), "every key documented, no stray key"
    assert load_config(ETC, env={}) == Config()


def test_only_the_node_daemon_writes_cdi_specs_unless_asked() -> None:
    # The README's unprivileged run, even as root with the shipped file.
    private = ["--socket", "/tmp/s", "--run-dir", "/tmp/r", "--state-dir", "/tmp/d", "--sim"]
    assert load_config(ETC, {}, flags_of(parse_args(private))).cdi_spec_dir == ""
    assert load_config(ETC, {}, {}).cdi_spec_dir == "/var/run/cdi"  # the node's daemon
    asked = load_config(ETC, {"VGPUD_CDI_DIR": "/tmp/cdi"}, flags_of(parse_args(private)))
    assert asked.cdi_spec_dir == "/tmp/cdi"
    assert load_config(ETC, {"VGPUD_CDI_DIR": ""}, {}).cdi_spec_dir == ""
    with pytest.raises(ConfigError, match='"auto" or ""'):
        parse_config({"cdi_dir": "cdi"}, {}, {})


def test_precedence_flags_over_env_over_file() -> None:
    file = {"placement_policy": "spread", "scan_interval": 2, "socket": "/f.sock"}
    env = {"VGPUD_SCAN_INTERVAL": "3.5", "VGPUD_SOCKET": "/e.sock", "UNRELATED": "x"}
    config = parse_config(file, env, {"socket": "/flag.sock", "sim": None})
    assert config.placement_policy == "spread"  # file only
    assert config.scan_interval == 3.5  # env over file
    assert config.socket == "/flag.sock"  # flag over env
    assert config.sim is False  # a flag not given changes nothing


@pytest.mark.parametrize(
    ("file", "env", "message"),
    [
        ({"sockett": "/x"}, {}, "unknown key 'sockett'"),
        ({"sim": "yes"}, {}, "sim in the config file must be a bool"),
        ({"max_vgpus_per_gpu": 1.5}, {}, "must be a int"),
        ({}, {"VGPUD_SIM": "maybe"}, "$VGPUD_SIM must be a bool"),
        ({}, {"VGPUD_SCAN_INTERVAL": "fast"}, "must be a float"),
        ({"placement_policy": "random"}, {}, "choose one of binpack, spread"),
        ({"default_share": 0}, {}, "default_share = 0 is outside 1..100"),
        ({"memory_scaling": 0.5}, {}, "memory_scaling"),
        ({"default_memory": "lots"}, {}, "is not a size"),
        ({"metrics_listen": "9400"}, {}, "use HOST:PORT"),
        ({"run_dir": "relative"}, {}, "must be an absolute path"),
    ],
)
def test_bad_values_are_refused_with_the_key_named(
    file: dict[str, object], env: dict[str, str], message: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(file, env, {})
    assert message in str(err.value)


def test_env_booleans_and_numbers() -> None:
    config = parse_config({}, {"VGPUD_SIM": "1", "VGPUD_MAX_VGPUS_PER_GPU": "4"}, {})
    assert config.sim is True and config.max_vgpus_per_gpu == 4


def test_missing_or_broken_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read config"):
        load_config(tmp_path / "absent.toml", env={})
    bad = tmp_path / "bad.toml"
    bad.write_text("socket = \n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(bad, env={})


def test_changed_keys_and_restart_keys() -> None:
    old = Config()
    new = parse_config({"placement_policy": "spread", "socket": "/other.sock"}, {}, {})
    diff = changed_keys(old, new)
    assert diff == {
        "placement_policy": ("binpack", "spread"),
        "socket": ("/run/vgpud.sock", "/other.sock"),
    }
    assert "socket" in RESTART_KEYS and "placement_policy" not in RESTART_KEYS
