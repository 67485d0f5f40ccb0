"""Text to tensors for CurioSFT: the training prompt (paper Table 7), loaders for the authors'
parquet/JSONL schema, tokenisation with a response-only loss mask, length-grouped micro-batches,
and the download of the paper's data (python data.py download).

Row schema (the authors' and LUFFY's files, e.g. OpenR1-Math-46K and the benchmarks):
    data_source: str
    prompt: [{role: system, content}, {role: user, content: <question>}]
    reward_model: {ground_truth: str, style: "rule"}
    target: [{role: assistant, content: "<think>\\n..."}]   (training files: the expert response)
"""
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow.parquet as pq
import torch


# --------------------------------------------------------------------------------------------------
# Prompt (paper Table 7)
# --------------------------------------------------------------------------------------------------
SYSTEM_PROMPT = (
    "You are an exceptional mathematician. Your task is to solve mathematical questions through a "
    "systematic and thorough reasoning process. This involves careful analysis, exploration of "
    "possible approaches, verification of intermediate steps, critical reassessment, and iterative "
    "refinement of your reasoning process.\n\n"
    'Structure your response in two distinct sections: "Thought" and "Solution".\n'
    'In the "Thought" section, present your detailed reasoning process in the following format:\n'
    "<think>\n"
    "{Your detailed reasoning, including brainstorming, logical deductions, verification, and "
    "refinement of ideas.}\n"
    "</think>\n"
    'This section must conclude with "</think>", and should reflect deep, reflective, and '
    "self-correcting thinking process.\n"
    'In the "Solution" section, following the "</think>", concisely draw the final, logical, and '
    "accurate answer from your reasoning.\n\n"
    "Please output your final answer within \\boxed{}."
)
USER_PREFIX = "Here is the question:"  # Table 7: no space before {question}
THINK = "<think>\n"  # Table 7 opens the assistant turn with it; the model writes from there


def _chatml(messages: list[dict]) -> str:
    """Qwen's ChatML, ending with an opened assistant turn (add_generation_prompt=True)."""
    turns = "".join(f"<|im_start|>{m['role']}\n{m['content']}<|im_end|>\n" for m in messages)
    return turns + "<|im_start|>assistant\n"


def chat_prompt(messages: list[dict], tokenizer=None) -> str:
    """The tokenizer's chat template applied to `messages`, ending with an opened assistant turn
    (Qwen's ChatML when the tokenizer has no template)."""
    if tokenizer is not None and tokenizer.chat_template:
        import jinja2

        try:
            return tokenizer.apply_chat_template(messages, add_generation_prompt=True,
                                                 tokenize=False)
        except jinja2.TemplateError as e:        # a broken template, or one its sandbox refused
            where = getattr(tokenizer, "name_or_path", "") or "the tokenizer"
            raise ValueError(f"{where}: its chat template failed ({type(e).__name__}: "
                             f"{str(e).splitlines()[0] if str(e) else ''})") from None
    return _chatml(messages)


def build_prompt(question: str, tokenizer=None, system: str = SYSTEM_PROMPT) -> str:
    """Table 7 prompt, ending with "<|im_start|>assistant\\n<think>\\n". A question that already
    starts with Table 7's "Here is the question:" (a row that stores Table 7's user turn) is not
    prefixed twice."""
    user = USER_PREFIX + question.removeprefix(USER_PREFIX)
    messages = [{"role": "system", "content": system}, {"role": "user", "content": user}]
    text = chat_prompt(messages, tokenizer)
    # Some templates (e.g. DeepSeek-R1 distills) already open the think block; never open it twice.
    return text if text.endswith(THINK) else text + THINK


# --------------------------------------------------------------------------------------------------
# Loaders: .parquet, .jsonl, .json; a bad row is an error naming file, row and field, never skipped
# --------------------------------------------------------------------------------------------------
@dataclass
class Example:
    question: str  # content of the last user message in `prompt`
    ground_truth: str  # reward_model.ground_truth, numbers converted with str()
    response: str | None  # target[0].content without its leading "<think>\n"; None: no target
    data_source: str
    row: int  # 0-based row in the file, for error messages and de-duplication
    system: str | None = None  # content of the row's system message, if it has one
    messages: list | None = None  # the row's `prompt` as stored: [{role, content}, ...]
    file: str = field(default="", compare=False)  # the file the row came from, for error messages

    def where(self) -> str:
        return f"{self.file} row {self.row}" if self.file else f"row {self.row}"


