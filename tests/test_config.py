"""cli.parse_config: presets and flags, with one-line errors that name the preset, setting or flag."""
from dataclasses import dataclass, fields
from typing import Literal

import pytest

from plumbing import cli, models
from run_python import run_python


@dataclass
class Demo:
    """demo settings"""
    REQUIRED = ("model",)
    model: str = ""
    """the model"""
    lr: float = 1e-5
    """learning rate"""
    epochs: int = 3
    """passes"""
    scratch: bool = False
    """from scratch"""
    loss: Literal["sft", "curio"] = "curio"
    """the loss"""
    cap: float | None = None
    """optional cap"""
    tags: list[str] = None
    """tags"""

    def __post_init__(self):
        cli.check_settings(self, positive=["lr", "cap"], at_least_one=["epochs"])


def parse(argv):
    return cli.parse_config(Demo, argv=argv, prog="demo.py")[0]


def test_flags_presets_and_negative_numbers(tmp_path):
    preset = tmp_path / "p.py"
    preset.write_text("lr = 3e-4\nepochs = 2\nscratch = True\nloss = 'sft'\n")
    cfg = parse([str(preset), "--model", "m", "--cap", "none", "--epochs", "5"])
    assert (cfg.lr, cfg.epochs, cfg.scratch, cfg.loss, cfg.cap) == (3e-4, 5, True, "sft", None)
    with pytest.raises(SystemExit, match=r"--lr -0.001: must be a finite number > 0"):
        parse(["--model", "m", "--lr", "-1e-3"])           # a value argparse alone would read as a flag


def test_presets_stand_anywhere_apply_in_order_and_lose_to_flags(tmp_path):
    first, second = tmp_path / "first.py", tmp_path / "second.py"
    first.write_text("lr = 3e-4\nepochs = 2\n")
    second.write_text("lr = 1e-3\nloss = 'sft'\n")
    expected = (1e-3, 5, "sft")                        # second's lr over first's; the flag's epochs over both
    for argv in ([str(first), str(second), "--model", "m", "--epochs", "5"],
                 ["--epochs", "5", str(first), "--model", "m", str(second)],
                 ["--model", "m", "--epochs", "5", str(first), str(second)],
                 ["--config", str(first), "--epochs", "5", f"--config={second}", "--model", "m"]):
        cfg = parse(argv)
        assert (cfg.lr, cfg.epochs, cfg.loss) == expected, argv
    assert parse(["--model", "net.py", str(first)]).model == "net.py"   # a flag's value is not a preset
    assert cli.split_presets(["--tags", "a", "b.py", "--scratch", "c.py"], [Demo]) == (["b.py", "c.py"],
                                                                                      ["--tags", "a", "--scratch"])


def test_a_preset_after_the_flags_of_a_stage_script(tmp_path):
    import curio_loss as cl
    import sft

    args, loss = cli.parse_config(sft.Args, cl.LossConfig, argv=["--loss", "curio", "config/sft_paper.py", "--model",
                                                                 "m", "--train_file", "t", "--alpha", "0.5"])
    assert (args.loss, args.global_batch, args.token_budget, loss.alpha) == ("curio", 256, 32768, 0.5)


def test_renamed_settings_name_the_new_one(tmp_path):
    import evaluate

    old = tmp_path / "eval_old.py"
    old.write_text("n = 8\n")
    with pytest.raises(SystemExit, match=f"preset {old}: setting 'n' was renamed 'n_samples'"):
        cli.parse_config(evaluate.Args, argv=[str(old), "--model", "m", "--data", "d"])
    for flag in (["--n", "8"], ["--n=8"]):
        with pytest.raises(SystemExit, match="--n: renamed --n_samples"):
            cli.parse_config(evaluate.Args, argv=["--model", "m", "--data", "d", *flag])
    args, = cli.parse_config(evaluate.Args, argv=["config/eval_paper.py", "--model", "m", "--data", "d"])
    assert args.n_samples == 8


def test_torchrun_passes_every_flag_of_the_stage_scripts_to_them():
    """torchrun's parser takes an abbreviation of its own flags from the script's arguments (--n for --nnodes):
    no flag of sft.py, rl.py or evaluate.py may be one (evaluate.py's plot, compare and tokens never run under
    torchrun: plot's --logs is one, of --logs_specs)."""
    from torch.distributed.run import get_args_parser

    import curio_loss as cl
    import evaluate
    import rl
    import sft

    flags = [f"--{f.name}" for cls in (sft.Args, cl.LossConfig, rl.Args, evaluate.Args)
             for f in fields(cls)]
    flags += [flag.replace("_", "-") for flag in flags]
    script_args = [word for flag in flags for word in (flag, "1")]
    parsed = get_args_parser().parse_args(["--nproc_per_node", "2", "evaluate.py", *script_args])
    assert parsed.training_script_args == script_args and parsed.nnodes == "1:1"


