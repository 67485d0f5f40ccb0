"""--model org/name: a Hugging Face hub id is downloaded into the hub's cache (huggingface_hub.snapshot_download,
replaced here: nothing is downloaded in tests) or, with HF_HUB_OFFLINE=1, found there; a missing local path stays an
error; no code is ever downloaded; every stage script takes the id."""
import inspect
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import huggingface_hub
import pytest
import transformers

import evaluate as ev
from plumbing import models
from test_evaluate import _write_benchmarks, checkpoint  # noqa: F401 (a fixture)

REPO = Path(__file__).resolve().parents[1]


def hub_cache(root: Path, repo_id: str, model_dir) -> Path:
    """A Hugging Face cache holding repo_id's snapshot (refs/main -> snapshots/<commit>/), as a download leaves it."""
    cache = root / "hub"
    storage = cache / f"models--{repo_id.replace('/', '--')}"
    shutil.copytree(model_dir, storage / "snapshots" / "0123abcd")
    (storage / "refs").mkdir()
    (storage / "refs" / "main").write_text("0123abcd")
    return cache


def test_a_hub_id_is_downloaded_with_weights_and_configs_only(checkpoint, monkeypatch, capsys):
    calls = []

    def snapshot_download(repo_id, *, allow_patterns=None, local_files_only=False, **kwargs):
        calls.append((repo_id, allow_patterns, local_files_only, kwargs))
        return checkpoint

    real = inspect.signature(huggingface_hub.snapshot_download).parameters
    assert {"allow_patterns", "local_files_only"} <= real.keys()             # the arguments resolve_model passes
    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("TRANSFORMERS_OFFLINE", raising=False)
    assert models.resolve_model("Qwen/Qwen2.5-Math-1.5B") == checkpoint
    (repo_id, patterns, local_only, extra), = calls
    assert repo_id == "Qwen/Qwen2.5-Math-1.5B" and not local_only and not extra
    assert "*.safetensors" in patterns and "*.json" in patterns and not any(p.endswith(".py") for p in patterns)
    message = capsys.readouterr().out.strip().splitlines()
    assert len(message) == 1 and "downloading the Hugging Face hub model Qwen/Qwen2.5-Math-1.5B" in message[0]
    models.resolve_model("Qwen/Qwen2.5-Math-1.5B", weights=False)             # sft.py --scratch: no weights
    assert "*.safetensors" not in calls[-1][1]
    # local paths never reach the hub: an existing one, and a missing one that is no org/name
    assert models.resolve_model(checkpoint) == checkpoint and len(calls) == 2
    for missing in ("out/sft/step_000100", "./models/x", "/abs/path"):
        assert models.resolve_model(missing) == missing
        with pytest.raises(SystemExit, match=f"--model '{missing}': no such directory"):
            models.check_model_dir(missing)
    assert len(calls) == 2


def test_a_hub_error_is_one_line(monkeypatch):
    def not_found(repo_id, **kwargs):
        raise huggingface_hub.errors.LocalEntryNotFoundError("Cannot find it.\nA second line of detail.")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", not_found)
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    with pytest.raises(SystemExit) as e:
        models.resolve_model("org/missing")
    assert str(e.value).count("\n") == 0 and "--model 'org/missing': no such local directory, and the " \
        "Hugging Face hub did not give it (LocalEntryNotFoundError: Cannot find it.)" == str(e.value)


def test_offline_the_cache_or_a_one_line_error(checkpoint, tmp_path, monkeypatch, capsys):
    """The real snapshot_download with HF_HUB_OFFLINE=1: a cached model is found, an uncached one is an error."""
    cache = hub_cache(tmp_path, "org/tiny", checkpoint)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    found = models.resolve_model("org/tiny")
    assert Path(found) == cache / "models--org--tiny" / "snapshots" / "0123abcd" and capsys.readouterr().out == ""
    with pytest.raises(SystemExit, match="--model 'org/absent': not a local directory, and not in the Hugging Face "
                                         "cache; HF_HUB_OFFLINE=1 forbids downloading it"):
        models.resolve_model("org/absent")

    # evaluate.py end to end on the cached copy, named after the model
    out = tmp_path / "eval"
    ev.main(["--model", "org/tiny", "--data", str(_write_benchmarks(tmp_path)), "--out", str(out), "--engine", "hf",
             "--n_samples", "1", "--max_new_tokens", "4", "--grader_workers", "1", "--limit", "1"])
    result = json.loads((out / "results.json").read_text())
    assert result["name"] == "tiny" and result["model"] == found


@pytest.mark.parametrize("script, extra", [("sft.py", ["config/sft_tiny.py", "--scratch"]),
                                           ("rl.py", ["config/rl_tiny.py"])])
def test_the_trainers_take_a_hub_id(script, extra, checkpoint, tmp_path):
    """Offline, from the cache: the model resolves, and the run goes on to the training file (given broken here,
    so that it stops there, naming it)."""
    cache = hub_cache(tmp_path, "org/tiny", checkpoint)
    transformers.AutoTokenizer.from_pretrained(checkpoint).save_pretrained(cache / "models--org--tiny" / "snapshots"
                                                                                 / "0123abcd")
    bad = tmp_path / "train.jsonl"
    bad.write_text('{"data_source": "x"}\n')
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HUB_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    for model, message in (("org/tiny", f"{bad} row 0"), ("org/absent", "not in the Hugging Face cache")):
        proc = subprocess.run([sys.executable, script, *extra, "--model", model, "--train_file", str(bad),
                               "--out_dir", str(tmp_path / f"out_{model.replace('/', '_')}")], cwd=REPO,
                              capture_output=True, text=True, timeout=300, env=env)
        last = proc.stderr.strip().splitlines()[-1]         # rl.py's engine loads the model first: its progress bar
        assert proc.returncode == 1 and message in last, proc.stderr[-2000:]
