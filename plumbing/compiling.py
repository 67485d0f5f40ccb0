"""Plumbing (a reader of the method may skip this file): --compile, torch.compile of the decoder
layers and of the loss's passes over [tokens, vocab] logits (fused kernels, fewer launches: one
H200's step idled between kernels). sft.py and rl.py turn it on; under torch.compile curio_loss
takes its plain expressions, whose float32 upcast and passes inductor fuses, not its blockwise
ones. Off by default until a GPU has timed it (bench/sft_step.py --forms packed compiled)."""
import functools

import torch


def no_silent_fallback() -> None:
    """A function that compiles more than torch's limit of graphs (8) stops the run with dynamo's
    error, instead of running eagerly from then on: a checkpoint whose forward ran compiled and
    whose recompute eagerly fails later and less clearly (torch.utils.checkpoint's CheckpointError),
    and a slower step would go unnoticed."""
    torch._dynamo.config.fail_on_recompile_limit_hit = True


def compile_layer(layer) -> None:
    """The decoder layer's forward through torch.compile. Its forward only: FSDP's hooks and the
    activation checkpoint around it stay eager, and the parameters keep their names (checkpoints).
    The layers share their compiled graphs (torch compiles the code, the parameters are inputs): a
    graph per grad mode and parameters' requires_grad (the student's forward, its recompute in
    backward, a no-grad forward, the frozen teacher's), first for the first shape, then once more
    each with the sequence length symbolic. Nothing in it depends on the count of sequences in a
    packed row (plumbing/attention.py)."""
    no_silent_fallback()
    layer.forward = torch.compile(layer.forward)


@functools.cache
def compiled(fn):
    """torch.compile(fn), one per function: a graph for the first shape, then one with the token
    count symbolic (the last chunk of a micro-batch)."""
    no_silent_fallback()
    return torch.compile(fn)


def compiled_if(on: bool, *fns):
    """The functions, each through `compiled` where on."""
    return tuple(compiled(fn) if on else fn for fn in fns)
