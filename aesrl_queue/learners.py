"""The off-policy learners: what trains the critic, and how an actor climbs it.

A `Learner` owns the critic of a run (its networks, any target copies, its optimizer) and is the one
place the critic daemon, the RL jobs' actor steps and the `td3` baseline go through:

- `critic_step(batch, target_actor)`: one critic update toward r + γ·min Q(s', π'(s') + noise), with
  π' the target policy (μ in the daemon, the actor or its target copy in the `td3` baseline). It
  returns [loss, mean Q1] as a tensor on the device, never syncing with the host, so the daemon can
  capture it as a CUDA graph.
- `after_actor_step()`: what follows a delayed policy step (TD3 soft-updates its target copies).
- `weights()` / `critic_for_actor(spec, weights, device)`: what the daemon publishes and what an RL job
  rebuilds from it: a frozen critic whose `q1(s, a)` the actor climbs.
- `state()` / `load_state()`: the checkpoint, with the optimizer, so a restarted daemon resumes.
- `betas`, `policy_delay`: how an actor is trained against it (Adam's betas, critic steps per
  policy step); `publish_average`: where the `td3` baseline's actor is published as a Polyak average
  of itself, that average's rate per policy step (0: the actor itself).

Actors stay deterministic MLPs kept as flat vectors (ES perturbs them), whatever the learner.

Learners:
- `td3` (Fujimoto et al. 2018): twin critics with target copies, soft-updated by tau; the paper's.
- `crossq` (Bhatt et al., ICLR 2024), with TD3's deterministic actor: no target networks; Batch
  Renormalization in the critic, whose one forward pass takes (s, a) and (s', a') together so both
  see the same batch statistics; wide critics (2048-2048); Adam with β1 = 0.5; a policy step every
  third critic step.
- `crossq-sac`: CrossQ as published, on SAC's squashed Gaussian policy whose mean is the flat actor
  (`CrossQSACLearner`); the `td3` baseline publishes a Polyak average of its actor.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from aesrl_queue import codec
from aesrl_queue.nets import NetSpec, _mlp, _mlp_forward, _torch_activation, get_flat, set_flat
from aesrl_queue.numpy_actor import LOG_STD_MAX, LOG_STD_MIN
from aesrl_queue.td3 import _actor_step, soft_update, to_numpy, to_tensors
from aesrl_queue.td3 import critic_step as td3_critic_step


class TD3Learner:
    """TD3's twin critics and their target copies (the paper's learner)."""

    name = "td3"
    policy_delay = 2
    has_targets = True  # the baseline keeps a target copy of its actor too
    betas = (0.9, 0.999)
    publish_average = 0.0

    def __init__(self, spec: NetSpec, *, lr: float, gamma: float, tau: float, policy_noise: float,
                 noise_clip: float, device: str | torch.device = "cpu", capturable: bool = False,
                 delayed_targets: bool = False) -> None:
        self.spec, self.device = spec, torch.device(device)
        self.gamma, self.tau = float(gamma), float(tau)
        self.policy_noise, self.noise_clip = float(policy_noise), float(noise_clip)
        # the daemon soft-updates the targets after every critic step; the baseline after each policy step
        self.delayed_targets = delayed_targets
        self.critic = spec.make_critic(self.device)
        self.critic_target = copy.deepcopy(self.critic).requires_grad_(False)
        self.opt = torch.optim.Adam(self.critic.parameters(), lr=lr, capturable=capturable)

    def critic_step(self, batch: dict[str, torch.Tensor], target_actor: nn.Module,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        return td3_critic_step(self.critic, self.critic_target, self.opt, target_actor, batch, self.gamma,
                               self.tau, self.policy_noise, self.noise_clip, self.spec.max_action,
                               not self.delayed_targets, generator)

    def actor_step(self, actor: nn.Module, actor_opt: torch.optim.Optimizer, obs: torch.Tensor) -> torch.Tensor:
        """One policy step of `actor` up the critic's Q1; the loss, on the device."""
        return _actor_step(actor, self.actor_critic(), actor_opt, obs)

    def after_actor_step(self) -> None:
        if self.delayed_targets:
            soft_update(self.critic_target, self.critic, self.tau)

    def actor_critic(self) -> nn.Module:
        """The critic an actor step climbs (its q1)."""
        return self.critic

    def weights(self) -> dict[str, np.ndarray]:
        return {"critic": get_flat(self.critic), "critic_target": get_flat(self.critic_target)}

    @staticmethod
    def critic_for_actor(spec: NetSpec, weights: dict[str, Any], device: str | torch.device) -> nn.Module:
        critic = spec.make_critic(device)
        set_flat(critic, codec.check_array(weights.get("critic"), what="critic weights"))
        return critic.requires_grad_(False)

    def state(self) -> dict[str, Any]:
        return {**self.weights(), "opt": to_numpy(self.opt.state_dict())}

    def load_state(self, ckpt: dict[str, Any]) -> None:
        set_flat(self.critic, codec.check_array(ckpt["critic"], what="ckpt critic"))
        set_flat(self.critic_target, codec.check_array(ckpt["critic_target"], what="ckpt critic_target"))
        self.opt.load_state_dict(to_tensors(ckpt["opt"], self.device))