@pytest.mark.parametrize("line, message", [
    ("scratch = 'False'", r"scratch = 'False' is not of type bool"),
    ("epochs = 1.5", r"epochs = 1.5 is not of type int"),
    ("loss = 'dpo'", r"loss = 'dpo' is not of type"),
    ("lerning_rate = 1e-5", r"unknown setting 'lerning_rate'"),
])
def test_preset_values_of_the_wrong_type_name_the_preset(tmp_path, line, message):
    preset = tmp_path / "bad.py"
    preset.write_text(line + "\n")
    with pytest.raises(SystemExit, match=f"preset {preset}: {message}"):
        parse([str(preset), "--model", "m"])


@pytest.mark.parametrize("argv, message", [
    (["--model", "m", "--lr", "nan"], r"--lr nan: must be a finite number > 0"),
    (["--model", "m", "--epochs", "0"], r"--epochs 0: must be >= 1"),
    (["--model", "m", "--cap", "-2"], r"--cap -2.0: must be a finite number > 0"),
])
def test_out_of_range_values_name_the_flag(argv, message):
    with pytest.raises(SystemExit, match=message):
        parse(argv)


def test_choices_required_and_help(capsys):
    with pytest.raises(SystemExit):
        parse(["--model", "m", "--loss", "dpo"])
    assert "--loss: invalid choice: 'dpo'" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        parse([])
    assert "required: --model" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        parse(["--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and "demo settings:" in out and "(required) the model" in out
    assert "usage: demo.py [config/PRESET.py ...]" in out and "{sft,curio}" in out


def test_model_directory_errors_name_the_problem(tmp_path, tiny_model_dir):
    with pytest.raises(SystemExit, match="--model 'Qwen/Qwen2.5-Math-7B': no such directory"):
        models.check_model_dir("Qwen/Qwen2.5-Math-7B")      # itself never a hub lookup (resolve_model is)
    with pytest.raises(SystemExit, match="no config.json"):
        models.check_model_dir(str(tmp_path))
    (tmp_path / "config.json").write_text((tiny_model_dir / "config.json").read_text())
    with pytest.raises(SystemExit, match="no tokenizer files"):
        models.check_model_dir(str(tmp_path))
    models.check_model_dir(str(tiny_model_dir), weights=False)
    with pytest.raises(SystemExit, match=r"no \*.safetensors weights"):
        models.check_model_dir(str(tiny_model_dir))


def test_a_vocabulary_smaller_than_the_tokenizer_is_refused(tmp_path, tiny_model_dir):
    import json
    import shutil

    shutil.copytree(tiny_model_dir, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    (tmp_path / "m" / "config.json").write_text(json.dumps({**config, "vocab_size": 100}))
    with pytest.raises(SystemExit, match=r"the tokenizer has \d+ tokens but config.json's vocab_size is 100"):
        models.load_tokenizer(str(tmp_path / "m"))
    assert len(models.load_tokenizer(str(tiny_model_dir))) <= config["vocab_size"]


def test_user_errors_print_one_line_and_debug_shows_the_traceback(tmp_path, tiny_model_dir):
    import os

    bad = tmp_path / "train.jsonl"
    bad.write_text('{"data_source": "x"}\n')
    cmd = ["sft.py", "config/sft_tiny.py", "--model", tiny_model_dir, "--scratch", "--train_file", bad, "--out_dir",
           tmp_path / "out"]
    proc = run_python(cmd, timeout=120)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and len(lines) == 1 and lines[0].startswith("sft.py: error: ") and str(bad) in lines[0]
    debug = run_python(cmd, env={**os.environ, "CURIOSFT_DEBUG": "1"}, timeout=120)
    assert debug.returncode != 0 and "Traceback" in debug.stderr


@pytest.mark.parametrize("flag, value", [("tau_min", "2.0"), ("top_k", "0"), ("gamma", "nan")])
def test_loss_settings_out_of_range_name_the_flag(flag, value):
    import curio_loss as cl

    with pytest.raises(ValueError, match=f"--{flag} .*: out of range"):
        cli.parse_config(cl.LossConfig, argv=[f"--{flag}", value])
    cli.parse_config(cl.LossConfig, argv=[])            # the defaults pass


def test_loss_solver_lists_its_choices(capsys):
    import curio_loss as cl

    with pytest.raises(SystemExit):
        cli.parse_config(cl.LossConfig, argv=["--solver", "secant"])
    assert "--solver: invalid choice: 'secant'" in capsys.readouterr().err
