"""Plumbing (a reader of the method may skip this file): checkpoints.

A checkpoint is a Hugging Face directory that evaluate.py, rl.py and vLLM load, plus the sharded
trainer state (model, optimiser, teacher) and each rank's RNG for an exact resume, and a SHA-256
digest of every file, checked before a resume. Every function here but export_weights is collective:
every rank calls it.

A resume reads trainer/.metadata, a pickle, with an unpickler that admits only the classes
torch.distributed.checkpoint writes there, and the trainer's other values with torch.load's
weights_only: a crafted checkpoint is refused, nothing in it runs. The digests catch damaged files
(a truncated write, flipped bits), not a directory crafted to match them.

    python -m plumbing.checkpoints export out/sft_curio/step_000540 out/curio_7b   # the model only
"""
import contextlib
import copy
import errno
import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from plumbing.distributed import print0
from plumbing.models import full_tensors


def save(out_dir: Path, step: int, model, tokenizer, trainer_state: dict, extra_state: dict,
         dtype: torch.dtype = torch.float32, max_shard_gb: float = 5.0, keep_last: int = 0,
         keep: Path | None = None) -> Path:
    """out_dir/step_{step:06d}/: a Hugging Face directory (config.json, model*.safetensors in
    `dtype`, sharded with an index as save_pretrained writes them, tokenizer files) that
    from_pretrained and vLLM load, plus trainer/ (torch.distributed.checkpoint of `trainer_state`:
    sharded float32 model, optimiser, teacher...), rng_rank{r}.pt per rank, state.json
    (`extra_state`: counters and data position) and sha256.json, the digest of every other file.
    Written under a .tmp name and renamed when complete: a crash mid-save never leaves a checkpoint
    that looks finished. A save that cannot fit stops before writing; one that fills the disk anyway
    is removed and stops every rank with one line. Then, with keep_last > 0, the oldest complete
    checkpoints beyond the newest keep_last are deleted, never `keep` (the one this run resumed
    from). Every rank must call it."""
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    final, tmp = out_dir / f"step_{step:06d}", out_dir / f"step_{step:06d}.tmp"
    failures = []                # this rank's failed writes; every collective still runs to the end
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        _attempt(failures, _save_small_files, tmp, model, tokenizer, dtype, extra_state)
    need = _large_files_bytes(trainer_state, model, dtype)
    free = [shutil.disk_usage(tmp).free if rank == 0 else 0, bool(failures)]
    dist.broadcast_object_list(free, src=0)      # one decision for every rank: none is left waiting
    if need > free[0] and not free[1]:
        if rank == 0:
            shutil.rmtree(tmp)
        raise SystemExit(f"{out_dir}: checkpoint step {step} needs {_size(need)}, the disk has "
                         f"{_size(free[0])} free (--keep_last N deletes old checkpoints)")
    if not free[1]:
        save_hf_weights(model, tmp, dtype, int(max_shard_gb * 2**30), step, failures)
        _attempt(failures, dcp.save, trainer_state, checkpoint_id=str(tmp / "trainer"))
        rng = {"cpu": torch.get_rng_state(),
               **({"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_available() else {})}
        _attempt(failures, torch.save, rng, tmp / f"rng_rank{rank}.pt")
    _stop_if_any_rank_failed(failures, out_dir, step, tmp)
    digests = file_digests(tmp)   # every file is written (the flag above was a collective)
    if rank == 0:
        _attempt(failures, (tmp / "sha256.json").write_text, json.dumps(digests, indent=1))
    _stop_if_any_rank_failed(failures, out_dir, step, tmp)
    if rank == 0:
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
        if keep_last > 0:
            for old in complete(out_dir)[:-keep_last]:
                if keep is None or old.resolve() != Path(keep).resolve():
                    shutil.rmtree(old)
    dist.barrier()
    return final


def _save_small_files(directory: Path, model, tokenizer, dtype, extra_state: dict) -> None:
    config = copy.deepcopy(model.config)
    config.dtype = dtype                 # vLLM's and from_pretrained's dtype="auto" read it
    config.save_pretrained(directory)
    if getattr(model, "generation_config", None) is not None:
        model.generation_config.save_pretrained(directory)
    tokenizer.save_pretrained(directory)
    (directory / "state.json").write_text(json.dumps(extra_state, indent=1))


def _large_files_bytes(trainer_state, model, dtype) -> int:
    """What the weights, trainer/ and the RNG files take on disk: their tensors, plus DCP's metadata
    and each file's rounding to the filesystem's blocks (1% and 16 MiB leave room for both)."""
    weights = sum(p.numel() for p in model.state_dict().values()) * dtype.itemsize
    return int((_tensor_bytes(trainer_state) + weights) * 1.01) + (16 << 20)


def _attempt(failures: list, write, *args, **kwargs) -> None:
    """write(*args, **kwargs), a failure kept in `failures` rather than raised: the other ranks must
    not be left waiting in a collective this rank would skip."""
    try:
        write(*args, **kwargs)
    except (OSError, RuntimeError, _checkpoint_exception()) as e:
        failures.append(e)


def _checkpoint_exception():
    from torch.distributed.checkpoint.api import CheckpointException

    return CheckpointException   # DCP raises it on every rank when one rank's write failed


def _stop_if_any_rank_failed(failures: list, out_dir: Path, step: int, tmp: Path) -> None:
    """Every rank learns whether any rank failed to write; then all remove the partial checkpoint
    and stop with one line: a full disk (ENOSPC, or torch's "inline_container" error for it) or the
    first error."""
    flag = torch.tensor([float(bool(failures))])
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    if flag.item() == 0:
        return
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(tmp, ignore_errors=True)
    kept = latest(out_dir)
    free = shutil.disk_usage(out_dir).free
    text = str(failures[0]).strip().splitlines()[0] if failures \
        else "another rank could not write its part"
    full = any(getattr(e, "errno", None) == errno.ENOSPC or "No space left" in str(e)
               or "inline_container" in str(e)
               for e in failures)
    reason = f"the disk is full ({_size(free)} free)" if full or free < 1e6 else text
    kept_text = f"the newest checkpoint is {kept}" if kept else "no checkpoint is kept"
    raise SystemExit(f"{out_dir}: checkpoint step {step} could not be written: {reason}; it was "
                     f"removed and {kept_text}")


def _size(n_bytes: int) -> str:
    return f"{n_bytes / 1e9:.2f} GB" if n_bytes >= 1e9 else f"{n_bytes / 1e6:.1f} MB"


def _tensor_bytes(state) -> int:
    """Bytes of every tensor in a nested state dict, at their global (unsharded) shapes."""
    if isinstance(state, torch.Tensor):
        return state.numel() * state.element_size()
    if isinstance(state, dict):
        return sum(_tensor_bytes(v) for v in state.values())
    if isinstance(state, (list, tuple)):
        return sum(_tensor_bytes(v) for v in state)
    return 0


def save_hf_weights(model, directory: Path, dtype: torch.dtype, max_shard_bytes: int, step: int = 0,
                    failures: list | None = None) -> None:
    """The model's weights as save_pretrained writes them: model.safetensors, or
    model-0000i-of-0000n.safetensors shards of at most max_shard_bytes (a larger tensor gets its
    own) and model.safetensors.index.json. Parameters are gathered one at a time and written shard
    by shard, so rank 0 never holds more than one shard. A non-finite weight stops the save on every
    rank (each holds the same full tensor): no broken model is saved. failures: rank 0's failed
    writes go there and the gathering goes on to the end (every rank takes part)."""
    failures = [] if failures is None else failures
    # safetensors refuses shared storage; HF re-ties on load
    tied = model.config.tie_word_embeddings
    sizes = {name: p.numel() * dtype.itemsize for name, p in model.state_dict().items()
             if not (tied and name == "lm_head.weight")}
    shards, current = [], 0                  # greedy in state-dict order, as huggingface_hub splits
    for name, size in sizes.items():
        if not shards or current + size > max_shard_bytes:
            shards.append([])
            current = 0
        shards[-1].append(name)
        current += size
    files = ["model.safetensors"] if len(shards) == 1 else \
            [f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    closes = {names[-1]: file for names, file in zip(shards, files)}
    rank0, shard = dist.get_rank() == 0, {}
    # a collective each
    for name, full in full_tensors(model, dtype, skip=set(model.state_dict()) - sizes.keys()):
        if not torch.isfinite(full).all():
            raise FloatingPointError(f"step {step}: weight {name} has non-finite values; no "
                                     "checkpoint is written")
        if rank0:
            shard[name] = full.cpu().contiguous()
        if name in closes:
            if rank0 and not failures:
                _attempt(failures, save_file, shard, directory / closes[name],
                         metadata={"format": "pt"})
            shard = {}
    if rank0 and len(files) > 1 and not failures:
        index = {"metadata": {"total_size": sum(sizes.values())},
                 "weight_map": {name: file for names, file in zip(shards, files) for name in names}}
        text = json.dumps(index, indent=2, sort_keys=True) + "\n"
        _attempt(failures, (directory / "model.safetensors.index.json").write_text, text)


def complete(out_dir: Path) -> list[Path]:
    """The complete checkpoints in out_dir (renamed from .tmp, state.json written), oldest first."""
    return sorted(p for p in Path(out_dir).glob("step_*") if p.is_dir()
                  and not p.name.endswith(".tmp")
                  and (p / "state.json").exists())


def latest(out_dir: Path) -> Path | None:
    done = complete(out_dir)
    return done[-1] if done else None


def file_sha256(src: Path, dst: Path | None = None) -> str:
    """The SHA-256 of a file, read once in 16 MB blocks; with dst, the file is written there as it
    is read. Not collective."""
    h = hashlib.sha256()
    with open(src, "rb") as f, contextlib.ExitStack() as stack:
        out = stack.enter_context(open(dst, "wb")) if dst is not None else None
        while block := f.read(1 << 24):
            h.update(block)
            if out is not None:
                out.write(block)
    return h.hexdigest()


def file_digests(directory: Path) -> dict[str, str]:
    """{relative path: sha256} of every file below `directory`, the same dict on every rank; the
    files are hashed in parallel, rank r taking every world-th of them (each rank's trainer shard is
    one file)."""
    files = sorted(str(p.relative_to(directory)) for p in directory.rglob("*") if p.is_file())
    mine = {name: file_sha256(directory / name)
            for name in files[dist.get_rank() :: dist.get_world_size()]}
    everyone = [None] * dist.get_world_size()
    dist.all_gather_object(everyone, mine)
    return {k: v for part in everyone for k, v in sorted(part.items())}


def recorded_digests(path: Path) -> dict[str, str]:
    """A checkpoint's sha256.json as {relative path: sha256}; a ValueError naming the file when it
    is not one."""
    file = path / "sha256.json"
    try:
        recorded = json.loads(file.read_text())
    except (ValueError, UnicodeDecodeError):
        recorded = None
    if not isinstance(recorded, dict) or not all(isinstance(v, str) for v in recorded.values()):
        raise ValueError(f"{file}: not a JSON object of file digests")
    return recorded


def damaged_files(path: Path) -> list[str] | None:
    """The files of a complete checkpoint whose digest differs from sha256.json, or that are missing
    or extra; None when it has no sha256.json (written before digests existed: nothing can be
    checked)."""
    if not (path / "sha256.json").is_file():
        return None
    try:
        recorded = recorded_digests(path)
    except ValueError:
        return ["sha256.json"]
    found = file_digests(path)
    found.pop("sha256.json")
    if "state.json" not in recorded:              # written after the digests before they covered it
        found.pop("state.json", None)
    return sorted(name for name in recorded.keys() | found.keys()
                  if recorded.get(name) != found.get(name))


def resume_point(out_dir: Path) -> Path | None:
    """The newest complete checkpoint whose files match their digests, or None when there is none
    yet. A damaged one is skipped with a message naming its files (the previous one is used); if
    every one is damaged the run stops rather than silently starting over. A checkpoint without
    digests is damaged when another of the run has them (this project writes them with every
    checkpoint); when none has, it is used, and said unchecked."""
    done = complete(out_dir)
    any_digests = any((path / "sha256.json").is_file() for path in done)
    for path in reversed(done):
        bad = damaged_files(path)
        if bad is None and any_digests:
            print0(f"checkpoint {path}: its sha256.json is missing, while the run's other "
                   "checkpoints have one; trying the previous one")
            continue
        if bad is None:
            print0(f"checkpoint {path}: no sha256.json, so its files cannot be checked; resuming "
                   "from it unchecked")
            return path
        if not bad:
            return path
        print0(f"checkpoint {path}: files do not match their digests ({', '.join(bad[:5])}); "
               "trying the previous one")
    if done:
        raise SystemExit(f"{out_dir}: every checkpoint is damaged; move them away to start over")
    return None


def verify_model_dir(path: str, rank0: bool = True) -> None:
    """Before evaluate.py or rl.py loads --model: a checkpoint this project saved carries digests,
    and the files a model loads (config, weights, tokenizer: the top level, not trainer/) must match
    them, or the run stops naming the damaged files. A directory without digests (a download) is
    used, and said to be unchecked. Not collective: each caller hashes the files itself."""
    p = Path(path)
    if not (p / "sha256.json").is_file():
        if rank0:
            print(f"--model {path}: no sha256.json, so its files cannot be checked (a model from "
                  "elsewhere)",
                  flush=True)
        return
    try:
        recorded = recorded_digests(p)
    except ValueError as e:
        raise SystemExit(f"--model {path}: {e}") from None
    loaded = {name: digest for name, digest in recorded.items() if not is_trainer_file(name)}
    bad = sorted(name for name, digest in loaded.items()
                 if not (p / name).is_file() or file_sha256(p / name) != digest)
    if bad:
        raise SystemExit(f"--model {path}: files do not match their digests "
                         f"({', '.join(bad[:5])}): the checkpoint is damaged")


# What torch 2.13's torch.distributed.checkpoint pickles into .metadata (metadata.py,
# filesystem.py _StorageInfo, torch.Size, a dtype and a layout per tensor, the save's directory as a
# path): the only globals trainer/.metadata may name. Found by listing a saved checkpoint's; the
# resume tests (tests/test_reliability.py) load sft.py's, with a teacher, and rl.py's.
METADATA_GLOBALS = {("torch.distributed.checkpoint.metadata", name) for name in (
    "Metadata", "MetadataIndex", "StorageMeta", "TensorStorageMetadata", "BytesStorageMetadata",
    "ChunkStorageMetadata", "TensorProperties", "_MEM_FORMAT_ENCODING")} | {
    ("torch.distributed.checkpoint.filesystem", "_StorageInfo"), ("torch", "Size"),
    ("torch.serialization", "_get_layout"), ("pathlib", "PosixPath")}


class _MetadataUnpickler(pickle.Unpickler):
    """pickle's loader for trainer/.metadata, with find_class (the one way a pickle reaches code:
    a class to build, a function to call) limited to METADATA_GLOBALS and torch's dtypes."""

    def find_class(self, module, name):
        dtype = module == "torch" and isinstance(getattr(torch, name, None), torch.dtype)
        if (module, name) not in METADATA_GLOBALS and not dtype:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which is not checkpoint "
                                         "metadata")
        return super().find_class(module, name)


def read_metadata(file: Path):
    """torch.distributed.checkpoint's Metadata of a trainer/ directory, read with
    _MetadataUnpickler: a file naming anything else is refused with one line naming it, before any
    of it runs. Not collective."""
    from torch.distributed.checkpoint.metadata import Metadata

    try:
        with open(file, "rb") as f:
            metadata = _MetadataUnpickler(f).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError) as e:
        raise SystemExit(f"{file}: not torch.distributed.checkpoint metadata ({e}); refused, "
                         "nothing in it was run") from None
    if not isinstance(metadata, Metadata):
        raise SystemExit(f"{file}: not torch.distributed.checkpoint metadata (a "
                         f"{type(metadata).__name__}); refused")
    return metadata


class Refused(pickle.UnpicklingError):
    """A saved value that is not a plain one (it names a callable): the one-line message says
    where and what."""


def _safe_dcp(directory: Path):
    """(storage_reader, planner) for dcp.load that unpickle nothing beyond metadata and plain
    values: the reader reads .metadata (or a rank's, DCP's fallback) with read_metadata, the
    planner the non-tensor values (the optimiser's lr, betas...) with weights_only=True, as DCP
    already reads tensors."""
    from torch.distributed.checkpoint import DefaultLoadPlanner, FileSystemReader
    from torch.distributed.checkpoint.default_planner import set_element
    from torch.distributed.checkpoint.metadata import StorageMeta

    class Reader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            try:
                metadata = read_metadata(Path(self._get_metadata_path(kwargs.get("rank"))))
            except SystemExit as e:                 # DCP handles an Exception (a rank's file)
                raise pickle.UnpicklingError(str(e)) from None
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    class Planner(DefaultLoadPlanner):
        def load_bytes(self, read_item, value):
            try:
                obj = torch.load(value, weights_only=True)
            except pickle.UnpicklingError:            # torch's message: bold, cut, many lines
                value.seek(0)
                try:
                    names = torch.serialization.get_unsafe_globals_in_checkpoint(value)
                except Exception:                     # not even a torch.save file
                    names = []
                file = directory / self.metadata.storage_data[read_item.storage_index].relative_path
                what = f"names {names[0]}" if names else "is not a torch.save value"
                raise Refused(f"{file}: its saved value {read_item.dest_index.fqn} {what}, which is "
                              "not a plain value; refused, nothing in it was run") from None
            if self.flatten_state_dict:
                set_element(self.original_state_dict, self.mappings[read_item.dest_index.fqn], obj)
            else:
                self.state_dict[read_item.dest_index.fqn] = obj

    return Reader(str(directory)), Planner()


def load(path: Path, trainer_state: dict, floats: tuple[str, ...] = ()) -> dict:
    """Loads trainer/ into `trainer_state` in place (same structure as saved) and restores this
    rank's RNG; returns state.json's counters, checked: non-negative integers, or for the names in
    `floats` (measured values a resume needs) non-negative floats. Nothing is unpickled but
    checkpoint metadata (read_metadata) and weights_only loads: a crafted file stops the run with
    one line."""
    import torch.distributed.checkpoint as dcp

    read_metadata(path / "trainer" / ".metadata")      # a refusal here is one line on every rank
    reader, planner = _safe_dcp(path / "trainer")
    try:
        dcp.load(trainer_state, storage_reader=reader, planner=planner)
    except _checkpoint_exception() as e:
        errors = [exc for exc, _ in e.failures.values()]
        if isinstance(errors[0], Refused):
            raise SystemExit(str(errors[0])) from None
        raise SystemExit(f"{path / 'trainer'}: cannot be loaded ({type(errors[0]).__name__}: "
                         f"{str(errors[0]).strip().splitlines()[0]})") from None
    rng_file, state_file = path / f"rng_rank{dist.get_rank()}.pt", path / "state.json"
    try:
        rng = torch.load(rng_file, weights_only=True)
        torch.set_rng_state(rng["cpu"])
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state(rng["cuda"])
    except Exception as e:
        raise SystemExit(f"{rng_file}: not a readable RNG state "
                         f"({type(e).__name__}: {e})") from None
    try:
        state = json.loads(state_file.read_text())
    except (ValueError, UnicodeDecodeError) as e:
        raise SystemExit(f"{state_file}: not valid JSON ({e})") from None
    counters = state.items() if isinstance(state, dict) else ()
    if not state or not all(_counter(v) or (k in floats and isinstance(v, float) and v >= 0)
                            for k, v in counters):
        raise SystemExit(f"{state_file}: expected counters such as {{\"step\": 12}}, got "
                         f"{json.dumps(state)[:80]}")
    return state


def _counter(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_trainer_file(name: str) -> bool:
    """A file of a checkpoint that only a resume needs: the sharded trainer state, the RNG states,
    the position."""
    return name.startswith("trainer/") or name.startswith("rng_rank") or name == "state.json"


def export_weights(src: Path, dst: Path) -> list[str]:
    """Copy a checkpoint's Hugging Face model (config, safetensors weights, tokenizer, generation
    config: every file but the trainer's) to a new directory dst, each file checked against the
    checkpoint's sha256.json as it is read, and write dst/sha256.json of what was copied. What
    evaluate.py, vLLM and the hub need: a 7B CurioSFT checkpoint's 15 GB of bf16 weights without its
    120 GB trainer/. Written under a .tmp name and renamed when complete, as save() does: a failed
    or killed export leaves no dst. Not collective. Returns the files copied."""
    src, dst = Path(src), Path(dst)
    if not (src / "config.json").is_file() or not (src / "sha256.json").is_file():
        raise SystemExit(f"{src}: not a checkpoint written by sft.py or rl.py (config.json, "
                         "sha256.json)")
    if dst.exists() and any(dst.iterdir()):
        raise SystemExit(f"{dst}: exists and is not empty; export into a new directory")
    try:
        recorded = recorded_digests(src)
    except ValueError as e:
        raise SystemExit(str(e)) from None
    names = sorted(name for name in recorded if not is_trainer_file(name))
    tmp = dst.with_name(dst.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        copied = {}
        for name in names:
            if not (src / name).is_file():
                raise SystemExit(f"{src / name}: missing, though sha256.json lists it; nothing "
                                 "exported")
            (tmp / name).parent.mkdir(parents=True, exist_ok=True)
            copied[name] = file_sha256(src / name, tmp / name)
            if copied[name] != recorded[name]:
                raise SystemExit(f"{src / name}: does not match its digest in sha256.json; nothing "
                                 "exported")
        (tmp / "sha256.json").write_text(json.dumps(copied, indent=1))
        os.replace(tmp, dst)                     # onto a missing or empty dst
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return names


def trainer_state(model, optimizer, teacher):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    if teacher is not None:
        state["teacher"] = get_model_state_dict(teacher)
    return state


def restore(path, model, optimizer, teacher, floats: tuple[str, ...] = ()):
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    state = trainer_state(model, optimizer, teacher)
    position = load(path, state, floats)
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])
    if teacher is not None:
        set_model_state_dict(teacher, state["teacher"])
    return position


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(prog="python -m plumbing.checkpoints",
                                     description=export_weights.__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    export = commands.add_parser("export", help="a checkpoint's weights, config and tokenizer, "
                                                "without trainer/")
    export.add_argument("src", help="a checkpoint directory (out/RUN/step_NNNNNN)")
    export.add_argument("dst", help="a new directory")
    a = parser.parse_args()
    files = export_weights(Path(a.src), Path(a.dst))
    size = sum((Path(a.dst) / f).stat().st_size for f in files)
    print(f"{a.dst}: {len(files)} files, {size / 1e9:.2f} GB, each matching {a.src}/sha256.json")