SYSTEM_PROMPT_MODES = ("paper", "row", "messages")


def example_prompt(ex: Example, tokenizer=None, system_prompt: str = "paper") -> str:
    """The prompt of one example, by mode (the stage scripts' --system_prompt):
    paper: Table 7 around the row's question (every stage's default; App. E uses it for SFT and RL).
    row: Table 7 with the row's own system message (the toy demo's one-liner: 3x shorter sequences).
    messages: the row's prompt messages exactly as stored, through the tokenizer's chat template,
    nothing added: what the authors' code trains and evaluates on. Whether the assistant turn then
    opens with "<think>" is up to the template."""
    if system_prompt == "paper":
        return build_prompt(ex.question, tokenizer)
    if system_prompt == "row":
        if ex.system is None:
            raise ValueError(f"{ex.where()}: field 'prompt' has no system message, "
                             f"which system_prompt='row' needs")
        return build_prompt(ex.question, tokenizer, ex.system)
    if system_prompt == "messages":
        for k, m in enumerate(ex.messages or [None]):
            if not (isinstance(m, dict) and isinstance(m.get("role"), str)
                    and isinstance(m.get("content"), str)):
                raise ValueError(f"{ex.where()}: field 'prompt[{k}]' is not a {{role, content}} "
                                 f"message of strings, which system_prompt='messages' needs")
        messages = [{"role": m["role"], "content": m["content"]} for m in ex.messages]
        return chat_prompt(messages, tokenizer)
    modes = ", ".join(SYSTEM_PROMPT_MODES)
    raise ValueError(f"system_prompt {system_prompt!r}: expected one of {modes}")


def _read_rows(path: Path) -> list:
    if path.suffix == ".parquet":
        return pq.read_table(path).to_pylist()  # plain dicts and lists, not pandas' numpy arrays
    if path.suffix == ".jsonl":
        rows = []
        for i, line in enumerate(path.read_bytes().splitlines()):
            try:
                rows.append(json.loads(line.decode("utf-8")))
            except UnicodeDecodeError as e:
                raise ValueError(f"{path} row {i}: not UTF-8 (byte {e.start} of the line)") \
                    from None
            except json.JSONDecodeError as e:
                raise ValueError(f"{path} row {i}: invalid JSON ({e})") from None
        return rows
    if path.suffix == ".json":
        try:
            rows = json.loads(path.read_bytes().decode("utf-8"))
        except UnicodeDecodeError as e:
            raise ValueError(f"{path}: not UTF-8 (byte {e.start})") from None
        if not isinstance(rows, list):
            raise ValueError(f"{path}: expected a JSON list of rows, got {type(rows).__name__}")
        return rows
    raise ValueError(f"{path}: unknown extension {path.suffix!r} (.parquet, .jsonl or .json)")


def _parse_row(row, i: int, path: Path, require_response: bool) -> Example:
    def bad(field, problem):
        return ValueError(f"{path} row {i}: field '{field}' {problem}")

    def get(obj, key, field, kind):
        """obj[key] checked to be a `kind`; `field` is the dotted name used in the error."""
        value = obj.get(key) if isinstance(obj, dict) else None
        if value is None:
            raise bad(field, "is missing")
        if not isinstance(value, kind) or isinstance(value, bool):
            raise bad(field, f"has type {type(value).__name__}")
        return value

    def text(obj, key, field):
        value = get(obj, key, field, str)
        if not value.strip():
            raise bad(field, "is empty")
        return value

    if not isinstance(row, dict):
        raise ValueError(f"{path} row {i}: expected an object, got {type(row).__name__}")
    data_source = get(row, "data_source", "data_source", str)

    messages = get(row, "prompt", "prompt", list)
    roles = [m.get("role") if isinstance(m, dict) else None for m in messages]
    users = [k for k, role in enumerate(roles) if role == "user"]
    if not users:
        raise bad("prompt", "has no user message")
    question = text(messages[users[-1]], "content", f"prompt[{users[-1]}].content")
    systems = [k for k, role in enumerate(roles) if role == "system"]
    system = None
    if systems:
        system = text(messages[systems[0]], "content", f"prompt[{systems[0]}].content")

    reward_model = get(row, "reward_model", "reward_model", dict)
    truth = get(reward_model, "ground_truth", "reward_model.ground_truth", (str, int, float))
    ground_truth = str(truth)
    if not ground_truth.strip():
        raise bad("reward_model.ground_truth", "is empty")
    if isinstance(truth, float) and not math.isfinite(truth):       # pandas' missing value, inf
        raise bad("reward_model.ground_truth", f"is {truth}, not an answer")
    if not _braces_nest(ground_truth):                                # "\frac{": a cut-off answer
        raise bad("reward_model.ground_truth", f"has unbalanced braces: {ground_truth[:60]!r}")

    response = None
    if row.get("target") is not None or require_response:
        target = get(row, "target", "target", list)
        if not target:
            raise bad("target", "is empty")
        response = get(target[0], "content", "target[0].content", str).removeprefix(THINK)
        if not response.strip():  # also catches a response that is only "<think>\n"
            raise bad("target[0].content", "is empty")
    return Example(question, ground_truth, response, data_source, i, system, messages, str(path))


