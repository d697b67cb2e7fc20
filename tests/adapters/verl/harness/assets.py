"""Locally built inputs for the veRL CPU harness: a byte-level BPE tokenizer with a ChatML template, a
randomly initialised tiny Qwen2 model and a toy arithmetic dataset in veRL's RLHF schema. Seeded,
so two builds are identical; nothing is downloaded."""

from __future__ import annotations

import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def _corpus(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    words = ["what", "is", "plus", "minus", "the", "answer", "user", "assistant", "system"]
    return [f"what is {rng.randint(0, 99)} plus {rng.randint(0, 99)} " + " ".join(rng.choices(words, k=6))
            for _ in range(n)]


def build_tokenizer(out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=492, special_tokens=SPECIAL,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(_corpus(400, 0), trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                   bos_token=None, unk_token=None)
    fast.chat_template = CHAT_TEMPLATE
    fast.save_pretrained(out)


def build_model(out: Path, seed: int = 0) -> int:
    import torch
    from transformers import AutoTokenizer, GenerationConfig, Qwen2Config, Qwen2ForCausalLM

    tok = AutoTokenizer.from_pretrained(out)
    cfg = Qwen2Config(vocab_size=len(tok), hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                      tie_word_embeddings=False, eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id,
                      bos_token_id=None, torch_dtype="float32")
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(cfg)
    model.save_pretrained(out)
    GenerationConfig(eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id).save_pretrained(out)
    return sum(p.numel() for p in model.parameters())


def build_data(out: Path, *, train_rows: int = 64, test_rows: int = 8, seed: int = 0) -> None:
    import pandas as pd

    rng = random.Random(seed)

    def rows(n: int, split: str) -> list[dict]:
        out_rows = []
        for i in range(n):
            a, b = rng.randint(0, 99), rng.randint(0, 99)
            out_rows.append({"data_source": "toy_add", "ability": "math",
                             "prompt": [{"role": "user", "content": f"what is {a} plus {b}"}],
                             "reward_model": {"style": "rule", "ground_truth": str(a + b)},
                             "extra_info": {"split": split, "index": i}})
        return out_rows

    pd.DataFrame(rows(train_rows, "train")).to_parquet(out / "train.parquet")
    pd.DataFrame(rows(test_rows, "test")).to_parquet(out / "test.parquet")


def build(out: Path) -> Path:
    """Tokenizer, model and data under `out` (created); returns `out`."""
    out.mkdir(parents=True, exist_ok=True)
    build_tokenizer(out)
    build_model(out)
    build_data(out)
    return out


if __name__ == "__main__":
    import sys

    print(build(Path(sys.argv[1])))
