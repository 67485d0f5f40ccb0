"""bench/: the GPU check's smoke run on CPU (every row of its summary, three files in --out, the summary written
after every part), and the pieces of its arithmetic and plumbing: model FLOPs against a FLOP count of a real forward
and backward, the datasheet peaks, the memory planner's command line, and what a missing math-verify, a crashed or a
hanging stage does to the summary."""
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))
import gpu_check  # noqa: E402
import sft_step  # noqa: E402


@pytest.fixture(scope="module")
def smoke(tmp_path_factory):
    """`bash bench/gpu_check.sh --smoke` once: (exit status, output, summary.json, summary.md, --out, and the versions
    of (summary.json, summary.md) seen in --out while the check ran, polled every 0.2 s)."""
    import os
    import signal
    import time

    out = tmp_path_factory.mktemp("gpu_check")
    log = tmp_path_factory.mktemp("gpu_check_log") / "output.txt"

    def written():
        """The files as they are: written whole (md, then json), so each version is what a kill would leave. md
        read again after json: unchanged, the two belong together."""
        try:
            md, summary = (out / "summary.md").read_text(), (out / "summary.json").read_text()
            return (summary, md) if (out / "summary.md").read_text() == md else None
        except FileNotFoundError:
            return None

    seen = []

    def note():
        if (state := written()) and (not seen or state[0] != seen[-1][0]):
            seen.append(state)

    with open(log, "w") as sink:
        proc = subprocess.Popen(["bash", "bench/gpu_check.sh", "--smoke", "--out", str(out)], cwd=ROOT, stdout=sink,
                                stderr=subprocess.STDOUT, start_new_session=True)
        try:
            deadline = time.time() + 900
            while proc.poll() is None and time.time() < deadline:
                note()
                time.sleep(0.2)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    note()                                                      # --out as the check left it: the last version
    summary, md = (json.loads(seen[-1][0]), seen[-1][1]) if seen else (None, "")
    return proc.returncode, log.read_text(), summary, md, out, seen


def test_smoke_run_fills_every_row_with_a_finite_number(smoke):
    rc, output, summary, md, *_ = smoke
    assert rc == 0, output[-4000:]
    rows = {(r["section"], r["figure"]): r for r in summary["rows"]}
    beside = sft_step.forms.OLD                  # the smoke's --beside: compiling takes minutes on a CPU
    expected = {("SFT step", f) for f, _ in gpu_check.sft_figures(beside)}
    expected |= {("teacher side", f) for f, _ in gpu_check.TEACHER_FIGURES}
    expected |= {("bf16 error", f) for f, _ in gpu_check.BF16_FIGURES}
    expected |= {("evaluate.py", f) for f, _ in gpu_check.EVAL_FIGURES}
    expected |= {("rl.py", f) for f, _ in gpu_check.RL_FIGURES}
    expected |= {("check", "gpu_check wall time")}
    assert set(rows) == expected
    # CPU has no allocator statistics: the measured peaks (and so the planner ratio) are the only figures left out,
    # and the planner's prediction while bench/memory.py does not exist
    not_on_cpu = {("SFT step", f"{v} {what}") for v in sft_step.VARIANTS
                  for what in ("peak memory", "measured / planned", f"peak memory, {beside}")}
    not_on_cpu |= {("teacher side", f) for f, _ in gpu_check.COMPILED_TEACHER_FIGURES}
    if not (ROOT / "bench" / "memory.py").exists():
        not_on_cpu |= {("SFT step", f"{v} planner prediction") for v in sft_step.VARIANTS}
        assert rows[("SFT step", "sft planner prediction")]["note"] == "planner: not available"
    for key, r in rows.items():
        if key in not_on_cpu:
            assert r["value"] is None and r["status"] in ("n/a", "–"), key
        else:
            assert isinstance(r["value"], (int, float)) and math.isfinite(r["value"]) and r["value"] > 0, (key, r)
    for section, figure in expected:                                  # the table shows every row, and the versions
        assert f"| {section} | {figure} |" in md
    assert f"torch {torch.__version__}" in md and "transformers" in md and summary["crashed"] == []


def test_smoke_run_leaves_three_files_in_out(smoke, tmp_path):
    """A lent machine sends back at most 8 files: --out gets summary.md, summary.json and one archive of the logs,
    which holds every part's log; the toy data and the runs went to a scratch folder, deleted."""
    import tarfile

    out = Path(smoke[4])
    assert sorted(p.name for p in out.iterdir()) == ["logs.tar.gz", "summary.json", "summary.md"]
    with tarfile.open(out / "logs.tar.gz") as tar:
        names = {Path(n).name: n for n in tar.getnames()}
        assert {"sft_step.log", "toy_data.log", "evaluate.log", "rl.log"} <= names.keys()
        sft_log = tar.extractfile(names["sft_step.log"]).read().decode()
    # the SFT figures are sft.train's own: its log lines, a run of 1 + teacher_every steps per variant and form
    assert sft_log.count(f"step {sft_step.TEACHER_EVERY + 1} epoch") == 2 * len(sft_step.VARIANTS)


