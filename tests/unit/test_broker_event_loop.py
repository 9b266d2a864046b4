"""Which event loop `python -m services.broker` runs on: asyncio's own by default,
uvloop for a broker that serves the RocketMQ 5 SDKs itself (enableProxy), and what
--event-loop or $FERRY_EVENT_LOOP asks for over either."""

from __future__ import annotations

import argparse

from services.broker import cli
from services.broker.config import load_config


def _config(**keys: str):
    config, _ = load_config(None, [f"{k}={v}" for k, v in keys.items()], env={})
    return config


def _parsed(argv: list[str], monkeypatch, env: str | None = None) -> argparse.Namespace:
    if env is None:
        monkeypatch.delenv("FERRY_EVENT_LOOP", raising=False)
    else:
        monkeypatch.setenv("FERRY_EVENT_LOOP", env)
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    return parser.parse_args(argv)


def test_defaults_by_mode(monkeypatch):
    args = _parsed([], monkeypatch)
    assert args.event_loop is None
    assert cli.event_loop_of(args.event_loop, _config()) == "asyncio"
    assert cli.event_loop_of(args.event_loop, _config(enableProxy="true")) == "uvloop"


def test_flag_and_environment_win(monkeypatch):
    local = _config(enableProxy="true")
    assert cli.event_loop_of(_parsed(["--event-loop", "asyncio"], monkeypatch).event_loop,
                             local) == "asyncio"  # fmt: skip
    assert cli.event_loop_of(_parsed([], monkeypatch, env="asyncio").event_loop, local) == (
        "asyncio"
    )
    assert cli.event_loop_of(_parsed([], monkeypatch, env="uvloop").event_loop, _config()) == (
        "uvloop"
    )


def test_help_names_both_defaults(monkeypatch, capsys):
    parser = argparse.ArgumentParser()
    cli.add_arguments(parser)
    text = parser.format_help()
    assert "default asyncio, uvloop with enableProxy" in " ".join(text.split())
