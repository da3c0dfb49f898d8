"""Test-time selection arithmetic: majority vote, pass@k, best-of-N, exactly.

Each function is the closed form or an exact enumeration of one selection rule, so a proof can hold sampling
against it. Probabilities are float64 (or `Fraction`, where a function says so); nothing is estimated here.

| function | what it computes | source |
|---|---|---|
| `vote_accuracy_binary` | P(a strict majority of N votes is right), Σ_{k>N/2} C(N,k) p^k (1−p)^(N−k) | Wang et al. 2022, §2 (the vote) |
| `vote_accuracy` | P(the plurality of N votes over K answers is the right one), ties broken uniformly | Wang et al. 2022, §2 |
| `pass_at_k`, `pass_at_k_naive` | 1 − C(n−c, k)/C(n, k) (unbiased) and 1 − (1 − c/n)^k (biased) | Chen et al. 2021, §2.1, eq. 1 |
| `best_of_n` | the distribution of the output best-of-N picks, by order statistics, ties broken uniformly | Beirami et al. 2024, §2; Gao et al. 2023 |
| `bon_kl`, `bon_kl_bound` | KL(best-of-N ‖ base) exactly, and the formula log N − (N−1)/N it is bounded by | Beirami et al. 2024, §3 |

Bad settings raise `ConfigError` naming the fix.
"""

from __future__ import annotations

import math
from fractions import Fraction

import torch

from proofs.transformer.config import ConfigError

F64 = torch.float64


def _check_n(N: int, name: str = "N") -> None:
    if isinstance(N, bool) or not isinstance(N, int) or N < 1:
        raise ConfigError(f"{name}={N!r} must be a positive integer: the number of samples drawn")


def _check_probs(probs: torch.Tensor) -> torch.Tensor:
    p = torch.as_tensor(probs, dtype=F64)
    if p.dim() != 1 or p.numel() < 1:
        raise ConfigError(f"probs must be a 1-D distribution over outputs, got shape {tuple(p.shape)}")
    if (p < 0).any() or abs(p.sum().item() - 1) > 1e-6:
        raise ConfigError(f"probs must be non-negative and sum to 1 (sum {p.sum().item():.6g}): normalise them first")
    return p


