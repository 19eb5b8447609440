"""Resuming a run: what the options given on the command line mean for a run that already exists.

A resumed run keeps its stored config. An option that restates the stored value is ignored (and
named); one that contradicts it is refused, except `--steps`, which sets a new budget of stored
steps (larger than what the run has already stored). Nothing here writes anything.
"""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path
from typing import Any

from aesrl_queue.config import RunConfig

FLAG = {"env_id": "--env", "total_steps": "--steps", "config_file": "--config"}


class ResumeError(ValueError):
    """The options contradict the stored run; the message says which and what to do."""


def flag(name: str) -> str:
    return FLAG.get(name, "--" + name.replace("_", "-"))


def _norm(name: str, value: Any) -> Any:
    if name in ("hidden", "critic_hidden"):
        if isinstance(value, str):
            value = [int(x) for x in value.replace("x", ",").split(",") if x.strip()]
        return tuple(int(x) for x in value)
    if name in ("r", "fitness_shift"):  # a number, or a mode name that stays as it is
        try:
            return float(value)
        except (TypeError, ValueError):
            return value
    if name == "env_kwargs" and isinstance(value, str):
        return json.loads(value)
    return value


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, int | float) and not isinstance(b, bool):
        return math.isclose(a, float(b), rel_tol=1e-9, abs_tol=0.0)
    if isinstance(b, float) and isinstance(a, int | float) and not isinstance(a, bool):
        return math.isclose(float(a), b, rel_tol=1e-9, abs_tol=0.0)
    return a == b


def given_options(env_id: str | None, config_file: str | None, kw: dict[str, Any]) -> dict[str, tuple[str, Any]]:
    """field -> (the flag that set it, the value), for every config option given explicitly."""
    out: dict[str, tuple[str, Any]] = {}
    if config_file:
        from aesrl_queue.config import ConfigError

        text = Path(config_file).read_text()
        try:
            import tomllib

            data = tomllib.loads(text) if str(config_file).endswith(".toml") else json.loads(text)
        except ValueError as exc:
            raise ConfigError("file", f"{config_file} is not valid: {exc}") from None
        for k, v in (data or {}).items():
            out[k] = (f"{flag('config_file')} {config_file} ({k})", v)
    if env_id:
        out["env_id"] = (flag("env_id"), env_id)
    for k, v in kw.items():
        if v is not None:
            out[k] = (flag(k), v)
    return out


def check_resume(stored: RunConfig, given: dict[str, tuple[str, Any]], steps_done: int) -> tuple[RunConfig, list[str]]:
    """The config to resume with and the notes to print; ResumeError when options contradict the run."""
    fields = {f.name for f in dataclasses.fields(RunConfig)}
    ignored, conflicts, notes = [], [], []
    cfg = stored
    for name, (how, value) in given.items():
        if name not in fields or name in ("created_at",):
            continue
        try:
            want = _norm(name, value)
        except (ValueError, TypeError):
            want = value
        have = _norm(name, getattr(stored, name))
        if name == "total_steps":
            if int(want) == stored.total_steps:
                ignored.append(how)
            elif int(want) <= steps_done:
                conflicts.append(f"{how} {want:,} is not above the {steps_done:,} steps the run has already stored")
            else:
                cfg = dataclasses.replace(cfg, total_steps=int(want))
                notes.append(f"budget {stored.total_steps:,} -> {int(want):,} stored steps ({how} {int(want)})")
            continue
        if _same(want, have):
            ignored.append(how)
        else:
            shown = ",".join(map(str, have)) if isinstance(have, tuple) else have
            conflicts.append(f"{how} {value} (the run has {name}={shown})")
    if conflicts:
        raise ResumeError(f"run {stored.run_id} is {stored.algo} on {stored.env_id}; "
                          f"{'; '.join(conflicts)}: drop these options to resume it, or use a new --run-id")
    if ignored:
        notes.append(f"ignored (the run's own settings): {', '.join(ignored)}")
    return cfg, notes
