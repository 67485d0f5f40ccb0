"""plumbing/models.py's optimiser: AdamW stepping the FSDP2 shards' local tensors is torch's AdamW on the DTensor
parameters, bit for bit, in the update, the state and the state dict a checkpoint saves."""
import pytest
import torch

from plumbing import models


def sharded(seed):
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(seed)
    model = torch.nn.Sequential(*[torch.nn.Linear(8, 8) for _ in range(6)])
    for layer in model:
        fully_shard(layer)
    return fully_shard(model)


def train(model, optimizer, steps=3):
    for k in range(steps):
        torch.manual_seed(100 + k)
        model(torch.randn(4, 8)).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)


@pytest.mark.parametrize("fused", [False, True])
def test_shard_local_adamw_is_torchs_adamw_bit_for_bit(world_of_one, fused):
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    kwargs = dict(lr=1e-2, weight_decay=0.01, betas=(0.9, 0.95), fused=fused)
    ours, theirs = sharded(0), sharded(0)
    opt_ours = models.ShardLocalAdamW(ours.parameters(), **kwargs)
    opt_theirs = torch.optim.AdamW(theirs.parameters(), **kwargs)
    train(ours, opt_ours)
    train(theirs, opt_theirs)
    for a, b in zip(ours.parameters(), theirs.parameters()):
        assert torch.equal(a.full_tensor(), b.full_tensor())
    assert not torch.equal(next(ours.parameters()).full_tensor(), next(sharded(0).parameters()).full_tensor())
    state_ours = get_optimizer_state_dict(ours, opt_ours)["state"]
    state_theirs = get_optimizer_state_dict(theirs, opt_theirs)["state"]
    assert state_ours.keys() == state_theirs.keys() and state_ours
    def full(x):
        return x.full_tensor() if hasattr(x, "full_tensor") else x

    for name in state_ours:
        for key in ("step", "exp_avg", "exp_avg_sq"):
            a, b = state_ours[name][key], state_theirs[name][key]
            assert type(a) is type(b) and torch.equal(full(a), full(b))
