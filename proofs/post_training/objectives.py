"""Post-training objectives: one function per objective, each a few lines, with the paper's equation.

Every proof of the "Post-training and reasoning" pages builds its losses from here, never from a copy:

| function | objective | source |
|---|---|---|
| `response_labels` | SFT labels: prompt positions ignored, the response and its EOS kept | InstructGPT §3.5 (SFT) |
| `token_logprobs`, `sequence_logprob` | log π(token) and log π(y) = Σ_t log π(y_t) from logits | |
| `bradley_terry_loss` | reward-model loss −log σ(r(x, y_w) − r(x, y_l)) | Ouyang et al. 2022, §3.5, eq. 1 |
| `kl_estimators` | k1, k2, k3 with r = π_ref/π, from samples of π | Schulman 2020; DeepSeekMath eq. 4 |
| `ppo_clip_objective` | min(ρA, clip(ρ, 1−ε, 1+ε)A), with DAPO's ε_high | Schulman et al. 2017, §3, eq. 7; Yu et al. 2025, §3.1 |
| `group_advantages` | (r_i − mean) / std within a group of G outputs | Shao et al. 2024, §4.1.2 |
| `grpo_loss` | clipped surrogate per token − β·k3, three length normalisations | Shao et al. 2024, eq. 3; Liu et al. 2025; Yu et al. 2025, eq. 8 |
| `dpo_loss` | −log σ(β[log π/π_ref (y_w) − log π/π_ref (y_l)]) | Rafailov et al. 2023, §4, eq. 7 |
| `kl_regularised_optimum` | π*(y) = π_ref(y) exp(r(y)/β) / Z | Rafailov et al. 2023, eq. 4 |
| `distillation_loss` | T²·CE(softmax(z_t/T), softmax(z_s/T)) | Hinton et al. 2015, §2 |
| `kl_shaped_rewards` | per-token rewards −β(log π − log π_ref), the RM score on the last token (PPO-RLHF) | Ouyang et al. 2022, §3.5, eq. 2; Shao et al. 2024, eq. 2 |
| `process_advantages` | GRPO with a PRM: step rewards normalised over the group, a token gets the sum over its step and later ones | Shao et al. 2024, §4.1.3 |
| `cpi_objective` | the unclipped surrogate ρA (PPO's "no clipping or penalty" ablation) | Schulman et al. 2017, §3, eq. 6; §6.1 |

Objectives are written as losses to minimise (the negated objective) except `ppo_clip_objective` and
`cpi_objective`, which return the per-sample surrogate the paper maximises, and `kl_shaped_rewards`, which returns
per-token rewards. Bad settings raise `ConfigError` naming the fix.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from proofs.transformer.config import ConfigError

IGNORE = -100  # the label PyTorch's cross_entropy skips (ignore_index); Hugging Face uses the same value


def _check_same_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    if len(set(shapes.values())) > 1:
        raise ConfigError(f"these tensors must have one shape, got {shapes}: pass one value per sample (or token)")


# --8<-- [start:sft]
def response_labels(ids: torch.Tensor, prompt_len: int | torch.Tensor, mask_prompt: bool = True) -> torch.Tensor:
    """Next-token labels for SFT. ids (B, T) = prompt + response (+ EOS); labels (B, T - 1) predict ids[:, 1:].
    With mask_prompt the positions that predict a prompt token get IGNORE: the loss is the response's alone,
    and the EOS that closes it stays a target (drop it and the model never learns to stop)."""
    if ids.dim() != 2:
        raise ConfigError(f"ids must be (batch, length), got shape {tuple(ids.shape)}")
    labels = ids[:, 1:].clone()                                   # (B, T-1): the token each position predicts
    if mask_prompt:
        p = torch.as_tensor(prompt_len).reshape(-1, 1)            # (B, 1) or (1, 1)
        if (p < 1).any() or (p >= ids.shape[1]).any():
            raise ConfigError(f"prompt_len must be in [1, {ids.shape[1] - 1}] so that a response remains")
        target_pos = torch.arange(1, ids.shape[1]).unsqueeze(0)  # (1, T-1): position of each label in ids
        labels = labels.masked_fill(target_pos < p, IGNORE)  # (B, T-1): broadcasts an int prompt_len too
    return labels
# --8<-- [end:sft]


def token_logprobs(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log π(label) at each position, 0 where the label is IGNORE. logits (B, T, V), labels (B, T) -> (B, T)."""
    if logits.shape[:-1] != labels.shape:
        raise ConfigError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} disagree: logits must be "
                          "(batch, length, vocab) and labels (batch, length)")
    keep = labels != IGNORE
    logp = logits.log_softmax(-1).gather(-1, labels.clamp_min(0).unsqueeze(-1)).squeeze(-1)  # (B, T)
    return logp * keep


