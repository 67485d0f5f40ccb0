"""Every setting a resumed run may change (sft.py's and rl.py's MAY_CHANGE_ON_RESUME, the --eval_* flags of
measure.VALIDATION_MAY_CHANGE among them) changes nothing it feeds: a run begun with another value of it,
stopped after step 2 and resumed with the reference's value, ends with the reference run's weights, checkpoint
counters (the engine check's floor among them), log.jsonl (timing fields aside), rollouts.jsonl and
val_samples.jsonl, bit for bit. A test per setting for sft.py and rl.py; with each hybrid, every setting changed
in one first part (one per kind of record it may change). The tests take the names from the lists themselves: a
setting added to a list without an entry in CHANGES (a value to begin with, and what it may change of the steps
run with it) fails here, and so does one whose change is not exact. Prefix-RFT's default schedule horizon, which
a changed --steps would move, has a test of its own.

All runs are in this process, one thread, with validation every step (its figures are compared too) and the
quick grader of tests/test_validation.py."""
import json
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

import curio_loss as cl
import measure
import rl
import sft
from plumbing import run_dir
from plumbing.cli import parse_config
from tests.conftest import toy_rows

pytestmark = pytest.mark.usefixtures("one_thread", "world_of_one")

STEPS, STOP = 3, 2                       # the reference's steps; the first part stops after STOP of them
# what the steps run with a changed setting may show: nothing (the default), fewer records kept (a subset of the
# reference's), other validation records (the training's unchanged)
KEPT, VALIDATION = "kept", "validation"
MOVED = "moved"                          # out_dir: the first part ran in another directory, then moved


@dataclass
class Change:
    value: object                        # the value the first part runs with
    may_differ: str | None = None        # KEPT, VALIDATION


# A value other than the reference's for every setting of measure.VALIDATION_MAY_CHANGE, the same in both
# scripts (the reference: --eval_every 1 --eval_n 1 --eval_temperature 0.6 --eval_top_p 0.95
# --eval_max_new_tokens 4 --eval_grading paper). They change only the val_* records of the steps run with them.
VALIDATION_CHANGES = {
    "eval_every": [Change(0, VALIDATION), Change(2, VALIDATION)], "eval_file": [Change("other", VALIDATION)],
    "eval_n": [Change(2, VALIDATION)], "eval_temperature": [Change(1.0, VALIDATION)],
    "eval_top_p": [Change(1.0, VALIDATION)], "eval_max_new_tokens": [Change(3, VALIDATION)],
    "eval_grading": [Change("authors", VALIDATION)]}
# Both scripts' own. Here some change nothing by construction: the HF engine takes no gpu_memory_utilization or
# vllm_sleep, the quick grader no grader_workers, a process group already made no dist_timeout_min, and sft.py's
# --engine auto is HF on a CPU (vLLM's validation: tests/test_vllm_cpu.py).
COMMON_CHANGES = {
    "out_dir": [Change(MOVED)], "save_every": [Change(1)], "keep_last": [Change(1)],
    "loggers": [Change(["tensorboard"])],            # a stand-in backend: the package is not a requirement
    "log_line": [Change("full")], "grad_ckpt": [Change(True)], "dist_timeout_min": [Change(5.0)],
    "gpu_memory_utilization": [Change(0.3)], "gen_batch_size": [Change(1)], "grader_workers": [Change(1)],
    "sync_bucket_mb": [Change(1)]}
SFT_CHANGES = {
    **COMMON_CHANGES, **VALIDATION_CHANGES,
    "max_steps": [Change(STOP), Change(5)],          # finished at step 2; stopped at 2 of 5 (every epoch's steps)
    "log_every": [Change(2, KEPT)], "engine": [Change("auto", VALIDATION)]}
RL_CHANGES = {
    **COMMON_CHANGES, **VALIDATION_CHANGES,
    "steps": [Change(STOP), Change(STEPS + 2)],      # finished at step 2; stopped at 2 of 5
    "vllm_sleep": [Change(False)], "engine_logp_tol": [Change(1e-3)],
    "log_rollouts": [Change(1, KEPT)]}


