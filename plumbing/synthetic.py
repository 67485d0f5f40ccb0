"""Plumbing (a reader of the method may skip this file): synthetic stand-ins that the tests, the
benchmarks and the demo share. Logits shaped like an LLM's, for the loss's tests and timings, and a
tiny model directory (a real tokenizer, a small Qwen2 config), for the demo and the GPU check."""
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