def _braces_nest(text: str) -> bool:
    """Every { closed by a later } (LaTeX answers: \\frac{1}{2}, \\{1, 2\\})."""
    depth = 0
    for c in text:
        depth += (c == "{") - (c == "}")
        if depth < 0:
            return False
    return depth == 0


def load_examples(path, require_response: bool = False) -> list[Example]:
    """Every row of a .parquet, .jsonl or .json (list of rows) file in the schema above.
    Raises ValueError naming the file (and the row and field) for a missing file, an unknown
    extension, an empty file or any bad row. require_response=True makes `target` mandatory
    (SFT files)."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{path}: file not found")
    rows = _read_rows(path)
    if not rows:
        raise ValueError(f"{path}: no rows")
    return [_parse_row(row, i, path, require_response) for i, row in enumerate(rows)]


# --------------------------------------------------------------------------------------------------
# Tokenisation: prompt tokens are context, the response and its EOS are targets
# --------------------------------------------------------------------------------------------------
def _eos_id(tokenizer) -> int:
    if tokenizer.eos_token_id is None:
        raise ValueError("tokenizer has no eos_token_id: the expert response must end with EOS")
    return tokenizer.eos_token_id


def _join(prompt_ids: list[int], response_ids: list[int], eos_id: int):
    """(input_ids, loss_mask). The mask is 1 on exactly the response tokens and EOS, so the model
    learns to stop. (The SFT dataset of verl, the framework the authors' code forks, is off by one
    here: it trains the last prompt token and not EOS.)"""
    input_ids = prompt_ids + response_ids + [eos_id]
    loss_mask = [0] * len(prompt_ids) + [1] * (len(response_ids) + 1)
    return input_ids, loss_mask


def tokenize_sft(tokenizer, prompt: str, response: str) -> tuple[list[int], list[int]]:
    """(input_ids, loss_mask), both of length len(prompt ids) + len(response ids) + 1.
    Prompt and response are encoded separately so the boundary is exact (no BPE merge across it)."""
    prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
    response_ids = tokenizer.encode(response, add_special_tokens=False)
    return _join(prompt_ids, response_ids, _eos_id(tokenizer))


def build_sft_data(tokenizer, examples: list[Example], max_prompt_len: int = 1024,
                   max_response_len: int = 8192, system_prompt: str = "paper"):
    """[(input_ids, loss_mask)] (int32 tensors) for every example that fits, and stats {"kept",
    "dropped_prompt", "dropped_response"} for the caller to print: an over-long example is dropped,
    never truncated (a truncated response would teach the model to stop without an answer)."""
    eos_id = _eos_id(tokenizer)
    for ex in examples:
        if ex.response is None:
            raise ValueError(f"{ex.where()}: no expert response (load with require_response=True)")
    data, stats = [], {"kept": 0, "dropped_prompt": 0, "dropped_response": 0}
    chunk = 512  # batched encoding is faster (Rust threads); chunks bound the memory of one call
    for start in range(0, len(examples), chunk):
        part = examples[start : start + chunk]
        prompts = tokenizer([example_prompt(ex, tokenizer, system_prompt) for ex in part],
                            add_special_tokens=False)
        responses = tokenizer([ex.response for ex in part], add_special_tokens=False)
        for p_ids, r_ids in zip(prompts["input_ids"], responses["input_ids"]):
            if len(p_ids) > max_prompt_len:
                stats["dropped_prompt"] += 1
            elif len(r_ids) + 1 > max_response_len:  # +1: the EOS is part of the response
                stats["dropped_response"] += 1
            else:  # int32 tensors: ~5 bytes a token, Python lists ~40 (46k x 4k tokens per rank)
                ids, mask = _join(p_ids, r_ids, eos_id)
                data.append((torch.tensor(ids, dtype=torch.int32),
                             torch.tensor(mask, dtype=torch.int32)))
                stats["kept"] += 1
    return data, stats


@dataclass
class Prompt:
    """A question as GRPO samples it: the row, the prompt text the engine sees, its token ids."""
    example: Example
    text: str
    ids: list[int]


def load_prompts(path, tokenizer, max_prompt_len: int, system_prompt: str = "paper",
                 require_response: bool = False) -> tuple[list[Prompt], int]:
    """Every example of the file whose prompt fits max_prompt_len (the token ids as the engines see
    them: no BOS or other added tokens), and the file's rows (the others were dropped)."""
    kept = []
    examples = load_examples(path, require_response=require_response)
    for ex in examples:
        text = example_prompt(ex, tokenizer, system_prompt)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) <= max_prompt_len:
            kept.append(Prompt(ex, text, ids))
    return kept, len(examples)


