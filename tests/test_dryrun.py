"""bench/dryrun.py: the trainers' own steps on simulated GPUs (fake CUDA tensors, a fake process group), run as the
command users run, in subprocesses. The paper's presets at 7B on 8 simulated GPUs, and each check shown to fail
when the thing it checks is broken once (on a small model, in one process that breaks and mends in turn)."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from demo.stage_process import StageProcess
from run_python import run_python

ROOT = Path(__file__).resolve().parents[1]
DRYRUN = str(ROOT / "bench" / "dryrun.py")


def test_paper_presets_run_on_8_simulated_gpus_within_10_percent_of_the_plan(library, tmp_path):
    """CurioSFT and one baseline with the paper's SFT preset, and GRPO with the paper's RL preset, at 7B on 8
    simulated GPUs, the three at once (two cores)."""
    runs = {"sft_curio": ["config/sft_paper.py", "--eval_every", "59"],     # with validation: its engine's share
            "sft_baseline": ["config/sft_paper.py", "--loss", "sft"],
            "rl_paper": ["config/rl_paper.py", "--eval_every", "20"]}
    procs = {name: StageProcess([sys.executable, DRYRUN, *argv, "--gpus", "8", "--json", tmp_path / name],
                                tmp_path / f"{name}.log", {}) for name, argv in runs.items()}    # forked launchers
    for name, proc in procs.items():
        code, out = proc.wait(timeout=900), (tmp_path / f"{name}.log").read_text()
        assert code == 0, f"{name}: {out[-3000:]}"
        r = json.loads((tmp_path / name).read_text())
        assert r["model"] == "Qwen/Qwen2.5-Math-7B" and r["gpus"] == 8 and r["steps_run"] == 2
        assert 0.9 <= r["ratio"] <= 1.1 and r["fits"] and r["margin_gib"] > 0, r
        assert r["form"] == "packed" and r["attention_kernel"] == "varlen", r     # the trainers' default
        # the trainer's own loop, sft.train / rl.train, with the schedule's every part in both steps
        assert r["checkpoints_written"] == [2] and "rollout engine" in r["seams"], r
        # one host read per optimiser step, the step's own (GRPO: and its engine check's and log record's),
        # none inside the micro-batch loop
        own = (["(read_step)"] if r["stage"] == "sft"
               else ["(engine_logp_diff)", "(policy_update)", "(step_record)"])
        assert r["syncs_per_step"] == len(own) and sorted(s[s.index("("):] for s in r["sync_sites"]) == own, r
        if r["stage"] == "sft":
            assert {"teacher update", "teacher forward"} <= set(r["est_ms_parts"]) or name == "sft_baseline", r
        # calibrated on one H200 (tests/test_roofline.py): an SFT step's MFU in the 20s at 7B, not the roofs' 44%
        assert 0.15 < r["mfu_est"] < 0.6 and r["est_ms_per_step"] > 1000 and r["flops_per_step"] > 1e15, r
        assert r["calibration"].startswith("calibrated on one H200") and r["est_ms_by_class"]["matmul"] > 0, r
        assert r["not_covered"] and "failed" not in r
        assert "peak per GPU, step 2: measured" in out and "a roofline estimate" in out
    curio, sft = (json.loads((tmp_path / name).read_text()) for name in ("sft_curio", "sft_baseline"))
    assert curio["loss"] == "curio" and json.loads((tmp_path / "rl_paper").read_text())["stage"] == "rl"
    # sft.py --eval_every ran after both steps, and the fit counts the planner's validation phase (vLLM awake)
    assert curio["validations"] == 2 and sft["validations"] == 0
    assert json.loads((tmp_path / "rl_paper").read_text())["validations"] == 2     # rl.py's, with its rollout engine
    share = 0.5 * curio["gpu_gib"]                                       # sft.py's --gpu_memory_utilization
    assert curio["peak_gib_planned_all_phases"] > share + 10 and share > curio["peak_gib_planned"], curio
    # the paper's cost claim, 1.25x SFT's step: one teacher forward against the student's three passes; in time,
    # calibrated, the teacher side's top-k (its radix passes at 6% of the memory's bandwidth on the H200) adds more
    assert 1.2 < curio["flops_per_step"] / sft["flops_per_step"] <= 1.27
    assert 1.2 < curio["est_ms_per_step"] / sft["est_ms_per_step"] <= 1.40
    assert 0.15 < curio["teacher_share"] < 0.30 and sft["teacher_share"] == 0



@pytest.mark.slow   # 4-5 min on 2 cores: CI runs the paper's presets' dry runs, this adds the hybrids' update
def test_table_3_hybrids_run_on_8_simulated_gpus_within_10_percent_of_the_plan(library, tmp_path):
    """LUFFY and RL-PLUS at 7B on 8 simulated GPUs with their presets: the expert's tokens and the
    entropy bonus with gradient (an extra pass over each chunk's logits) are in the planner's trace
    too, so measured and planned memory agree, and the update still reads the host once."""
    procs = {name: subprocess.Popen([sys.executable, DRYRUN, f"config/rl_{name}.py", "--gpus", "8",
                                     "--json", str(tmp_path / name), "--no_confirm"],
                                    cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                    text=True)
             for name in ("luffy", "plus")}
    for name, proc in procs.items():
        out = proc.communicate(timeout=900)[0]
        assert proc.returncode == 0, f"{name}: {out[-3000:]}"
        r = json.loads((tmp_path / name).read_text())
        assert r["loss"] == {"luffy": "luffy", "plus": "rl_plus"}[name] and r["gpus"] == 8
        assert 0.9 <= r["ratio"] <= 1.1 and r["fits"], r
        assert r["syncs_per_step"] == 3 and "failed" not in r      # the engine check's, update's, record's


BREAKS = r'''
import json, os, sys
from pathlib import Path
root, out, argv = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
sys.path[:0] = [root, root + "/bench"]
import sim_gpu
sim_gpu.preload(Path(os.environ[sim_gpu.LIB_ENV]))
import torch
import curio_loss as cl
import dryrun
import sft


def run(label, *flags):
    dryrun.rank_main(argv + [*flags, "--json", str(out / label)])


run("intact")

curio_sft_loss = cl.curio_sft_loss                  # a .cpu() slipped into the loss
cl.curio_sft_loss = lambda *a, **k: (lambda loss, diag: (loss.cpu(), diag))(*curio_sft_loss(*a, **k))
run("cpu_in_the_loss")
cl.curio_sft_loss = curio_sft_loss

shard_model = sft.shard_model                       # the teacher left unsharded, or computing in float32


def unsharded(m, device, bf16, grad_ckpt, trainable=True, **options):
    if trainable:
        return shard_model(m, device, bf16, grad_ckpt, trainable, **options)
    for module in m.modules():                      # full float32 tensors on the device, no FSDP
        for name, p in list(module.named_parameters(recurse=False)):
            setattr(module, name, torch.nn.Parameter(torch.empty(p.shape, device=device), requires_grad=False))
        for name, b in list(module.named_buffers(recurse=False)):
            module.register_buffer(name, torch.empty(b.shape, dtype=b.dtype, device=device), persistent=False)
    m.reshard = lambda: None                        # as FSDP's, so that the step runs through
    return m


sft.shard_model = unsharded
run("unsharded_teacher")
sft.shard_model = lambda m, device, bf16, grad_ckpt, trainable=True, **options: shard_model(
    m, device, bf16 and trainable, grad_ckpt, trainable, **options)
run("float32_teacher")
sft.shard_model = shard_model

torch.backends.cuda.enable_flash_sdp(False)         # padded rows' attention on the math path
torch.backends.cuda.enable_mem_efficient_sdp(False)
run("math_attention", "--form", "padded")
torch.backends.cuda.enable_flash_sdp(True)
torch.backends.cuda.enable_mem_efficient_sdp(True)

curio_sft_loss = cl.curio_sft_loss                  # a host read slipped into the loss


def item_in_the_loss(*args, **kwargs):
    loss, diag = curio_sft_loss(*args, **kwargs)
    print("a chunk's loss:", loss.sum().item())
    return loss, diag


cl.curio_sft_loss = item_in_the_loss
run("item_in_the_loss")
cl.curio_sft_loss = curio_sft_loss

teacher_log_prob = cl.teacher_log_prob              # a wasteful teacher side: a second full-vocabulary softmax


def wasteful(z, y, cfg=cl.LossConfig()):
    lq, diag = teacher_log_prob(z, y, cfg)
    return lq + 0 * torch.softmax(z.float(), -1).amax(-1), diag


cl.teacher_log_prob = wasteful
run("wasteful_teacher")
cl.teacher_log_prob = teacher_log_prob

plan = dryrun.memory.plan                           # the planner off by 20%


def plan_off(*args, **kwargs):
    result = plan(*args, **kwargs)
    for phase in result["phases"].values():
        phase["total_bytes"] = int(phase["total_bytes"] * 1.2)
    return result


dryrun.memory.plan = plan_off
run("planner_off")
'''


def tiny_model(tmp_path) -> Path:
    """A model directory with a config.json only: a 2-layer Qwen2 of vocabulary 8192 (the dry run reads no
    weights)."""
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "model_type": "qwen2", "architectures": ["Qwen2ForCausalLM"], "hidden_size": 256, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "intermediate_size": 512, "vocab_size": 8192,
        "tie_word_embeddings": False, "max_position_embeddings": 4096}))
    return model


@pytest.mark.slow
def test_each_check_fails_when_what_it_checks_is_broken(library, tmp_path):
    model = tiny_model(tmp_path)
    argv = ["config/sft_paper.py", "--model", str(model), "--max_prompt_len", "64", "--max_response_len", "448",
            "--token_budget", "1024", "--loss_chunk", "256", "--gpus", "2"]
    env = dict(os.environ, CURIOSFT_SIM_GPU_LIB=library)
    done = subprocess.run([sys.executable, "-c", BREAKS, str(ROOT), str(tmp_path), json.dumps(argv)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    result = {p.name: json.loads(p.read_text()) for p in tmp_path.iterdir() if p.is_file()}
    intact = result["intact"]
    assert "failed" not in intact and 0.9 <= intact["ratio"] <= 1.1, intact
    assert intact["attention_kernel"] == "varlen" and intact["form"] == "packed", intact
    assert result["cpu_in_the_loss"]["failed"].startswith("devices: a tensor moved to the host"), result
    assert "sft.py" in result["cpu_in_the_loss"]["failed"]                  # the line that asked for it
    assert result["unsharded_teacher"]["failed"].startswith("sharding: the teacher's model.embed_tokens.weight is "
                                                            "not sharded"), result["unsharded_teacher"]
    assert result["float32_teacher"]["failed"].startswith("sharding: the teacher computes in None")
    assert result["math_attention"]["failed"].startswith("attention: {'math'"), result["math_attention"]
    assert result["planner_off"]["failed"].startswith("memory: "), result["planner_off"]
    assert result["planner_off"]["ratio"] == pytest.approx(intact["ratio"] / 1.2, abs=1e-3)    # the plan's 20%
    # the sync counter: an .item() per loss chunk, named by the line that asked for it
    item = result["item_in_the_loss"]
    assert intact["syncs_per_step"] == 1 and item["failed"].startswith("syncs: "), item
    assert item["syncs_per_step"] > 2 and any("sft.py" in site and "chunk_loss" in site for site in item["sync_sites"])
    # the roofline: the extra softmax costs the teacher side at least one more write and read of the logits
    extra = intact["micro_batch"]["trained"] * 2 * 8192 * 4 * 2 / 3.35e12 * 1e3      # ms
    waste = result["wasteful_teacher"]
    assert waste["est_ms_parts"]["teacher loss"] >= intact["est_ms_parts"]["teacher loss"] + extra, waste
    assert waste["est_ms_per_step"] > intact["est_ms_per_step"] and waste["flops_per_step"] == intact["flops_per_step"]


@pytest.mark.slow
def test_preflight_names_the_largest_budget_that_fits_and_confirms_it(library, tmp_path):
    """The command users run before renting GPUs: settings that do not fit the given memory, the largest token
    budget that does by the planner, confirmed by a second dry run, and the ratios to the SFT baseline."""
    model = tiny_model(tmp_path)
    out = tmp_path / "preflight.json"
    done = run_python([DRYRUN, "config/sft_paper.py", "--model", model, "--max_prompt_len", "64",
                       "--max_response_len", "960", "--token_budget", "4096", "--loss_chunk", "256", "--gpus", "2",
                       "--gpu_gib", "0.13", "--compare_losses", "sft", "--json", out])
    r = json.loads(out.read_text())
    assert done.returncode == 1 and not r["fits"] and r["failed"].startswith("fits: "), done.stdout[-3000:]
    assert r["fitting"]["flag"] == "--token_budget" and r["fitting"]["value"] in (1024, 2048, 3072), r["fitting"]
    assert r["fitting"]["confirmed"]["fits"] is True, r["fitting"]
    assert f"--token_budget {r['fitting']['value']} does by the planner" in done.stdout
    assert "confirmed: fits" in done.stdout and "curio / sft: FLOPs" in done.stdout
    assert r["compare"]["sft"]["flops_ratio"] > 1 and r["compare"]["sft"]["est_ms_ratio"] > 1


# a host read or a move to the host slipped into a trainer's loop: (file, the line after which it is added, the line)
SLIPS = {"sft_float_before_all_reduce": ("sft.py", "    grad_norm = clip_grad_norm(model, args.grad_clip)\n",
                                         "    print('grad norm', float(grad_norm))\n"),
         "sft_cpu_between_micro_batches": ("sft.py", "        loss += total.detach()\n",
                                           "        print('micro-batch loss', total.detach().cpu())\n"),
         "rl_float_between_micro_batches": ("rl.py", "        policy_loss_sum = total.detach()\n",
                                            "        print('micro-batch loss', float(policy_loss_sum))\n"),
         "rl_cpu_after_the_step": ("rl.py", "        grad_norms.append(grad_norm)\n",
                                   "        print('old log-probs', mbs[0].old_lp.cpu())\n")}
SLIPPED = r'''
import json, os, sys
from pathlib import Path
root, out, runs = sys.argv[1], Path(sys.argv[2]), json.loads(sys.argv[3])
sys.path[:0] = [root, root + "/bench"]
import sim_gpu
sim_gpu.preload(Path(os.environ[sim_gpu.LIB_ENV]))
import dryrun
for label, argv in runs.items():
    dryrun.rank_main(argv + ["--json", str(out / label)])
'''


def copy_with_slips(src: Path, dst: Path, slips: list[str]) -> dict:
    """The project's code and presets copied to dst with the slips added: {slip: its line number}."""
    import shutil

    dst.mkdir()
    for name in ("plumbing", "bench", "config"):
        shutil.copytree(src / name, dst / name, ignore=shutil.ignore_patterns("__pycache__"))
    for path in src.glob("*.py"):
        shutil.copy(path, dst / path.name)
    lines = {}
    for slip in slips:
        name, after, line = SLIPS[slip]
        text = (dst / name).read_text()
        assert text.count(after) == 1, (slip, after)
        text = text.replace(after, after + line)
        (dst / name).write_text(text)
        lines[slip] = f"{name}:{text[: text.index(after + line) + len(after)].count(chr(10)) + 1}"
    return lines


@pytest.mark.slow       # ~3.5 min on 2 shared cores; in CI the paper presets' exact sync sites catch a slip
def test_a_host_read_or_move_added_to_a_trainers_loop_fails_naming_its_line(library, tmp_path):
    """sft.train and rl.train themselves run in the dry run: a float() or a .cpu() added to either loop (between
    micro-batches, before the all-reduce, after the step) fails it, naming the added line; the code as it is
    passes (test_paper_presets_...). Two copies of the project, each with one slip in each trainer."""
    model = tiny_model(tmp_path)
    small = ["--model", str(model), "--max_prompt_len", "64", "--max_response_len", "448", "--loss_chunk", "256",
             "--gpus", "2"]
    env = dict(os.environ, CURIOSFT_SIM_GPU_LIB=library)
    procs, where = [], {}
    for k, (sft_slip, rl_slip) in enumerate([("sft_float_before_all_reduce", "rl_cpu_after_the_step"),
                                             ("sft_cpu_between_micro_batches", "rl_float_between_micro_batches")]):
        root = tmp_path / f"copy{k}"
        where |= copy_with_slips(ROOT, root, [sft_slip, rl_slip])
        runs = {sft_slip: ["config/sft_paper.py", "--token_budget", "1024", *small],
                rl_slip: ["config/rl_paper.py", *small]}
        procs.append(subprocess.Popen([sys.executable, "-c", SLIPPED, str(root), str(tmp_path), json.dumps(runs)],
                                      cwd=root, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for proc in procs:
        out = proc.communicate(timeout=900)[0]
        assert proc.returncode == 0, out[-3000:]
    for slip, line in where.items():
        failed = json.loads((tmp_path / slip).read_text()).get("failed", "")
        assert line in failed and (failed.startswith("syncs: ") or failed.startswith("devices: ")), (slip, line,
                                                                                                     failed)
        print(slip, "->", failed)
