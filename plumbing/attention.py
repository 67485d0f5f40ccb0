"""Plumbing (a reader of the method may skip this file): attention over a packed micro-batch.

The trainers pack a micro-batch's sequences into one row without padding (data.collate with
pack=True), as verl's `use_remove_padding` does: no token of a padded position is computed, and
attention runs inside each sequence only (causal, restarting at each sequence's first token). The
model is loaded with ATTENTION, a function transformers calls in every decoder layer in place of
its SDPA one:
- with the packed row's sequence boundaries (chunked_logits.normed_hidden passes them):
  torch's varlen flash attention on CUDA (one kernel over every sequence, causal tiles skipped),
  else causal SDPA over each sequence in turn (the CPU; a torch before 2.11; float32 inputs);
- without them (HF generate, a test's plain forward): transformers' own SDPA, unchanged.
"""
import functools
import inspect

import torch
from transformers import AttentionInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

ATTENTION = "curio_varlen"          # the name models are loaded with (plumbing/models.py)


def _varlen_attn():
    """torch's varlen_attn where it is causal by window_size (torch >= 2.11), else None. Its flash
    kernel takes fewer key/value heads than query heads (GQA) as they are: torch 2.13's enable_gqa
    only lets them past a check that torch 2.11 does not make."""
    try:
        from torch.nn.attention.varlen import varlen_attn
    except ImportError:
        return None
    params = inspect.signature(varlen_attn).parameters
    if "window_size" not in params:
        return None
    return functools.partial(varlen_attn, enable_gqa=True) if "enable_gqa" in params else varlen_attn


VARLEN_ATTN = _varlen_attn()


def flash_takes(dtype: torch.dtype, head_dim: int) -> bool:
    """Whether varlen_attn's flash kernel runs these inputs: fp16 or bf16, a head dimension of at
    most 256 (it raises on others: float32 with --no-bf16 takes SDPA over each sequence)."""
    return dtype in (torch.float16, torch.bfloat16) and head_dim <= 256


def packed_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None,
                     cu_seq_lens_q=None, max_length_q=None, **kwargs):
    """Causal attention within each sequence of a packed row: query [1, Hq, T, D], key and value
    [1, Hkv, T, D], the sequences' offsets (cu_seq_lens_q [n + 1] int32, on the device) and the
    longest one's length (max_length_q, on the host) -> ([1, T, Hq, D], None), as transformers'
    attention functions return. Without offsets: transformers' SDPA. Under --compile nothing here
    depends on the count of sequences, which would compile the layer again for every count."""
    if cu_seq_lens_q is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, **kwargs)
    if attention_mask is not None or dropout:
        raise ValueError("packed attention takes no attention mask and no dropout")
    if query.is_cuda and VARLEN_ATTN is not None and flash_takes(query.dtype, query.shape[-1]):
        q, k, v = (x.transpose(1, 2)[0] for x in (query, key, value))          # [T, H, D]
        out = VARLEN_ATTN(q, k, v, cu_seq_lens_q, cu_seq_lens_q, max_length_q, max_length_q,
                          scale=scaling, window_size=(-1, 0))
        return out.unsqueeze(0), None
    return _per_sequence(module, query, key, value, scaling, cu_seq_lens_q), None


@torch.compiler.disable      # --compile: outside the graph, whose shapes would follow the lengths
def _per_sequence(module, query, key, value, scaling, cu_seq_lens_q):
    """Causal SDPA over each sequence of a packed row in turn -> [1, T, Hq, D]. The lengths are
    read from the offsets (a host sync on a GPU: only its float32 path comes here)."""
    outs, start = [], 0
    for n in torch.diff(cu_seq_lens_q).tolist():
        part = [x[:, :, start : start + n] for x in (query, key, value)]
        outs.append(sdpa_attention_forward(module, *part, None, scaling=scaling,
                                           is_causal=True)[0])                    # [1, n, Hq, D]
        start += n
    return torch.cat(outs, dim=1)


AttentionInterface.register(ATTENTION, packed_attention)
AttentionMaskInterface.register(ATTENTION, sdpa_mask)     # masks as for SDPA when not packed
