"""The operator's settings and its command line."""

from __future__ import annotations

import pytest

from ardiff.cli import build_parser, main
from ardiff.operator.config import OperatorConfig, OperatorConfigError, config_from_env


def test_environment_fallbacks() -> None:
    env = {
        "ARDIFF_REDIS_URL": "redis://r:6379/0",
        "ARDIFF_WATCH_NAMESPACES": "worlds, labs",
        "ARDIFF_OPERATOR_RECONCILE_SECONDS": "0.5",
    }
    config = config_from_env(env)
    assert config == OperatorConfig(
        redis_url="redis://r:6379/0",
        worker_redis_url="redis://r:6379/0",
        namespaces=("worlds", "labs"),
        reconcile_seconds=0.5,
    )


def test_flags_win_over_the_environment() -> None:
    env = {"ARDIFF_REDIS_URL": "redis://env/0", "ARDIFF_WORKER_REDIS_URL": "redis://svc/0"}
    config = config_from_env(
        env, redis_url="redis://flag/0", all_namespaces=True, peering="ardiff", priority=5
    )
    assert (config.redis_url, config.worker_redis_url) == ("redis://flag/0", "redis://svc/0")
    assert (config.all_namespaces, config.namespaces, config.peering, config.priority) == (
        True,
        (),
        "ardiff",
        5,
    )


@pytest.mark.parametrize(
    ("env", "overrides", "message"),
    [
        ({}, {}, "redis_url must be set"),
        ({"ARDIFF_REDIS_URL": "redis://r"}, {"standalone": True, "peering": "p"}, "mutually exclusive"),
        (
            {"ARDIFF_REDIS_URL": "redis://r", "ARDIFF_OPERATOR_MIRROR_SECONDS": "0"},
            {},
            "mirror_seconds must be",
        ),
        ({"ARDIFF_REDIS_URL": "redis://r", "ARDIFF_OPERATOR_RECONCILE_SECONDS": "x"}, {}, "must be a number"),
        ({"ARDIFF_REDIS_URL": "redis://r", "ARDIFF_WORKER_REDIS_USERS": "nobody"}, {}, "worker_redis_users"),
    ],
)
def test_bad_settings_are_rejected(env: dict, overrides: dict, message: str) -> None:
    with pytest.raises(OperatorConfigError, match=message):
        config_from_env(env, **overrides)


def test_cli_parses_the_contract_flags() -> None:
    args = build_parser().parse_args(
        [
            "operator",
            "run",
            "-n",
            "a",
            "--namespace",
            "b",
            "--redis-url",
            "redis://x",
            "--peering",
            "p",
            "--priority",
            "3",
        ]
    )
    assert (args.namespaces, args.redis_url, args.peering, args.priority) == (["a", "b"], "redis://x", "p", 3)
    with pytest.raises(SystemExit):
        build_parser().parse_args(["operator", "run", "-n", "a", "--all-namespaces"])


def test_cli_reports_a_bad_config_without_a_traceback(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("ARDIFF_REDIS_URL", raising=False)
    assert main(["operator", "run", "-n", "worlds"]) == 1
    err = capsys.readouterr().err
    assert (
        err.strip()
        == "error: invalid_operator_config: operator redis_url must be set (--redis-url or ARDIFF_REDIS_URL)"
    )


def test_who_makes_the_pools_redis_users() -> None:
    """Issue 23 item 1: the operator by default; the administrator where ACL SETUSER is forbidden."""
    env = {"ARDIFF_REDIS_URL": "redis://r"}
    assert config_from_env(env).worker_redis_users == "operator"
    administrator = config_from_env({**env, "ARDIFF_WORKER_REDIS_USERS": "administrator"})
    assert administrator.worker_redis_users == "administrator"
    args = build_parser().parse_args(["operator", "run", "--worker-redis-users", "administrator"])
    assert args.worker_redis_users == "administrator"
    assert (
        config_from_env(env, worker_redis_users=args.worker_redis_users).worker_redis_users == "administrator"
    )
