"""The gradient of a population's A2C losses two ways: autograd through the stacked networks
(:class:`~gae_core.agent.stacked.StackedMLP`, what the trainer does) against ``torch.func``
(``functional_call`` + ``vmap(grad(...))`` over the members' parameters stacked by
``stack_module_state``, PyTorch's "model ensembling" recipe).

    python benchmarks/bench_torch_func.py [--repeats 7] [--iterations 50]

Measurements side by side in this one process (the two ways alternate, so machine noise hits
both alike), one torch thread as in a sweep worker. For M members of one
:class:`~gae_core.agent.policy.ActorCritic` shape and R rows per member (random observations,
actions, advantages, targets, about 10 % of rows masked out), one gradient is:

* A (stacked): the actor's and the critic's forward passes for all members at once
  (``StackedMLP``, as ``Learner.policy`` and the rollout's critic pass), advantages
  standardised per member, :func:`~gae_core.agent.losses.a2c_loss` ``[M]`` and
  ``loss.sum().backward()`` into the stacks' ``.grad`` (as ``Learner._a2c``; no clipping, no
  optimizer step);
* B (torch.func): the same loss per member (the same ``standardize``, ``a2c_loss`` and
  ``log_probs_and_entropy`` on one member's ``[R]`` rows, its means over its valid rows via the
  mask) through ``functional_call`` on one ``ActorCritic``, ``vmap(grad(loss))`` over members.

Before timing, the two ways' gradients are checked equal (allclose, rtol 1e-4, atol 1e-6) for
every parameter. Cases: the CartPole preset's population (obs 4, Discrete(2), 64-64, 8 envs ×
5 steps = 40 rows, M = 35 and 1), a HalfCheetah-like Gaussian policy (obs 17, Box(6), 64-64,
64 rows, M = 16 and 1) and a PPO-sized rollout of 2048 rows, M = 4 (its minibatches of 64 are
the 64-row case). Prints ms per gradient of each way (median of the repeats), the ratio B/A
with four decimals and "A kept: PASS" where the stacked way is at least as fast (ratio ≥ 1).
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import gymnasium as gym
import torch
from torch import nn
from torch.func import functional_call, grad, stack_module_state, vmap

from gae_core.agent.losses import Coefficients, Rows, a2c_loss, standardize
from gae_core.agent.policy import ActorCritic, log_probs_and_entropy
from gae_core.agent.stacked import StackedMLP

CASES = (  # label, obs dim, actions (None: Discrete(2)), rows per member, members
    ("CartPole preset R=40 M=35", 4, None, 40, 35),
    ("CartPole preset R=40 M=1", 4, None, 40, 1),
    ("HalfCheetah R=64 M=16", 17, 6, 64, 16),
    ("HalfCheetah R=64 M=1", 17, 6, 64, 1),
    ("HalfCheetah R=2048 M=4", 17, 6, 2048, 4),
)
HIDDEN = (64, 64)


def _cpu_model() -> str:
    try:
        info = Path("/proc/cpuinfo").read_text()
        line = next(x for x in info.splitlines() if x.startswith("model name"))
        return line.split(":", 1)[1].strip()
    except (OSError, StopIteration):
        return "unknown"


class _MemberLoss(nn.Module):
    """One member's A2C loss (a scalar) as a module, so ``functional_call`` can swap in any
    member's parameters (named ``model.actor.0.weight``, …, ``model.log_std``)."""

    def __init__(self, model: ActorCritic) -> None:
        super().__init__()
        self.model = model

    def forward(self, obs, actions, advantages, returns, mask, standardise, value_coef,
                entropy_coef):  # fmt: skip
        advantages = torch.where(standardise, standardize(advantages, mask), advantages)
        log_probs, entropy = self.model.log_probs_and_entropy(obs, actions)
        values = self.model.values(obs)
        return a2c_loss(log_probs, entropy, values, Rows(advantages, returns, mask),
                        Coefficients(value_coef, entropy_coef)).loss  # fmt: skip


