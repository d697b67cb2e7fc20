"""Build the tiny local assets a CPU ROLL run needs: a BPE tokenizer with a ChatML template, a
2-layer Qwen2 model (hidden 32) and a toy "a+b" math data set. Nothing is downloaded.

    python assets.py OUT_DIR      # writes OUT_DIR/{model,data/train.jsonl}; reused when present

Runs in the ROLL virtualenv (transformers / tokenizers); deterministic for a given seed.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
VOCAB = 300
ROWS = 64


def _rows(seed: int) -> list[dict]:
    rng = random.Random(seed)
    rows = []
    for _ in range(ROWS):
        a, b = rng.randint(0, 49), rng.randint(0, 49)
        rows.append({"messages": json.dumps([{"role": "user", "content": f"What is {a}+{b}? Answer in \\boxed{{}}."}]),
                     "ground_truth": str(a + b), "tag": "math_rule"})
    return rows


def _tokenizer(rows: list[dict], out: Path):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    corpus = [json.loads(r["messages"])[0]["content"] + " \\boxed{" + r["ground_truth"] + "}" for r in rows]
    corpus += ["user assistant system\n"] * 4
    tok.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=VOCAB, special_tokens=SPECIALS,
                                                        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)
    return fast


def _model(tok, out: Path, seed: int) -> None:
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=4096,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=tok.eos_token_id, torch_dtype="float32")
    Qwen2ForCausalLM(cfg).save_pretrained(out, safe_serialization=True)


def build(root: Path, seed: int = 0) -> Path:
    """Write the model, tokenizer and data under `root` (skipped when already complete)."""
    model_dir, data = root / "model", root / "data" / "train.jsonl"
    if (model_dir / "config.json").exists() and (model_dir / "tokenizer.json").exists() and data.exists():
        return root
    rows = _rows(seed)
    model_dir.mkdir(parents=True, exist_ok=True)
    tok = _tokenizer(rows, model_dir)
    _model(tok, model_dir, seed)
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return root


if __name__ == "__main__":
    print(build(Path(sys.argv[1])))
