"""Each service's settings report every bad field at once, each as (field, flag, value, rule)."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

import pytest

from agent.command import register as agent_register
from agent.command import settings_from as agent_settings_from
from agent.settings import FLAGS as AGENT_FLAGS
from agent.settings import Settings as AgentSettings
from app.core.errors import SettingError
from app.service.settings import Checker, default_of, flag_rows, help_of
from extender.config import FLAGS as EXTENDER_FLAGS
from extender.config import Settings as ExtenderSettings
from webhook.main import create_app as webhook_app
from webhook.settings import Settings as WebhookSettings


def test_checker_names_the_flag_and_quotes_strings() -> None:
    check = Checker({"tls_cert_file": "--tls-cert"})
    check.bad("tls_cert_file", "/x.crt", "must name a readable file")
    check.port("ops_port", 0)
    check.port("port", 0, zero="none")  # 0 allowed where it means something
    assert check.errors == [
        SettingError("tls_cert_file", "--tls-cert", "'/x.crt'", "must name a readable file"),
        SettingError("ops_port", "--ops-port", "0", "must be in 1..65535"),
    ]
    assert check.errors[0].as_flag() == "--tls-cert='/x.crt': must name a readable file"
    assert str(check.errors[1]) == "ops_port=0: must be in 1..65535"


WEBHOOK_CASES = [
    (WebhookSettings(scheduler_name="Gpu_S"), "--scheduler-name", "'Gpu_S'"),
    (WebhookSettings(scheduler_name="a" * 254), "--scheduler-name", repr("a" * 254)),
    (WebhookSettings(mps_pipe_host_dir="t/m"), "--mps-pipe-host-dir", "'t/m'"),
    (WebhookSettings(mps_pipe_host_dir="/t/../e"), "--mps-pipe-host-dir", "'/t/../e'"),
    (WebhookSettings(port=70000), "--port", "70000"),
    (WebhookSettings(cert_check_interval_s=0), "--cert-check-interval", "0"),
    (WebhookSettings(cert_file="/nope.crt", key_file="/nope.key"), "--cert", "'/nope.crt'"),
    (WebhookSettings(workers=0), "--workers", "0"),
    (WebhookSettings(workers=65), "--workers", "65"),
]


@pytest.mark.parametrize(
    ("settings", "flag", "value"),
    WEBHOOK_CASES,
    ids=[
        "scheduler-case",
        "scheduler-long",
        "pipe-relative",
        "pipe-dotdot",
        "port",
        "interval",
        "cert",
        "workers-0",
        "workers-65",
    ],
)
def test_webhook_settings_errors(settings: WebhookSettings, flag: str, value: str) -> None:
    errors = settings.validate()
    assert (flag, value) in [(e.flag, e.value) for e in errors], errors
    field = next(e.field for e in errors if e.flag == flag)
    with pytest.raises(ValueError, match=f"invalid webhook settings: .*{field}="):
        webhook_app(settings)


def test_webhook_settings_defaults_and_a_valid_scheduler_name_pass() -> None:
    assert WebhookSettings().validate() == []
    assert WebhookSettings(scheduler_name="gpupack-scheduler.team-a").validate() == []
    assert WebhookSettings(workers=1).validate() == WebhookSettings(workers=64).validate() == []


def test_webhook_workers_error_names_flag_value_and_rule() -> None:
    [error] = WebhookSettings(workers=0).validate()
    assert error.as_flag() == "--workers=0: must be a whole number from 1 to 64"


def test_webhook_settings_report_every_error_at_once() -> None:
    errors = WebhookSettings(scheduler_name="X", mps_pipe_host_dir="rel", port=0).validate()
    assert [e.field for e in errors] == ["scheduler_name", "mps_pipe_host_dir", "port"]


def test_extender_settings_errors_are_typed() -> None:
    errors = ExtenderSettings(port=0, policy="best", heartbeat_timeout_s=-1).validate()
    assert [(e.field, e.flag, e.value) for e in errors] == [
        ("port", "--port", "0"),
        ("policy", "--policy", "'best'"),
        ("heartbeat_timeout_s", "--heartbeat-timeout", "-1"),
    ]
    assert [e.flag for e in ExtenderSettings().serving_errors()] == ["--tls-cert", "--tls-key", "--client-ca"]


def agent_args(*argv: str) -> AgentSettings:
    parser = argparse.ArgumentParser()
    agent_register(parser.add_subparsers())
    return agent_settings_from(parser.parse_args(["agent", "run", *argv]))


def test_agent_flags_become_settings(tmp_path: Path) -> None:
    sim = tmp_path / "sim.yaml"
    sim.write_text("gpus: []\n")
    settings = agent_args("--node", "n1", "--sim", str(sim), "--heartbeat", "2s", "--no-mps", "--port", "0")
    assert (settings.node, settings.sim, settings.heartbeat_s, settings.mps, settings.port) == (
        "n1", sim, 2.0, False, 0,
    )  # fmt: skip
    assert settings.validate() == []


def test_agent_settings_report_every_error_with_its_flag(tmp_path: Path) -> None:
    errors = AgentSettings(
        node="",
        sim=tmp_path / "missing.yaml",
        interval_s=0,
        port=-1,
        mps_thread_percentage=0,
        mps_pinned_mem_limit_mib=0,
    ).validate()
    assert [e.flag for e in errors] == [
        "--node", "--sim", "--interval", "--port", "--mps-thread-percentage", "--mps-pinned-mem-limit-mib",
    ]  # fmt: skip
    assert errors[0].as_flag() == "--node='': required: pass --node or set NODE_NAME"


def test_extender_and_webhook_flags_become_settings() -> None:
    from app.cli import build_parser
    from extender.command import settings_from as extender_settings_from

    args = build_parser().parse_args(
        ["extender", "serve", "--tls-cert", "c", "--lease-duration", "30", "--watch-timeout", "20"]
    )
    ext = extender_settings_from(args)
    assert (ext.tls_cert_file, ext.tls_key_file, ext.lease_duration_s, ext.watch_timeout_s) == (
        "c",
        None,
        30,
        20,
    )
    assert (ext.renew_deadline_s, ext.retry_period_s) == (20.0, 4.0)
    assert ext.identity == ExtenderSettings().identity  # unset: $POD_NAME, else host-pid
    errors = ExtenderSettings(watch_timeout_s=0, live_within_s=0).validate()
    assert [e.flag for e in errors] == ["--watch-timeout"]


def test_webhook_flags_become_settings() -> None:
    from app.cli import build_parser
    from webhook.command import settings_from as webhook_settings_from

    base = ["webhook", "serve", "--cert", "c.pem", "--key", "k.pem", "--cert-check-interval", "2"]
    hook = webhook_settings_from(
        build_parser().parse_args([*base, "--scheduler-name", "", "--hami-takeover", "--workers", "3"])
    )
    assert (hook.cert_file, hook.key_file, hook.cert_check_interval_s) == ("c.pem", "k.pem", 2.0)
    assert hook.workers == 3
    assert webhook_settings_from(build_parser().parse_args(base)).workers == 1
    assert (hook.scheduler_name, hook.mps_pipe_host_dir, hook.hami_takeover) == (
        None,
        "/tmp/nvidia-mps",
        True,
    )


@pytest.mark.parametrize(
    ("argv", "lines"),
    [
        (
            ["webhook", "serve", "--cert", "/nope.crt", "--key", "/nope.key", "--scheduler-name", "Bad_Name"],
            [
                "gpupack webhook serve: --scheduler-name='Bad_Name': must be a DNS-1123 subdomain",
                "gpupack webhook serve: --cert='/nope.crt': must name a readable PEM file",
                "gpupack webhook serve: --key='/nope.key': must name a readable PEM file",
            ],
        ),
        (
            ["extender", "serve", "--ops-port", "8888", "--policy", "best"],
            [
                "gpupack extender serve: --ops-port=8888: must be in 1..65535 and differ from port=8888",
                "gpupack extender serve: --policy='best': must be one of",
                "gpupack extender serve: --tls-cert=None: required",
                "gpupack extender serve: --tls-key=None: required",
                "gpupack extender serve: --client-ca=None: required",
            ],
        ),
        (
            ["agent", "run", "--node", "", "--port", "70000"],
            [
                "gpupack agent run: --node='': required: pass --node or set NODE_NAME",
                "gpupack agent run: --port=70000: must be in 0..65535 (0: no /metrics and /healthz)",
            ],
        ),
    ],
    ids=["webhook", "extender", "agent"],
)
def test_a_service_with_bad_flags_exits_2_listing_each(
    argv: list[str], lines: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    from app import cli

    assert cli.main(argv) == 2
    err = capsys.readouterr().err.splitlines()
    assert len(err) == len(lines), err
    for got, want in zip(err, lines, strict=True):
        assert got.startswith(want), (got, want)


def _serve_parser(argv: list[str]) -> argparse.ArgumentParser:
    """The parser of `gpupack SERVICE VERB` as the CLI builds it."""
    from app.cli import build_parser

    parser: argparse.ArgumentParser = build_parser()
    for word in argv:
        sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
        parser = sub.choices[word]
    return parser


SERVICES = [
    (["webhook", "serve"], WebhookSettings, "webhook.settings"),
    (["extender", "serve"], ExtenderSettings, "extender.config"),
    (["agent", "run"], AgentSettings, "agent.settings"),
]


@pytest.mark.parametrize(("argv", "cls", "module"), SERVICES, ids=["webhook", "extender", "agent"])
def test_each_flag_takes_default_and_help_from_its_settings_field(
    argv: list[str], cls: type[Any], module: str
) -> None:
    import importlib

    flags = importlib.import_module(module).FLAGS
    parser = _serve_parser(argv)
    by_flag = {a.option_strings[0]: a for a in parser._actions if a.option_strings and a.dest != "help"}
    rows = flag_rows(cls, flags)
    # Every settings field with a help sentence is a flag, and every flag is such a field.
    assert sorted(by_flag) == sorted(r.flag for r in rows)
    for row in rows:
        action = by_flag[row.flag]
        assert action.help == help_of(cls, row.field)
        if row.field == "node":  # the agent's node defaults to $NODE_NAME when the parser is built
            continue
        assert action.default == default_of(cls, row.field), row.flag
        if row.default:
            assert action.help.endswith(f"(default: {row.default})"), action.help


def test_the_defaults_the_issue_named_are_written_once_and_shown_as_such() -> None:
    rows = {r.flag: r for r in flag_rows(ExtenderSettings, EXTENDER_FLAGS)}
    assert (rows["--lease-duration"].default, rows["--watch-timeout"].default) == ("15", "45")
    assert rows["--identity"].default == "$POD_NAME, else host-pid"  # computed at start-up
    agent = {r.flag: r for r in flag_rows(AgentSettings, AGENT_FLAGS)}
    assert (agent["--memory-threshold-mib"].default, agent["--heartbeat"].default) == ("256", "30s")
    assert agent["--no-mps"].default == ""  # a switch: its sentence says what it does
    # The components take these from the settings: the agent's reporter and the extender's informers.
    from agent.main import reporter_config
    from extender.runtime import informer_config

    cadence = reporter_config(AgentSettings(node="n1"))
    assert (cadence.heartbeat_s, cadence.memory_threshold_mib) == (30, 256)
    assert informer_config(ExtenderSettings()).watch_timeout_s == 45