# --------------------------------------------------------------------------------------------------
# Batching: one optimiser step = `global_batch` examples, split into length-grouped micro-batches
# --------------------------------------------------------------------------------------------------
def _tokens(mb: list[int], lengths: list[int], pack: bool = False) -> int:
    """The tokens a micro-batch computes: its sequences end to end (pack), else each padded to the
    longest."""
    return sum(lengths[i] for i in mb) if pack else max(lengths[i] for i in mb) * len(mb)


def _pack(step: list[int], lengths: list[int], token_budget: int, pack: bool) -> list[list[int]]:
    """Micro-batches of at most token_budget tokens (_tokens), longest sequence first; a sequence
    over the budget forms a micro-batch alone. Padded: the first sequence of a micro-batch sets its
    padded length, so a sequence joins the newest micro-batch while (n + 1) x that length fits.
    Packed: first fit, a sequence joins the first micro-batch it fits in (fewer, fuller
    micro-batches: a packed one has no padding to save)."""
    mbs = []
    for i in sorted(step, key=lambda i: (-lengths[i], i)):
        candidates = mbs if pack else mbs[-1:]
        fits = [mb for mb in candidates if _tokens(mb + [i], lengths, pack) <= token_budget]
        if fits:
            fits[0].append(i)
        else:
            mbs.append([i])
    return mbs


def least_padded_split(lengths: list[int], groups: int, cap: int) -> list[int]:
    """Sizes of `groups` consecutive micro-batches of lengths sorted longest first whose padded
    tokens (size x first length) are fewest, none over cap: a long sequence goes with few, short
    ones with more. Exact, by dynamic programming over (micro-batches, sequences):
    O(groups x n^2)."""
    n = len(lengths)
    best = [[math.inf] * (n + 1) for _ in range(groups + 1)]     # best[g][k]: first k in g groups
    start = [[0] * (n + 1) for _ in range(groups + 1)]
    best[0][0] = 0
    for g in range(1, groups + 1):
        for k in range(g, n - (groups - g) + 1):
            for i in range(g - 1, k):
                cost = best[g - 1][i] + (k - i) * lengths[i]
                if (k - i) * lengths[i] <= cap and cost < best[g][k]:
                    best[g][k], start[g][k] = cost, i
    if best[groups][n] == math.inf:
        raise ValueError(f"{n} sequences do not split into {groups} micro-batches of <= {cap} "
                         f"tokens")
    sizes, k = [], n
    for g in range(groups, 0, -1):
        sizes.append(k - start[g][k])
        k = start[g][k]
    return sizes[::-1]


