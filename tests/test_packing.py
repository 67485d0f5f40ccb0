"""Packed micro-batches (data.collate pack=True, plumbing/attention.py) against the padded ones and against
transformers' own forward with its dense padding mask: the same trained tokens, values and gradients (float32 on
the CPU, within the rounding a different matmul shape gives), and attention that never crosses a sequence."""
import pytest
import torch

import baselines
import chunked_logits
import curio_loss as cl
import data
import rl
import sft
from plumbing import attention, models


def fsdp_model(model_dir, seed=0):
    return models.shard_model(models.load_full_model(str(model_dir), scratch=True, seed=seed),
                              torch.device("cpu"), bf16=False, grad_ckpt=False)


def sequences(lengths, vocab, seed=0):
    """(ids, loss mask) pairs: a 3-token prompt, the rest trained."""
    g = torch.Generator().manual_seed(seed)
    return [(torch.randint(3, vocab, (n,), generator=g).tolist(), [0] * 3 + [1] * (n - 3)) for n in lengths]


LENGTHS = [23, 9, 17, 4]


def test_packed_attention_keeps_each_sequence_to_itself(world_of_one, tiny_model_dir):
    model = fsdp_model(tiny_model_dir)
    items = sequences(LENGTHS, model.config.vocab_size)
    packed = data.collate(items, 0, pack=True)
    h = chunked_logits.normed_hidden(model, packed)[0]                          # [sum, H]
    start = 0
    for ids, _ in items:                          # each sequence alone, no padding, no mask: the definition
        alone = chunked_logits.normed_hidden(model, data.collate([(ids, [0] * len(ids))], 0))[0]
        torch.testing.assert_close(h[start : start + len(ids)], alone, rtol=1e-5, atol=1e-5)
        start += len(ids)
    # a token changed in the first sequence changes nothing in the others, bit for bit
    items[0][0][5] = (items[0][0][5] + 1) % model.config.vocab_size
    again = chunked_logits.normed_hidden(model, data.collate(items, 0, pack=True))[0]
    assert not torch.equal(again[: LENGTHS[0]], h[: LENGTHS[0]])
    assert torch.equal(again[LENGTHS[0] :], h[LENGTHS[0] :])


def test_right_padded_rows_need_no_mask(world_of_one, tiny_model_dir):
    """Under a causal mask no real token attends to a later pad: without the dense [B, 1, T, T] mask the trained
    positions' hidden states are transformers' own with its padding mask."""
    model = fsdp_model(tiny_model_dir)
    batch = data.collate(sequences(LENGTHS, model.config.vocab_size), 0)
    assert batch["padded"] and chunked_logits.attention_mask(batch) is None
    with torch.no_grad():
        h, _ = chunked_logits.select_targets(chunked_logits.normed_hidden(model, batch), batch)
        want = model(batch["input_ids"], attention_mask=batch["attention_mask"]).logits
    torch.testing.assert_close(model.lm_head(h), want.flatten(0, 1)[batch["target_index"]], rtol=1e-5, atol=1e-5)


def test_a_packed_batch_is_refused_by_a_model_that_would_attend_across_sequences(world_of_one, tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(tiny_model_dir), attn_implementation="sdpa")
    packed = data.collate(sequences(LENGTHS, model.config.vocab_size), 0, pack=True)
    with pytest.raises(ValueError, match=f"attn_implementation='{attention.ATTENTION}'"):
        chunked_logits.normed_hidden(model, packed)


def grads(model):
    return [p.grad.full_tensor().clone() for p in model.parameters() if p.grad is not None]


@pytest.mark.parametrize("loss", ["curio", "curio_self_teacher", "sft", "entropy_top20", "kl"])
def test_an_sft_micro_batch_packed_gives_the_padded_loss_diagnostics_and_gradient(world_of_one, tiny_model_dir,
                                                                                    loss):
    model = fsdp_model(tiny_model_dir)
    second = baselines.second_model(loss)
    other = fsdp_model(tiny_model_dir, seed=1).requires_grad_(False) if second else None
    teacher, base = (other, None) if second == "teacher" else (None, other)
    args, cfg = sft.Args(loss=loss, loss_chunk=16), baselines.config_for(loss, cl.LossConfig())
    items = sequences(LENGTHS, model.config.vocab_size)
    out = {}
    for pack in (False, True):
        batch = data.collate(items, 0, pack=pack)
        weights = torch.linspace(0.5, 1.5, len(batch["target_index"]))
        total, diag = sft.micro_batch_loss(model, teacher, base, batch, None, args, cfg, True, weights)
        total.backward()
        out[pack] = total.detach(), diag, grads(model)
        model.zero_grad(set_to_none=True)
    (t0, d0, g0), (t1, d1, g1) = out[False], out[True]
    torch.testing.assert_close(t1, t0, rtol=1e-5, atol=1e-6)
    assert d0.keys() == d1.keys() and d0
    for k in d0:
        torch.testing.assert_close(d1[k], d0[k], rtol=1e-4, atol=1e-5)
    assert len(g0) == len(g1) > 0
    for a, b in zip(g1, g0):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


class GradCapture:
    """An optimiser that only records the gradients it would apply."""

    def __init__(self, params):
        self.params, self.grads = list(params), None

    def step(self):
        self.grads = [p.grad.full_tensor().clone() for p in self.params if p.grad is not None]

    def zero_grad(self, set_to_none=True):
        for p in self.params:
            p.grad = None


def test_a_grpo_update_packed_gives_the_padded_old_log_probs_losses_and_gradient(world_of_one, tiny_model_dir):
    model = fsdp_model(tiny_model_dir)
    args = rl.Args(loss_chunk=7, grad_clip=1e9, entropy_coef=0.01, loss_agg="rank_sum_over_max_len")
    items = sequences(LENGTHS, model.config.vocab_size)
    out = {}
    for pack in (False, True):
        batch = data.collate(items, 0, pack=pack)
        n = len(batch["target_index"])
        old, ent = chunked_logits.token_log_probs(model, batch, args.loss_chunk, temperature=0.8)
        adv = torch.linspace(-1.0, 1.0, n)
        mb = rl.MicroBatch(batch, adv, old + torch.linspace(-0.3, 0.3, n), ent)
        capture = GradCapture(model.parameters())
        sums, _ = rl.policy_update(model, capture, [mb], args, torch.device("cpu"))
        out[pack] = old, ent, sums, capture.grads
    for a, b in zip(out[True], out[False]):
        if isinstance(a, list):
            assert len(a) == len(b) > 0
            for x, y in zip(a, b):
                torch.testing.assert_close(x, y, rtol=1e-4, atol=1e-6)
        else:
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)


def test_varlen_flash_attention_is_asked_only_for_inputs_its_kernel_runs():
    """torch's varlen_attn raises on float32 (sft.py --no-bf16 on a GPU) and head dimensions over 256: those take
    SDPA over each sequence (tests/test_gpu.py runs both paths on CUDA)."""
    from plumbing.attention import flash_takes

    assert flash_takes(torch.bfloat16, 128) and flash_takes(torch.float16, 256)
    assert not flash_takes(torch.float32, 128) and not flash_takes(torch.bfloat16, 512)
