"""demo/stage_process.py: a stage script forked from the server that imported torch runs as `python script args`
would, and its output reaches its log and the demo."""
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from safetensors.torch import load_file

from demo import stage_process
from demo.stage_process import StageProcess

ROOT = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="forked stages: Linux only")

SCRIPT = """import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "path0", sys.path[0], "torch imported", "torch" in sys.modules)
import multiprocessing, torch
print("threads", torch.get_num_threads(), "start method", multiprocessing.get_start_method(), flush=True)
if sys.argv[1] == "fail":
    raise SystemExit("a one-line refusal")
if sys.argv[1] == "interrupt":
    raise KeyboardInterrupt
if sys.argv[1] == "wait":
    import time
    time.sleep(60)
"""


def run(cmd, log: Path, monkeypatch, fresh: bool = False, **env) -> tuple[int, list[str]]:
    """cmd's exit status and lines, forked from the server or (fresh) in a fresh interpreter."""
    monkeypatch.setenv("CURIOSFT_FRESH_PROCESSES", "1" if fresh else "0")
    assert stage_process.forked([str(c) for c in cmd]) != fresh
    stage = StageProcess(cmd, log, {"OMP_NUM_THREADS": "1", **env})
    return stage.wait(), list(stage.lines())


def test_a_forked_script_runs_as_python_would_run_it(tmp_path, monkeypatch):
    script = tmp_path / "stage.py"
    script.write_text(SCRIPT)
    cmd = [sys.executable, str(script), "ok", "--flag"]
    code, lines = run(cmd, tmp_path / "a.log", monkeypatch, OMP_NUM_THREADS="2")
    assert code == 0
    # torch already imported: the server's; the rest as a fresh interpreter has it
    assert lines == [f"argv ['ok', '--flag'] cwd {ROOT} path0 {tmp_path} torch imported True\n",
                     "threads 2 start method fork\n"]
    code, lines = run(cmd, tmp_path / "b.log", monkeypatch, fresh=True, OMP_NUM_THREADS="2")
    assert code == 0 and lines == [lines[0].replace("True", "False"), "threads 2 start method fork\n"]


@pytest.mark.parametrize("how, status, said", [("fail", 1, "a one-line refusal\n"),
                                               ("interrupt", -signal.SIGINT, "KeyboardInterrupt\n")])
def test_a_forked_script_exits_with_the_status_a_fresh_interpreter_gives(tmp_path, monkeypatch, how, status,
                                                                          said):
    script = tmp_path / "stage.py"
    script.write_text(SCRIPT)
    code, lines = run([sys.executable, str(script), how], tmp_path / "a.log", monkeypatch)
    assert code == status and lines[-1] == said
    code, lines = run([sys.executable, str(script), how], tmp_path / "b.log", monkeypatch, fresh=True)
    assert code == status


def test_a_signal_stops_a_forked_script_as_it_stops_a_fresh_one(tmp_path):
    script = tmp_path / "stage.py"
    script.write_text(SCRIPT)
    stage = StageProcess([sys.executable, str(script), "wait"], tmp_path / "a.log", {})
    lines = stage.lines()
    assert next(lines).startswith("argv ['wait']")
    stage.process.kill() if stage.popen is None else stage.popen.kill()
    assert stage.wait() == -signal.SIGKILL


def test_a_training_stage_forked_saves_the_bytes_a_fresh_process_saves(tmp_path, tiny_model_dir, monkeypatch):
    """sft.py forked and in a fresh interpreter: the same checkpoint, bit for bit (what the server imported
    changes no result)."""
    from conftest import toy_rows
    import data

    model = tiny_model_dir
    train = tmp_path / "train.jsonl"
    data.write_jsonl(toy_rows(16), train)
    saved = []
    for fresh in (False, True):
        out = tmp_path / f"run_{fresh}"
        cmd = [sys.executable, "sft.py", "config/sft_tiny.py", "--model", str(model), "--train_file", str(train),
               "--loss", "curio", "--out_dir", str(out), "--max_steps", "2", "--scratch"]
        code, lines = run(cmd, tmp_path / f"{fresh}.log", monkeypatch, fresh)
        assert code == 0, "".join(lines[-20:])
        saved.append(load_file(next(out.glob("step_*/model.safetensors"))))
    assert saved[0].keys() == saved[1].keys()
    for name in saved[0]:
        assert saved[0][name].equal(saved[1][name]), name


def test_lines_come_as_the_stage_writes_them(tmp_path):
    script = tmp_path / "stage.py"
    script.write_text("import time\nprint('one', flush=True)\ntime.sleep(1.5)\nprint('two\\r2b', flush=True)\n")
    stage = StageProcess([sys.executable, str(script)], tmp_path / "a.log", {})
    t0 = time.time()
    lines = stage.lines()
    assert next(lines) == "one\n" and time.time() - t0 < 1.4
    assert list(lines) == ["two\n", "2b\n"] and stage.wait() == 0


CASES = {"a refusal": "import sys; print('out'); sys.exit('a one-line refusal')",
         "a crash": "print('out\\r\\nmore', flush=True); import sys; print(sys.argv); raise ValueError('boom')",
         "a success": "import sys, torch; print(sys.argv, sys.path[0] == '', torch.get_num_threads())"}


@pytest.mark.parametrize("case", sorted(CASES))
def test_run_python_gives_what_subprocess_run_gives(case):
    """tests/run_python.py, forked: the exit status, standard output and standard error (a traceback's
    first and last lines) of subprocess.run in a fresh interpreter."""
    from run_python import run_python

    args, env = ["-c", CASES[case], "an", "argv"], {**os.environ, "OMP_NUM_THREADS": "1"}
    got = run_python(args, env=env)
    want = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True)
    assert stage_process.forked(got.args) and (got.returncode, got.stdout) == (want.returncode, want.stdout)
    err, want_err = got.stderr.splitlines(), want.stderr.splitlines()
    assert err[-1:] == want_err[-1:] and err[:1] == want_err[:1], (got.stderr, want.stderr)


def test_run_python_forks_only_what_a_fork_runs_as_a_fresh_interpreter_would():
    """An environment that changes what an import reads (huggingface_hub's cache) gets a fresh interpreter,
    as does a module run (`-m`); a command past its timeout is killed and raises TimeoutExpired."""
    from run_python import run_python

    code = "import huggingface_hub.constants as c, sys; print(c.HF_HUB_CACHE, 'torch' in sys.modules)"
    proc = run_python(["-c", code], env={**os.environ, "HF_HUB_CACHE": "/elsewhere"})
    assert proc.returncode == 0 and proc.stdout == "/elsewhere False\n", proc.stderr
    in_server = ["-c", "import sys; print('torch' in sys.modules)"]
    assert run_python(in_server).stdout == "True\n"                                              # forked
    # an environment copied at import, before pytest set PYTEST_CURRENT_TEST (test_reliability's ONE_THREAD)
    copied = {k: v for k, v in os.environ.items() if k != "PYTEST_CURRENT_TEST"}
    assert run_python(in_server, env=copied).stdout == "True\n"
    assert run_python(["-m", "json.tool", "--help"]).returncode == 0
    with pytest.raises(subprocess.TimeoutExpired):
        run_python(["-c", "import time; time.sleep(60)"], timeout=1)