def _setup(obs_dim: int, action_dim: int | None, rows: int, members: int):
    obs_space = gym.spaces.Box(-10.0, 10.0, (obs_dim,))
    discrete = action_dim is None
    act_space = gym.spaces.Discrete(2) if discrete else gym.spaces.Box(-1.0, 1.0, (action_dim,))
    models = [ActorCritic(obs_space, act_space, HIDDEN, seed=i) for i in range(members)]
    g = torch.Generator().manual_seed(1234)
    with torch.no_grad():  # members distinct everywhere, biases and log-std not all zero
        for m in models:
            for p in m.parameters():
                p.add_(0.05 * torch.randn(p.shape, generator=g))
    obs = torch.randn(members, rows, obs_dim, generator=g)
    if discrete:
        actions = torch.randint(0, 2, (members, rows), generator=g)
    else:
        actions = torch.randn(members, rows, action_dim, generator=g)
    data = {
        "obs": obs, "actions": actions,
        "advantages": torch.randn(members, rows, generator=g),
        "returns": torch.randn(members, rows, generator=g),
        "mask": (torch.rand(members, rows, generator=g) > 0.1).float(),
        "standardise": torch.ones(members, dtype=torch.bool),
        "value_coef": torch.full((members,), 0.5) + 0.1 * torch.rand(members, generator=g),
        "entropy_coef": 0.01 * torch.rand(members, generator=g),
    }  # fmt: skip

    # A: the trainer's stacks (gae_core.agent.trainer) and Learner._a2c's computation
    actor = StackedMLP([m.actor for m in models])
    critic = StackedMLP([m.critic for m in models])
    log_std = None
    if not discrete:
        log_std = torch.stack([m.log_std.detach() for m in models]).requires_grad_(True)
    params_a = [*actor.parameters(), *critic.parameters()] + ([log_std] if not discrete else [])
    d = data

    def step_a():
        for p in params_a:
            p.grad = None
        values = critic(d["obs"]).squeeze(-1)
        adv = d["advantages"]
        adv = torch.where(d["standardise"][:, None], standardize(adv, d["mask"]), adv)
        out = actor(d["obs"])
        stacked_log_std = None if discrete else log_std[:, None, :]
        log_probs, entropy = log_probs_and_entropy(out, d["actions"], stacked_log_std)
        terms = a2c_loss(log_probs, entropy, values, Rows(adv, d["returns"], d["mask"]),
                         Coefficients(d["value_coef"], d["entropy_coef"]))  # fmt: skip
        terms.loss.sum().backward()

    # B: torch.func over the members' stacked parameters
    wrapped = [_MemberLoss(m) for m in models]
    params_b, buffers_b = stack_module_state(wrapped)
    params_b = {k: v.detach() for k, v in params_b.items()}
    base = copy.deepcopy(wrapped[0]).to("meta")
    keys = ("obs", "actions", "advantages", "returns", "mask", "standardise", "value_coef",
            "entropy_coef")  # fmt: skip

    def member_loss(params, *args):
        return functional_call(base, (params, buffers_b), args)

    gradient = vmap(grad(member_loss), in_dims=(0,) + (0,) * len(keys))
    args_b = tuple(d[k] for k in keys)

    def step_b():
        return gradient(params_b, *args_b)

    # the same gradients, parameter by parameter
    step_a()
    grads_b = step_b()
    pairs = []
    for prefix, net, stack in (("model.actor", models[0].actor, actor),
                               ("model.critic", models[0].critic, critic)):  # fmt: skip
        linears = [i for i, m in enumerate(net) if isinstance(m, nn.Linear)]
        for layer, index in enumerate(linears):
            pairs.append((f"{prefix}.{index}.weight",
                          stack.weights[layer].grad.transpose(1, 2)))  # fmt: skip
            pairs.append((f"{prefix}.{index}.bias", stack.biases[layer].grad[:, 0]))
    if not discrete:
        pairs.append(("model.log_std", log_std.grad))
    assert {name for name, _ in pairs} == set(grads_b), (sorted(grads_b), pairs)
    worst = 0.0
    for name, g_a in pairs:
        g_b = grads_b[name]
        assert g_a.shape == g_b.shape, (name, g_a.shape, g_b.shape)
        if not torch.allclose(g_a, g_b, rtol=1e-4, atol=1e-6):
            diff = (g_a - g_b).abs().max().item()
            raise AssertionError(f"{name}: gradients differ (max |A − B| = {diff:.3g})")
        worst = max(worst, (g_a - g_b).abs().max().item())
    return step_a, step_b, worst


def _time(fn, iterations: int) -> float:
    started = time.perf_counter()
    for _ in range(iterations):
        fn()
    return (time.perf_counter() - started) / iterations


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--iterations", type=int, default=50)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}, CPU {_cpu_model()}, {torch.get_num_threads()} thread")
    print(f"ms per gradient (median of {args.repeats} alternating repeats of "
          f"{args.iterations} iterations; forward + backward/grad, no optimizer)")  # fmt: skip
    header = f"{'case':<28}{'A stacked':>11}{'B func':>11}{'B/A':>9}  max|ΔA−B|  verdict"
    print(header)
    print("-" * len(header))
    all_kept = True
    for label, obs_dim, action_dim, rows, members in CASES:
        step_a, step_b, worst = _setup(obs_dim, action_dim, rows, members)
        for _ in range(5):  # warm-up (vmap's first calls, allocator)
            step_a()
            step_b()
        times_a, times_b = [], []
        for _ in range(args.repeats):
            times_a.append(_time(step_a, args.iterations))
            times_b.append(_time(step_b, args.iterations))
        a, b = statistics.median(times_a), statistics.median(times_b)
        ratio = b / a
        kept = ratio >= 1.0
        all_kept &= kept
        verdict = "A kept: PASS" if kept else "FAIL: torch.func faster"
        print(f"{label:<28}{a * 1e3:11.4f}{b * 1e3:11.4f}{ratio:9.4f}  {worst:9.2e}  "
              f"{verdict}")  # fmt: skip
    print("stacked modules kept everywhere" if all_kept else "torch.func faster somewhere")
    return 0 if all_kept else 1


if __name__ == "__main__":
    sys.exit(main())
