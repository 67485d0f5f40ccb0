"""Plumbing (a reader of the method may skip this file): a training run's output directory.

Shared by sft.py and rl.py: one run per directory (a lock, and the settings that define the run
recorded and checked on resume), stale partial checkpoints removed, and the run's log: log.jsonl
always (cut back to the resumed step, as rl.py's rollouts.jsonl is), a console line or a progress
bar on rank 0, and optionally Weights & Biases and TensorBoard (imported only when asked for;
neither is in requirements.txt)."""
import errno
import fcntl
import json
import os
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch.distributed as dist

from plumbing import checkpoints
from plumbing.checkpoints import file_sha256
from plumbing.distributed import print0

LOGGERS = ("wandb", "tensorboard")
_HELD = []  # the locks this process holds: released when it exits


def claim(out_dir: Path, settings: dict, may_change: set[str], resuming: bool,
          data: dict | None = None, defaults: dict | None = None):
    """Every rank calls it, once the run's inputs are known good; rank 0 does the work: lock out_dir
    for this process's lifetime (the lock's file is returned for tests to close), refuse to resume a
    run whose defining settings differ from the recorded ones (every setting not in `may_change`) or
    whose training data is not the same (`data`: the file, its sha256 and rows), remove step_*.tmp
    left by an interrupted save and a `stopped` marker, and record the settings in run_config.json.
    A setting the record lacks (a run begun before the setting existed) counts as its value in
    `defaults`, the behaviour it adds being off by default. A refusal stops every rank with the same
    one-line message."""
    lock, error = None, None
    if dist.get_rank() == 0:
        try:
            lock = _claim(out_dir, settings, may_change, resuming, data, defaults or {})
        except SystemExit as e:
            error = str(e)
    outcome = [error]
    dist.broadcast_object_list(outcome, src=0)
    if outcome[0] is not None:
        raise SystemExit(outcome[0])
    return lock


def recorded(out_dir: Path) -> dict:
    """The settings run_config.json in out_dir records ({} for none, or an unreadable one: claim
    then says why). Read before claim, on every rank: a value the run started with, which a resume
    keeps (claim rewrites the file with the same value)."""
    try:
        settings = json.loads((Path(out_dir) / "run_config.json").read_text())
    except (OSError, ValueError, UnicodeDecodeError):
        return {}
    return settings if isinstance(settings, dict) else {}


def release() -> None:
    """End of a run: release the directories this process claimed (a later run in the process may
    claim them)."""
    while _HELD:
        _HELD.pop().close()


def lock_dir(out_dir: Path, what: str = "run"):
    """Hold out_dir for this process's lifetime, or stop with one line when another process does."""
    out_dir.mkdir(parents=True, exist_ok=True)
    lock = open(out_dir / ".lock", "w")
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise SystemExit(f"{out_dir}: another {what} is writing to this directory (it holds "
                         f"{lock.name})") from None
    _HELD.append(lock)
    return lock


def drop_if_empty(out_dir: Path) -> None:
    """Remove out_dir when a failed job left nothing in it but its lock (after release)."""
    if out_dir.is_dir() and {p.name for p in out_dir.iterdir()} <= {".lock"}:
        shutil.rmtree(out_dir, ignore_errors=True)


