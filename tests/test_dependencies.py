"""Declared dependency ranges: setup.cfg allows only versions the project runs, and a worker on an
RQ it cannot run on refuses to start with one line instead of failing every job."""

from __future__ import annotations

import configparser
import importlib.metadata as md
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, child_env
from workers.worker import RQ_RANGE, rq_problem


def install_requires() -> dict[str, str]:
    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "setup.cfg")
    out = {}
    for line in cfg["options"]["install_requires"].strip().splitlines():
        name = re.match(r"[A-Za-z0-9_.-]+", line.strip()).group(0)
        out[name.lower()] = line.strip()
    return out


def test_every_runtime_requirement_has_a_range_that_includes_the_installed_version():
    from packaging.requirements import Requirement

    reqs = install_requires()
    assert "mujoco-core" in reqs, "MuJoCo, which gymnasium's environments need, has its range"
    assert reqs["rq"].startswith(RQ_RANGE.split(",")[0]), (reqs["rq"], RQ_RANGE)
    for line in reqs.values():
        req = Requirement(line)
        lows = [s.version for s in req.specifier if s.operator == ">="]
        assert lows and any(s.operator == "<" for s in req.specifier), f"{line}: needs a lower and an upper bound"
        installed = md.version(req.name)
        assert req.specifier.contains(installed, prereleases=True), f"{line}: the tested {installed} is outside it"


def test_rq_problem_names_the_installed_and_required_versions():
    assert rq_problem() is None  # the RQ the suite runs on
    assert rq_problem("3.0.0") is None and rq_problem("3.1.2") is None
    msg = rq_problem("2.6.1")
    assert msg is not None and "rq 2.6.1 is installed" in msg and RQ_RANGE in msg and "\n" not in msg
    assert rq_problem("3") is None and rq_problem("3.9.9") is None
    # A major version the overrides were not written for is refused too, prereleases and all.
    for newer in ("4", "4.0.0", "4.0.0rc1", "4.2.1", "5.0"):
        msg = rq_problem(newer)
        assert msg is not None and f"rq {newer} is installed" in msg and RQ_RANGE in msg and "\n" not in msg, newer
        assert "written for RQ 3" in msg, msg


@pytest.fixture(scope="module")
def rq2(tmp_path_factory):
    """RQ 2.6.1 in a folder put first on PYTHONPATH (everything else as installed)."""
    target = tmp_path_factory.mktemp("rq2")
    res = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--disable-pip-version-check",
                          "--target", str(target), "rq==2.6.1"], capture_output=True, text=True, timeout=300)
    if res.returncode != 0:
        pytest.skip(f"rq 2.6.1 cannot be installed here: {res.stderr.strip().splitlines()[-1:]}")
    env = child_env()
    env["PYTHONPATH"] = str(target) + os.pathsep + env["PYTHONPATH"]
    return env


@pytest.fixture(scope="module")
def rq4(tmp_path_factory):
    """The installed RQ under the version number 4.0.0 (no RQ 4 is released): a copy of its package,
    its version.py changed, put first on PYTHONPATH."""
    import rq

    target = tmp_path_factory.mktemp("rq4")
    shutil.copytree(os.path.dirname(rq.__file__), target / "rq", ignore=shutil.ignore_patterns("__pycache__"))
    (target / "rq" / "version.py").write_text("VERSION = '4.0.0'\n")
    env = child_env()
    env["PYTHONPATH"] = str(target) + os.pathsep + env["PYTHONPATH"]
    return env


def test_workers_refuse_rq_2_with_one_line(rq2, redis_url, tmp_path):
    _refused_in_one_line(rq2, "2.6.1", redis_url, tmp_path)


def test_workers_refuse_rq_4_with_one_line(rq4, redis_url, tmp_path):
    _refused_in_one_line(rq4, "4.0.0", redis_url, tmp_path)


def _refused_in_one_line(env, version, redis_url, tmp_path):
    expected = f"error: rq {version} is installed; an AesrlWorker needs {RQ_RANGE}"
    for cmd in ([sys.executable, "-m", "cli.main", "worker", "-n", "1", "--redis-url", redis_url],
                [sys.executable, "-m", "rq.cli", "worker", "-w", "workers.AesrlWorker", "-u", redis_url, "--burst"],
                [sys.executable, "-m", "cli.main", "run", "--env", "Pendulum-v1", "--steps", "100", "--workers", "1",
                 "--out", str(tmp_path / "runs")]):
        res = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
        assert res.returncode in (1, 2), (cmd, res.returncode, res.stderr)
        lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
        assert lines and lines[-1].startswith(expected), (cmd, res.stderr[-2000:])
        assert "Traceback" not in res.stderr, (cmd, res.stderr[-2000:])
    assert not (tmp_path / "runs").exists()  # `run` refused before making a folder
