"""What the project asks of vLLM, checked against the pinned vLLM 0.32.0's own sources, without importing vLLM (it
cannot run on a CPU build of torch). The wheel is downloaded once (`pip download vllm==0.32.0 --no-deps`, 326 MB)
into a cache outside the repository ($CURIOSFT_CACHE, default ~/.cache/curiosft); where it cannot be fetched, the
tests skip and say so.

The calls are not listed here by hand: the project's own code (generation.py's engines, rl.py's wake/sync/sleep,
evaluate.py's engine) runs against tests/fake_vllm.py, which records every LLM(...) keyword, SamplingParams field and
method call; each is then looked up in the wheel's classes, read with `ast`: LLM.__init__ and the EngineArgs fields
its **kwargs feed, SamplingParams' fields, LLM.sleep / wake_up / apply_model / reset_prefix_cache / generate, the
output fields the project reads (RequestOutput, CompletionOutput, Logprob) and Qwen2ForCausalLM.load_weights."""
import ast
import functools
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import torch

import fake_vllm
from plumbing import generation, models

VERSION = "0.32.0"
FILES = {"llm": "vllm/entrypoints/llm.py", "engine_args": "vllm/engine/arg_utils.py",
         "sampling": "vllm/sampling_params.py", "outputs": "vllm/outputs.py", "logprobs": "vllm/logprobs.py",
         "qwen2": "vllm/model_executor/models/qwen2.py", "worker": "vllm/v1/worker/gpu_worker.py",
         "runner": "vllm/v1/worker/gpu_model_runner.py",
         "embedding": "vllm/model_executor/layers/vocab_parallel_embedding.py"}
METHODS = ("sleep", "wake_up", "apply_model", "reset_prefix_cache", "generate", "collective_rpc")


def wheel_path() -> Path | str:
    """The wheel, downloaded on first use; a string saying why not otherwise."""
    cache = Path(os.environ.get("CURIOSFT_CACHE") or Path.home() / ".cache" / "curiosft") / "wheels"
    found = sorted(cache.glob(f"vllm-{VERSION}-*.whl"))
    if found:
        return found[0]
    cache.mkdir(parents=True, exist_ok=True)
    try:
        done = subprocess.run([sys.executable, "-m", "pip", "download", f"vllm=={VERSION}", "--no-deps", "-q",
                               "-d", str(cache)], capture_output=True, text=True, timeout=900)
    except subprocess.TimeoutExpired:
        return f"pip download vllm=={VERSION} did not finish in 15 minutes"
    found = sorted(cache.glob(f"vllm-{VERSION}-*.whl"))
    if done.returncode or not found:
        return f"pip download vllm=={VERSION} failed: {(done.stderr.strip().splitlines() or ['?'])[-1]}"
    return found[0]


def _class(tree: ast.Module, name: str) -> ast.ClassDef:
    for node in ast.walk(tree):
        if isinstance(node, ast.ClassDef) and node.name == name:
            return node
    raise AssertionError(f"vLLM {VERSION}: no class {name}")


def _fields(cls: ast.ClassDef) -> set[str]:
    """Annotated class attributes (dataclass / msgspec fields) and the parameters of __init__."""
    names = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    return names | _params(cls, "__init__")[0]


def _params(cls: ast.ClassDef, method: str) -> tuple[set[str], bool]:
    """(parameter names, takes **kwargs) of a method; (empty, False) when the class has none."""
    for node in cls.body:
        if isinstance(node, ast.FunctionDef) and node.name == method:
            a = node.args
            return {x.arg for x in a.posonlyargs + a.args + a.kwonlyargs} - {"self"}, a.kwarg is not None
    return set(), False


@pytest.fixture(scope="module")
def vllm_api():
    """{what: accepted names} from the wheel's sources."""
    wheel = wheel_path()
    if isinstance(wheel, str):
        pytest.skip(wheel)
    with zipfile.ZipFile(wheel) as z:
        trees = {k: ast.parse(z.read(path)) for k, path in FILES.items()}
    llm = _class(trees["llm"], "LLM")
    init, init_kwargs = _params(llm, "__init__")
    assert init_kwargs, "LLM.__init__ takes **kwargs for EngineArgs"
    api = {"LLM": init | _fields(_class(trees["engine_args"], "EngineArgs")),
           "SamplingParams": _fields(_class(trees["sampling"], "SamplingParams")),
           "RequestOutput": _fields(_class(trees["outputs"], "RequestOutput")),
           "CompletionOutput": _fields(_class(trees["outputs"], "CompletionOutput")),
           "Logprob": _fields(_class(trees["logprobs"], "Logprob")),
           "Qwen2ForCausalLM": {n.name for n in _class(trees["qwen2"], "Qwen2ForCausalLM").body
                                if isinstance(n, ast.FunctionDef)},
           # sync_weights' worker side (generation._reload_weights)
           "Worker": {n.name for n in _class(trees["worker"], "Worker").body if isinstance(n, ast.FunctionDef)},
           "GPUModelRunner.reload_weights": _params(_class(trees["runner"], "GPUModelRunner"), "reload_weights")[0],
           "UnquantizedEmbeddingMethod": {n.name for n in _class(trees["embedding"], "UnquantizedEmbeddingMethod").body
                                          if isinstance(n, ast.FunctionDef)}}
    for method in METHODS:
        names, takes_kwargs = _params(llm, method)
        assert names or method == "reset_prefix_cache", f"vLLM {VERSION}: no LLM.{method}"
        api[f"LLM.{method}"] = names
        assert not takes_kwargs
    return api


