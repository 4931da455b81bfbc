"""The algorithms of issue 32 against references written here, straight from each paper's equations.

Every reference is a plain Python loop over float64 numbers (0-d float64 tensors where autograd is needed),
importing nothing from the implementation but the function under test, and is compared with it on random
inputs (several seeds and shapes, masks with holes in the middle as agentic rows have: sampled tokens, a tool
output, more sampled tokens, padding) to 1e-6 in float64:

  GSPO         Zheng et al. 2025, eq. (5)-(7): J = 1/G sum_i min(s_i A_i, clip(s_i) A_i),
               s_i = (pi(y_i) / pi_old(y_i))^(1/|y_i|); value and gradient w.r.t. logp
  CISPO        MiniMax-M1 2025, eq. (4): J = 1/sum|o_i| sum_i sum_t sg(clip(r_it)) A_i log pi(o_it); gradient
  Dr. GRPO     Liu et al. 2025: A_i = r_i - mean_g (no std), the loss summed and divided by G * L_max
  RLOO         Ahmadian et al. 2024: A_i = r_i - 1/(k-1) sum_{j != i} r_j
  REINFORCE++  Hu 2025: r_t = -beta KL_t (+ the outcome at the last token), G_t = sum_{s >= t} r_s, normalised
               over every token of the batch (and, without KL, the batch-normalised outcome)
  GAE          Schulman et al. 2016, eq. (16): the backward recursion over the row's sampled steps
  overlong     DAPO, Yu et al. 2025, eq. (13)
  correction   token / sequence / geometric importance weights, truncated or masked, and their ESS
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from arlctl.rl.advantages import compute_advantages, overlong_penalty, reinforce_pp_token_advantages
from arlctl.rl.correction import ess_fraction, ess_sums, rollout_is_weights
from arlctl.rl.losses import LossConfig, aggregate_loss, cispo_loss, gspo_loss, policy_loss
from arlctl.rl.value import gae

TOL = 1e-6
CASES = [(seed, b, t) for seed in (0, 1, 2) for b, t in ((1, 1), (2, 5), (4, 9), (6, 17))]
CLAMP = 20.0  # the spec's bound on every log-ratio


def agentic_mask(rng: random.Random, b: int, t: int, nonempty: bool = True) -> list[list[int]]:
    """Rows of sampled tokens, a hole (tool output), more sampled tokens, then padding."""
    rows = []
    for _ in range(b):
        n = rng.randint(1 if nonempty else 0, t)  # the row's length before padding
        row = [1] * n + [0] * (t - n)
        if n >= 3 and rng.random() < 0.8:
            start = rng.randint(1, n - 2)
            for k in range(start, rng.randint(start + 1, n - 1)):
                row[k] = 0  # the hole is strictly inside: sampled tokens on both sides
        rows.append(row)
    return rows


def randn(rng: random.Random, b: int, t: int, scale: float = 1.0, shift: float = 0.0) -> list[list[float]]:
    return [[rng.gauss(shift, scale) for _ in range(t)] for _ in range(b)]


def tensor(rows) -> torch.Tensor:
    return torch.tensor(rows, dtype=torch.float64)


def check(actual, expected) -> None:
    torch.testing.assert_close(torch.as_tensor(actual, dtype=torch.float64), tensor(expected), atol=TOL, rtol=0)


def policy_inputs(seed, b, t):
    """old logp, logp (row-level drift plus token noise: ratios fall inside and outside the band), A, mask."""
    rng = random.Random(seed)
    mask = agentic_mask(rng, b, t)
    old = randn(rng, b, t, 0.5, -1.5)
    drift = [rng.gauss(0.0, 0.12) for _ in range(b)]
    logp = [[old[i][k] + drift[i] + rng.gauss(0.0, 0.1) for k in range(t)] for i in range(b)]
    adv = [rng.gauss(0.0, 1.0) for _ in range(b)]
    return logp, old, adv, mask


def clip(x, low, high):
    return max(low, min(high, x))


# ----------------------------------------------------------------------------------------------- GSPO, CISPO


@pytest.mark.parametrize("seed, b, t", CASES)
def test_gspo_matches_the_sequence_objective(seed, b, t):
    logp, old, adv, mask = policy_inputs(seed, b, t)
    eps_low, eps_high = 0.1, 0.15
    # reference: 0-d float64 leaves, one per token, so autograd gives d(-J)/d logp_it
    leaves = [[torch.tensor(x, dtype=torch.float64, requires_grad=True) for x in row] for row in logp]
    objective, ratios, active = torch.zeros((), dtype=torch.float64), [], []
    for i in range(b):
        n = sum(mask[i])
        log_s = sum(leaves[i][k] - old[i][k] for k in range(t) if mask[i][k]) / n  # (1/|y|) log(pi / pi_old)
        s = torch.exp(log_s)
        s_clipped = torch.clamp(s, 1 - eps_low, 1 + eps_high)
        unclipped, clipped = s * adv[i], s_clipped * adv[i]
        objective = objective + (unclipped if unclipped <= clipped else clipped)  # min(s A, clip(s) A)
        ratios.append(float(s.detach()))
        active.append(1 - eps_low <= ratios[-1] <= 1 + eps_high or bool(unclipped < clipped))  # has gradient
    ref_loss = -objective / b  # -J = -1/G sum_i ...
    ref_loss.backward()
    ref_grad = [[float(x.grad) if x.grad is not None else 0.0 for x in row] for row in leaves]

    logp_t = tensor(logp).requires_grad_(True)
    per_token, seq_ratio = gspo_loss(logp_t, tensor(old), tensor(adv), tensor(mask), eps_low, eps_high)
    loss = aggregate_loss(per_token, tensor(mask), "seq-mean-token-mean")
    loss.backward()
    check(seq_ratio, ratios)
    check(loss, float(ref_loss.detach()))
    check(logp_t.grad, ref_grad)
    # and the paper's closed form of the gradient, eq. (10): 1/G sum_i s_i A_i (1/|y_i|) sum_t grad logp_it,
    # on the sequences whose min picks the unclipped term (the clipped one carries no gradient)
    for i in range(b):
        n = sum(mask[i])
        for k in range(t):
            expected = -ratios[i] * adv[i] / (n * b) if mask[i][k] and active[i] else 0.0
            assert abs(float(logp_t.grad[i, k]) - expected) < TOL


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_policy_cases_exercise_both_branches(seed):
    # the random inputs must clip some sequences (GSPO) and tokens (CISPO) and leave others in the band
    seqs, tokens = set(), set()
    for b, t in ((4, 9), (6, 17)):
        logp, old, adv, mask = policy_inputs(seed, b, t)
        for i in range(b):
            n = sum(mask[i])
            seqs.add(0.9 <= math.exp(sum(logp[i][k] - old[i][k] for k in range(t) if mask[i][k]) / n) <= 1.15)
            tokens.update(0.9 <= math.exp(logp[i][k] - old[i][k]) <= 1.15 for k in range(t) if mask[i][k])
    assert seqs == {True, False} and tokens == {True, False}


@pytest.mark.parametrize("seed, b, t", CASES)
def test_cispo_gradient_is_the_clipped_detached_weight(seed, b, t):
    logp, old, adv, mask = policy_inputs(seed, b, t)
    eps_low, eps_high = 0.1, 0.15
    n_tokens = sum(sum(row) for row in mask)
    ref_grad, ref_loss = [], 0.0
    for i in range(b):
        row = []
        for k in range(t):
            if not mask[i][k]:
                row.append(0.0)
                continue
            w = clip(math.exp(logp[i][k] - old[i][k]), 1 - eps_low, 1 + eps_high)  # sg(clip(r))
            row.append(-w * adv[i] / n_tokens)  # d/dlogp of -(1/N) sum sg(w) A logp
            ref_loss += -w * adv[i] * logp[i][k] / n_tokens
        ref_grad.append(row)
    logp_t = tensor(logp).requires_grad_(True)
    per_token, _ = cispo_loss(logp_t, tensor(old), tensor(adv), eps_low, eps_high)
    loss = aggregate_loss(per_token, tensor(mask), "token-mean")
    loss.backward()
    check(loss, ref_loss)
    check(logp_t.grad, ref_grad)
    # the same through policy_loss
    logp_t = tensor(logp).requires_grad_(True)
    loss, _ = policy_loss(logp_t, tensor(old), tensor(adv), tensor(mask),
                          LossConfig(kind="cispo", eps_low=eps_low, eps_high=eps_high))
    loss.backward()
    check(loss, ref_loss)
    check(logp_t.grad, ref_grad)


# ----------------------------------------------------------------------------------------------- advantages


def random_rewards(seed: int, n: int, groups: int):
    rng = random.Random(seed)
    index = [rng.randrange(groups) for _ in range(n)]
    rewards = [rng.choice([0.0, 1.0, rng.random(), float("nan")]) for _ in range(n)]
    return rewards, index


def finite_members(rewards, index, g):
    return [r for r, j in zip(rewards, index) if j == g and math.isfinite(r)]


def dense(index):
    seen = {}
    return [seen.setdefault(j, len(seen)) for j in index]


SIZES = [(seed, n, groups) for seed in range(4) for n, groups in ((1, 1), (6, 2), (16, 4), (40, 6))]


@pytest.mark.parametrize("seed, n, groups", SIZES)
def test_dr_grpo_advantage_has_no_std(seed, n, groups):
    rewards, index = random_rewards(seed, n, groups)
    index = dense(index)
    expected = []
    for r, g in zip(rewards, index):
        members = finite_members(rewards, index, g)
        if not math.isfinite(r) or len(members) < 2 or max(members) == min(members):
            expected.append(0.0)
        else:
            expected.append(r - sum(members) / len(members))
    check(compute_advantages(tensor(rewards), torch.tensor(index), "dr-grpo"), expected)


@pytest.mark.parametrize("seed, n, groups", SIZES)
def test_rloo_leave_one_out_baseline(seed, n, groups):
    rewards, index = random_rewards(seed, n, groups)
    index = dense(index)
    expected = []
    for i, (r, g) in enumerate(zip(rewards, index)):
        others = [rewards[j] for j in range(n) if j != i and index[j] == g and math.isfinite(rewards[j])]
        members = finite_members(rewards, index, g)
        if not math.isfinite(r) or not others or max(members) == min(members):
            expected.append(0.0)
        else:
            expected.append(r - sum(others) / len(others))  # r_i - 1/(k-1) sum_{j != i} r_j
    check(compute_advantages(tensor(rewards), torch.tensor(index), "rloo"), expected)


@pytest.mark.parametrize("seed, n, groups", SIZES)
def test_reinforce_pp_outcome_is_batch_normalised(seed, n, groups):
    rewards, index = random_rewards(seed, n, groups)
    finite = [r for r in rewards if math.isfinite(r)]
    expected = [0.0] * n
    if len(finite) >= 2 and max(finite) != min(finite):
        mean = sum(finite) / len(finite)
        std = math.sqrt(sum((r - mean) ** 2 for r in finite) / (len(finite) - 1))
        expected = [(r - mean) / (std + 1e-6) if math.isfinite(r) else 0.0 for r in rewards]
    check(compute_advantages(tensor(rewards), torch.tensor(dense(index)), "reinforce++"), expected)


@pytest.mark.parametrize("seed, b, t", CASES)
@pytest.mark.parametrize("beta", [0.0, 0.05, 1.0])
def test_reinforce_pp_token_advantages(seed, b, t, beta):
    rng = random.Random(seed)
    mask = agentic_mask(rng, b, t, nonempty=False)
    kl = randn(rng, b, t, 0.2)
    outcome = [rng.choice([0.0, 1.0]) for _ in range(b)]
    returns, values = [[0.0] * t for _ in range(b)], []
    for i in range(b):
        steps = [k for k in range(t) if mask[i][k]]
        later = 0.0
        for j in reversed(range(len(steps))):
            k = steps[j]
            reward = -beta * kl[i][k] + (outcome[i] if j == len(steps) - 1 else 0.0)  # outcome at [EOS]
            later = reward + later  # G_t = r_t + G_{t+1}, gamma = 1
            returns[i][k] = later
            values.append(later)
    expected = [[0.0] * t for _ in range(b)]
    if len(values) >= 2:
        mean = sum(values) / len(values)
        var = sum((v - mean) ** 2 for v in values) / (len(values) - 1)
        if var > 1e-20:
            expected = [[(returns[i][k] - mean) / (math.sqrt(var) + 1e-6) if mask[i][k] else 0.0
                         for k in range(t)] for i in range(b)]
    check(reinforce_pp_token_advantages(tensor(outcome), tensor(kl), tensor(mask), beta), expected)


@pytest.mark.parametrize("l_max, l_cache", [(20, 4), (16, 16), (100, 1), (4096, 512)])
def test_dapo_overlong_penalty(l_max, l_cache):
    lengths = sorted({0, 1, l_max - l_cache, l_max - l_cache + 1, l_max - 1, l_max, l_max + 1, 2 * l_max,
                      *random.Random(l_max).sample(range(2 * l_max + 2), 20)})
    expected = []
    for n in lengths:
        if n <= l_max - l_cache:
            expected.append(0.0)
        elif n <= l_max:
            expected.append(((l_max - l_cache) - n) / l_cache)
        else:
            expected.append(-1.0)
    check(overlong_penalty(lengths, l_max, l_cache), expected)


# ----------------------------------------------------------------------------------------------- Dr. GRPO loss


@pytest.mark.parametrize("seed, b, t", CASES)
def test_dr_grpo_constant_length_normaliser(seed, b, t):
    logp, old, adv, mask = policy_inputs(seed, b, t)
    budget = t + 7  # the generation budget L_max, longer than any row
    total = 0.0
    for i in range(b):
        for k in range(t):
            if mask[i][k]:
                r = math.exp(logp[i][k] - old[i][k])
                total += min(r * adv[i], clip(r, 0.8, 1.2) * adv[i])
    expected = -total / (b * budget)  # -(1/(G L_max)) sum_i sum_t min(r A, clip(r) A)
    loss, _ = policy_loss(tensor(logp), tensor(old), tensor(adv), tensor(mask),
                          LossConfig(loss_agg="seq-mean-token-sum-norm"), norm_tokens=budget)
    check(loss, expected)
    per_token = tensor(randn(random.Random(seed + 100), b, t))
    plain = sum(float(per_token[i, k]) for i in range(b) for k in range(t) if mask[i][k])
    check(aggregate_loss(per_token, tensor(mask), "seq-mean-token-sum-norm", norm_tokens=budget),
          plain / (b * budget))


# ----------------------------------------------------------------------------------------------- GAE


@pytest.mark.parametrize("seed, b, t", CASES)
@pytest.mark.parametrize("gamma, lam", [(1.0, 1.0), (0.99, 0.95), (0.9, 0.0), (0.5, 0.7)])
def test_gae_over_compressed_steps(seed, b, t, gamma, lam):
    rng = random.Random(seed)
    mask = agentic_mask(rng, b, t, nonempty=False)
    rewards, values = randn(rng, b, t), randn(rng, b, t)
    adv, ret = [[0.0] * t for _ in range(b)], [[0.0] * t for _ in range(b)]
    for i in range(b):
        steps = [k for k in range(t) if mask[i][k]]  # the row's actions, tool tokens skipped
        r = [rewards[i][k] for k in steps]
        v = [values[i][k] for k in steps] + [0.0]  # V after the last action: terminal, 0
        a_next = 0.0
        for j in reversed(range(len(steps))):
            delta = r[j] + gamma * v[j + 1] - v[j]  # delta_k = r_k + gamma V_{k+1} - V_k
            a_next = delta + gamma * lam * a_next  # A_k = delta_k + gamma lam A_{k+1}
            adv[i][steps[j]] = a_next
            ret[i][steps[j]] = a_next + v[j]
    got_adv, got_ret = gae(tensor(rewards), tensor(values), tensor(mask), gamma, lam)
    check(got_adv, adv)
    check(got_ret, ret)


# ----------------------------------------------------------------------------------------------- correction


@pytest.mark.parametrize("seed, b, t", CASES)
@pytest.mark.parametrize("level", ["token", "sequence", "geometric"])
@pytest.mark.parametrize("mode, cap, low", [("truncate", 1.5, None), ("mask", 1.5, None), ("mask", 2.0, 0.8)])
def test_rollout_correction_weights_and_ess(seed, b, t, level, mode, cap, low):
    rng = random.Random(seed)
    mask = agentic_mask(rng, b, t, nonempty=False)
    behaviour = randn(rng, b, t, 0.5, -1.5)
    proximal = [[x + rng.gauss(0.0, 0.3) for x in row] for row in behaviour]
    low_bound = 1.0 / cap if low is None else low
    weights, masked = [[0.0] * t for _ in range(b)], [[False] * t for _ in range(b)]
    for i in range(b):
        deltas = [proximal[i][k] - behaviour[i][k] for k in range(t) if mask[i][k]]
        row_log = sum(deltas) if level == "sequence" else sum(deltas) / max(len(deltas), 1)
        for k in range(t):
            if not mask[i][k]:
                continue
            log_w = proximal[i][k] - behaviour[i][k] if level == "token" else row_log
            w = math.exp(clip(log_w, -CLAMP, CLAMP))
            if mode == "truncate":
                weights[i][k] = min(w, cap)
            elif w > cap or w < low_bound:
                masked[i][k] = True  # out of the band: the token (or the whole row) leaves the loss
            else:
                weights[i][k] = w  # kept unclipped
    got_w, got_masked = rollout_is_weights(tensor(proximal), tensor(behaviour), tensor(mask), level, mode, cap, low)
    check(got_w, weights)
    assert got_masked.tolist() == masked
    # ESS / n = (sum w)^2 / (n sum w^2) over the mask-1 tokens (Kong 1992)
    flat = [weights[i][k] for i in range(b) for k in range(t) if mask[i][k]]
    sq = sum(w * w for w in flat)
    expected_ess = 1.0 if not flat or sq == 0 else sum(flat) ** 2 / (len(flat) * sq)
    sums = ess_sums(got_w, tensor(mask))
    check(sums["is_w_sum"], sum(flat))
    check(sums["is_w_sq_sum"], sq)
    check(sums["is_n"], float(len(flat)))
    assert abs(ess_fraction(float(sums["is_w_sum"]), float(sums["is_w_sq_sum"]), float(sums["is_n"]))
               - expected_ess) < TOL