class BatchRenorm(nn.Module):
    """Batch Renormalization (Ioffe 2017) over the features of a (B, F) batch, on CrossQ's schedule.

    Training normalises by the batch's statistics: for the first `warmup` training steps as plain batch
    norm, then corrected toward the running statistics (r, d, clipped to r_max, d_max); evaluation by
    the running statistics alone. The step count is a tensor, so a CUDA graph can replay it."""

    def __init__(self, features: int, momentum: float = 0.01, eps: float = 1e-3, warmup: int = 100_000,
                 r_max: float = 3.0, d_max: float = 5.0) -> None:
        super().__init__()
        self.momentum, self.eps, self.warmup = momentum, eps, warmup
        self.r_max, self.d_max = r_max, d_max
        self.weight = nn.Parameter(torch.ones(features))
        self.bias = nn.Parameter(torch.zeros(features))
        self.register_buffer("running_mean", torch.zeros(features))
        self.register_buffer("running_var", torch.ones(features))
        self.register_buffer("steps", torch.zeros(()))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.training:
            x = (x - self.running_mean) / torch.sqrt(self.running_var + self.eps)
            return x * self.weight + self.bias
        mean = x.mean(0)
        var = x.var(0, unbiased=False)
        std = torch.sqrt(var + self.eps)
        with torch.no_grad():
            running_std = torch.sqrt(self.running_var + self.eps)
            on = (self.steps > self.warmup).to(x.dtype)  # 0 while warming up: r = 1, d = 0
            r = torch.clamp(std / running_std, 1.0 / self.r_max, self.r_max) * on + (1.0 - on)
            d = torch.clamp((mean - self.running_mean) / running_std, -self.d_max, self.d_max) * on
            self.running_mean.lerp_(mean, self.momentum)
            self.running_var.lerp_(var, self.momentum)
            self.steps.add_(1.0)
        x = (x - mean) / std * r + d
        return x * self.weight + self.bias