@pytest.fixture(scope="module")
def eval_files(tmp_path_factory):
    folder = tmp_path_factory.mktemp("eval")
    for name, seed in (("val", 7), ("other", 8)):
        (folder / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in toy_rows(2, seed=seed)))
    return folder


@pytest.fixture(autouse=True)
def quick_grader_and_stand_ins(monkeypatch):
    """tests/test_validation.py's grader, a logger backend that records nothing, and a stop request that
    test_*'s first parts arm: after step STOP the run saves and leaves as after SIGTERM (here by raising
    Stopped, where the script would exit)."""
    monkeypatch.setattr(measure, "grade", lambda texts, *args: ([float(len(t) % 2) for t in texts], 0))
    monkeypatch.setattr(rl, "grade", lambda texts, *args: ([float(len(t) % 2) for t in texts], 0))
    monkeypatch.setattr(run_dir, "_open_backend", lambda *args: (lambda record: None))

    def leave(out_dir, step, name, log):
        if log is not None:
            log.close()
        run_dir.release()
        raise Stopped(step)
    monkeypatch.setattr(run_dir, "leave_after_signal", leave)


class Stopped(Exception):
    pass


class StopAfter:
    """StopSignal asked once per step (one optimiser step per data batch here): yes after step `step`."""

    def __init__(self, step=None):
        self.step, self.asked, self.name = step, 0, "SIGTERM"

    def requested(self, device):
        self.asked += 1
        return self.asked == self.step


def toy_reward(samples, examples):
    """tests/test_rl.py's: the share of response tokens whose id is a multiple of 4 (the updates move)."""
    return [sum(t % 4 == 0 for t in s.token_ids) / len(s.token_ids) for s in samples], 0


HYBRID_PRESETS = {"none": [], "luffy": ["config/rl_luffy.py"], "rl_plus": ["config/rl_plus.py"],
                  "prefix_rft": ["config/rl_paper.py", "config/rl_prefix_rft.py"]}


def args_of(trainer, out, paths, **changed):
    """(script module, its settings, loss settings or None) of the reference run into `out`, with `changed`."""
    common = ["--out_dir", str(out), "--eval_every", "1", "--eval_file", str(paths["eval"]), "--eval_n", "1",
              "--eval_max_new_tokens", "4", "--gen_batch_size", "2", "--grader_workers", "2",
              "--save_every", "0", "--system_prompt", "paper"]
    if trainer == "sft":
        module = sft
        args, cfg = parse_config(sft.Args, cl.LossConfig, argv=[
            "config/sft_tiny.py", "--model", str(paths["model"]), "--scratch", "--train_file", str(paths["train"]),
            "--max_steps", str(STEPS), "--token_budget", "1024", *common])
    else:
        module, cfg = rl, None
        (args,) = parse_config(rl.Args, argv=[
            *HYBRID_PRESETS[trainer], "config/rl_tiny.py", "--model", str(paths["model"]), "--train_file",
            str(paths["train"]), "--steps", str(STEPS), "--prompts_per_step", "2", "--rollouts", "2",
            "--mini_batch", "1", "--micro_batch", "4", "--max_response_len", "6", "--lr", "1e-2", "--engine", "hf",
            "--log_rollouts", "2", *common,           # prefix_rft: a horizon that no --steps moves
            *(["--prefix_schedule_steps", str(STEPS)] if trainer == "prefix_rft" else [])])
    for name, value in changed.items():
        setattr(args, name, str(paths["other"]) if name == "eval_file" else value)
    return module, args, cfg


def train(trainer, out, paths, stop_after=None, **changed):
    module, args, cfg = args_of(trainer, out, paths, **changed)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(module, "StopSignal", lambda: StopAfter(stop_after))
        try:
            if trainer == "sft":
                sft.train(args, cfg, torch.device("cpu"))
            else:
                rl.train(args, torch.device("cpu"), reward_fn=toy_reward)
        except Stopped:
            pass


