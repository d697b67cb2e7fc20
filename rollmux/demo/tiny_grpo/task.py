"""The verifiable toy task: repeat a digit a given number of times, then stop.

A prompt is ``[BOS, d, k, SEP]`` with a digit ``d`` and a count ``k``; the correct response is ``d``
repeated ``k`` times followed by ``EOS``. The reward gives partial credit, so a random policy already
sees a gradient: ``matches / max(k, length)``, where ``matches`` counts the first ``k`` response
tokens equal to ``d`` and ``length`` counts response tokens before ``EOS`` (all of them when the
response was cut at the length limit). It is 1 only for the exact answer.

Learning it needs the policy to read the prompt (attend to ``d``) and to count (stop after ``k``),
and the stopping decision makes response lengths vary, with a tail while the policy is young.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

DIGITS = 10  # tokens 0..9 are the digits
BOS, SEP, EOS, PAD = 10, 11, 12, 13
VOCAB = 14
PROMPT_LEN = 4


def make_prompts(n: int, max_count: int, gen: torch.Generator) -> torch.Tensor:
    """``n`` random prompts ``[BOS, d, k, SEP]`` with ``d`` in 0..9 and ``k`` in 1..max_count.

    Returns:
        int64 tensor of shape ``[n, PROMPT_LEN]``.
    """
    import torch

    d = torch.randint(0, DIGITS, (n,), generator=gen)
    k = torch.randint(1, max_count + 1, (n,), generator=gen)
    return torch.stack([torch.full_like(d, BOS), d, k, torch.full_like(d, SEP)], dim=1)


def reward(prompt: Sequence[int], response: Sequence[int]) -> float:
    """Score one response (token ids after the prompt, PAD allowed after EOS) in [0, 1].

    Args:
        prompt: ``[BOS, d, k, SEP]``.
        response: sampled tokens; everything from the first EOS on is ignored.

    Returns:
        ``matches / max(k, length)``; 1.0 exactly for ``d`` repeated ``k`` times then EOS.
    """
    d, k = int(prompt[1]), int(prompt[2])
    body = list(response)
    if EOS in body:
        body = body[: body.index(EOS)]
    matches = sum(1 for tok in body[:k] if tok == d)
    return matches / max(k, len(body))