def test_smoke_run_figures_agree_with_each_other(smoke):
    rows = {r["figure"]: r for r in smoke[2]["rows"]}
    ratio = rows["curio / sft step time"]
    curio, base = rows["curio step time"]["value"], rows["sft step time"]["value"]
    assert ratio["value"] == pytest.approx(curio / base)
    assert ratio["status"] == ("PASS" if ratio["value"] <= 1.25 else "MISS")
    assert rows["sft MFU"]["status"] == ("PASS" if rows["sft MFU"]["value"] >= 0.40 else "MISS")
    assert rows["curio MFU"]["value"] == pytest.approx(rows["sft MFU"]["value"] * base / curio)  # same FLOPs
    parts = sum(rows[f"rl.py {p}"]["value"] for p in ("generation", "reward", "training", "weight sync"))
    assert rows["rl.py step time"]["value"] == pytest.approx(parts)
    old = rows[f"sft step time, {sft_step.forms.OLD}"]["value"]
    assert rows[f"sft {sft_step.forms.OLD} / packed"]["value"] == pytest.approx(old / base)
    teacher = rows["bisection / logsumexp"]["value"]
    assert teacher == pytest.approx(rows["teacher_log_prob (bisection)"]["value"] / rows["logsumexp pass"]["value"])


def test_model_flops_match_a_flop_count_of_forward_and_backward():
    """FlopCounterMode counts every matmul of a real forward + backward (eager attention: its two matmuls over all
    T^2 pairs, so twice the causal count the MFU uses); lm_head on the last 20 positions of each sequence, as
    chunked_logits applies it only to the trained ones."""
    from torch.utils.flop_counter import FlopCounterMode
    from transformers import AutoModelForCausalLM

    for tied in (False, True):
        shape = dict(hidden=64, layers=3, heads=4, kv_heads=2, inter=96, vocab=100, tied=tied, max_pos=128)
        model = AutoModelForCausalLM.from_config(sft_step.qwen2_config(shape, 48), attn_implementation="eager")
        ids = torch.randint(0, shape["vocab"], (2, 48))
        with FlopCounterMode(display=False) as counter:
            model(input_ids=ids, logits_to_keep=20).logits.sum().backward()
        flops = sft_step.model_flops(shape, [48, 48], trained=2 * 20)
        assert counter.get_total_flops() == flops["layers"] + flops["lm_head"] + 2 * flops["attention"]
        assert flops["total"] == flops["layers"] + flops["lm_head"] + flops["attention"]


def test_datasheet_peaks_by_device_name():
    assert sft_step.datasheet_peak_tflops("NVIDIA H100 80GB HBM3") == 989.0     # SXM
    assert sft_step.datasheet_peak_tflops("NVIDIA H100 PCIe") == 756.0          # not the SXM figure
    assert sft_step.datasheet_peak_tflops("NVIDIA H100 NVL") == 835.0
    assert sft_step.datasheet_peak_tflops("NVIDIA H200") == 989.0
    assert sft_step.datasheet_peak_tflops("NVIDIA A100-SXM4-80GB") == 312.0
    assert sft_step.datasheet_peak_tflops("NVIDIA GeForce RTX 4090") is None    # measured instead
    assert sft_step.peak_tflops(torch.device("cpu"), torch.float32, 123.0) == (123.0, "--peak_tflops")
    rate, source = sft_step.peak_tflops(torch.device("cpu"), torch.float32, None)
    assert rate > 0 and source.startswith("measured")


FAKE_PLANNER = """import json, sys
with open(sys.argv[0] + ".calls", "a") as f:
    f.write(json.dumps(sys.argv[1:]) + "\\n")
if "--help" in sys.argv:
    print("usage: memory.py [--bf16 | --no-bf16] ...")
elif "--fail" in sys.argv[0]:
    sys.exit("memory.py: error: unknown model")
else:
    print(json.dumps({"parts": {"parameters": 1}, "phases": {"sft": 2}, "total_bytes": 123456789}))
"""