def records(path: Path) -> list[dict]:
    """A JSONL file's records, timing fields left out."""
    if not path.exists():
        return []
    return [{k: v for k, v in json.loads(line).items() if not k.endswith("_s") and k != "tokens_per_s"}
            for line in path.read_text().splitlines()]


def outcome(out: Path) -> dict:
    final = out / f"step_{STEPS:06d}"
    return {"weights": (final / "model.safetensors").read_bytes(), "state": json.loads((final / "state.json")
                                                                                      .read_text()),
            **{name: records(out / name) for name in ("log.jsonl", "rollouts.jsonl", "val_samples.jsonl")}}


def assert_as_the_reference(got: dict, want: dict, may_differ: str | None, what: str):
    """The resumed run's outcome against the reference's: the weights and checkpoint counters equal; every
    record of the steps after STOP equal; those of the steps up to STOP equal, or, as may_differ allows, a
    subset (KEPT) or equal but for validation's (VALIDATION)."""
    assert got["weights"] == want["weights"], f"{what}: other weights"
    assert got["state"] == want["state"], what
    for name in ("log.jsonl", "rollouts.jsonl", "val_samples.jsonl"):
        if not want[name]:                                 # sft.py writes no rollouts.jsonl
            assert not got[name], f"{what}: {name}"
            continue
        after = [[r for r in run[name] if r["step"] > STOP] for run in (got, want)]
        assert after[0] == after[1], f"{what}: {name}, the steps after the resume"
        before = [[r for r in run[name] if r["step"] <= STOP] for run in (got, want)]
        if may_differ == KEPT:
            assert before[0] and all(r in before[1] for r in before[0]), f"{what}: {name}, kept records"
        elif may_differ == VALIDATION:
            trained = [[r for r in b if not any(k.startswith("val_") for k in r)] for b in before]
            if name != "val_samples.jsonl":
                assert trained[0] == trained[1], f"{what}: {name}, the training's records"
        else:
            assert before[0] == before[1], f"{what}: {name}, the steps before the resume"


@pytest.fixture(scope="module")
def paths(tiny_model_dir, toy_sft_file, checkpoint, eval_files):
    return {"model": checkpoint, "scratch_model": tiny_model_dir, "train": toy_sft_file,
            "eval": eval_files / "val.jsonl", "other": eval_files / "other.jsonl"}


@pytest.fixture(scope="module")
def reference(paths, tmp_path_factory):
    """One uninterrupted run per trainer, made on first use (inside a test: with its stand-ins)."""
    made = {}

    def get(trainer):
        if trainer not in made:
            out = tmp_path_factory.mktemp(f"reference_{trainer}")
            train(trainer, out, paths_for(trainer, paths))
            made[trainer] = outcome(out)
        return made[trainer]
    return get


def paths_for(trainer, paths):
    return {**paths, "model": paths["scratch_model"]} if trainer == "sft" else paths


def changes_of(trainer, name) -> list[Change]:
    table = SFT_CHANGES if trainer == "sft" else RL_CHANGES
    assert name in table, (f"{name} may change on resume ({trainer}) but tests/test_resume_settings.py has no "
                           f"value to check that it changes nothing: add one to its CHANGES")
    return table[name]


def check(trainer, changes: dict[str, Change], may_differ, reference, paths, tmp_path):
    """A first part with `changes`, stopped after step STOP, resumed with the reference's settings: as the
    reference (assert_as_the_reference)."""
    out = tmp_path / "run"
    first = tmp_path / "first" if "out_dir" in changes else out
    changed = {name: c.value for name, c in changes.items() if c.value != MOVED}
    train(trainer, first, paths_for(trainer, paths), stop_after=STOP, **changed)
    what = " ".join(f"--{name} {value!r}" for name, value in changed.items()) or "--out_dir"
    assert (first / f"step_{STOP:06d}").is_dir(), f"{what}: the first part saved no step {STOP}"
    if first != out:
        shutil.move(first, out)
    train(trainer, out, paths_for(trainer, paths))                   # the reference's settings
    assert_as_the_reference(outcome(out), reference(trainer), may_differ, what)
    shutil.rmtree(tmp_path)


