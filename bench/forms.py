"""Benchmark plumbing: the forms of a training step that bench/sft_step.py times side by side and
bench/dryrun.py replays. A form is a layout of the micro-batch and the code paths its step takes;
"6fbcbf7" is the step as one H200 measured it (bench/data/h200-2026-11-27/): right-padded rows with
a dense padding mask, the loss's float32 copy of each chunk of bf16 logits, torch.topk over the whole
vocabulary, torch's AdamW on the DTensor parameters. It is kept so that those figures stay checkable
(`bench/dryrun.py --against`) and so that a GPU run times today's forms beside it. Every form
computes the same losses and gradients (tests/test_packing.py, tests/test_curio_loss.py)."""
import contextlib
from unittest import mock

import torch

import chunked_logits
import curio_loss as cl
from plumbing import models

OLD = "6fbcbf7"     # the form one H200 measured (bench/data/h200-2026-11-27/)
FORMS = {OLD: "right-padded rows, a dense [B, 1, T, T] padding mask, a float32 copy of each "
                    "chunk's logits, torch.topk over the vocabulary, AdamW on DTensors (as one "
                    "H200 measured sft.py at 6fbcbf7)",
         "padded": "right-padded rows, causal attention without a mask (--no-pack)",
         "packed": "the sequences end to end, attention within each (--pack, the default)",
         "compiled": "packed, the decoder layers and the loss's passes over the logits through "
                     "torch.compile (--compile)"}
NOT_PRICED = {"compiled"}   # forms the dry run cannot price: its roofline counts eager kernels


def packs(form: str) -> bool:
    """The trainers' --pack in `form`."""
    return form in ("packed", "compiled")


def compiles(form: str) -> bool:
    """The trainers' --compile in `form`."""
    return form == "compiled"


def dense_padding_mask(batch):
    """sft.py's attention mask at 6fbcbf7: for a padded batch, causal and not a padding key,
    [B, 1, T, T] bool (the mask transformers builds for SDPA), which no attention kernel can skip
    a tile of."""
    if not batch["padded"]:
        return None
    keep = batch["attention_mask"].bool()                                  # [B, T]
    T = keep.shape[1]
    causal = torch.ones(T, T, dtype=torch.bool, device=keep.device).tril()
    return causal & keep[:, None, None, :]


@contextlib.contextmanager
def code_paths(form: str):
    """Inside: the trainers' code takes `form`'s paths (their layout is --pack: packs(form))."""
    if form not in FORMS:
        raise ValueError(f"form {form!r}: expected one of {', '.join(FORMS)}")
    with contextlib.ExitStack() as stack:
        if form == OLD:
            stack.enter_context(mock.patch.object(chunked_logits, "attention_mask",
                                                  dense_padding_mask))
            stack.enter_context(mock.patch.object(cl, "BLOCKWISE", False))
            stack.enter_context(mock.patch.object(models, "ShardLocalAdamW", torch.optim.AdamW))
        yield