class BRNCritic(nn.Module):
    """CrossQ's twin critics: Batch Renormalization on the input and after every hidden activation
    (Linear, activation, BatchRenorm; then the output Linear), as CrossQ's code orders them."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], activation: str) -> None:
        super().__init__()
        self.obs_dim, self.act_dim = int(obs_dim), int(act_dim)
        self.hidden, self.activation = tuple(hidden), activation
        sizes = (self.obs_dim + self.act_dim, *hidden)
        self._act = _torch_activation(activation)

        def head() -> nn.ModuleList:
            layers: list[nn.Module] = [BatchRenorm(sizes[0])]
            for i, o in zip(sizes[:-1], sizes[1:], strict=True):
                layers += [nn.Linear(i, o), BatchRenorm(o)]
            layers.append(nn.Linear(sizes[-1], 1))
            return nn.ModuleList(layers)

        self.head1, self.head2 = head(), head()

    def _head(self, layers: nn.ModuleList, x: torch.Tensor) -> torch.Tensor:
        x = layers[0](x)
        for i in range(1, len(layers) - 1, 2):
            x = layers[i + 1](self._act(layers[i](x)))
        return layers[-1](x)

    def forward(self, obs: torch.Tensor, act: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.cat([obs, act], dim=-1)
        return self._head(self.head1, x), self._head(self.head2, x)

    def q1(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self._head(self.head1, torch.cat([obs, act], dim=-1))


def _buffers(module: nn.Module) -> np.ndarray:
    with torch.no_grad():
        return torch.cat([b.reshape(-1) for b in module.buffers()]).to("cpu", torch.float32).numpy().copy()


def _set_buffers(module: nn.Module, flat: np.ndarray) -> None:
    arr = torch.from_numpy(np.asarray(flat, dtype=np.float32).reshape(-1))
    want = sum(b.numel() for b in module.buffers())
    if arr.numel() != want:
        raise ValueError(f"critic statistics have length {arr.numel()}, expected {want}")
    pos = 0
    with torch.no_grad():
        for b in module.buffers():
            b.copy_(arr[pos:pos + b.numel()].view_as(b))
            pos += b.numel()


class CrossQLearner:
    """CrossQ with a deterministic actor: no target networks, batch-renormalised twin critics."""

    name = "crossq"
    policy_delay = 3
    has_targets = False
    betas = (0.5, 0.999)
    publish_average = 0.0

    def __init__(self, spec: NetSpec, *, lr: float, gamma: float, tau: float, policy_noise: float,
                 noise_clip: float, device: str | torch.device = "cpu", capturable: bool = False,
                 delayed_targets: bool = False) -> None:
        del tau, delayed_targets  # no target networks
        self.spec, self.device = spec, torch.device(device)
        self.gamma, self.policy_noise, self.noise_clip = float(gamma), float(policy_noise), float(noise_clip)
        self.critic = self.make_critic(spec, self.device)
        self.opt = torch.optim.Adam(self.critic.parameters(), lr=lr, betas=self.betas, capturable=capturable)

    @staticmethod
    def make_critic(spec: NetSpec, device: str | torch.device) -> BRNCritic:
        return BRNCritic(spec.obs_dim, spec.act_dim, spec.critic_hidden, spec.critic_activation).to(device)

    # the critic's loss: the sum of the two heads' squared errors (SAC's code halves it)
    loss_scale = 1.0

    def next_actions(self, target_actor: nn.Module, next_obs: torch.Tensor,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """a' for the target and what it subtracts from min Q(s', a') (None: nothing): TD3's smoothed
        target policy."""
        max_action = self.spec.max_action
        mean = target_actor(next_obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        noise = (noise * self.policy_noise).clamp_(-self.noise_clip, self.noise_clip)
        return (mean + noise).clamp_(-max_action, max_action), None

    def critic_step(self, batch: dict[str, torch.Tensor], target_actor: nn.Module,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        obs, act, next_obs = batch["obs"], batch["act"], batch["next_obs"]
        rew, done = batch["rew"].reshape(-1, 1), batch["done"].reshape(-1, 1)
        with torch.no_grad():
            next_act, penalty = self.next_actions(target_actor, next_obs, generator)
        self.critic.train()
        # (s, a) and (s', a') in one pass: both are normalised by the statistics of their union
        q1_all, q2_all = self.critic(torch.cat([obs, next_obs]), torch.cat([act, next_act]))
        n = obs.shape[0]
        q1, q2 = q1_all[:n], q2_all[:n]
        next_q = torch.min(q1_all[n:], q2_all[n:]).detach()
        if penalty is not None:
            next_q = next_q - penalty
        y = rew + self.gamma * (1.0 - done) * next_q
        loss = F.mse_loss(q1, y) + F.mse_loss(q2, y)
        if self.loss_scale != 1.0:
            loss = self.loss_scale * loss
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        self.opt.step()
        self.critic.eval()
        return torch.stack([loss.detach(), q1.detach().mean()])

    def actor_step(self, actor: nn.Module, actor_opt: torch.optim.Optimizer, obs: torch.Tensor) -> torch.Tensor:
        return _actor_step(actor, self.actor_critic(), actor_opt, obs)

    def after_actor_step(self) -> None:
        pass

    def actor_critic(self) -> nn.Module:
        self.critic.eval()  # an actor climbs the critic as evaluated, on its running statistics
        return self.critic

    def weights(self) -> dict[str, np.ndarray]:
        return {"critic": get_flat(self.critic), "critic_stats": _buffers(self.critic)}

    @classmethod
    def critic_for_actor(cls, spec: NetSpec, weights: dict[str, Any], device: str | torch.device) -> nn.Module:
        critic = cls.make_critic(spec, device)
        set_flat(critic, codec.check_array(weights.get("critic"), what="critic weights"))
        _set_buffers(critic, codec.check_array(weights.get("critic_stats"), what="critic statistics"))
        return critic.eval().requires_grad_(False)

    def state(self) -> dict[str, Any]:
        return {**self.weights(), "opt": to_numpy(self.opt.state_dict())}

    def load_state(self, ckpt: dict[str, Any]) -> None:
        set_flat(self.critic, codec.check_array(ckpt["critic"], what="ckpt critic"))
        _set_buffers(self.critic, codec.check_array(ckpt["critic_stats"], what="ckpt critic statistics"))
        self.opt.load_state_dict(to_tensors(ckpt["opt"], self.device))


class LogStd(nn.Module):
    """A Gaussian policy's log standard deviation per state: an MLP of the actor's sizes and activation,
    clamped to [LOG_STD_MIN, LOG_STD_MAX]."""

    def __init__(self, obs_dim: int, act_dim: int, hidden: Sequence[int], activation: str) -> None:
        super().__init__()
        self.layers = _mlp((int(obs_dim), *hidden, int(act_dim)))
        self._act = _torch_activation(activation)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        return _mlp_forward(self.layers, self._act, obs).clamp(LOG_STD_MIN, LOG_STD_MAX)


def gaussian_logp(log_std: torch.Tensor, noise: torch.Tensor) -> torch.Tensor:
    """log N(mean + std·noise; mean, std), summed over the action's dimensions: the draw before the squash."""
    return (-0.5 * noise.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1, keepdim=True)


