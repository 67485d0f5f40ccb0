"""A stand-in for the `vllm` package that records what the code asks of it, for tests on machines without CUDA.
Each behaviour it mimics is read from vLLM 0.32.0's source (the file and function are named next to it); none of
it is verified against vLLM itself. `install(monkeypatch)` puts it in sys.modules and makes plumbing/generation.py
see vLLM."""
import sys
import types
from dataclasses import dataclass

import torch
import transformers

from plumbing import generation


@dataclass
class Logprob:  # vllm/logprobs.py: one entry of CompletionOutput.logprobs[position][token_id]
    logprob: float


@dataclass
class CompletionOutput:  # vllm/outputs.py
    token_ids: list[int]
    logprobs: list[dict[int, Logprob]] | None
    finish_reason: str


@dataclass
class RequestOutput:  # vllm/outputs.py
    outputs: list[CompletionOutput]


def install(monkeypatch):
    """A fresh fake `vllm` module: .LLM, .SamplingParams, .events (calls in order, shared with any spy a test adds),
    .engines (every LLM built) and .sampling_params (every SamplingParams made)."""
    module = types.ModuleType("vllm")
    module.events, module.engines, module.sampling_params = [], [], []

    class SamplingParams:
        def __init__(self, **kwargs):
            self.kwargs = kwargs
            self.__dict__.update(kwargs)
            module.sampling_params.append(self)

    class LLM:
        def __init__(self, model, **kwargs):
            # entrypoints/llm.py LLM.__init__: keyword arguments become EngineArgs; weights load in `dtype`
            self.kwargs, self.asleep, self.loads, self.scripted, self.skip_on_load = kwargs, set(), [], None, None
            dtype = kwargs.get("dtype", "auto")
            self.model = transformers.AutoModelForCausalLM.from_pretrained(
                model, dtype=torch.float32 if dtype == "auto" else getattr(torch, dtype))
            self.model.load_weights = self._load_weights
            module.engines.append(self)
            module.events.append("LLM")

        def sleep(self, level=1, mode="abort"):
            # LLM.sleep -> EngineCore.sleep -> Executor.sleep (v1/executor/abstract.py): puts "weights" and
            # "kv_cache" to sleep, and only warns if the weights already sleep. Level 2 discards the weights
            # (device_allocator/sleep_mode_backend.py CuMemBackend.suspend): here they turn to NaN.
            assert self.kwargs.get("enable_sleep_mode"), "sleep needs LLM(enable_sleep_mode=True)"
            module.events.append(f"sleep:{level}")
            if "weights" in self.asleep:
                return
            self.asleep = {"weights", "kv_cache"}
            if level == 2:
                for p in self.model.parameters():
                    p.data.fill_(float("nan"))

        def wake_up(self, tags=None):
            # Executor.wake_up: a tag that is not asleep is only warned about; EngineCore.wake_up returns whether
            # everything is awake, and only then resumes the scheduler
            module.events.append("wake:" + ",".join(tags or ["all"]))
            tags = set(self.asleep if tags is None else tags)
            if tags <= self.asleep:
                self.asleep -= tags
            return not self.asleep

        def apply_model(self, fn):
            # v1/worker/worker_base.py apply_model: fn(model) in each worker; one worker per engine here
            return [fn(self.model)]

        def collective_rpc(self, method, timeout=None, args=(), kwargs=None):
            # entrypoints/llm.py collective_rpc -> v1/serial_utils.py run_method: a callable is called with the
            # worker first; one worker per engine here
            module.events.append("collective_rpc")
            return [method(Worker(self), *args, **(kwargs or {}))]

        def _load_weights(self, weights):
            # models/utils.py AutoWeightsLoader.load_weights: copies into the parameters, returns the loaded names
            assert "weights" not in self.asleep, "load_weights into sleeping (unmapped) weight memory"
            module.events.append("load")
            params, loaded = dict(self.model.named_parameters()), set()
            batch = {}
            for name, tensor in weights:
                batch[name] = tensor.clone()
                if name != self.skip_on_load:
                    params[name].data.copy_(tensor)
                    loaded.add(name)
            self.loads.append(batch)
            return loaded

        @torch.no_grad()
        def _logprobs(self, prompt_ids, ids, sp):
            # v1/sample/sampler.py Sampler.forward: raw_logprobs are the model's log-probs of the tokens before
            # temperature and top-p; processed_logprobs here those at the request's temperature (the fake's tokens
            # are not drawn from the model, and top-p is not applied)
            raw = self.kwargs.get("logprobs_mode") == "raw_logprobs"
            logits = self.model(torch.tensor([prompt_ids + ids])).logits[0, len(prompt_ids) - 1 : -1].float()
            temperature = 1.0 if raw else sp.temperature
            lps = (logits / temperature).log_softmax(-1).gather(-1, torch.tensor(ids)[:, None])[:, 0]
            return [{t: Logprob(lp)} for t, lp in zip(ids, lps.tolist())]

        def reset_prefix_cache(self):
            module.events.append("reset_prefix_cache")
            return True

        def generate(self, prompts, params, use_tqdm=True):
            # v1/engine/core.py EngineCore.wake_up resumes the scheduler only when nothing sleeps: a request sent
            # earlier would wait forever
            assert not self.asleep, f"generate while {sorted(self.asleep)} sleep"
            assert all(p.isfinite().all() for p in self.model.parameters()), "discarded weights never reloaded"
            module.events.append("generate")
            vocab = self.model.config.vocab_size
            outputs = []
            for i, (prompt, sp) in enumerate(zip(prompts, params)):
                assert prompt["prompt_token_ids"]
                children = []
                for j in range(sp.n):   # v1/engine/parallel_sampling.py: child j samples with seed + j
                    if self.scripted is not None:
                        ids, reason = self.scripted[i][j]
                    else:
                        g = torch.Generator().manual_seed(sp.seed + j)
                        ids = torch.randint(3, vocab, (int(torch.randint(1, sp.max_tokens + 1, (1,), generator=g)),),
                                            generator=g).tolist()
                        reason = "length" if len(ids) == sp.max_tokens else "stop"
                        ids[-1] = sp.stop_token_ids[0] if reason == "stop" else ids[-1]
                    logprobs = None if sp.logprobs is None else self._logprobs(prompt["prompt_token_ids"], ids, sp)
                    children.append(CompletionOutput(list(ids), logprobs, reason))
                outputs.append(RequestOutput(children))
            return outputs

    class Worker:
        def __init__(self, llm):
            self.llm = llm

        def get_model(self):  # v1/worker/gpu_worker.py Worker.get_model
            return self.llm.model

        def reload_weights(self, weights_iterator=None):
            # gpu_worker.py reload_weights -> model_loader/reload/inplace.py: one model.load_weights call over the
            # whole iterator (the layerwise processing around it has no stand-in here)
            assert weights_iterator is not None, "reload_weights without weights reads the checkpoint again"
            self.llm.model.load_weights(weights_iterator)

    module.LLM, module.SamplingParams = LLM, SamplingParams
    monkeypatch.setitem(sys.modules, "vllm", module)
    monkeypatch.setattr(generation, "vllm_device", lambda: "cuda")     # it stands in for the GPU engine
    return module