def unaccepted(calls: list[tuple[str, set[str]]], api: dict) -> list[str]:
    """'what: name' for every keyword (or field) of `calls` that the API does not accept."""
    return [f"{what}: {name}" for what, names in calls for name in sorted(names - api[what])]


def record_methods(vllm, monkeypatch) -> list[tuple[str, set[str]]]:
    """Wrap the fake LLM's methods so that each call records its keyword names (and positional arguments by the
    parameter names vLLM gives them)."""
    calls = []
    positional = {"generate": ["prompts", "sampling_params"], "apply_model": ["func"], "sleep": ["level"],
                  "wake_up": ["tags"], "reset_prefix_cache": [], "collective_rpc": ["method", "timeout", "args"]}
    for method in METHODS:
        original = getattr(vllm.LLM, method)

        @functools.wraps(original)
        def spy(self, *args, _original=original, _method=method, **kwargs):
            calls.append((f"LLM.{_method}", set(positional[_method][: len(args)]) | set(kwargs)))
            return _original(self, *args, **kwargs)

        monkeypatch.setattr(vllm.LLM, method, spy)
    return calls


@pytest.fixture
def project_calls(checkpoint, world_of_one, monkeypatch):
    """Every call rl.py's and evaluate.py's engines make, run against the recording fake."""
    import evaluate

    vllm = fake_vllm.install(monkeypatch)
    calls = record_methods(vllm, monkeypatch)
    monkeypatch.setenv("RANK", "0")
    # rl.py: the colocated engine, asleep; wake with the trainer's weights; rollouts without log-probs; sleep
    engine, tokenizer = generation.rollout_engine(str(checkpoint), "vllm", "bfloat16", 0, 0.5, 64, sleep=True,
                                                  has_trainer_weights=False)
    trainer = models.shard_model(models.load_full_model(str(checkpoint), scratch=False, seed=0),
                                 torch.device("cpu"), bf16=False, grad_ckpt=False)
    generation.wake(engine, trainer, 1 << 20)
    generation.generate(engine, tokenizer, ["1+1=", "2+2="], n=2, max_new_tokens=4, logprobs=False)
    generation.sleep(engine)
    # evaluate.py: its engine's keywords (as evaluate_checkpoint passes them on two ranks), with log-probs
    seen = []

    def stop_at_engine(*args, **kwargs):
        seen.append((args, kwargs))
        raise KeyboardInterrupt

    monkeypatch.setattr(evaluate, "load_engine", stop_at_engine)
    with pytest.raises(KeyboardInterrupt):
        evaluate.evaluate_checkpoint(evaluate.Args(model=str(checkpoint), data="-", engine="vllm"), {}, 0, 2, None)
    args, kwargs = seen[0]
    engine, tokenizer = generation.load_engine(*args, **kwargs)
    generation.generate(engine, tokenizer, ["1+1="], n=2, max_new_tokens=4, logprobs=True)
    # vLLM's CPU build (the tests' engine): its own settings, read here in the same version's EngineArgs
    monkeypatch.setattr(generation, "vllm_device", lambda: "cpu")
    monkeypatch.setenv("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    generation.load_engine(str(checkpoint), "vllm", "float32", max_model_len=64, gpu_memory_utilization=0.5)
    calls += [("LLM", set(llm.kwargs) | {"model"}) for llm in vllm.engines]
    calls += [("SamplingParams", set(sp.kwargs)) for sp in vllm.sampling_params]
    return calls


def test_every_vllm_call_the_project_makes_is_accepted_by_the_pinned_wheel(vllm_api, project_calls):
    what = {w for w, _ in project_calls}
    assert {"LLM", "SamplingParams", *(f"LLM.{m}" for m in METHODS)} <= what, what     # every kind was exercised
    # each request carries its own seed (samples independent of batching), a field the wheel must accept
    assert all("seed" in names for w, names in project_calls if w == "SamplingParams")
    assert not unaccepted(project_calls, vllm_api)
    # the fields the project reads of the outputs: the recording fake's, which the project's tests run against
    read = [("RequestOutput", set(fake_vllm.RequestOutput.__dataclass_fields__)),
            ("CompletionOutput", set(fake_vllm.CompletionOutput.__dataclass_fields__)),
            ("Logprob", set(fake_vllm.Logprob.__dataclass_fields__)),
            ("Qwen2ForCausalLM", {"load_weights"}), ("Worker", {"get_model", "reload_weights"}),
            ("GPUModelRunner.reload_weights", {"weights_iterator"}),
            ("UnquantizedEmbeddingMethod", {"process_weights_after_loading"})]
    assert not unaccepted(read, vllm_api)


def test_a_misspelt_keyword_is_caught(vllm_api, project_calls):
    """Break one keyword of each kind the way a typo would: the check names it."""
    broken = [(what, {name + "s" for name in sorted(names)[:1]} | names) for what, names in project_calls if names]
    missing = unaccepted(broken, vllm_api)
    assert "LLM: gpu_memory_utilizations" in missing or any(m.startswith("LLM: ") for m in missing)
    for kind in ("LLM", "SamplingParams", "LLM.sleep", "LLM.wake_up", "LLM.generate"):
        assert any(m.startswith(f"{kind}: ") for m in missing), kind
    assert unaccepted([("LLM", {"enable_sleep_mod"}), ("SamplingParams", {"max_token"})], vllm_api) == \
        ["LLM: enable_sleep_mod", "SamplingParams: max_token"]