def _claim(out_dir: Path, settings: dict, may_change: set[str], resuming: bool, data: dict | None,
           defaults: dict):
    lock = lock_dir(out_dir)
    recorded_file = out_dir / "run_config.json"
    settings = json.loads(json.dumps(settings))              # compare as recorded: tuples are lists
    try:
        if resuming and recorded_file.is_file():
            try:
                recorded = json.loads(recorded_file.read_text())
            except (ValueError, UnicodeDecodeError) as e:
                raise SystemExit(f"{recorded_file}: not valid JSON ({e}); the run's settings "
                                 "cannot be checked") from None
            recorded_data = recorded.pop("data", None)
            # the nested layout of earlier versions
            recorded = {**json.loads(json.dumps(defaults)), **recorded.pop("loss_config", {}),
                        **recorded}
            changed = sorted(k for k in settings.keys() | recorded.keys()
                             if k not in may_change and not _same(k, settings.get(k),
                                                                  recorded.get(k)))
            if changed:
                diffs = ", ".join(f"--{k} {recorded.get(k)!r} -> {settings.get(k)!r}"
                                  for k in changed)
                raise SystemExit(f"{out_dir} holds a run with other settings ({diffs}); resume it "
                                 "with its own settings or choose another --out_dir")
            if data and recorded_data and _content(recorded_data) != _content(data):
                raise SystemExit(f"{data['file']} is not the file this run started on (then: "
                                 f"{recorded_data['rows']} rows, sha256 "
                                 f"{recorded_data['sha256'][:12]}; now: {data['rows']} rows, "
                                 f"sha256 {data['sha256'][:12]}): resume with that file or choose "
                                 "another --out_dir")
    except SystemExit:
        _HELD.remove(lock)
        lock.close()
        raise
    for stale in out_dir.glob("step_*.tmp"):
        shutil.rmtree(stale)
    (out_dir / "stopped").unlink(missing_ok=True)
    write_atomic(recorded_file, json.dumps({**settings, **({"data": data} if data else {})},
                                           indent=1))
    return lock


# the settings that name a file or directory: the same one through another path (../, a link) is
# the same setting
PATH_SETTINGS = ("model", "train_file", "eval_file", "out_dir")


def _same(name: str, value, recorded) -> bool:
    if name in PATH_SETTINGS and isinstance(value, str) and isinstance(recorded, str):
        return value == recorded or Path(value).resolve() == Path(recorded).resolve()
    return value == recorded


def _content(data: dict) -> dict:
    """A data file's identity without its path (compared as a setting, resolved)."""
    return {k: v for k, v in data.items() if k != "file"}


def leave_after_signal(out_dir: Path, step: int, signal_name: str | None, log) -> None:
    """A run stopped by SIGTERM or SIGINT once its checkpoint is saved: rank 0 leaves `stopped` in
    out_dir (for a requeue script: {"step", "signal"}; the next start removes it) and every rank
    exits with STOPPED_EXIT."""
    from plumbing.distributed import STOPPED_EXIT, shutdown

    if dist.get_rank() == 0:
        write_atomic(out_dir / "stopped", json.dumps({"step": step, "signal": signal_name}) + "\n")
    print0(f"stopped by {signal_name} after step {step}, saved: the same command resumes the run "
           f"(exit status {STOPPED_EXIT})")
    if log is not None:
        log.close()
    release()
    shutdown(STOPPED_EXIT)


def mark_complete(out_dir: Path, step: int) -> None:
    """Rank 0, at the end of a run that reached its last step and saved it: the record
    (complete.json) that says the run is done, which a rerun and the demo read instead of guessing
    from the checkpoints."""
    if dist.get_rank() == 0:
        write_atomic(out_dir / "complete.json", json.dumps({"step": step}) + "\n")


def _record(out_dir: Path) -> int | None:
    """The step complete.json names, or None (no record, or not one)."""
    try:
        step = json.loads((Path(out_dir) / "complete.json").read_text())["step"]
    except (OSError, ValueError, KeyError, TypeError, UnicodeDecodeError):
        return None
    return step if isinstance(step, int) and not isinstance(step, bool) else None


def completed(out_dir: Path) -> int | None:
    """The step at which the run in out_dir completed, by its record, when its newest complete
    checkpoint is that step's; else None (not run, interrupted, or a record without its checkpoint).
    Cheap and not collective: the demo's test for a finished stage; the stage scripts check the
    checkpoint's digests too (check_end)."""
    step, newest = _record(out_dir), checkpoints.latest(out_dir)
    named = step is not None and newest is not None and newest.name == f"step_{step:06d}"
    return step if named else None