def sequence_logprob(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log π(y) = Σ_t log π(y_t | y_<t) over the labelled positions: (B, T, V), (B, T) -> (B,)."""
    return token_logprobs(logits, labels).sum(-1)


# --8<-- [start:reward]
def bradley_terry_loss(r_chosen: torch.Tensor, r_rejected: torch.Tensor) -> torch.Tensor:
    """The reward model's loss on comparisons (InstructGPT §3.5, eq. 1): −log σ(r(x, y_w) − r(x, y_l)), averaged.
    It sees only differences, so adding any c(x) to every reward of a prompt leaves it unchanged."""
    _check_same_shape(r_chosen=r_chosen, r_rejected=r_rejected)
    return -F.logsigmoid(r_chosen - r_rejected).mean()
# --8<-- [end:reward]


# --8<-- [start:kl]
def kl_estimators(logp: torch.Tensor, logp_ref: torch.Tensor) -> dict[str, torch.Tensor]:
    """Per-sample estimates of KL(π‖π_ref) from samples of π (Schulman 2020), with log r = log π_ref − log π:
    k1 = −log r (unbiased, can be negative), k2 = ½(log r)² (biased, low variance),
    k3 = (r − 1) − log r (unbiased, never negative; GRPO's, DeepSeekMath eq. 4)."""
    _check_same_shape(logp=logp, logp_ref=logp_ref)
    log_r = logp_ref - logp
    return {"k1": -log_r, "k2": 0.5 * log_r ** 2, "k3": log_r.exp() - 1 - log_r}
# --8<-- [end:kl]


def _check_clip(eps: float, eps_high: float | None) -> float:
    eps_high = eps if eps_high is None else eps_high
    if not (0 < eps < 1) or eps_high <= 0:
        raise ConfigError(f"clip range needs 0 < eps < 1 and eps_high > 0, got eps={eps}, eps_high={eps_high}; "
                          "PPO uses eps = 0.2, DAPO eps_high = 0.28")
    return eps_high


# --8<-- [start:ppo]
def ppo_clip_objective(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, eps: float = 0.2,
                       eps_high: float | None = None, use_min: bool = True) -> torch.Tensor:
    """PPO's clipped surrogate per sample, to MAXIMISE (Schulman et al. 2017, §3, eq. 7):
    min(ρA, clip(ρ, 1 − ε, 1 + ε_high)A) with ρ = π/π_old. ε_high = ε is PPO; ε_high > ε is DAPO's clip-higher
    (Yu et al. 2025, §3.1). use_min=False drops the min (the clipped term alone): a switch for the proofs."""
    eps_high = _check_clip(eps, eps_high)
    _check_same_shape(logp=logp, logp_old=logp_old, advantages=advantages)
    ratio = (logp - logp_old).exp()
    clipped = ratio.clamp(1 - eps, 1 + eps_high) * advantages
    return torch.minimum(ratio * advantages, clipped) if use_min else clipped
# --8<-- [end:ppo]


# --8<-- [start:advantages]
def group_advantages(rewards: torch.Tensor, scale: str = "std", eps: float = 1e-4) -> torch.Tensor:
    """GRPO's outcome advantages (Shao et al. 2024, §4.1.2): rewards (P, G), G outputs for each of P prompts;
    every output gets (r_i − mean of its group), divided by the group's std when scale="std" (GRPO) or not
    when scale="none" (Dr. GRPO, Liu et al. 2025). A group whose rewards are all equal gets zeros."""
    if rewards.dim() != 2:
        raise ConfigError(f"rewards must be (prompts, group), got shape {tuple(rewards.shape)}")
    if rewards.shape[1] < 2:
        raise ConfigError("a group of 1 output has no baseline (its advantage is always 0): sample G >= 2 per prompt")
    if scale not in ("std", "none"):
        raise ConfigError(f"scale must be 'std' (GRPO) or 'none' (Dr. GRPO), got {scale!r}")
    centred = rewards - rewards.mean(1, keepdim=True)
    return centred / (rewards.std(1, keepdim=True) + eps) if scale == "std" else centred
# --8<-- [end:advantages]


# --8<-- [start:grpo]
def grpo_loss(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor,
              eps: float = 0.2, beta: float = 0.0, logp_ref: torch.Tensor | None = None,
              norm: str = "sequence", max_len: int | None = None, eps_high: float | None = None) -> torch.Tensor:
    """GRPO's loss to MINIMISE (Shao et al. 2024, eq. 3): per token, −[PPO surrogate − β·k3(π‖π_ref)], with every
    token of output i sharing its advantage. logp, logp_old, logp_ref, mask: (N, T) over N sampled outputs;
    advantages: (N,). How token terms are averaged is the length switch:
      "sequence": mean over each output's tokens, then over outputs (GRPO, eq. 3's 1/|o_i|);
      "token":    sum over all tokens of the batch / their count (DAPO, Yu et al. 2025, eq. 8);
      "constant": sum over all tokens / (N · max_len) (Dr. GRPO, Liu et al. 2025)."""
    _check_same_shape(logp=logp, logp_old=logp_old, mask=mask)
    if advantages.shape != logp.shape[:1]:
        raise ConfigError(f"advantages must be (N,) = {tuple(logp.shape[:1])}, got {tuple(advantages.shape)}")
    if beta < 0 or (beta > 0 and logp_ref is None):
        raise ConfigError(f"beta must be >= 0, and beta > 0 needs logp_ref (the reference's log-probs); got {beta}")
    mask = mask.to(logp.dtype)
    per_token = -ppo_clip_objective(logp, logp_old, advantages[:, None].expand_as(logp), eps, eps_high)  # (N, T)
    if beta > 0:
        per_token = per_token + beta * kl_estimators(logp, logp_ref)["k3"]
    if norm == "sequence":
        return ((per_token * mask).sum(1) / mask.sum(1).clamp_min(1)).mean()
    if norm == "token":
        return (per_token * mask).sum() / mask.sum().clamp_min(1)
    if norm == "constant":
        if max_len is None:
            raise ConfigError("norm='constant' divides by N * max_len: pass max_len (the generation budget)")
        return (per_token * mask).sum() / (logp.shape[0] * max_len)
    raise ConfigError(f"norm must be 'sequence' (GRPO), 'token' (DAPO) or 'constant' (Dr. GRPO), got {norm!r}")
# --8<-- [end:grpo]


# --8<-- [start:dpo]
def dpo_loss(logp_chosen: torch.Tensor, logp_rejected: torch.Tensor, ref_chosen: torch.Tensor,
             ref_rejected: torch.Tensor, beta: float = 0.1) -> torch.Tensor:
    """DPO (Rafailov et al. 2023, §4, eq. 7), averaged over pairs: −log σ(β[(log π − log π_ref)(y_w) −
    (log π − log π_ref)(y_l)]). Inputs are sequence log-probs (N,). β·(log π − log π_ref) is the implicit reward."""
    if beta <= 0:
        raise ConfigError(f"beta must be > 0 (it is the KL weight of the RLHF objective DPO solves), got {beta}")
    _check_same_shape(logp_chosen=logp_chosen, logp_rejected=logp_rejected, ref_chosen=ref_chosen,
                      ref_rejected=ref_rejected)
    margin = (logp_chosen - ref_chosen) - (logp_rejected - ref_rejected)
    return -F.logsigmoid(beta * margin).mean()
# --8<-- [end:dpo]


def kl_regularised_optimum(ref_probs: torch.Tensor, rewards: torch.Tensor, beta: float) -> torch.Tensor:
    """The maximiser of E_π[r] − β·KL(π‖π_ref) over distributions on a finite set (Rafailov et al. 2023, eq. 4):
    π*(y) ∝ π_ref(y)·exp(r(y)/β). ref_probs and rewards: (..., K)."""
    if beta <= 0:
        raise ConfigError(f"beta must be > 0, got {beta}")
    _check_same_shape(ref_probs=ref_probs, rewards=rewards)
    return (ref_probs.log() + rewards / beta).softmax(-1)


# --8<-- [start:distil]
def distillation_loss(student_logits: torch.Tensor, teacher_logits: torch.Tensor, T: float = 2.0) -> torch.Tensor:
    """Hinton et al. 2015, §2: cross-entropy between the teacher's and the student's softened distributions,
    softmax(z/T), times T² so the gradient keeps its size as T changes (its logit gradient is (q − p)/T).
    Logits (..., V); the mean over all leading positions."""
    if T <= 0:
        raise ConfigError(f"temperature T must be > 0, got {T}")
    if student_logits.shape != teacher_logits.shape:
        raise ConfigError(f"student {tuple(student_logits.shape)} and teacher {tuple(teacher_logits.shape)} logits "
                          "must match: distillation needs one vocabulary (map the teacher's first)")
    soft_targets = (teacher_logits / T).softmax(-1)
    return -(soft_targets * (student_logits / T).log_softmax(-1)).sum(-1).mean() * T ** 2
# --8<-- [end:distil]


# --8<-- [start:kl_reward]
def kl_shaped_rewards(score: torch.Tensor, logp: torch.Tensor, logp_ref: torch.Tensor, mask: torch.Tensor,
                      beta: float) -> torch.Tensor:
    """PPO-RLHF's per-token rewards (Ouyang et al. 2022, §3.5, eq. 2 with its "per-token KL penalty"; written out in
    Shao et al. 2024, eq. 2): every response token gets −β(log π − log π_ref), the last one also the reward model's
    score. score (N,); logp, logp_ref, mask (N, T) -> (N, T). Summed over an output: r(x, y) − β·log π(y|x)/π_ref(y|x).
    Detached: the penalty is part of the reward, so it reaches the policy only through the advantage."""
    if beta < 0:
        raise ConfigError(f"beta must be >= 0 (the KL reward coefficient; InstructGPT's eq. 2), got {beta}")
    _check_same_shape(logp=logp, logp_ref=logp_ref, mask=mask)
    if score.shape != logp.shape[:1]:
        raise ConfigError(f"score must be (N,) = {tuple(logp.shape[:1])}: one reward-model score per output, "
                          f"got {tuple(score.shape)}")
    mask = mask.to(logp.dtype)
    n_tokens = mask.sum(1, keepdim=True)  # (N, 1)
    if (n_tokens < 1).any():
        raise ConfigError("every output needs at least one response token in mask (the score goes on the last one)")
    last = (mask.cumsum(1) == n_tokens) & (mask > 0)  # (N, T): the last response token of each output
    return (-beta * (logp - logp_ref) * mask + score[:, None] * last).detach()
# --8<-- [end:kl_reward]


# --8<-- [start:process_advantages]
def process_advantages(step_rewards: torch.Tensor, step_mask: torch.Tensor, eps: float = 1e-4) -> torch.Tensor:
    """GRPO with process supervision (Shao et al. 2024, §4.1.3): every step of every output in a group of G gets a
    reward; all the group's step rewards are normalised together, (r − mean)/std, and a token's advantage is the
    sum of the normalised rewards of its own step and every later step of its output. step_rewards, step_mask
    (G, S): S steps at most, mask False on padding -> (G, S), the advantage each token of that step gets (0 on
    padding). Outcome supervision (`group_advantages`) gives every token of an output one shared value instead."""
    _check_same_shape(step_rewards=step_rewards, step_mask=step_mask)
    if step_rewards.dim() != 2:
        raise ConfigError(f"step_rewards must be (group, steps), got shape {tuple(step_rewards.shape)}")
    mask = step_mask.bool()
    if mask.sum() < 2:
        raise ConfigError("a group needs at least 2 scored steps in all to normalise them: sample G >= 2 outputs")
    r = step_rewards[mask]
    normed = torch.zeros_like(step_rewards).masked_scatter(mask, (r - r.mean()) / (r.std() + eps))
    return normed.flip(1).cumsum(1).flip(1) * mask  # Σ over this step and the later ones of the same output
# --8<-- [end:process_advantages]


# --8<-- [start:cpi]
def cpi_objective(logp: torch.Tensor, logp_old: torch.Tensor, advantages: torch.Tensor) -> torch.Tensor:
    """The unclipped surrogate ρA per sample, to MAXIMISE (Schulman et al. 2017, §3, eq. 6, L^CPI; the "no clipping or
    penalty" arm of §6.1): the first term inside PPO's min, with ρ = π/π_old. Its gradient is ρA·∇log π at every ρ."""
    _check_same_shape(logp=logp, logp_old=logp_old, advantages=advantages)
    return (logp - logp_old).exp() * advantages
# --8<-- [end:cpi]
