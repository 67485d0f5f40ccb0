"""The model side shared by sft.py and rl.py: the final hidden states of a batch, the positions
whose next token is trained, and per-token quantities of the [tokens, vocab] logits, one chunk
at a time.

The trick both stages rely on: a 152k-token vocabulary makes the logits of one 8k-token sequence
1.2e9 floats (5 GB in float32). So the model's forward stops at the final norm (`normed_hidden`),
the trained positions are selected (`select_targets`), and `lm_head` is applied to `chunk`
positions at a time inside a torch checkpoint (`chunked_sum`): backward recomputes each chunk's
logits instead of keeping them.
"""
import torch
from torch.utils.checkpoint import checkpoint

import curio_loss as cl
from plumbing import attention
from plumbing.compiling import compiled_if


def normed_hidden(model, batch):
    """Final normed hidden states [B, T, H] from the model's own forward (so FSDP's hooks run), with
    logits for only the last position: the full [B, T, V] logits are never built."""
    captured = {}
    hook = model.model.norm.register_forward_hook(lambda mod, inp, out: captured.update(h=out))
    try:
        model(input_ids=batch["input_ids"], attention_mask={"full_attention": attention_mask(batch)},
              logits_to_keep=1, use_cache=False,     # no KV cache: nothing here generates
              **packed_sequences(model, batch))
    finally:
        hook.remove()
    return captured["h"]


def attention_mask(batch):
    """The attention mask the decoder layers use: none, so attention is causal by SDPA's flag (flash
    attention on a GPU, which skips the tiles causality rules out). Exact for right-padded rows
    too: under a causal mask no real token attends to a later padding token, and padded positions
    are never trained (select_targets). transformers would build the mask from the [B, T] padding
    mask, a dense [B, 1, T, T] one that no attention kernel can skip tiles of, after reading values
    back to the host (is the mask all ones? are sequences packed?): a GPU sync every forward."""
    return None


def packed_sequences(model, batch) -> dict:
    """The forward's arguments for a packed batch (data.collate, pack=True): every sequence's
    positions from 0 and its bounds, which the model's attention (plumbing/attention.py) keeps
    attention within; none for a padded batch."""
    if "cu_seq_lens" not in batch:
        return {}
    if model.config._attn_implementation != attention.ATTENTION:
        raise ValueError(f"a packed batch needs the model loaded with attn_implementation="
                         f"{attention.ATTENTION!r} (plumbing/models.py), not "
                         f"{model.config._attn_implementation!r}: it would attend across sequences")
    return {"position_ids": batch["position_ids"], "cu_seq_lens_q": batch["cu_seq_lens"],
            "max_length_q": max(batch["seq_lens"])}


def no_grad_logits(head, h):
    """[n, V] logits of a head without gradient (CurioSFT's teacher, the kl baseline's base model).
    bf16 on CUDA: torch.mm's out_dtype keeps cuBLAS's float32 accumulator instead of rounding every
    logit to bf16, whose values between 16 and 32 are 0.125 apart (up to 0.06 nats of error in a
    log-prob). Elsewhere, or where torch lacks out_dtype, the head as it is (CPU runs float32). Call
    it after the model's forward: FSDP then holds the head's gathered weight."""
    w = head.weight
    if h.is_cuda and h.dtype in (torch.bfloat16, torch.float16) and w.dtype == h.dtype:
        try:
            z = torch.mm(h, w.t(), out_dtype=torch.float32)
            return z if head.bias is None else z + head.bias.float()
        except (TypeError, NotImplementedError):   # a torch without out_dtype for mm
            pass
    return head(h)


def select_targets(hidden, batch):
    """The positions whose next token is trained (response, EOS): [B, T, H] -> h [N, H], y [N].
    By data.collate's target_index, which the host built: a boolean mask would make the GPU
    report N back to the host (a sync) before the step could go on."""
    index = batch["target_index"]                                 # [N], flat positions
    return hidden.flatten(0, 1)[index], batch["input_ids"].flatten()[index + 1]


def chunked_sum(fn, chunk, *per_token):
    """Sum of fn(*tensors of one chunk, memo) -> (loss sum, diagnostics) over chunks of `chunk`
    tokens of the per-token tensors (None passes through). Each chunk is recomputed in backward
    (torch checkpoint), so only the inputs, e.g. h [N, H], are kept, never the [N, V] logits fn
    builds. memo, a dict per chunk, keeps what fn's forward computed without a gradient for the
    recompute, which then need not compute it again (a pass over [n, V] logits is memory-bound)."""
    n = len(per_token[0])
    total, diags = per_token[0].new_zeros((), dtype=torch.float32), []
    for s in range(0, max(n, 1), chunk):       # one (empty) chunk when N = 0: FSDP needs a backward
        part = [t if t is None else t[s : s + chunk] for t in per_token]
        loss, diag = checkpoint(fn, *part, {}, use_reentrant=False)
        total = total + loss
        diags.append(diag)
    return total, cat_diags(diags)


def chunked_map(fn, chunk, *per_token):
    """[fn(*tensors of one chunk)] over chunks of `chunk` tokens, each chunk recomputed in backward
    as in chunked_sum, for a loss whose per-token terms need every chunk's result first
    (entropy_top20's mask). fn returns per-token tensors [n], never [n, V] ones."""
    out = []
    for s in range(0, max(len(per_token[0]), 1), chunk):
        part = [t if t is None else t[s : s + chunk] for t in per_token]
        out.append(checkpoint(fn, *part, use_reentrant=False))
    return out


def cat_diags(diags):
    """Per-token diagnostics {name: [n_i]} of several chunks (or ranks) as {name: [sum n_i]}."""
    return {k: torch.cat([d[k] for d in diags]) for k in diags[0]} if diags else {}


@torch.no_grad()
def token_log_probs(model, batch, chunk: int, temperature: float = 1.0, with_entropy: bool = True,
                    compile_loss: bool = False):
    """log pi(y_t) [N] of the trained tokens and the full-vocabulary entropy there [N] (None
    without with_entropy: PSFT's old log-probs need none), at `temperature`, one chunk of logits at
    a time (PSFT's old log-probs; GRPO's old log-probs and rollout entropy). The head runs as in the
    trained forward, in the compute dtype, so that a ratio pi / pi_old of 1 stays exactly 1 (under
    --compile, compile_loss: within rounding, as the no-grad forward is a graph of its own)."""
    student_log_prob, entropy = compiled_if(compile_loss, cl.student_log_prob, cl.entropy)
    h, y = select_targets(normed_hidden(model, batch), batch)             # [N, H], [N]
    lp, ent = [], []
    for s in range(0, max(len(y), 1), chunk):
        logits = model.lm_head(h[s : s + chunk])                           # [n, V]
        lp.append(student_log_prob(logits, y[s : s + chunk], temperature)[0])
        if with_entropy:
            ent.append(entropy(logits, temperature))
    return torch.cat(lp), (torch.cat(ent) if with_entropy else None)
