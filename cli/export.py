"""`aesrl-queue export` and `aesrl-queue evaluate`: a run's policy as one self-describing file, and its
return measured again (optionally filmed).

The file is a `torch.save` of plain types and tensors only (loads with `weights_only=True`): the flat
parameter vector, an `Actor` state_dict, and the run config needed to rebuild the network and env.
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import numpy as np

from aesrl_queue.codec import json_default

FORMAT = "aesrl-queue-policy"
FORMAT_VERSION = 1
NET_FIELDS = ("obs_dim", "act_dim", "max_action", "hidden", "activation")
VIDEO_MISSING = ("--video needs the video extra: pip install -e '.[video]' in a clone (imageio, imageio-ffmpeg "
                 "for MP4, pygame to render classic-control envs such as Pendulum, MuJoCo's renderer)")


class ExportError(ValueError):
    """The source cannot provide the policy asked for (say what to do instead)."""


def _load_folder(src: Path, which: str) -> dict[str, Any]:
    npz_path = src / "policy.npz" if src.is_dir() else src
    if not npz_path.is_file():
        raise ExportError(f"{src}: no policy.npz (a run folder written by `aesrl-queue run` or `scheduler start --out`)")
    try:
        with np.load(npz_path, allow_pickle=False) as npz:
            data = {k: npz[k] for k in npz.files}
        config = json.loads(str(data["config"]))
        if not isinstance(config, dict) or "mu" not in data:
            raise ValueError("no config and mu")
    except (ValueError, OSError, KeyError, EOFError) as exc:
        raise ExportError(f"{npz_path}: not a policy.npz written by `aesrl-queue run` ({type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else 'unreadable'}); pass a run folder, its "
                          "policy.npz or a file from `aesrl-queue export`") from None
    if which == "best":
        if "best" not in data:
            raise ExportError(f"{src}: the run folder holds no best individual (older run?); export --which mu")
        return {"params": data["best"], "config": config, "which": "best",
                "source": {"folder": str(src), "fitness": float(data["best_fitness"]),
                           "kind": str(data.get("best_kind", "")), "job": str(data.get("best_job", ""))}}
    return {"params": data["mu"], "config": config, "which": "mu",
            "source": {"folder": str(src), "mu_version": int(data["version"]),
                       "f_mu": float(data["f_mu"]) if "f_mu" in data else math.nan,
                       "f_mu_version": int(data["f_mu_version"]) if "f_mu_version" in data else -1}}


def _load_redis(client, run_id: str, which: str) -> dict[str, Any]:
    from aesrl_queue.store import Store

    store = Store(client, run_id)
    if not store.exists():
        raise ExportError(f"run {run_id!r} is neither a run folder nor a run on this Redis (`aesrl-queue runs` lists them)")
    cfg = store.config()
    config = json.loads(json.dumps(cfg.to_dict(), default=json_default))
    if which == "best":
        best = store.read_best()
        if best is None:
            raise ExportError(f"run {run_id} has no best individual stored yet; export --which mu")
        return {"params": best["params"], "config": config, "which": "best",
                "source": {"run": run_id, "fitness": best.get("fitness"), "kind": best.get("kind", ""),
                           "job": best.get("job", "")}}
    st = store.state()
    version = st["version"]
    mu, _var = store.read_dist(version)
    return {"params": mu, "config": config, "which": "mu",
            "source": {"run": run_id, "mu_version": version, "f_mu": st.get("f_mu", math.nan),
                       "f_mu_version": st.get("f_mu_version", -1)}}


def export_policy(source: str, out: str | Path, which: str = "mu", client=None) -> dict[str, Any]:
    """Write `out` from a run folder (or its policy.npz) or, with a client, a run id on Redis."""
    import torch


    src = Path(source)
    if src.exists():
        got = _load_folder(src, which)
    elif client is not None:
        got = _load_redis(client, source, which)
    else:
        raise ExportError(f"{source}: no such run folder (pass --redis-url to export a run from Redis)")
    payload = policy_payload(got, source, which)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    torch.save(payload, out)
    return payload


def policy_payload(got: dict[str, Any], source: str | Path, which: str) -> dict[str, Any]:
    """The policy file's content from what a run folder or Redis holds."""
    import torch

    from aesrl_queue.nets import NetSpec, set_flat

    cfg = got["config"]
    params = np.asarray(got["params"], dtype=np.float32).reshape(-1)
    if not np.isfinite(params).all():
        raise ExportError(f"{source}: the {which} parameters hold non-finite values")
    spec = NetSpec.from_config(cfg)
    if params.size != spec.actor_dim:
        raise ExportError(f"{source}: {params.size} parameters, but the config's network has {spec.actor_dim}")
    actor = spec.make_actor()
    set_flat(actor, params)
    payload = {
        "format": FORMAT, "format_version": FORMAT_VERSION, "which": got["which"],
        "env_id": cfg["env_id"], "env_kwargs": cfg.get("env_kwargs") or {},
        "net": {k: (list(cfg[k]) if k == "hidden" else cfg[k]) for k in NET_FIELDS},
        "params": torch.from_numpy(params.copy()),
        "state_dict": {k: v.detach().clone() for k, v in actor.state_dict().items()},
        "config": cfg, "source": {k: (None if isinstance(v, float) and not math.isfinite(v) else v)
                                  for k, v in got["source"].items()},
        "exported_at": time.time(),
    }
    return payload


