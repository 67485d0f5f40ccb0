"""Plumbing for demo/run.py and the tests (tests/run_python.py), a reader may skip it: how a stage's
process starts, and how its output is read while it runs.

A stage is its own command line (`python sft.py ...`), run in a process of its own so that what it
does cannot leak into the next. A fresh Python pays torch's and transformers' imports, about 8 s of
CPU on a 2-core machine: more than half of the small demo's 80 stages' own work. So on Linux a
stage script's process is forked from a server process that imported them once (multiprocessing's
forkserver, which stays single-threaded: forking it is safe where forking the demo, which runs its
stages from threads, is not) and runs the script as `python script.py args` would: as __main__,
with sys.argv, the script's folder first on sys.path, the repository as working directory
(`python -c code` likewise). Every other command (or CURIOSFT_FRESH_PROCESSES=1) runs in a fresh
interpreter. Either way the stage's output goes straight to its log file, which the demo reads as
it grows.
"""
import multiprocessing
import os
import re
import runpy
import signal
import subprocess
import sys
import threading
import time
import traceback
import types
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
# What the server imports once for every stage: the stages' third-party imports and the
# repository's modules, as far as the stage scripts import them at their top.
PRELOAD = ["torch", "transformers", "transformers.models.qwen2.modeling_qwen2", "numpy", "tqdm",
           "baselines", "chunked_logits", "curio_loss", "data", "hybrid", "measure", "plumbing.cli",
           "plumbing.distributed", "plumbing.generation", "plumbing.grading", "plumbing.models",
           "plumbing.run", "plumbing.run_dir", "plumbing.report", "demo.toy"]
_START = threading.Lock()          # the demo starts stages from several threads
_context = None


def forked(cmd: list[str]) -> bool:
    """Whether `cmd` runs forked from the server, on Linux: `python <a .py file>` (its path from
    the repository root, or absolute) or `python -c <code>`."""
    if not (sys.platform.startswith("linux") and os.environ.get("CURIOSFT_FRESH_PROCESSES") != "1"
            and len(cmd) >= 2 and cmd[0] == sys.executable):
        return False
    return cmd[1] == "-c" and len(cmd) >= 3 or cmd[1].endswith(".py") and Path(ROOT, cmd[1]).is_file()


def _server():
    global _context
    if _context is None:
        _context = multiprocessing.get_context("forkserver")
        _context.set_forkserver_preload(PRELOAD)
    return _context


def _run_script(script: str, args: list[str], log: str, env: dict[str, str], err_log: str | None) -> None:
    """In the forked process: `python script args` (script "-c": `python -c args[0] args[1:]`), its
    output into `log`, its standard error into `err_log` if given."""
    for stream, path in ((1, log), (2, err_log or log)):
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
        os.dup2(fd, stream)
        os.close(fd)
    for stream in (sys.stdout, sys.stderr):
        stream.reconfigure(line_buffering=True)
    os.environ.update(env)
    # the start method a fresh interpreter has: in a forkserver's process multiprocessing's locks
    # (tqdm makes one) would be left to the server's resource tracker, which warns of each
    multiprocessing.set_start_method(None, force=True)
    import torch                        # (imported already) the threads the environment asks for

    torch.set_num_threads(int(env.get("OMP_NUM_THREADS", torch.get_num_threads())))
    os.chdir(ROOT)
    try:
        if script == "-c":
            sys.argv = ["-c", *args[1:]]
            sys.path.insert(0, "")
            main = types.ModuleType("__main__")
            sys.modules["__main__"] = main
            exec(compile(args[0], "<string>", "exec"), main.__dict__)
        else:
            sys.argv = [script, *args]
            sys.path.insert(0, str(Path(ROOT, script).parent))
            runpy.run_path(str(Path(ROOT, script)), run_name="__main__")
    except KeyboardInterrupt:      # as a fresh interpreter ends: the traceback, then killed by SIGINT
        traceback.print_exc()
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(signal.SIGINT, signal.SIG_DFL)
        os.kill(os.getpid(), signal.SIGINT)
    except Exception:              # a fresh interpreter's traceback and status (no "Process ...:" line)
        traceback.print_exc()
        raise SystemExit(1) from None


class StageProcess:
    """One stage's process, its output appended to `log` (its standard error to `err_log` if given,
    which lines() does not read). Exit statuses as subprocess gives them:
    a signal's is minus its number. (multiprocessing imports the caller's __main__ in the forked
    process, as __mp_main__: a script that starts one keeps its work under `if __name__ ==
    "__main__":`, as demo/run.py does.)"""

    def __init__(self, cmd: list, log: Path, env: dict[str, str], err_log: Path | None = None):
        self.cmd = cmd = [str(c) for c in cmd]
        for path in (log, err_log or log):
            path.touch()
        self.log, self.start_at = log, log.stat().st_size
        if forked(cmd):
            with _START:
                self.process = _server().Process(target=_run_script, daemon=False, args=(
                    cmd[1], cmd[2:], str(log), env, str(err_log) if err_log else None))
                self.process.start()
            self.popen = None
        else:
            with open(log, "ab") as f, open(err_log or os.devnull, "ab") as err:
                self.popen = subprocess.Popen(cmd, cwd=ROOT, env={**os.environ, **env}, stdout=f,
                                              stderr=err if err_log else subprocess.STDOUT)

    def poll(self) -> int | None:
        if self.popen is not None:
            return self.popen.poll()
        return None if self.process.is_alive() else self.process.exitcode

    def wait(self, timeout: float | None = None) -> int:
        """The exit status; past `timeout` seconds the process is killed and TimeoutExpired raised."""
        if self.popen is not None:
            try:
                return self.popen.wait(timeout)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
                raise
        self.process.join(timeout)
        if self.process.exitcode is None:
            self.process.kill()
            self.process.join()
            raise subprocess.TimeoutExpired(self.cmd, timeout)
        return self.process.exitcode

    def lines(self, poll_s: float = 0.1):
        """The lines the stage writes to its log ("\\r" ends one too, as tqdm's updates do), as they
        come, until it has exited and every one is read."""
        rest = b""
        with open(self.log, "rb") as f:
            f.seek(self.start_at)
            while True:
                running = self.poll() is None       # asked before reading: nothing is missed
                chunk = f.read()
                if chunk:
                    *complete, rest = re.split(rb"\r\n|\r|\n", rest + chunk)
                    for line in complete:
                        yield line.decode(errors="replace") + "\n"
                elif not running:
                    break
                else:
                    time.sleep(poll_s)
        if rest:
            yield rest.decode(errors="replace") + "\n"