def squashed_draw(mean: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor,
                  max_action: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(action, log π(action)): tanh(mean + std·noise)·max_action, reparameterised, and the
    log-probability of the squashed action in [-1, 1] (the Gaussian's, less the tanh's log-Jacobian)."""
    squashed = torch.tanh(mean + log_std.exp() * noise)
    logp = gaussian_logp(log_std, noise) - torch.log(1.0 - squashed.pow(2) + 1e-6).sum(-1, keepdim=True)
    return squashed * max_action, logp


class SACJobCritic(nn.Module):
    """What an RL job's actor climbs with crossq-sac, all frozen: the critic (on its running
    statistics), the published log-std network and temperature α. The actor's loss is SAC's,
    α·log π(a|s) - min(Q1, Q2)(s, a) with a drawn around the actor's mean."""

    def __init__(self, critic: BRNCritic, log_std: LogStd, log_alpha: float, max_action: float) -> None:
        super().__init__()
        self.critic, self.log_std, self.max_action = critic, log_std, float(max_action)
        self.register_buffer("alpha", torch.tensor(math.exp(log_alpha)))

    def q1(self, obs: torch.Tensor, act: torch.Tensor) -> torch.Tensor:
        return self.critic.q1(obs, act)

    def actor_loss(self, actor: nn.Module, obs: torch.Tensor) -> torch.Tensor:
        mean = actor.pre_tanh(obs)
        act, logp = squashed_draw(mean, self.log_std(obs), torch.randn_like(mean), self.max_action)
        q1, q2 = self.critic(obs, act)
        return (self.alpha * logp - torch.min(q1, q2)).mean()


