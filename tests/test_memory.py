"""bench/memory.py: parameter counts against Hugging Face's models, the plan against the measured peak of real
sft.py / rl.py steps on CPU (live tensor bytes, FSDP2 in a world of one), the plan's switches, its command line."""
import importlib.util
import json
import runpy
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

import baselines
import curio_loss as cl
import data
import rl
import sft
from conftest import grpo_step_peak
from plumbing import checkpoints, models

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "bench"))
import sft_step  # noqa: E402
_spec = importlib.util.spec_from_file_location("bench_memory", REPO / "bench" / "memory.py")
memory = sys.modules["bench_memory"] = importlib.util.module_from_spec(_spec)   # registered: --help reads its source
_spec.loader.exec_module(memory)

pytestmark = pytest.mark.usefixtures("one_thread")


def tiny_config(vocab, intermediate):
    return Qwen2Config(vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                       num_key_value_heads=2, intermediate_size=intermediate, max_position_embeddings=1024,
                       tie_word_embeddings=False)


def padded_batch(n_seq, longest, vocab):
    """n_seq right-padded sequences (the longest `longest`), the first eighth of each a prompt."""
    g = torch.Generator().manual_seed(0)
    items = []
    for b in range(n_seq):
        n = longest - 17 * b
        items.append((torch.randint(0, vocab, (n,), generator=g).tolist(), [0] * (n // 8) + [1] * (n - n // 8)))
    return data.collate(items, pad_id=0)


def test_parameter_counts_are_hugging_faces():
    for name, config in memory.MODELS.items():
        with torch.device("meta"):
            hf = Qwen2ForCausalLM(Qwen2Config(**config))
        assert memory.shapes_of(config).params == sum(p.numel() for p in hf.parameters()), name
    # the model cards: 7.61B (Qwen2.5-7B, which the Math model shares its shapes with) and 1.54B parameters
    assert memory.shapes_of(memory.MODELS["Qwen2.5-Math-7B"]).params == pytest.approx(7.61e9, rel=5e-3)
    assert memory.shapes_of(memory.MODELS["Qwen2.5-1.5B"]).params == pytest.approx(1.54e9, rel=5e-3)


def test_tracker_follows_views_frees_resizes_and_logsumexp():
    z = torch.randn(64, 1000)                                   # made outside: not counted
    tracker = memory.LiveTensorBytes()
    with tracker:
        a = torch.empty(1000)
        view = a[10:]
        assert tracker.live == 4000
        del a
        assert tracker.live == 4000                             # the view keeps the storage
        del view
        assert tracker.live == 0 and tracker.peak == 4000
        b = torch.empty(100)
        b.untyped_storage().resize_(0)                          # how FSDP2 frees an unsharded parameter
        assert tracker.live == 0
        b.untyped_storage().resize_(4000)
        assert tracker.live == 4000
        del b
        tracker.reset_peak()
        torch.logsumexp(z, -1)                                  # its exp(z - max) temporary is as large as z
        assert tracker.peak >= z.nbytes


def test_resident_tensors_leave_out_what_owns_no_memory():
    """An earlier --compile test in the same process leaves fake tensors of symbolic size in
    torch.compile's caches, and dead weak proxies sit among the garbage collector's objects: the
    resident count takes neither (it failed with a SymFloat, then a ReferenceError, after
    tests/test_compile.py)."""
    import weakref

    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    real = torch.empty(1000)
    fake = FakeTensorMode(shape_env=ShapeEnv(), static_shapes=False).from_tensor(real)
    assert not isinstance(fake.untyped_storage().nbytes(), int)          # symbolic
    gone = torch.nn.Linear(1, 1)
    dead = [weakref.proxy(gone)]
    del gone
    tracker = memory.LiveTensorBytes(resident=True)
    with tracker:
        pass
    assert isinstance(tracker.live, int) and tracker.live >= real.nbytes
    del dead                                          # among gc's objects until the tracker looked


# ------------------------------------------------------------------------------------------------
# The plan against the measured peak of real steps
# ------------------------------------------------------------------------------------------------
def measured_sft_peaks(tmp_path, monkeypatch, shape, loss, n_seq, longest, chunk, grad_ckpt, bf16,
                       pack=True):
    """Peak live tensor bytes of sft.train's second optimiser step (the first creates AdamW's
    states), whole and by phase: sft.py's own loop on a model of `shape` and 2 x n_seq rows
    (bench/sft_step.py's, `longest` tokens and shorter), two micro-batches a step, packed (sft.py's
    default) or padded (--no-pack). Returns the peaks and the largest micro-batch's (computed,
    trained) tokens. Seams: the phases are marked by wrapping the loop's named calls, and bf16
    (sft.py's GPU-only mixed precision) is switched on for the CPU where the models are sharded."""
    args = sft.Args(model=str(tmp_path / "model"), train_file=str(tmp_path / "train.jsonl"),
                    out_dir=str(tmp_path / "run"), loss=loss, epochs=2, global_batch=2 * n_seq,
                    token_budget=n_seq * longest, max_prompt_len=longest, max_response_len=longest,
                    system_prompt="messages", loss_chunk=chunk, grad_ckpt=grad_ckpt, log_every=1,
                    pack=pack)
    run = {"seq": longest, "batch": 2 * n_seq}
    sft_step.write_inputs(args, shape, run, entropy=1.0, device=torch.device("cpu"))
    first = sft_step.sequence_lengths(run)[:n_seq]        # longest first: micro-batch 1
    tracker, calls = memory.LiveTensorBytes(), []

    def marked(phase, fn):
        def run_in_phase(*a, **k):
            tracker.set_phase(phase)
            calls.append(phase)
            return fn(*a, **k)
        return run_in_phase

    def sharded(model, device, _bf16, *a, **k):
        model = models.shard_model(model, device, bf16, *a, **k)
        for layer in model.model.layers:
            layer.register_full_backward_pre_hook(lambda *_: tracker.set_phase("layers backward"))
        return model

    def steps(*a, plan_steps=sft.plan_steps):
        for n, item in enumerate(plan_steps(*a)):
            if n == 1:
                tracker.reset_peak()
                calls.clear()
            yield item

    monkeypatch.setattr(sft, "shard_model", sharded)
    monkeypatch.setattr(sft, "plan_steps", steps)
    monkeypatch.setattr(sft, "curio_micro_batch_loss",
                        marked("forward and loss", sft.curio_micro_batch_loss))
    monkeypatch.setattr(baselines, "variant_micro_batch_loss",
                        marked("forward and loss", baselines.variant_micro_batch_loss))
    monkeypatch.setattr(sft, "micro_batch_backward", marked("loss backward", sft.micro_batch_backward))
    monkeypatch.setattr(sft, "clip_grad_norm", marked("optimiser step", sft.clip_grad_norm))
    monkeypatch.setattr(checkpoints, "save", lambda *a, **k: "nothing (a memory test)")
    monkeypatch.setattr(checkpoints, "trainer_state", lambda *a: None)    # the end's save: not a step
    with tracker:
        sft.train(args, cl.LossConfig(), torch.device("cpu"))
    assert calls == ["forward and loss", "loss backward"] * 2 + ["optimiser step"]
    trained = sum(n - n // 8 for n in first)               # the response and EOS; a prompt an eighth
    return tracker.peak, tracker.phase_peak, (sum(first) if pack else n_seq * longest, trained)


def predicted_phases(result, phase):
    """The planner's moments grouped as the measurement's phases."""
    moments = result["phases"][phase]["moments"]
    group = {"loss backward": ("loss backward", "lm_head backward"), "optimiser step": ("optimiser step",)}
    out = {k: max(moments[m] for m in ms) for k, ms in group.items()}
    out["layers backward"] = max(v for m, v in moments.items() if m.startswith("layer ") or m.startswith("root"))
    return out


SFT_CASES = {  # loss, vocab, intermediate, sequences, longest, loss_chunk, checkpointing, bf16, packed
    "sft-ckpt-fp32": ("sft", 8192, 256, 2, 256, 128, True, False, True),
    "curio-fp32": ("curio", 8192, 256, 2, 256, 128, False, False, True),
    "curio-ckpt-fp32-1024tok": ("curio", 1024, 512, 2, 512, 256, True, False, True),
    "self-teacher-bf16": ("curio_self_teacher", 8192, 256, 2, 256, 128, False, True, True),
    "self-teacher-ckpt-fp32-1024tok": ("curio_self_teacher", 1024, 512, 2, 512, 512, True, False, True),
    "curio-ckpt-bf16-1536tok": ("curio", 1024, 512, 3, 512, 256, True, True, True),
    "kl-fp32": ("kl", 1024, 512, 2, 512, 256, False, False, True),
    # --no-pack: right-padded rows, no mask either
    "sft-ckpt-fp32-padded": ("sft", 8192, 256, 2, 256, 128, True, False, False),
    "curio-ckpt-bf16-1536tok-padded": ("curio", 1024, 512, 3, 512, 256, True, True, False),
}


@pytest.mark.parametrize("case", SFT_CASES)
def test_plan_is_within_15_percent_of_a_measured_sft_step(world_of_one, tmp_path, monkeypatch, case):
    loss, vocab, inter, n_seq, longest, chunk, grad_ckpt, bf16, pack = SFT_CASES[case]
    shape = dict(vocab=vocab, hidden=64, layers=2, heads=4, kv_heads=2, inter=inter, max_pos=1024, tied=False)
    peak, phases, (tokens, trained) = measured_sft_peaks(tmp_path, monkeypatch, shape, loss, n_seq, longest, chunk,
                                                         grad_ckpt, bf16, pack)
    result = memory.plan(sft_step.qwen2_config(shape, longest).to_dict(), stage="sft", loss=loss, gpus=1,
                         token_budget=tokens, pack=pack, seq_len=longest, trained_tokens=trained,
                         loss_chunk=chunk, bf16=bf16, grad_ckpt=grad_ckpt, global_batch=2 * n_seq, device="cpu")
    assert result["micro_batches"] > 1          # (packed: counted as sequences of the longest)
    ratio = peak / result["total_bytes"]
    print(f"{case}: measured {peak / 2**20:.2f} MiB, predicted {result['total_bytes'] / 2**20:.2f} MiB "
          f"(at '{result['phases']['sft step']['moment']}'), measured/predicted {ratio:.3f}")
    assert abs(ratio - 1) < 0.15, case
    for name, predicted in predicted_phases(result, "sft step").items():   # the model side too, not only the peak
        print(f"  {name}: measured/predicted {phases[name] / predicted:.3f}")
        assert abs(phases[name] / predicted - 1) < 0.15, (case, name)


def test_plan_is_within_15_percent_of_a_measured_rl_step(world_of_one, tmp_path, monkeypatch):
    """GRPO's step measured as the CUDA test measures it (conftest.grpo_step_peak: every live tensor of the process
    counted, as torch.cuda's allocator counts), after an in-process kl run of sft.train whose student and base
    outlive it in reference cycles: the garbage collection before the measurement frees their float32
    weights, and the step's peak is the plan's. Without it they would count: 1.247x on the H200, where the CUDA
    test followed the kl test (13.54 GiB against 10.86 planned)."""
    config, batch = tiny_config(1024, 512), padded_batch(2, 512, 1024)
    shape = dict(vocab=1024, hidden=64, layers=2, heads=4, kv_heads=2, inter=512, max_pos=1024, tied=False)
    measured_sft_peaks(tmp_path, monkeypatch, shape, "kl", 2, 512, 256, True, True)      # leaves its models behind
    params = memory.shapes_of(config.to_dict()).params
    measured, n = grpo_step_peak(memory, config, batch, 256, torch.device("cpu"), micro_batches=2)
    # at least the kl run's student and base, their float32 shards (earlier tests in this process may add theirs)
    assert measured["collected_bytes"] >= 2 * 4 * params, measured
    result = memory.plan(config.to_dict(), stage="rl", gpus=1, micro_batch=2, seq_len=512, pack=False,
                         trained_tokens=n, loss_chunk=256, grad_ckpt=True, mini_batch=1, rollouts=4, vllm_sleep=True,
                         device="cpu")
    training = result["phases"]["rl training"]
    assert result["micro_batches"] == 2 and training["parts"]["vllm"] == 0
    ratio = measured["bytes"] / training["total_bytes"]
    print(f"rl: measured {measured['bytes'] / 2**20:.2f} MiB, predicted {training['total_bytes'] / 2**20:.2f} MiB "
          f"(at '{training['moment']}'), measured/predicted {ratio:.3f}; the garbage collection freed "
          f"{measured['collected_bytes'] / 2**20:.2f} MiB")
    assert abs(ratio - 1) < 0.15


# ------------------------------------------------------------------------------------------------
# Switches, command line, errors
# ------------------------------------------------------------------------------------------------
SEVEN_B = memory.MODELS["Qwen2.5-Math-7B"]


def test_each_switch_moves_the_part_it_should():
    base = dict(stage="sft", loss="curio", gpus=8, token_budget=16384, loss_chunk=4096, global_batch=256)
    p = memory.plan(SEVEN_B, **base)
    parts = p["parts"]
    assert p["total_bytes"] == sum(parts.values()) and parts["teacher"] > 0 and parts["base"] == 0
    assert parts["parameters"] == 4 * p["params"] // 8 and parts["optimiser"] == 8 * p["params"] // 8
    assert memory.plan(SEVEN_B, **{**base, "gpus": 4})["parts"]["parameters"] == 2 * parts["parameters"]
    assert memory.plan(SEVEN_B, **{**base, "loss": "sft"})["parts"]["teacher"] == 0
    assert memory.plan(SEVEN_B, **{**base, "loss": "kl"})["parts"]["base"] > 0
    off = memory.plan(SEVEN_B, **{**base, "offload": True})
    assert off["parts"]["parameters"] == off["parts"]["optimiser"] == off["parts"]["teacher"] == 0
    chunk = memory.plan(SEVEN_B, **{**base, "loss_chunk": 1024})["phases"]["sft step"]
    full = p["phases"]["sft step"]["moments"]["loss backward"]
    # 3/4 of the chunk's bf16 logits and their gradient, [n, V] each (float32 work goes by blocks)
    assert chunk["moments"]["loss backward"] < full - 3 * 1024 * SEVEN_B["vocab_size"] * (2 + 2)
    no_ckpt = memory.plan(SEVEN_B, **{**base, "grad_ckpt": False})
    assert no_ckpt["total_bytes"] > 2 * p["total_bytes"] and not no_ckpt["fits"]
    one_step = memory.plan(SEVEN_B, **{**base, "global_batch": 8})          # one sequence per GPU: no accumulation
    assert one_step["micro_batches"] == 1 and one_step["total_bytes"] < p["total_bytes"]
    rl_run = dict(stage="rl", gpus=8, micro_batch=4, gpu_memory_utilization=0.4, mini_batch=64)
    awake = memory.plan(SEVEN_B, **rl_run, vllm_sleep=False)["phases"]
    asleep = memory.plan(SEVEN_B, **rl_run, vllm_sleep=True)["phases"]
    share = int(0.4 * memory.Run.gpu_gib * memory.GIB)
    assert awake["rl training"]["parts"]["vllm"] == share and asleep["rl training"]["parts"]["vllm"] == 0
    assert asleep["rl generation"]["parts"]["vllm"] == share
    # sft.py --eval_every: its validation engine awake beside the trainer's weights, AdamW states and teacher
    assert "sft validation" not in p["phases"]
    validating = memory.plan(SEVEN_B, **base, eval_every=59, gpu_memory_utilization=0.4)["phases"]["sft validation"]
    assert validating["parts"]["vllm"] == share and validating["moment"] == "sampling"
    assert validating["total_bytes"] == share + parts["parameters"] + parts["optimiser"] + parts["teacher"]
    offloaded = memory.plan(SEVEN_B, **base, eval_every=59, offload=True)["phases"]["sft validation"]
    assert offloaded["total_bytes"] == int(sft.Args().gpu_memory_utilization * memory.Run.gpu_gib * memory.GIB)


def run_cli(*argv):
    return subprocess.run([sys.executable, "bench/memory.py", *argv], cwd=REPO, capture_output=True, text=True,
                          timeout=300)


def test_command_line_json_is_the_plan_and_reads_config_json(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps(memory.MODELS["Qwen2.5-1.5B"]))
    flags = ["--stage", "sft", "--loss", "curio", "--gpus", "1", "--token_budget", "8192", "--loss_chunk", "4096",
             "--json"]
    proc = run_cli("--model", str(tmp_path / "config.json"), *flags)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout)
    assert out["total_bytes"] == sum(out["parts"].values()) == out["phases"]["sft step"]["total_bytes"]
    want = memory.plan(memory.MODELS["Qwen2.5-1.5B"], model="Qwen2.5-1.5B", stage="sft", loss="curio", gpus=1,
                       token_budget=8192, loss_chunk=4096)
    assert out["parts"] == want["parts"] and out["run"]["seq_len"] == 8192


def test_presets_set_the_run_and_bad_input_is_one_clear_line(capsys):
    memory.main(["config/rl_paper.py", "--stage", "rl", "--model", "Qwen2.5-Math-7B", "--json"])
    run = json.loads(capsys.readouterr().out)["run"]
    preset = runpy.run_path("config/rl_paper.py")
    assert [run[k] for k in ("micro_batch", "loss_chunk", "gpu_memory_utilization")] == \
        [preset[k] for k in ("micro_batch", "loss_chunk", "gpu_memory_utilization")]
    assert run["token_budget"] == 4 * (1024 + 8192)
    memory.main(["config/sft_authors.py", "--model", "Qwen2.5-Math-7B", "--json"])   # validates: its engine's share
    authors = json.loads(capsys.readouterr().out)
    assert authors["peak_phase"] == "sft validation" and authors["fits"]
    assert authors["parts"]["vllm"] == int(0.8 * memory.Run.gpu_gib * memory.GIB)
    with pytest.raises(SystemExit, match="config/rl_paper.py sets RL fields .*add --stage rl"):
        memory.main(["config/rl_paper.py", "--model", "Qwen2.5-Math-7B"])
    with pytest.raises(SystemExit, match="--model Qwen-9B: neither a named shape"):
        memory.main(["--model", "Qwen-9B"])
    with pytest.raises(SystemExit, match="unknown loss 'curios'"):
        memory.main(["--model", "Qwen2.5-1.5B", "--loss", "curios"])
    with pytest.raises(ValueError, match=r"missing field\(s\) \['intermediate_size'\]"):
        memory.plan({k: v for k, v in SEVEN_B.items() if k != "intermediate_size"})


@pytest.mark.parametrize("gpus", [1, 2])
def test_the_small_presets_fit_one_or_two_gpus(gpus, capsys):
    """config/sft_small.py and config/rl_small.py after the paper's presets: Qwen2.5-Math-1.5B at the paper's lengths
    on 1-2 80 GB GPUs."""
    from plumbing.cli import parse_config

    for stage in ("sft", "rl"):
        presets = [f"config/{stage}_paper.py", f"config/{stage}_small.py"]
        memory.main([*presets, "--stage", stage, "--model", "Qwen2.5-Math-1.5B", "--gpus", str(gpus), "--json"])
        plan = json.loads(capsys.readouterr().out)
        assert plan["fits"] and plan["run"]["seq_len"] == 1024 + 8192, (stage, gpus, plan["total_bytes"] / 2**30)
        assert plan["run"]["loss_chunk"] == 2048                            # the small preset's, over the paper's
        args, = parse_config(sft.Args if stage == "sft" else rl.Args, argv=[*presets, "--model", "m",
                                                                            "--train_file", "t"])
        assert args.max_prompt_len + args.max_response_len <= 16384          # the 16k context data.py gives it
    assert memory.MODELS["Qwen2.5-Math-1.5B"] == memory.MODELS["Qwen2.5-1.5B"]
