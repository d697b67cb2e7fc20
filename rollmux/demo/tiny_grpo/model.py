"""The policy: a tiny causal transformer with sampling and per-token log-probabilities."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from rollmux.demo.tiny_grpo.task import EOS, PAD, VOCAB


@dataclass(frozen=True, slots=True)
class Sample:
    """A batch of sampled responses, right-padded with PAD after EOS."""

    tokens: torch.Tensor  # [B, P + T] int64: prompt then response
    response_mask: torch.Tensor  # [B, T] float32: 1 for sampled tokens up to and including EOS
    old_logp: torch.Tensor  # [B, T] float32: log-prob of each sampled token under the sampling policy


class TinyPolicy(nn.Module):
    """Token + position embeddings, ``n_layers`` pre-norm transformer blocks, a linear head.

    Args:
        max_len: longest sequence (prompt + response) the position table covers.
        d_model: width; the main knob for train cost per token.
        n_layers: depth.
        n_heads: attention heads (must divide d_model).
    """

    def __init__(self, *, max_len: int, d_model: int = 64, n_layers: int = 2, n_heads: int = 4) -> None:
        super().__init__()
        self.tok = nn.Embedding(VOCAB, d_model)
        self.pos = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, n_heads, 4 * d_model, dropout=0.0, batch_first=True, norm_first=True
        )
        self.blocks = nn.TransformerEncoder(layer, n_layers, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """Logits ``[B, L, VOCAB]`` for next-token prediction at every position."""
        length = tokens.shape[1]
        x = self.tok(tokens) + self.pos(torch.arange(length, device=tokens.device))
        mask = nn.Transformer.generate_square_subsequent_mask(length, device=tokens.device)
        return self.head(self.norm(self.blocks(x, mask=mask, is_causal=True)))


def token_logp(policy: TinyPolicy, tokens: torch.Tensor, prompt_len: int) -> torch.Tensor:
    """Log-prob of each response token given everything before it: ``[B, L - prompt_len]``."""
    logits = policy(tokens[:, :-1])[:, prompt_len - 1 :]
    return torch.log_softmax(logits.float(), dim=-1).gather(-1, tokens[:, prompt_len:, None]).squeeze(-1)


@torch.no_grad()
def sample(policy: TinyPolicy, prompts: torch.Tensor, max_new_tokens: int, gen: torch.Generator) -> Sample:
    """Sample responses token by token until every row emitted EOS or the limit is reached.

    No KV cache: each step reruns the whole prefix, so a step's cost grows with length and the
    batch's longest response sets the rollout time (the tail). ``gen`` must be on the prompts' device.
    """
    tokens = prompts
    done = torch.zeros(prompts.shape[0], dtype=torch.bool, device=prompts.device)
    logps, masks = [], []
    for _ in range(max_new_tokens):
        logp = torch.log_softmax(policy(tokens)[:, -1].float(), dim=-1)
        nxt = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(-1)
        nxt = torch.where(done, torch.full_like(nxt, PAD), nxt)
        masks.append((~done).float())
        logps.append(logp.gather(-1, nxt[:, None]).squeeze(-1) * masks[-1])
        tokens = torch.cat([tokens, nxt[:, None]], dim=1)
        done |= nxt == EOS
        if bool(done.all()):
            break
    return Sample(tokens, torch.stack(masks, dim=1), torch.stack(logps, dim=1))