def check_end(out_dir: Path, resume_from: Path | None, last_step: int, flag: str,
              why_not_on=None) -> bool:
    """Before a run loads its model, given resume_from (checkpoints.resume_point: the newest
    checkpoint whose digests match, or None): True when the run is complete, resume_from being at
    last_step (then complete.json is written if it was not). complete.json counts only with the
    checkpoint it names: naming another (a hand edit, a truncated copy, two machines' files) it is
    removed with one line and the run resumes from resume_from. A run that ended before last_step
    goes on to it, unless why_not_on(step) says why that would not give what one uninterrupted run
    to last_step gives: then, and for a run past last_step (flag: the setting that asked for it),
    one line refuses. Every rank calls it."""
    step = 0 if resume_from is None else int(resume_from.name.removeprefix("step_"))
    record, rank0 = _record(out_dir), dist.get_rank() == 0
    if (out_dir / "complete.json").exists() and record != step:
        said = ("not a completion record ({\"step\": N})" if record is None else
                f"names step {record}, but the newest intact checkpoint is {resume_from or 'none'}")
        print0(f"{out_dir / 'complete.json'}: {said}: ignored and removed")
        if rank0:
            (out_dir / "complete.json").unlink(missing_ok=True)
        record = None
    if step > last_step:
        raise SystemExit(f"{out_dir}: the run there is at step {step}, past the {last_step} asked "
                         f"for ({flag}): ask for {step} or more, or choose another --out_dir")
    if step == last_step:
        if record is None:
            mark_complete(out_dir, step)
        print0(f"{out_dir}: complete at step {step} of {last_step}; nothing to train")
        return True
    why = why_not_on(step) if why_not_on is not None and step > 0 else None
    if why:
        raise SystemExit(f"{out_dir}: the run there ended at step {step}; going on to step "
                         f"{last_step} ({flag}) would not give what one run to it gives: {why}; "
                         "choose another --out_dir")
    if record is not None:
        print0(f"{out_dir}: complete at step {step}; going on to step {last_step} ({flag})")
        if rank0:
            (out_dir / "complete.json").unlink()     # until the new end is reached and saved
    return False


def file_identity(path) -> dict:
    """What identifies a data file beyond its path: its sha256 and (given by the caller) its
    rows."""
    return {"file": str(path), "sha256": file_sha256(path)}


# the console's line per logged step (--log_line compact); log.jsonl keeps every field
COMPACT = ("step", "epoch", "loss", "lr", "grad_norm", "student_entropy_top20", "entropy",
           "w_top20", "reward_mean", "zero_std_frac", "response_length", "tokens_per_s",
           "step_time_s", "val_accuracy", "val_entropy", "val_response_len", "val_s")


