"""evaluate.py's run path: the --out check, atomic writes, per-benchmark progress that a rerun reuses, and
data-parallel evaluation under torchrun giving the samples and metrics of one process."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import evaluate as ev
import measure
from plumbing import generation, run_dir
from run_python import run_python
from test_evaluate import QUESTIONS, _write_benchmarks, _write_sft_data, checkpoint  # noqa: F401 (a fixture)
from test_paper_scale import REPO, torchrun

TINY = ["--engine", "hf", "--max-new-tokens", "8", "--grader-workers", "1", "--batch-size", "1"]


def test_rank_blocks_are_contiguous_whole_batches():
    for count in range(0, 12):
        for batch_size in (1, 3, 4):
            for world in (1, 2, 3, 5):
                blocks = [measure.rank_block(count, batch_size, r, world) for r in range(world)]
                assert [i for b in blocks for i in b] == list(range(count)), (count, batch_size, world)
                assert all(b.start % batch_size == 0 for b in blocks if len(b))


def test_hf_samples_do_not_depend_on_the_split(checkpoint):
    engine, tok = generation.load_engine(checkpoint, "hf")
    prompts = [ev.example_prompt(ev.Example(q, "5", "", "math", i), tok, "paper") for i, q in enumerate(QUESTIONS)]
    whole = generation.generate(engine, tok, prompts, n=2, max_new_tokens=8, seed=3, batch_size=2)
    tail = generation.generate(engine, tok, prompts[2:], n=2, max_new_tokens=8, seed=3, batch_size=2, offset=2)
    assert [[s.token_ids for s in q] for q in tail] == [[s.token_ids for s in q] for q in whole[2:]]
    assert whole[0][0].token_ids != whole[2][0].token_ids or whole[0][1].token_ids != whole[2][1].token_ids


def test_atomic_write_keeps_the_old_file_when_writing_fails(tmp_path, monkeypatch):
    target = tmp_path / "results.json"
    run_dir.write_atomic(target, "old")
    real_write = Path.write_text

    def full_disk(self, text):
        real_write(self, text[:2])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_text", full_disk)
    with pytest.raises(SystemExit, match="results.json: the disk is full .*: it was not written"):
        run_dir.write_atomic(target, "new contents")
    assert target.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def test_out_that_is_a_file_fails_before_any_model_loads(checkpoint, tmp_path, monkeypatch):
    def no_model(*args, **kwargs):
        raise AssertionError("a model was loaded")

    monkeypatch.setattr(ev, "load_engine", no_model)
    (tmp_path / "taken").write_text("x")
    bench = _write_benchmarks(tmp_path)
    for out, message in ((tmp_path / "taken", "exists and is not a directory"),
                         (tmp_path / "taken" / "eval", "cannot write in")):
        with pytest.raises(ValueError, match=message):
            ev.main(["--model", checkpoint, "--data", str(bench), "--out", str(out), *TINY])


def test_user_errors_are_one_line(checkpoint, tmp_path):
    (tmp_path / "taken").write_text("x")
    for flags, message in ((["--out", str(tmp_path / "taken")], "exists and is not a directory"),
                           (["--limit=-1"], "--limit -1: must be a finite number >= 0")):
        proc = subprocess.run([sys.executable, "evaluate.py", "--model", checkpoint, "--data", str(tmp_path), *flags],
                              cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 1 and message in proc.stderr and len(proc.stderr.strip().splitlines()) == 1, \
            proc.stderr


def _results(out: Path) -> tuple[dict, str]:
    result = json.loads((out / "results.json").read_text())
    del result["settings"]["out"]
    return result, (out / "samples.jsonl").read_text()


def test_a_rerun_after_a_crash_keeps_the_finished_benchmarks(checkpoint, tmp_path, monkeypatch, capsys):
    bench = _write_benchmarks(tmp_path)
    argv = ["--model", checkpoint, "--data", str(bench), "--n_samples", "2", *TINY]
    ev.main(argv + ["--out", str(tmp_path / "clean")])

    calls, real_generate = [], generation.generate

    def crash_on(k):
        def generate(*args, **kwargs):
            calls.append(len(args[2]))
            if len(calls) == k:
                raise RuntimeError("killed")
            return real_generate(*args, **kwargs)
        return generate

    out = tmp_path / "crashed"
    monkeypatch.setattr(measure, "generate", crash_on(2))
    with pytest.raises(RuntimeError, match="killed"):
        ev.main(argv + ["--out", str(out)])
    first = next(iter(ev.load_benchmarks(str(bench))))
    assert [p.name for p in (out / "progress").iterdir()] == [measure.progress_file_name(first)]
    assert not (out / "results.json").exists()

    calls.clear()
    monkeypatch.setattr(measure, "generate", crash_on(0))
    capsys.readouterr()
    ev.main(argv + ["--out", str(out)])
    assert len(calls) == 2  # the first benchmark was loaded, not generated again
    assert f"{first}: loaded from" in capsys.readouterr().out
    assert _results(out) == _results(tmp_path / "clean")

    calls.clear()
    ev.main(argv + ["--out", str(out), "--seed", "1"])  # other settings: nothing reused
    assert len(calls) == 3 and _results(out)[0]["settings"]["seed"] == 1


def test_torchrun_two_ranks_give_the_results_of_one_process(checkpoint, tmp_path):
    bench = _write_benchmarks(tmp_path)
    sft = _write_sft_data(tmp_path)
    # --n_samples is a flag after the script: torchrun's own parser took the old --n for its --nnodes
    argv = ["evaluate.py", "--n_samples", "2", "--model", checkpoint, "--data", bench, "--sft-data", sft, *TINY,
            "--name", "tiny"]
    single = run_python([*argv, "--out", tmp_path / "one"], env={**os.environ, "OMP_NUM_THREADS": "1"},
                        timeout=300)
    assert single.returncode == 0, single.stderr[-3000:]
    proc = torchrun(*argv, "--out", tmp_path / "two", nproc=2)
    assert proc.stdout.count("[1/3]") == 2  # rank 0 alone reports: a start and an end line
    one, two = _results(tmp_path / "one"), _results(tmp_path / "two")
    assert two == one
    assert {b: m["questions"] for b, m in one[0]["benchmarks"].items()} == {"math": 2, "aime": 2, "arc_c": 1}
    assert one[0]["expert_entropy"]["tokens"] > 0


def test_a_plot_on_a_full_disk_is_one_line_and_keeps_the_old_file(tmp_path, monkeypatch):
    import matplotlib.pyplot as plt

    from plumbing import report

    target = tmp_path / "plot.png"
    target.write_bytes(b"old")
    real_write = Path.write_bytes

    def full_disk(self, data):
        real_write(self, data[:10])
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(Path, "write_bytes", full_disk)
    with pytest.raises(SystemExit, match="plot.png: the disk is full .*: it was not written"):
        report.save_png(plt.figure(), target)
    assert target.read_bytes() == b"old" and [p.name for p in tmp_path.iterdir()] == ["plot.png"]