def load_policy(path: str | Path) -> dict[str, Any]:
    """A policy file from `export`, or μ of a run folder or its policy.npz."""
    import torch

    p = Path(path)
    if p.is_dir() or p.suffix == ".npz":
        return policy_payload(_load_folder(p, "mu"), p, "mu")

    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except FileNotFoundError:
        raise ExportError(f"{path}: no such file") from None
    except Exception as exc:  # torch's own text asks to file an issue: one line of ours instead
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExportError(f"{path}: not a policy file written by `aesrl-queue export`, a run folder or a "
                          f"policy.npz ({first[:120]})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise ExportError(f"{path}: not a policy file written by `aesrl-queue export`")
    if payload.get("format_version", 0) > FORMAT_VERSION:
        raise ExportError(f"{path}: format version {payload['format_version']} is newer than this aesrl-queue")
    return payload


def numpy_actor(payload: dict[str, Any]):
    from aesrl_queue.nets import NetSpec

    actor = NetSpec.from_config(payload["net"]).make_numpy_actor()
    actor.set_params(payload["params"].numpy())
    return actor


def evaluate_policy(path: str | Path, episodes: int = 10, seed: int = 0, video_dir: str | Path | None = None,
                    ) -> dict[str, Any]:
    """Mean and std of the deterministic policy's return over `episodes` episodes (episode i resets
    with seed + i); with video_dir, also film the first episode."""
    from aesrl_queue.rollout import run_episodes

    payload = load_policy(path)
    actor = numpy_actor(payload)
    returns, lengths = [], []
    for i in range(episodes):
        ep = run_episodes(payload["env_id"], actor, k=1, seed=seed + i, store=False, env_kwargs=payload["env_kwargs"])
        returns.append(ep.returns[0])
        lengths.append(ep.lengths[0])
    out = {"env_id": payload["env_id"], "which": payload["which"], "episodes": episodes,
           "mean": float(np.mean(returns)), "std": float(np.std(returns)), "returns": returns, "lengths": lengths,
           "source": payload.get("source", {})}
    if video_dir is not None:
        try:
            out["video"] = record_video(payload, actor, Path(video_dir), seed)
        except ExportError as exc:  # the returns are still worth printing
            out["video_error"] = str(exc)
    return out


def record_video(payload: dict[str, Any], actor, video_dir: Path, seed: int) -> dict[str, Any]:
    """Film one episode (reset with `seed`) to video_dir as MP4, or GIF without ffmpeg.

    Raises ExportError with the install command when no writer or renderer is available.
    """
    import os

    os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
    os.environ.setdefault("SDL_VIDEODRIVER", "dummy")  # render off-screen, also without a display
    try:
        import imageio.v2 as imageio
    except ImportError:
        raise ExportError(VIDEO_MISSING) from None
    import gymnasium as gym

    import aesrl_queue.envs  # noqa: F401  (registers the project's envs)

    try:
        env = gym.make(payload["env_id"], render_mode="rgb_array", **payload["env_kwargs"])
    except gym.error.Error as exc:
        raise ExportError(f"cannot render {payload['env_id']}: {exc}") from None
    frames, ret = [], 0.0
    try:
        obs, _ = env.reset(seed=seed)
        frames.append(env.render())
        while True:
            obs, r, terminated, truncated, _ = env.step(actor.act(obs))
            ret += float(r)
            frames.append(env.render())
            if terminated or truncated:
                break
    except gym.error.DependencyNotInstalled as exc:
        raise ExportError(f"{VIDEO_MISSING}. The renderer said: {exc}") from None
    except Exception as exc:  # MuJoCo without an OpenGL context, etc.
        raise ExportError(f"cannot render {payload['env_id']} ({type(exc).__name__}: {exc}); for MuJoCo on a "
                          "headless machine try MUJOCO_GL=egl or MUJOCO_GL=osmesa") from None
    finally:
        env.close()
    frames = [f for f in frames if f is not None]
    if not frames:
        raise ExportError(f"{payload['env_id']} rendered no frames")
    video_dir.mkdir(parents=True, exist_ok=True)
    fps = int(env.metadata.get("render_fps") or 30)
    stem = f"{payload['env_id'].replace(':', '_').replace('/', '_')}-{payload['which']}-seed{seed}"
    try:
        import imageio_ffmpeg  # noqa: F401

        path = video_dir / f"{stem}.mp4"
        imageio.mimsave(path, frames, fps=fps, macro_block_size=1)
    except ImportError:
        path = video_dir / f"{stem}.gif"
        imageio.mimsave(path, frames, duration=1000.0 / fps, loop=0)
    return {"path": str(path), "frames": len(frames), "return": ret}