class CrossQSACLearner(CrossQLearner):
    """CrossQ as published, on SAC: the policy is a tanh-squashed Gaussian whose mean is the flat
    actor's pre-tanh output (what ES perturbs; workers and evaluations act with its tanh, the
    deterministic actor) and whose log standard deviation is this learner's own network; an entropy
    temperature α (from 1) is tuned toward an entropy of -act_dim. The critic's target draws a' from
    the policy at s' and subtracts α·log π(a'|s'). The critic is CrossQ's.

    With an actor of its own (the `td3` baseline's Agent, delayed_targets=True) the policy step
    maximises min(Q1, Q2) - α·log π, mean and log-std together, and α follows, every third critic
    step. The critic daemon has no actor: there each critic step also takes that step for the log-std
    and α alone, around the target policy's mean (μ), and RL jobs climb the published critic, log-std
    and α with SAC's loss (SACJobCritic). There α follows the entropy of the Gaussian before the
    squash, the part the log-std sets: the squash's share is set by μ, which ES and the RL jobs move
    and no step here can. Where μ's pre-tanh output is large the squashed policy cannot reach the
    target entropy at any width, and α tuned on it grows without bound and takes the critic with it
    (Hopper-v5, aesrl: log α 4.5 and a critic loss of 10¹¹ by 24 000 critic steps)."""

    name = "crossq-sac"
    stochastic = True
    loss_scale = 0.5
    # The deterministic actor (tanh of the policy's mean) of a stochastic policy swings between
    # neighbouring policy steps while the policy itself does not: on Walker2d a checkpoint scored 243
    # on fixed starts 26 policy steps before the final actor scored 4 352. The `td3` baseline evaluates
    # and publishes a Polyak average of its actor instead (about the last 200 policy steps).
    publish_average = 0.005

    def __init__(self, spec: NetSpec, *, lr: float, capturable: bool = False, delayed_targets: bool = False,
                 **kw: Any) -> None:
        super().__init__(spec, lr=lr, capturable=capturable, delayed_targets=delayed_targets, **kw)
        self.spread_steps = not delayed_targets  # the daemon: the log-std and α step with each critic step
        self.log_std = LogStd(spec.obs_dim, spec.act_dim, spec.hidden, spec.activation).to(self.device)
        self.log_alpha = torch.zeros((), device=self.device, requires_grad=True)
        self.target_entropy = -float(spec.act_dim)
        self.std_opt = torch.optim.Adam(self.log_std.parameters(), lr=lr, betas=self.betas, capturable=capturable)
        self.alpha_opt = torch.optim.Adam([self.log_alpha], lr=lr, capturable=capturable)

    def sample(self, actor: nn.Module, obs: torch.Tensor, noise: torch.Tensor | None = None,
               generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(action, log π(action | obs)) drawn around `actor`'s mean (`noise` standard normal, drawn
        when not given)."""
        mean = actor.pre_tanh(obs)
        if noise is None:
            noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        return squashed_draw(mean, self.log_std(obs), noise, self.spec.max_action)

    def explore(self, actor: nn.Module, obs: torch.Tensor, rng: np.random.Generator) -> np.ndarray:
        """A behaviour action for one observation (the baseline's exploration): a draw of the policy."""
        with torch.no_grad():
            noise = torch.as_tensor(rng.standard_normal(self.spec.act_dim), dtype=obs.dtype, device=obs.device)
            act, _ = self.sample(actor, obs[None], noise[None])
        return act[0].cpu().numpy()

    def next_actions(self, target_actor: nn.Module, next_obs: torch.Tensor,
                     generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """a' drawn from the policy at s', and α·log π(a'|s')."""
        next_act, next_logp = self.sample(target_actor, next_obs, generator=generator)
        return next_act, self.log_alpha.exp() * next_logp

    def critic_step(self, batch: dict[str, torch.Tensor], target_actor: nn.Module,
                    generator: torch.Generator | None = None) -> torch.Tensor:
        stats = super().critic_step(batch, target_actor, generator)
        if self.spread_steps:
            self._policy_step(target_actor, None, batch["obs"], generator)
        return stats

    def actor_step(self, actor: nn.Module, actor_opt: torch.optim.Optimizer, obs: torch.Tensor) -> torch.Tensor:
        return self._policy_step(actor, actor_opt, obs)

    def _policy_step(self, actor: nn.Module, actor_opt: torch.optim.Optimizer | None, obs: torch.Tensor,
                     generator: torch.Generator | None = None) -> torch.Tensor:
        """SAC's policy step: α toward the target entropy, then the log-std (and the actor's mean, with
        `actor_opt`; held where there is none) up min(Q1, Q2) - α·log π. With the mean held, α
        follows the Gaussian's entropy before the squash (the class's docstring says why)."""
        alpha = self.log_alpha.detach().exp()  # the temperature before this step's update, as SAC's code
        mean = actor.pre_tanh(obs)
        noise = torch.randn(mean.shape, generator=generator, device=mean.device, dtype=mean.dtype)
        log_std = self.log_std(obs)
        act, logp = squashed_draw(mean, log_std, noise, self.spec.max_action)
        held = self.alpha_logp(logp, log_std, noise, mean_trains=actor_opt is not None).detach()
        alpha_loss = -(self.log_alpha * (held + self.target_entropy)).mean()
        (self.log_alpha.grad,) = torch.autograd.grad(alpha_loss, [self.log_alpha])
        self.alpha_opt.step()
        q1, q2 = self.actor_critic()(obs, act)
        loss = (alpha * logp - torch.min(q1, q2)).mean()
        params = list(self.log_std.parameters())
        if actor_opt is not None:
            params += [p for p in actor.parameters() if p.requires_grad]
        for p, g in zip(params, torch.autograd.grad(loss, params), strict=True):
            p.grad = g  # the critic's parameters get none
        self.std_opt.step()
        if actor_opt is not None:
            actor_opt.step()
        return loss.detach()

    @staticmethod
    def alpha_logp(logp: torch.Tensor, log_std: torch.Tensor, noise: torch.Tensor, mean_trains: bool) -> torch.Tensor:
        """The log π that α is tuned on: the squashed policy's where the step trains the mean too (SAC),
        the Gaussian's before the squash where the mean is held (the class's docstring says why)."""
        return logp if mean_trains else gaussian_logp(log_std, noise)

    @classmethod
    def critic_for_actor(cls, spec: NetSpec, weights: dict[str, Any], device: str | torch.device) -> nn.Module:
        critic = super().critic_for_actor(spec, weights, device)
        log_std = LogStd(spec.obs_dim, spec.act_dim, spec.hidden, spec.activation).to(device)
        set_flat(log_std, codec.check_array(weights.get("log_std"), what="log-std weights"))
        log_alpha = codec.check_array(weights.get("log_alpha"), what="log alpha").reshape(-1)
        return SACJobCritic(critic, log_std, float(log_alpha[0]), spec.max_action).to(device).requires_grad_(False)

    def weights(self) -> dict[str, np.ndarray]:
        return {**super().weights(), "log_std": get_flat(self.log_std),
                "log_alpha": self.log_alpha.detach().reshape(1).cpu().numpy().copy()}

    def state(self) -> dict[str, Any]:
        return {**super().state(), "std_opt": to_numpy(self.std_opt.state_dict()),
                "alpha_opt": to_numpy(self.alpha_opt.state_dict())}

    def load_state(self, ckpt: dict[str, Any]) -> None:
        super().load_state(ckpt)
        set_flat(self.log_std, codec.check_array(ckpt["log_std"], what="ckpt log_std"))
        with torch.no_grad():
            self.log_alpha.copy_(torch.as_tensor(codec.check_array(ckpt["log_alpha"], what="ckpt log_alpha")).reshape(()))
        self.std_opt.load_state_dict(to_tensors(ckpt["std_opt"], self.device))
        self.alpha_opt.load_state_dict(to_tensors(ckpt["alpha_opt"], self.device))


def capture_step(step, device: torch.device, optimizer: torch.optim.Optimizer, warm: int = 3) -> torch.cuda.CUDAGraph:
    """`step` (a learner's step on a batch drawn with `sample_in_graph`) captured as a CUDA graph, as the
    critic daemon replays it: `warm` eager calls on a side stream first (the optimizer's state must exist
    before a capture), then one captured call. A capture runs nothing: only the warm-up calls train."""
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        for _ in range(warm):
            step()
    torch.cuda.current_stream(device).wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    optimizer.zero_grad(set_to_none=True)
    with torch.cuda.graph(graph):
        step()
    return graph


_CLASSES = {"td3": TD3Learner, "crossq": CrossQLearner, "crossq-sac": CrossQSACLearner}


def learner_class(name: str):
    try:
        return _CLASSES[name]
    except KeyError:
        raise ValueError(f"unknown learner {name!r}; one of {', '.join(_CLASSES)}") from None


def make_learner(cfg, spec: NetSpec, device: str | torch.device = "cpu", capturable: bool = False,
                 delayed_targets: bool = False):
    """The run's learner (cfg.learner) with its settings."""
    return learner_class(cfg.learner)(
        spec, lr=cfg.critic_lr, gamma=cfg.gamma, tau=cfg.tau, policy_noise=cfg.policy_noise,
        noise_clip=cfg.noise_clip, device=device, capturable=capturable, delayed_targets=delayed_targets)


class Agent:
    """A learner with its own actor, for the `td3` baseline (one process, no workers): a critic step
    per call, and a policy step every `policy_delay` of them (then TD3's targets follow)."""

    def __init__(self, spec: NetSpec, learner: str = "td3", lr: float = 3e-4, gamma: float = 0.99,
                 tau: float = 0.005, policy_noise: float = 0.2, noise_clip: float = 0.5,
                 policy_freq: int | None = None, device: str | torch.device = "cpu", capturable: bool = False) -> None:
        cls = learner_class(learner)
        self.policy_freq = int(policy_freq or cls.policy_delay)
        if self.policy_freq < 1:
            raise ValueError(f"policy_freq must be >= 1, got {policy_freq}")
        self.spec, self.device, self.tau = spec, torch.device(device), float(tau)
        self.actor = spec.make_actor(self.device)
        self.actor_target = copy.deepcopy(self.actor).requires_grad_(False) if cls.has_targets else None
        self.average = float(cls.publish_average)
        self.actor_avg = copy.deepcopy(self.actor).requires_grad_(False) if self.average > 0 else None
        self.learner = cls(spec, lr=lr, gamma=gamma, tau=tau, policy_noise=policy_noise, noise_clip=noise_clip,
                           device=self.device, delayed_targets=True, capturable=capturable)
        self.actor_opt = torch.optim.Adam(self.actor.parameters(), lr=lr, betas=cls.betas, capturable=capturable)
        self.total_it = 0
        self._graphs: dict[bool, torch.cuda.CUDAGraph] | None = None

    def train_step(self, batch: dict[str, torch.Tensor]) -> dict[str, float]:
        """One iteration; returns critic loss, q1_mean and (on policy steps) actor_loss."""
        self.total_it += 1
        values = self._iteration(batch, self.total_it % self.policy_freq == 0).tolist()
        out = {"loss": values[0], "q1_mean": values[1]}
        if len(values) > 2:
            out["actor_loss"] = values[2]
        return out

    def explore(self, obs: np.ndarray, rng: np.random.Generator, expl_noise: float) -> np.ndarray:
        """The behaviour action at `obs`: the actor plus Gaussian noise of expl_noise·max_action
        (clipped to the bounds), or a stochastic learner's own draw of its policy."""
        obs_t = torch.as_tensor(obs, dtype=torch.float32, device=self.device)
        if getattr(self.learner, "stochastic", False):
            return self.learner.explore(self.actor, obs_t, rng).astype(np.float32)
        max_a = self.spec.max_action
        with torch.no_grad():
            a = self.actor(obs_t[None])[0]
        act = a.cpu().numpy() + rng.normal(0.0, expl_noise * max_a, size=self.spec.act_dim)
        return np.clip(act, -max_a, max_a).astype(np.float32)

    def _iteration(self, batch: dict[str, torch.Tensor], policy: bool) -> torch.Tensor:
        target = self.actor if self.actor_target is None else self.actor_target
        stats = self.learner.critic_step(batch, target)
        if policy:
            actor_loss = self.learner.actor_step(self.actor, self.actor_opt, batch["obs"])
            self.learner.after_actor_step()
            if self.actor_target is not None:
                soft_update(self.actor_target, self.actor, self.tau)
            if self.actor_avg is not None:
                soft_update(self.actor_avg, self.actor, self.average)
            stats = torch.cat([stats, actor_loss.reshape(1)])
        return stats

    def graph_step(self, replay, batch_size: int) -> None:
        """One iteration on a CUDA device, sampled from `replay` and replayed from one of two captured
        CUDA graphs (a critic step; a critic and a policy step): the same step as train_step, launched
        as one call instead of a few hundred kernels. Nothing is read back. The optimizers must have
        been made capturable (`Agent(..., capturable=True)`); the first policy_freq iterations run
        eagerly, so that Adam's state exists before the capture."""
        if self._graphs is None:
            self._size = torch.zeros((), device=self.device)
            self._graphs = {}
        self._size.fill_(float(len(replay)))
        policy = (self.total_it + 1) % self.policy_freq == 0
        self.total_it += 1
        if self.total_it <= self.policy_freq:  # warm-up, on a side stream as capture wants
            side = torch.cuda.Stream(self.device)
            side.wait_stream(torch.cuda.current_stream(self.device))
            with torch.cuda.stream(side):
                self._iteration(replay.sample_in_graph(batch_size, self._size), policy)
            torch.cuda.current_stream(self.device).wait_stream(side)
            return
        if policy not in self._graphs:
            graph = torch.cuda.CUDAGraph()
            for opt in (self.learner.opt, self.actor_opt, getattr(self.learner, "std_opt", None),
                        getattr(self.learner, "alpha_opt", None)):
                if opt is not None:
                    opt.zero_grad(set_to_none=True)
            with torch.cuda.graph(graph):  # a capture runs nothing: replay it for this iteration too
                self._iteration(replay.sample_in_graph(batch_size, self._size), policy)
            self._graphs[policy] = graph
        self._graphs[policy].replay()

    def policy_weights(self) -> dict[str, np.ndarray]:
        """What a player of this agent's behaviour needs: the actor's flat parameters ("actor") and, for
        a stochastic learner, its log-std network's ("log_std"); no critic."""
        out = {"actor": get_flat(self.actor)}
        if getattr(self.learner, "stochastic", False):
            out["log_std"] = get_flat(self.learner.log_std)
        return out

    def actor_params(self) -> np.ndarray:
        """The published actor: the Polyak average of the actor where the learner's `publish_average`
        is above 0, else the actor."""
        return get_flat(self.actor if self.actor_avg is None else self.actor_avg)

    def state(self) -> dict[str, Any]:
        """The checkpoint: the actor (its target, its average), both optimizers and the learner's critic."""
        out = {f"critic_{k}" if k == "opt" else k: v for k, v in self.learner.state().items()}
        out.update(actor=get_flat(self.actor), actor_opt=to_numpy(self.actor_opt.state_dict()),
                   total_it=self.total_it)
        if self.actor_target is not None:
            out["actor_target"] = get_flat(self.actor_target)
        if self.actor_avg is not None:
            out["actor_avg"] = get_flat(self.actor_avg)
        return out

    def load_state(self, ckpt: dict[str, Any]) -> None:
        set_flat(self.actor, codec.check_array(ckpt["actor"], what="checkpoint actor"))
        if self.actor_target is not None:
            set_flat(self.actor_target, codec.check_array(ckpt["actor_target"], what="checkpoint actor_target"))
        if self.actor_avg is not None:
            # a checkpoint written without one starts the average at the actor
            set_flat(self.actor_avg, codec.check_array(ckpt.get("actor_avg", ckpt["actor"]), what="checkpoint actor_avg"))
        self.actor_opt.load_state_dict(to_tensors(ckpt["actor_opt"], self.device))
        self.learner.load_state({**ckpt, "opt": ckpt["critic_opt"]})
        self.total_it = int(ckpt["total_it"])
