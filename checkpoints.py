"""Checkpoints: a Hugging Face directory that evaluate.py, rl.py and vLLM load, plus the sharded trainer state
(model, optimiser, teacher) and each rank's RNG for an exact resume. Every function here is collective: every
rank calls it."""
import json
import os
import shutil
from pathlib import Path

import torch
import torch.distributed as dist
from safetensors.torch import save_file

from common import full_state_dict


def save(out_dir: Path, step: int, model, tokenizer, trainer_state: dict, extra_state: dict):
    """out_dir/step_{step}/: config.json, model.safetensors, tokenizer files (loadable by from_pretrained),
    trainer/ (torch.distributed.checkpoint of `trainer_state`: sharded model, optimiser, teacher...) and
    state.json (`extra_state`: counters and data position), plus rng_rank{r}.pt per rank.
    Written under a .tmp name and renamed when complete: a crash mid-save never leaves a checkpoint that
    looks finished. Every rank must call it."""
    import torch.distributed.checkpoint as dcp

    rank = dist.get_rank()
    final, tmp = out_dir / f"step_{step:06d}", out_dir / f"step_{step:06d}.tmp"
    if rank == 0:
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
    dist.barrier()
    weights = full_state_dict(model)
    dcp.save(trainer_state, checkpoint_id=str(tmp / "trainer"))
    torch.save({"cpu": torch.get_rng_state(), **({"cuda": torch.cuda.get_rng_state()} if torch.cuda.is_available() else {})},
               tmp / f"rng_rank{rank}.pt")
    dist.barrier()  # every rank's files are written before rank 0 renames the directory
    if rank == 0:
        unwrapped_config = model.config
        unwrapped_config.save_pretrained(tmp)
        if getattr(model, "generation_config", None) is not None:
            model.generation_config.save_pretrained(tmp)
        if unwrapped_config.tie_word_embeddings:  # safetensors refuses shared storage; HF re-ties on load
            weights.pop("lm_head.weight", None)
        save_file({k: v.contiguous() for k, v in weights.items()}, tmp / "model.safetensors", metadata={"format": "pt"})
        tokenizer.save_pretrained(tmp)
        (tmp / "state.json").write_text(json.dumps(extra_state, indent=1))  # last file: marks completeness
        shutil.rmtree(final, ignore_errors=True)
        os.replace(tmp, final)
    dist.barrier()
    return final


def latest(out_dir: Path) -> Path | None:
    done = sorted(p for p in out_dir.glob("step_*") if p.is_dir() and not p.name.endswith(".tmp")
                  and (p / "state.json").exists())
    return done[-1] if done else None


def load(path: Path, trainer_state: dict) -> dict:
    """Loads trainer/ into `trainer_state` in place (same structure as saved) and restores this rank's RNG;
    returns state.json. RNG files are read with weights_only=True (no pickle)."""
    import torch.distributed.checkpoint as dcp

    dcp.load(trainer_state, checkpoint_id=str(path / "trainer"))
    rng = torch.load(path / f"rng_rank{dist.get_rank()}.pt", weights_only=True)
    torch.set_rng_state(rng["cpu"])
    if "cuda" in rng and torch.cuda.is_available():
        torch.cuda.set_rng_state(rng["cuda"])
    return json.loads((path / "state.json").read_text())


def trainer_state(model, optimizer, teacher):
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    if teacher is not None:
        state["teacher"] = get_model_state_dict(teacher)
    return state


def restore(path, model, optimizer, teacher):
    from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

    state = trainer_state(model, optimizer, teacher)
    position = load(path, state)
    set_state_dict(model, optimizer, model_state_dict=state["model"], optim_state_dict=state["optim"])
    if teacher is not None:
        set_model_state_dict(teacher, state["teacher"])
    return position
