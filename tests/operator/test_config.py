"""The operator's settings and its command line."""

from __future__ import annotations

import re

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


def test_the_front_door_settings() -> None:
    """Issue 37: the front door's public URL (sessions' status.url under it) and the gateway's Redis Secret
    in the operator's own namespace, from flags or the environment; neither by default."""
    env = {"ARDIFF_REDIS_URL": "redis://r"}
    plain = config_from_env(env)
    assert (plain.gateway_public_url, plain.gateway_redis_secret) == (None, None)
    assert plain.session_url("worlds", "tiny") is None
    config = config_from_env(
        {
            **env,
            "ARDIFF_GATEWAY_PUBLIC_URL": "https://worlds.example.com/ardiff/",
            "ARDIFF_GATEWAY_REDIS_SECRET": "ardiff-gateway-redis",
            "ARDIFF_OPERATOR_NAMESPACE": "ardiff-system",
        }
    )
    assert config.session_url("worlds", "tiny") == "https://worlds.example.com/ardiff/pools/worlds/tiny"
    assert (config.gateway_redis_secret, config.operator_namespace) == (
        "ardiff-gateway-redis",
        "ardiff-system",
    )
    args = build_parser().parse_args(
        ["operator", "run", "--gateway-public-url", "http://10.0.0.1:30080", "--gateway-redis-secret", "gw"]
    )
    flags = config_from_env(
        {**env, "ARDIFF_OPERATOR_NAMESPACE": "ns"},
        gateway_public_url=args.gateway_public_url,
        gateway_redis_secret=args.gateway_redis_secret,
    )
    assert flags.session_url("a", "b") == "http://10.0.0.1:30080/pools/a/b"
    assert flags.gateway_redis_secret == "gw"


@pytest.mark.parametrize(
    ("env", "message"),
    [
        *(
            (
                {"ARDIFF_GATEWAY_PUBLIC_URL": url},
                f"gateway_public_url must be an http:// or https:// URL.*{re.escape(repr(url))}",
            )
            for url in (
                "ftp://worlds.example.com",
                "worlds.example.com",
                "https://",
                "https://worlds.example.com/?pool=a",
                "https://worlds.example.com/#top",
                "https://user:pw@worlds.example.com",
                "https://worlds.example.com:99999",
                "https://worlds.example.com/" + "a" * 1024,
            )
        ),
        (
            {"ARDIFF_GATEWAY_REDIS_SECRET": "gw", "ARDIFF_OPERATOR_NAMESPACE": "Not_A_Namespace"},
            "operator_namespace must be a DNS-1123 label, got 'Not_A_Namespace'",
        ),
        (
            {"ARDIFF_GATEWAY_REDIS_SECRET": "Gateway_Redis", "ARDIFF_OPERATOR_NAMESPACE": "ns"},
            "gateway_redis_secret must be a Secret name .*, got 'Gateway_Redis'",
        ),
        ({"ARDIFF_GATEWAY_REDIS_SECRET": "gw"}, "gateway_redis_secret needs the operator's own namespace"),
    ],
)
def test_bad_front_door_settings_are_refused(env: dict, message: str) -> None:
    with pytest.raises(OperatorConfigError, match=message):
        config_from_env({"ARDIFF_REDIS_URL": "redis://r", **env})