def test_planner_gets_the_agreed_command_line(tmp_path):
    planner, config = tmp_path / "memory.py", tmp_path / "config.json"
    planner.write_text(FAKE_PLANNER)
    total, note = sft_step.planner_prediction(planner, config, "curio", 8192, 4096, 3000, 4096,
                                              {"bf16": False, "grad_ckpt": True})
    assert total == 123456789
    calls = [json.loads(line) for line in (tmp_path / "memory.py.calls").read_text().splitlines()]
    assert calls[-1] == ["--model", str(config), "--stage", "sft", "--loss", "curio", "--gpus", "1",
                         "--token_budget", "8192", "--seq_len", "4096", "--trained_tokens", "3000",
                         "--loss_chunk", "4096", "--json", "--no-bf16"]
    assert "grad_ckpt" in note                         # not in its --help: the planner's own default is used
    absent = sft_step.planner_prediction(tmp_path / "absent.py", config, "sft", 1, 1, 1, 1, {})
    assert absent == (None, "planner: not available")
    failing = tmp_path / "memory--fail.py"
    failing.write_text(FAKE_PLANNER)
    assert sft_step.planner_prediction(failing, config, "sft", 1, 1, 1, 1, {}) == (None, "planner failed: memory.py: "
                                                                                       "error: unknown model")


def test_missing_math_verify_skips_evaluate_and_rl_without_a_crash(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "math_verify", None)                   # import math_verify -> ImportError
    summary = gpu_check.Summary()
    assert gpu_check.toy_world(gpu_check.TOY["smoke"], tmp_path, summary, 60) is None
    assert {r["section"] for r in summary.rows} == {"evaluate.py", "rl.py"}
    assert all(r["status"] == "skipped" and "math-verify" in r["note"] for r in summary.rows)
    assert summary.crashed == [] and not (tmp_path / "toy").exists()


def test_a_crashed_stage_is_reported_and_fails_the_check(tmp_path):
    summary = gpu_check.Summary()
    wall = gpu_check.stage([sys.executable, "-c", "raise SystemExit('boom')"], tmp_path / "x.log", summary, "part",
                           [("figure", "s")], 60)
    assert wall is None and summary.crashed == ["part"]
    assert summary.rows == [dict(section="part", figure="figure", value=None, unit="s", target="", status="CRASH",
                                 note="exit 1; see logs.tar.gz: x.log")]
    assert "boom" in (tmp_path / "x.log").read_text()


def test_a_hanging_stage_is_killed_at_its_limit(tmp_path):
    """The stage and what it started (its process group) are killed at the part's limit."""
    summary = gpu_check.Summary()
    code = ("import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)']); "
            "print('started', flush=True); time.sleep(300)")
    t0 = __import__("time").perf_counter()
    wall = gpu_check.stage([sys.executable, "-c", code], tmp_path / "hang.log", summary, "part", [("figure", "s")], 3)
    assert wall is None and __import__("time").perf_counter() - t0 < 30 and summary.crashed == ["part"]
    assert summary.rows[0]["status"] == "TIMEOUT" and "killed after 3 s" in summary.rows[0]["note"]
    out = subprocess.run(["pgrep", "-f", "time.sleep\\(300\\)"], capture_output=True, text=True).stdout
    assert out.strip() == ""                                       # the grandchild went with it


def test_the_summary_is_written_after_every_part(smoke):
    """A check killed in the middle leaves the figures of the parts it finished: each version of --out seen while
    the smoke run went holds the parts in their order up to one, and one before the last part is seen."""
    order = ["SFT step", "teacher side", "bf16 error", "evaluate.py", "rl.py"]
    versions = [(json.loads(summary), md) for summary, md in smoke[5]]
    sections = [[s for s in order if any(r["section"] == s for r in summary["rows"])] for summary, _ in versions]
    assert all(done == order[:len(done)] for done in sections) and sections[-1] == order, sections
    partial = [i for i, done in enumerate(sections) if "rl.py" not in done]
    assert partial, sections
    summary, md = versions[partial[0]]
    assert all(r["value"] is not None for r in summary["rows"] if r["figure"].endswith("step time"))
    assert "| SFT step | sft step time |" in md and "| rl.py |" not in md


def test_the_dry_runs_speed_table_sets_each_loss_beside_table_2():
    import dryrun

    def run(ms, parts=None):
        return {"other": {"est_ms_per_step": ms, "est_ms_parts": parts or {}}}

    r = {"loss": "sft", "est_ms_per_step": 5520.0,
         "compare": {"curio": run(6990.0, {"teacher forward": 1200.0, "teacher logits": 250.0}),
                     "curio_fixed_tau": run(6890.0), "entropy_top20": run(6240.0)}}
    rows = {line.split(" | ")[0][2:]: line.split(" | ") for line in dryrun.speed_table(r) if line.startswith("| ")}
    assert rows["curio"][1:] == ["CurioSFT", "6.99", "1.266", "1.211", "53.9", "1.248 |"]
    # rebased as the paper's steps count: + a no-grad forward and head (verl's old log-probs) in both
    assert rows["curio_fixed_tau"][3:5] == ["1.248", f"{(6890 + 1450) / (5520 + 1450):.3f}"]
    assert rows["entropy_top20"][1] == "–" and rows["entropy_top20"][-1] == "– |"  # not in Table 2
    assert dryrun.speed_table(r | {"loss": "curio"}) == []                          # only against SFT