def balanced_groups(lengths: list[int], groups: int, most: int) -> list[list[int]]:
    """Indices of `lengths` in `groups` packed micro-batches of at most `most` sequences each, their
    tokens balanced: longest first, each to the group with the fewest tokens that has room (ties:
    the first). Each group lists its indices in increasing order."""
    if groups * most < len(lengths):
        raise ValueError(f"{len(lengths)} sequences do not fit {groups} micro-batches of {most}")
    parts, tokens = [[] for _ in range(groups)], [0] * groups
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        g = min((g for g in range(groups) if len(parts[g]) < most), key=lambda g: tokens[g])
        parts[g].append(i)
        tokens[g] += lengths[i]
    return [sorted(p) for p in parts]


def split_micro_batches(lengths: list[int], most: int, cap: int, pack: bool) -> list[list[int]]:
    """Indices of sequences (lengths sorted longest first) in as many micro-batches as `most`
    sequences each would make (rl.py: every rank the same count): packed, tokens balanced
    (balanced_groups); padded, consecutive, padding least with none over cap tokens
    (least_padded_split)."""
    groups = -(-len(lengths) // most)
    if pack:
        return balanced_groups(lengths, groups, most)
    sizes = least_padded_split(lengths, groups, cap)
    ends = itertools.accumulate(sizes)
    return [list(range(end - size, end)) for end, size in zip(ends, sizes)]


def _deal(mbs: list[list[int]], lengths: list[int], world_size: int,
          pack: bool) -> list[list[list[int]]]:
    """Equal micro-batch counts per rank, computed tokens balanced: costliest first, dealt in snake
    order (0..w-1, w-1..0, ...). Each rank then runs its largest micro-batch first, so an OOM shows
    at once."""
    ranks = [[] for _ in range(world_size)]
    for k, mb in enumerate(sorted(mbs, key=lambda mb: -_tokens(mb, lengths, pack))):
        r = k % world_size
        ranks[r if (k // world_size) % 2 == 0 else world_size - 1 - r].append(mb)
    return ranks


def plan_micro_batches(lengths: list[int], global_batch: int, token_budget: int, world_size: int,
                       seed: int, epoch: int, pack: bool = False) -> list[list[list[list[int]]]]:
    """The epoch's plan: plan[step][rank] = micro-batches (lists of example indices) that rank runs.

    A pure function of its arguments, so every rank computes the same plan without communicating.
    Like DistributedSampler(drop_last=True): shuffled with seed + epoch, and the last len(lengths) %
    global_batch examples of the shuffled order are left out of this epoch. Within a step every
    example appears exactly once, ranks are disjoint, and every rank runs the same number of
    micro-batches (FSDP's collectives hang otherwise). The tokens a micro-batch computes (_tokens:
    packed end to end, or padded to its longest) stay <= token_budget except for a single sequence
    longer than it."""
    if global_batch % world_size != 0:
        raise ValueError(f"global_batch {global_batch} is not divisible by world_size {world_size}")
    n_steps = len(lengths) // global_batch
    if n_steps == 0:
        raise ValueError(f"{len(lengths)} examples are fewer than one global batch of "
                         f"{global_batch}")
    shuffle = torch.Generator().manual_seed(seed + epoch)
    order = torch.randperm(len(lengths), generator=shuffle).tolist()
    plan = []
    for s in range(n_steps):
        mbs = _pack(order[s * global_batch : (s + 1) * global_batch], lengths, token_budget, pack)
        # Split a micro-batch until ranks can get equal counts. This ends: all singletons give
        # global_batch micro-batches, a multiple of world_size. Parts of a micro-batch fit.
        while len(mbs) % world_size:
            if pack:    # the most tokens of those with 2+ sequences, alternately: halves alike
                size = [(len(mb) > 1, _tokens(mb, lengths, pack)) for mb in mbs]
                mb = mbs.pop(size.index(max(size)))
                mbs += [mb[0::2], mb[1::2]]
            else:       # the most sequences, into its longer and its shorter half
                mb = mbs.pop(max(range(len(mbs)), key=lambda j: len(mbs[j])))
                mbs += [mb[: len(mb) // 2], mb[len(mb) // 2 :]]
        plan.append(_deal(mbs, lengths, world_size, pack))
    return plan


def collate(batch: list[tuple[list[int], list[int]]], pad_id: int, device=None,
            pack: bool = False) -> dict:
    """A micro-batch as tensors, on `device` if given: right-padded rows [B, T] to its longest
    sequence, or (pack) one row [1, sum of lengths] of the sequences end to end, without padding.

    loss_mask is aligned with input_ids: loss_mask[b, t] = 1 when token input_ids[b, t] is a trained
    target, predicted from positions < t. The trainer therefore scores logits[:, :-1] against
    input_ids[:, 1:] and weights with loss_mask[:, 1:] (position 0 is never a target). target_index
    [N] lists the flat positions whose next token is trained, in order: the host knows them here,
    so selecting them on a GPU needs no boolean mask (a device-to-host sync). seq_lens: the
    sequences' lengths, on the host.
    Padded: padding has attention_mask = loss_mask = 0; padded (a bool) says whether any sequence
    is shorter than T. Packed: position_ids restart at 0 with each sequence and cu_seq_lens [B + 1]
    (int32) are its offsets: attention stays inside each sequence (plumbing/attention.py)."""
    lens = [len(ids) for ids, _ in batch]
    for b, (ids, mask) in enumerate(batch):
        if len(ids) != len(mask):
            raise ValueError(f"batch item {b}: {len(ids)} ids but {len(mask)} mask entries")
    rows, T = (1, sum(lens)) if pack else (len(batch), max(lens))
    input_ids = torch.full((rows, T), pad_id, dtype=torch.long)       # [B, T] or [1, sum]
    loss_mask = torch.zeros(rows, T, dtype=torch.float32)             # float: weighs losses
    target_index, start = [], 0
    for b, (ids, mask) in enumerate(batch):
        row, col = (0, start) if pack else (b, 0)
        input_ids[row, col : col + len(ids)] = torch.as_tensor(ids)
        loss_mask[row, col : col + len(ids)] = torch.as_tensor(mask, dtype=torch.float32)
        flags = mask.tolist() if isinstance(mask, torch.Tensor) else mask
        first = row * T + col                                         # flat position of token 0
        target_index += [first + t - 1 for t in range(1, len(flags)) if flags[t]]
        start += len(ids)
    tensors = {"input_ids": input_ids, "loss_mask": loss_mask,
               "target_index": torch.tensor(target_index, dtype=torch.long)}          # [N]
    if pack:
        tensors["position_ids"] = torch.cat([torch.arange(n) for n in lens]).view(1, -1)
        offsets = torch.tensor([0] + lens).cumsum(0)
        tensors["cu_seq_lens"] = offsets.to(torch.int32)
    else:
        tensors["attention_mask"] = (torch.arange(T) < torch.tensor(lens)[:, None]).long()
    if device is not None:
        tensors = {k: v.to(device) for k, v in tensors.items()}
    return tensors | {"seq_lens": lens, "padded": not pack and min(lens) < T}


def collate_ids(example_ids: list[int], dataset, pad_id: int, device=None,
                pack: bool = False) -> dict:
    """collate of the examples dataset[i] for i in example_ids: one micro-batch of a plan."""
    return collate([dataset[i] for i in example_ids], pad_id, device, pack)


def examples_of(batch: list[list[list[int]]], micro_batches: list[int]) -> list[int]:
    """The example ids of micro-batches `micro_batches` (indices) on every rank of a planned data
    batch (batch[rank][k]: example ids): the examples one optimiser step trains."""
    ids = []
    for rank_mbs in batch:
        for k in micro_batches:
            ids += rank_mbs[k]
    return ids


def padding_efficiency(lengths: list[int], micro_batches: list[list[int]],
                       pack: bool = False) -> float:
    """Real tokens / computed tokens over the micro-batches (1.0 = no padding, as when packed), for
    logging."""
    real = sum(lengths[i] for mb in micro_batches for i in mb)
    return real / sum(_tokens(mb, lengths, pack) for mb in micro_batches)


# --------------------------------------------------------------------------------------------------
# Writing rows (the demo's toy task, tests)
# --------------------------------------------------------------------------------------------------
def write_jsonl(rows: list[dict], path) -> Path:
    """One JSON row per line (what load_examples reads back); creates the parent directory."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


# --------------------------------------------------------------------------------------------------
# The paper's benchmarks, data and model (the download needs a machine online)
# --------------------------------------------------------------------------------------------------
HUB_DATASETS = {  # local folder name -> hub dataset
    # The authors' data: train.parquet (OpenR1-Math-46K with the questions rewritten by DeepSeek-V3,
    # App. E, and R1's responses: the training file of both stages in both recipes),
    # validation.parquet, and the benchmark files test.{math,gpqa,arc_c,mmlu_pro}.parquet.
    "curiosft": "Hao0oWang/CurioSFT_Data",
    "openr1_46k": "Elliott/Openr1-Math-46k-8192",  # LUFFY's OpenR1-Math-46K: the original questions
}
BENCHMARK_FILES = "test.*.parquet"  # in the authors' data: what their evaluation scripts evaluate
HUB_MODELS = {  # --models name -> Qwen2.5-Math-7B with its 4k context extended to 16k
    "authors": "Hao0oWang/Qwen2.5-Math-7B-16k-think",  # what the authors' download script fetches
    "luffy": "Elliott/Qwen2.5-Math-7B-16k-think",  # LUFFY's model of the same kind
    "small": "Qwen/Qwen2.5-Math-1.5B",  # 4k context, extended as it downloads (config/sft_small.py)
}
# The extension the 7B models above have (LUFFY's: rope_theta 10000 -> 40000, 4k -> 16k positions),
# without training, so that 1024 + 8192 tokens fit; --models small gets it in its config.json (a
# "-16k" folder).
CONTEXT_16K = {"rope_theta": 40000.0, "max_position_embeddings": 16384}


def _download_main(argv: list[str] | None = None) -> None:
    """python data.py download --out data [--model_out models [--models authors luffy]]: the
    datasets (and the 7B base models), each parquet file checked to load in the schema above."""
    import argparse

    p = argparse.ArgumentParser(prog="data.py download", description=_download_main.__doc__,
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--out", default="data", help="datasets go to OUT/<name>/")
    p.add_argument("--model_out", default="",
                   help="also download base models (~15 GB each) to MODEL_OUT/<hub name>/")
    p.add_argument("--models", nargs="+", choices=sorted(HUB_MODELS), default=["authors", "luffy"],
                   help="which base models --model_out downloads (small: Qwen2.5-Math-1.5B)")
    a = p.parse_args(argv)
    from huggingface_hub import snapshot_download

    jobs = [(repo, "dataset", Path(a.out) / name, False) for name, repo in HUB_DATASETS.items()]
    if a.model_out:
        for m in a.models:
            extend = m == "small"            # CONTEXT_16K, into a folder that says so
            folder = HUB_MODELS[m] + ("-16k" if extend else "")
            jobs.append((HUB_MODELS[m], "model", Path(a.model_out) / folder, extend))
    for repo, kind, local, extend in jobs:
        try:
            snapshot_download(repo, repo_type=kind, local_dir=local)
        except Exception as e:  # offline, DNS, proxy, 401, ...: the hub library raises many types
            raise SystemExit(f"data.py download: could not download {kind} {repo} from the Hugging "
                             f"Face hub ({type(e).__name__}: {e}). This needs a machine online; or "
                             f"copy the files to {local}.")
        for f in sorted(local.rglob("*.parquet")) if kind == "dataset" else []:
            print(f"{f}: {len(load_examples(f))} rows")  # raises, naming the row, off the schema
        if extend:
            config = json.loads((local / "config.json").read_text()) | CONTEXT_16K
            (local / "config.json").write_text(json.dumps(config, indent=2))
            print(f"{local / 'config.json'}: context extended to 16k ({CONTEXT_16K})")
        print(f"{local}: {repo}")
    authors = Path(a.out) / "curiosft"
    benchmarks = sorted(authors.glob(BENCHMARK_FILES))
    if not (authors / "train.parquet").is_file() or not benchmarks:
        raise SystemExit(f"data.py download: {HUB_DATASETS['curiosft']} gave no train.parquet or "
                         f"no {BENCHMARK_FILES} in {authors}: the repository's layout changed; see "
                         f"the files listed above")
    print(f"training file: {authors / 'train.parquet'}; benchmark files: "
          + ", ".join(map(str, benchmarks)))


if __name__ == "__main__":
    import sys

    usage = "usage: python data.py download [flags] (the demo's toy task: python demo/toy.py)"
    if sys.argv[1:2] in (["-h"], ["--help"]):
        print(usage + "; python data.py download --help lists the flags")
    elif sys.argv[1:2] != ["download"]:
        raise SystemExit(usage)
    else:
        _download_main(sys.argv[2:])
