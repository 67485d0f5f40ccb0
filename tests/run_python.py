"""How the tests run a script as its own command line (`python sft.py ...`, `python -c ...`), as the demo
runs its stages (demo/stage_process.py): on Linux forked from a server process that imported torch and
transformers once, elsewhere in a fresh interpreter. A fresh interpreter's imports cost about 5 s of CPU
on 2 shared cores, and the suite runs some 150 such commands of a few seconds' work each.
tests/test_stage_process.py shows that a forked and a fresh sft.py save the same bytes."""
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from demo.stage_process import StageProcess

# What a command's environment may change and still be forked: variables read while the script runs, and
# pytest's PYTEST_CURRENT_TEST (never read; an environment copied at import lacks it). Any other change
# (HF_HUB_CACHE, say, read when huggingface_hub is imported) needs a fresh interpreter. The forked process
# starts from the environment, the sys.path and the imports' warnings of the server's start, in this process.
READ_AT_RUN_TIME = {"OMP_NUM_THREADS", "MKL_NUM_THREADS", "CURIOSFT_DEBUG", "STOP_AT", "TOY_GRADE",
                    "PYTEST_CURRENT_TEST"}


def run_python(args: list, env: dict[str, str] | None = None,
               timeout: float = 600) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, *args], cwd=<the repository>, env=env, capture_output=True, text=True,
    timeout=timeout), forked from the server where the command and its environment allow."""
    env = dict(os.environ if env is None else env)
    changed = {k for k in env.keys() | os.environ.keys() if env.get(k) != os.environ.get(k)}
    cmd = [sys.executable, *map(str, args)]
    if not changed <= READ_AT_RUN_TIME:
        return subprocess.run(cmd, cwd=Path(__file__).resolve().parents[1], env=env, capture_output=True,
                              text=True, timeout=timeout)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp, "stdout"), Path(tmp, "stderr")
        try:
            status = StageProcess(cmd, out, env, err_log=err).wait(timeout)
        except subprocess.TimeoutExpired as e:
            e.stdout, e.stderr = text(out), text(err)
            raise
        return subprocess.CompletedProcess(cmd, status, text(out), text(err))


def text(path: Path) -> str:
    """A file's text as subprocess.run(text=True) gives an output: universal newlines."""
    return path.read_bytes().decode().replace("\r\n", "\n").replace("\r", "\n")
