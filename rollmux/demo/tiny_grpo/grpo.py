"""GRPO: group-normalised advantages and the clipped surrogate loss with an optional KL term."""

from __future__ import annotations

import torch


def group_advantages(rewards: torch.Tensor, group_size: int, eps: float = 1e-4) -> torch.Tensor:
    """``(r - mean(group)) / (std(group) + eps)`` for rewards laid out group by group.

    Args:
        rewards: ``[n_prompts * group_size]``; the samples of one prompt are contiguous.
        group_size: samples per prompt.

    Returns:
        Advantages of the same shape; 0 for a group whose samples all scored the same.
    """
    grouped = rewards.view(-1, group_size)
    adv = (grouped - grouped.mean(dim=1, keepdim=True)) / (grouped.std(dim=1, keepdim=True) + eps)
    return adv.reshape(-1)


def grpo_loss(
    logp: torch.Tensor,
    old_logp: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    *,
    clip_eps: float = 0.2,
    ref_logp: torch.Tensor | None = None,
    kl_coef: float = 0.0,
) -> torch.Tensor:
    """Clipped-ratio policy loss per token, averaged per sequence, then over the batch.

    Args:
        logp: ``[B, T]`` log-probs under the policy being trained.
        old_logp: ``[B, T]`` log-probs under the policy that sampled (no gradient).
        advantages: ``[B]`` one advantage per sequence, shared by its tokens.
        mask: ``[B, T]`` 1 for response tokens.
        clip_eps: PPO clip range for the ratio.
        ref_logp: ``[B, T]`` log-probs under the frozen reference policy, for the KL term.
        kl_coef: weight of the KL penalty (k3 estimator); 0 disables it.

    Returns:
        A scalar loss to minimise.
    """
    ratio = torch.exp(logp - old_logp)
    adv = advantages[:, None]
    per_token = -torch.minimum(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    if ref_logp is not None and kl_coef > 0:
        log_r = ref_logp - logp
        per_token = per_token + kl_coef * (torch.exp(log_r) - log_r - 1)
    per_seq = (per_token * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1)
    return per_seq.mean()