class RunLog:
    """Rank 0's log of a run. log.jsonl keeps the records of steps <= start_step from an earlier run
    (the steps a crash lost after the last checkpoint are dropped, so no step appears twice), then
    appends. On a terminal, a progress bar with ETA; elsewhere a plain line per record with the ETA
    appended. The console shows the COMPACT fields (line="compact") or every one (line="full")."""

    def __init__(self, out_dir: Path, start_step: int, total_steps: int, desc: str, loggers=(),
                 config=None, project: str = "curiosft", line: str = "compact"):
        self.path, self.start, self.total = out_dir / "log.jsonl", start_step, total_steps
        self.t0 = time.monotonic()
        self.line = line
        self.note = "  (every field: docs/metrics.md)"   # ends the run's first console line
        keep_steps_upto(self.path, start_step)
        self.file = open(self.path, "a")
        self.bar = None
        if sys.stderr.isatty():
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, initial=start_step, desc=desc, dynamic_ncols=True)
        self.backends = [_open_backend(name, out_dir, config or {}, project) for name in loggers]

    def write(self, record: dict) -> None:
        try:
            self.file.write(json.dumps(record) + "\n")
            self.file.flush()
        except OSError as e:
            if e.errno != errno.ENOSPC:
                raise
            raise SystemExit(f"{self.path}: the disk is full: step {record['step']} could not be "
                             "logged") from None
        shown = record if self.line == "full" else {k: record[k] for k in COMPACT if k in record}
        line = " ".join(f"{k} {v:.4g}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in shown.items())
        step, note, self.note = record["step"], self.note, ""
        if self.bar is not None:
            self.bar.update(step - self.bar.n)
            self.bar.write(line + note)
        else:
            done = step - self.start
            eta = (time.monotonic() - self.t0) / done * (self.total - step) if done > 0 \
                else float("nan")
            print(f"{line} eta {_hms(eta)}{note}", flush=True)
        for log in self.backends:
            log(record)

    def close(self) -> None:
        self.file.close()
        if self.bar is not None:
            self.bar.close()


def keep_steps_upto(path: Path, step: int) -> None:
    """Cut a JSONL file of {"step": ...} records (log.jsonl, rl.py's rollouts.jsonl) back to the
    records of steps <= step: a resumed run drops the steps a crash lost after the last checkpoint,
    so no step appears twice. Only a crash's half-written last line may be unreadable. A missing
    file becomes an empty one."""
    kept = []
    lines = path.read_text().splitlines() if path.is_file() else []
    for i, line in enumerate(lines):
        try:
            if json.loads(line)["step"] <= step:
                kept.append(line)
        except (ValueError, KeyError, TypeError):
            if i < len(lines) - 1:
                raise SystemExit(f"{path}, line {i + 1}: not a log record") from None
    write_atomic(path, "".join(line + "\n" for line in kept))   # a kill here keeps the old file


def _hms(seconds: float) -> str:
    if seconds != seconds:  # nan: no step timed yet
        return "?"
    s = int(seconds)
    return f"{s // 3600}:{s // 60 % 60:02d}:{s % 60:02d}"


def _open_backend(name: str, out_dir: Path, config: dict, project: str):
    """A function record -> None for one optional logger; a clear error when its package is
    absent."""
    if name not in LOGGERS:
        raise SystemExit(f"--loggers: unknown logger {name!r} (choices: {', '.join(LOGGERS)})")
    package = {"wandb": "wandb", "tensorboard": "tensorboard"}[name]
    try:
        if name == "wandb":
            import wandb

            run_id_file = out_dir / "wandb_run_id"    # a resumed run continues the same W&B run
            run_id = run_id_file.read_text().strip() if run_id_file.is_file() \
                else wandb.util.generate_id()
            write_atomic(run_id_file, run_id)
            run = wandb.init(project=project, name=out_dir.name, id=run_id, resume="allow",
                             config=config, dir=str(out_dir))
            return lambda record: run.log({k: v for k, v in record.items() if k != "step"},
                                          step=record["step"])
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(str(out_dir / "tensorboard"))

        def log(record):
            for k, v in record.items():
                if k != "step" and isinstance(v, (int, float)):
                    writer.add_scalar(k, v, record["step"])
            writer.flush()
        return log
    except ImportError:
        raise SystemExit(f"--loggers {name}: the {package} package is not installed (pip install "
                         f"{package})") from None


def settings_of(*configs) -> dict:
    """The flat dict of every dataclass's settings (what run_config.json records)."""
    out = {}
    for c in configs:
        out |= asdict(c)
    return out


def write_atomic(path: Path, text: str | bytes) -> None:
    """Write to a temporary name, then rename: a crash never leaves a partial file under `path` (the
    demo takes an existing results.json as a finished stage), and a full disk stops the run with one
    line, the file as it was before."""
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_bytes(text) if isinstance(text, bytes) else tmp.write_text(text)
        os.replace(tmp, path)
    except OSError as e:
        if e.errno != errno.ENOSPC:
            raise
        free = shutil.disk_usage(path.parent).free / 1e6
        raise SystemExit(f"{path}: the disk is full ({free:.1f} MB free): it was not written (an "
                         "earlier version, if any, is kept)") from None
    finally:
        tmp.unlink(missing_ok=True)