def test_every_setting_a_resume_may_change_has_an_entry_here_and_no_stale_one():
    assert SFT_CHANGES.keys() == sft.MAY_CHANGE_ON_RESUME
    assert RL_CHANGES.keys() == rl.MAY_CHANGE_ON_RESUME
    assert VALIDATION_CHANGES.keys() == measure.VALIDATION_MAY_CHANGE


@pytest.mark.parametrize("name", sorted(sft.MAY_CHANGE_ON_RESUME))
def test_a_setting_sft_may_change_on_resume_changes_nothing_else(name, reference, paths, tmp_path):
    for change in changes_of("sft", name):
        check("sft", {name: change}, change.may_differ, reference, paths, tmp_path)


@pytest.mark.parametrize("name", sorted(rl.MAY_CHANGE_ON_RESUME))
def test_a_setting_rl_may_change_on_resume_changes_nothing_else(name, reference, paths, tmp_path):
    for change in changes_of("none", name):
        check("none", {name: change}, change.may_differ, reference, paths, tmp_path)


@pytest.mark.parametrize("hybrid", ["luffy", "rl_plus", "prefix_rft"])
def test_the_settings_rl_may_change_on_resume_change_nothing_else_with_each_hybrid(hybrid, reference, paths,
                                                                                    tmp_path):
    """As above, each hybrid with every setting of the list changed in one first part, those that may change
    the same records together (one run per kind, and per value where a setting has several): what makes a
    setting inexact with a hybrid alone fails here (and without one, above, naming the setting)."""
    table = {name: changes_of(hybrid, name) for name in rl.MAY_CHANGE_ON_RESUME}
    for may_differ in (None, KEPT, VALIDATION):
        group = {name: values for name, values in table.items() if values[0].may_differ == may_differ}
        for i in range(max(map(len, group.values()))):
            changes = {name: values[min(i, len(values) - 1)] for name, values in group.items()}
            check(hybrid, changes, may_differ, reference, paths, tmp_path)


def test_prefix_rft_keeps_the_schedule_horizon_it_started_with(reference, paths, tmp_path, capsys):
    """--hybrid prefix_rft with --prefix_schedule_steps 0: the schedule spans the --steps the run started with,
    recorded in run_config.json. A run finished at step 2 and taken on to 3, and one stopped after step 2 of 5
    and resumed to 3, each end as one run straight to 3 with --prefix_schedule_steps 2, or 5, would; one straight
    to 3 with the default (a horizon of 3) ends elsewhere: the horizon is what makes them differ. Responses of up
    to 28 tokens, so that a prefix's length follows its ratio."""
    def run(out, steps, stop_after=None, horizon=0):
        train("prefix_rft", out, paths, stop_after, steps=steps, prefix_schedule_steps=horizon,
              max_response_len=28)

    def ended(out):
        return outcome(out) | {"config": json.loads((out / "run_config.json").read_text())["prefix_schedule_steps"]}

    straight = {}
    for horizon in (2, 5, 0):
        run(tmp_path / f"straight{horizon}", STEPS, horizon=horizon)
        straight[horizon] = ended(tmp_path / f"straight{horizon}")
    assert straight[0]["config"] == STEPS and straight[0]["weights"] != straight[2]["weights"]
    for first_steps, stop_after in ((STOP, None), (5, STOP)):
        out = tmp_path / f"on_from_{first_steps}"
        run(out, first_steps, stop_after)
        capsys.readouterr()
        run(out, STEPS)
        assert (f"--hybrid prefix_rft: the prefix schedule spans {first_steps} steps, the --steps the run started "
                f"with (run_config.json), not --steps {STEPS}") in capsys.readouterr().out
        got = ended(out)
        assert got["config"] == first_steps
        assert_as_the_reference(got, straight[first_steps], None, f"--steps {first_steps}, then {STEPS}")