# --8<-- [start:vote]
def vote_accuracy_binary(p: float | Fraction, N: int) -> float | Fraction:
    """Self-consistency on a right/wrong answer (Wang et al. 2022, §2: sample N paths, majority-vote the answer):
    the vote is right when more than N/2 samples are, Σ_{k>N/2} C(N, k) p^k (1−p)^(N−k). An even N's tie counts
    as a loss. Exact in Fractions if p is a Fraction."""
    _check_n(N)
    if not 0 <= p <= 1:
        raise ConfigError(f"p={p} must be a probability in [0, 1]: the accuracy of one sample")
    return sum(math.comb(N, k) * p ** k * (1 - p) ** (N - k) for k in range(N // 2 + 1, N + 1))


def vote_accuracy(probs: torch.Tensor, N: int, correct: int = 0) -> float:
    """Plurality vote over K answers (the "majority vote" of Wang et al. 2022, §2, for K > 2): P(the right answer
    has the most of N votes), a tie among m answers at the top broken uniformly (the right one wins it w.p. 1/m).
    Exact: condition on the right answer's count c ~ Binomial(N, p); the other N − c votes are multinomial, and a
    dynamic programme over the other answers sums R!·Π q_j^{x_j}/x_j! over every count vector with all x_j <= c,
    tracking how many equal c. O(N³K) float64 operations, no enumeration of the C(N+K−1, K−1) count vectors."""
    _check_n(N)
    p = _check_probs(probs)
    if not 0 <= correct < p.numel():
        raise ConfigError(f"correct={correct} must index one of the {p.numel()} answers")
    pc, K = p[correct].item(), p.numel()
    others = torch.cat([p[:correct], p[correct + 1:]])
    q = others / others.sum() if others.sum() > 0 else others
    total = 0.0
    for c in range(1, N + 1):  # c = 0 never wins: some other answer has a vote
        R = N - c
        if pc == 0.0 or (pc == 1.0 and R > 0):
            continue
        log_pc = math.lgamma(N + 1) - math.lgamma(c + 1) - math.lgamma(R + 1) + c * math.log(pc)
        log_pc += R * math.log(1 - pc) if R > 0 else 0.0
        # R! Π q_j^{x_j}/x_j! = (R!/R^R) Π (R q_j)^{x_j}/x_j!: the second form keeps every factor within float64
        log_scale = math.lgamma(R + 1) - R * math.log(R) if R > 0 else 0.0
        x = torch.arange(c + 1, dtype=F64)  # counts one other answer may take (<= c)
        lgx = torch.lgamma(x + 1)
        f = torch.zeros(R + 1, K, dtype=F64)  # f[s, m]: weight with s votes placed, m answers tied at c
        f[0, 0] = 1.0
        D = torch.arange(R + 1).unsqueeze(1) - torch.arange(R + 1).unsqueeze(0)  # s' - s
        below = (D >= 0) & (D < c)
        for qj in q.tolist():
            w = torch.exp(x * math.log(R * qj) - lgx) if R * qj > 0 else (x == 0).to(F64)  # (R q)^x / x!
            A = torch.where(below, w[D.clamp(0, c)], torch.zeros((), dtype=F64))  # x < c: no new tie
            new = A @ f
            if R >= c:  # x == c: one more answer tied with the right one
                new[c:, 1:] += w[c] * f[:R + 1 - c, :-1]
            f = new
        share = 1.0 / torch.arange(1, K + 1, dtype=F64)  # the right answer wins a tie of m + 1 w.p. 1/(m + 1)
        total += math.exp(log_pc + log_scale) * (f[R] * share).sum().item()
    return total
# --8<-- [end:vote]


# --8<-- [start:passk]
def pass_at_k(n: int, c: int, k: int) -> float | Fraction:
    """Chen et al. 2021, §2.1, eq. 1: from n samples of which c are correct, 1 − C(n−c, k)/C(n, k), the chance that
    k drawn without replacement from the n include a correct one. Unbiased for 1 − (1−p)^k. Exact (a Fraction)."""
    _check_n(n, "n")
    _check_n(k, "k")
    if k > n or not 0 <= c <= n:
        raise ConfigError(f"need 0 <= c <= n and k <= n (got n={n}, c={c}, k={k}): draw at least k samples")
    return 1 - Fraction(math.comb(n - c, k), math.comb(n, k))


def pass_at_k_naive(n: int, c: int, k: int) -> Fraction:
    """The plug-in 1 − (1 − c/n)^k: pass@1's estimate c/n put into the formula for k independent tries. Biased low
    (Jensen: (1 − c/n)^k is convex in c). Exact (a Fraction)."""
    _check_n(n, "n")
    _check_n(k, "k")
    if not 0 <= c <= n:
        raise ConfigError(f"need 0 <= c <= n (got n={n}, c={c})")
    return 1 - (1 - Fraction(c, n)) ** k
# --8<-- [end:passk]


# --8<-- [start:bon]
def best_of_n(probs: torch.Tensor, rewards: torch.Tensor, N: int) -> torch.Tensor:
    """The distribution of the output best-of-N returns: N i.i.d. draws from probs, keep the one of highest reward,
    a tie broken uniformly among the tied draws. By order statistics, the top reward level L is reached with
    probability F(≤L)^N − F(<L)^N (F the base's reward CDF); given L, each draw at that level is output i with
    probability p_i / P(L), so the pick splits the level's mass in proportion to the base (Beirami et al. 2024, §2,
    derive the case without ties). probs, rewards (K,) -> (K,) float64."""
    _check_n(N)
    p = _check_probs(probs)
    r = torch.as_tensor(rewards, dtype=F64)
    if r.shape != p.shape:
        raise ConfigError(f"rewards {tuple(r.shape)} must have one value per output, like probs {tuple(p.shape)}")
    levels, level_of = torch.unique(r, return_inverse=True)            # ascending reward levels
    mass = torch.zeros(levels.numel(), dtype=F64).index_add_(0, level_of, p)  # base mass of each level
    upto = mass.cumsum(0)                                                # F(<= L)
    top = upto ** N - (upto - mass).clamp_min(0) ** N                    # P(the best of N draws is at level L)
    out = top[level_of] * p / mass[level_of].clamp_min(torch.finfo(F64).tiny)
    return out


def bon_kl(probs: torch.Tensor, rewards: torch.Tensor, N: int) -> float:
    """KL(best-of-N ‖ base) = Σ_i π_N(i) log(π_N(i)/p_i), exactly, over the outputs the base can produce."""
    p = _check_probs(probs)
    pi = best_of_n(p, rewards, N)
    keep = pi > 0
    return (pi[keep] * (pi[keep] / p[keep]).log()).sum().item()


def bon_kl_bound(N: int) -> float:
    """log N − (N−1)/N: the KL of best-of-N when the reward has a continuous distribution (no atoms), used in the
    literature as best-of-N's KL; Beirami et al. 2024 (§3) show it is an upper bound on the actual KL."""
    _check_n(N)
    return math.log(N) - (N - 1) / N
# --8<-- [end:bon]
