"""Plumbing (a reader of the method may skip this file): synthetic stand-ins that the tests, the
benchmarks and the demo share. Logits shaped like an LLM's, for the loss's tests and timings, and a
tiny model directory (a real tokenizer, a small Qwen2 config), for the demo and the GPU check, and
the toy tokenizer that directory holds (a byte-level BPE trained on given texts)."""
from pathlib import Path

import torch


def llm_like_logits(n: int, v: int, seed: int = 0) -> torch.Tensor:
    """Synthetic logits [n, v] shaped like an LLM's: a Gaussian bulk, a heavy upper tail, and per
    token 1-4 head candidates a random margin above it, so entropies range from ~0 (facts) to a few
    nats (branches)."""
    g = torch.Generator().manual_seed(seed)
    z = 2.0 * torch.randn(n, v, generator=g)
    z += 3.0 * torch.rand(n, v, generator=g).pow(8)          # a few tokens far above the bulk
    heads = torch.randint(0, v, (n, 4), generator=g)
    margin = 17.0 + 10.0 * torch.rand(n, 1, generator=g)     # the top token's height over the bulk
    branching = torch.rand(n, 1, generator=g) < 0.35         # 1-3 rivals close to the top token
    # [n, 3] nats below the top
    gaps = 3.0 * torch.rand(n, 3, generator=g) + torch.where(branching, 0.0, 4.0)
    head_vals = margin - torch.cat([torch.zeros(n, 1), gaps], dim=1)
    return z.scatter_(1, heads, head_vals)


def make_model_dir(world: Path, model_kwargs: dict) -> Path:
    """world/model: the tokenizer in world/tokenizer (demo/toy.py writes it there) and a tiny Qwen2
    config.json (model_kwargs: its sizes) in one HF directory: what sft.py --scratch starts from."""
    import transformers

    model_dir = world / "model"
    tok = transformers.AutoTokenizer.from_pretrained(world / "tokenizer")
    cfg = transformers.Qwen2Config(vocab_size=len(tok), max_position_embeddings=1024,
                                   tie_word_embeddings=True, eos_token_id=tok.eos_token_id,
                                   pad_token_id=tok.pad_token_id, **model_kwargs)
    cfg.save_pretrained(model_dir)
    tok.save_pretrained(model_dir)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"  {model_dir}: Qwen2 config, vocab {len(tok)}, {n_params / 1e6:.2f}M parameters",
          flush=True)
    return model_dir


# ------------------------------------------------------------------------------------------------
# A toy tokenizer for the CPU demo and the tests: byte-level BPE in Qwen2's format
# ------------------------------------------------------------------------------------------------
# Qwen2's pre-tokenizer regex, as transformers' Qwen2Tokenizer rebuilds it. A tokenizer saved beside
# a config.json with model_type=qwen2 is reloaded by AutoTokenizer (and vLLM) as Qwen2Tokenizer,
# which replaces the saved normaliser and pre-tokenizer with Qwen's; training with the same ones
# keeps the ids identical after reload.
QWEN2_PRETOKENIZE_REGEX = (r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"""
                           r""" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+""")
# Qwen2.5's plain ChatML template (without tools or a default system turn); data._chatml() writes
# the same text.
CHATML_TEMPLATE = (
    r"{% for message in messages %}"
    r"{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    r"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def build_toy_tokenizer(texts: list[str], vocab_size: int = 2048):
    """A byte-level BPE tokenizer trained on `texts`, as a transformers tokenizer with eos = pad =
    <|endoftext|>, ChatML special tokens and a ChatML chat template. "<think>" and "</think>" are
    added (non-special) tokens so that they stay one token each and survive
    decode(skip_special_tokens=True). The vocabulary has at most vocab_size + 2 entries (fewer when
    the texts have fewer merges to learn): size models with len(tokenizer). Training is
    deterministic."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PRETOKENIZE_REGEX), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        # all 256 bytes: any text stays encodable
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token="<|endoftext|>",
        pad_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>", "<|im_end|>"],
    )
    tokenizer.add_tokens(["<think>", "</think>"])
    tokenizer.chat_template = CHATML_TEMPLATE
    return tokenizer
