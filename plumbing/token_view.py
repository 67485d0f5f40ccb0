"""Plumbing (a reader of the method may skip this file): what `evaluate.py tokens` computes for
its page of one SFT example: its settings (TokensArgs, and TokensLossConfig: the loss settings the
page uses), CurioSFT's numbers at each trained token (curio_token_view, from curio_loss's own
functions on chunked logits), and the models and the example they come from. plumbing/token_page.py
lays the numbers out.
"""
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Literal

import torch

import curio_loss as cl
from chunked_logits import cat_diags, no_grad_logits, normed_hidden, select_targets
from data import SYSTEM_PROMPT_MODES, Example, collate, example_prompt, load_examples, tokenize_sft
from plumbing import token_page
from plumbing.cli import check_settings
from plumbing.generation import load_engine
from plumbing.models import resolve_model
from plumbing.run_dir import write_atomic


@dataclass
class TokensArgs:
    """evaluate.py tokens settings"""
    REQUIRED = ("model", "data")
    model: str = ""
    """the student: a checkpoint directory (an sft.py checkpoint, or the model it starts from)"""
    teacher: str = ""
    """the teacher's checkpoint, same vocabulary (e.g. the run's previous one: CurioSFT's teacher is
    a lagged copy of the student); default: the model itself, the self-teacher view"""
    data: str = ""
    """SFT file: .parquet / .jsonl / .json in the authors' schema, with expert responses"""
    row: int = 0
    """the example: its 0-based row in the file"""
    out: str = "out/tokens.html"
    """the page: one self-contained HTML file"""
    system_prompt: Literal[("auto", *SYSTEM_PROMPT_MODES)] = "auto"
    """the prompt around the question: paper | row | messages; auto: what the checkpoint was
    trained with (its run's run_config.json), else paper"""
    loss_chunk: int = 2048
    """tokens per logits chunk: the [tokens, vocab] logits exist one chunk at a time"""
    dtype: Literal["auto", "float32", "bfloat16", "float16"] = "auto"
    """model dtype; auto: bfloat16 on GPU, float32 on CPU"""

    def __post_init__(self):
        check_settings(self, non_negative=["row"], at_least_one=["loss_chunk"])


@dataclass
class TokensLossConfig:
    """loss settings (curio_loss.LossConfig)

    The fields of curio_loss.LossConfig that the page uses, with its defaults and help (a test in
    tests/test_help.py keeps them the same): the Table 2 baselines' settings change nothing here,
    so they are no flags of evaluate.py tokens."""
    alpha: float = cl.LossConfig.alpha
    """weight of the self-exploratory distillation term L_SED (Eq. 6)"""
    delta_max: float = cl.LossConfig.delta_max
    """largest entropy increment in nats (Eq. 7)"""
    gamma: float = cl.LossConfig.gamma
    """sigmoid sharpness of the entropy increment (Eq. 7)"""
    h_pivot: float = cl.LossConfig.h_pivot
    """entropy pivot in nats: tokens above it get most of delta_max (Eq. 7, Sec. 5.4)"""
    tau_min: float = cl.LossConfig.tau_min
    """lower end of the teacher temperature search (App. D)"""
    tau_max: float = cl.LossConfig.tau_max
    """upper end of the teacher temperature search (App. D)"""
    top_k: int = cl.LossConfig.top_k
    """logits used for the entropy in the temperature search (App. D)"""
    solver: Literal["bisect", "newton"] = cl.LossConfig.solver
    """bisect: the paper's and the authors' search | newton: safeguarded Newton (App. B)"""
    bisect_iters: int = cl.LossConfig.bisect_iters
    """bisection steps, as in the authors' code: the bracket shrinks to 0.4 / 2^20 = 4e-7"""
    newton_iters: int = cl.LossConfig.newton_iters
    """safeguarded Newton steps: quadratic convergence reaches bisection's accuracy in about 5"""
    low_entropy_threshold: float | None = cl.LossConfig.low_entropy_threshold
    """the authors' code, not the paper: tau_min where the teacher entropy is <= this (none: off)"""
    fixed_tau: float | None = cl.LossConfig.fixed_tau
    """ablation 'w/o adaptive temp.' (Sec. 5.2): one teacher temperature for every token"""

    def __post_init__(self):  # LossConfig's range checks, as the flags are read
        self.loss_config()

    def loss_config(self) -> cl.LossConfig:
        """These settings as a curio_loss.LossConfig, the baselines' at their defaults."""
        return cl.LossConfig(**asdict(self))


@torch.no_grad()
def curio_token_view(model, teacher, batch: dict, cfg: cl.LossConfig, chunk: int) -> dict:
    """What CurioSFT does at each trained token (response and EOS) of a batch: {name: [N]} with the
    student's lp, the teacher's entropy H_t (top-k, App. D), Delta_t (Eq. 7), tau_t and lq (Alg. 1
    lines 6-11), and the weight w_t = 1 - alpha (lp - lq) that CurioSFT puts on cross-entropy
    there; the expert token ("target"). teacher: a second model, or None for the model itself (the
    self-teacher, as sft.py --loss curio_self_teacher). The logits exist one chunk at a time."""
    h, y = select_targets(normed_hidden(model, batch), batch)                # [N, H], [N]
    h_teacher = None if teacher is None else select_targets(normed_hidden(teacher, batch), batch)[0]
    parts = []
    for s in range(0, max(len(y), 1), chunk):
        logits = model.lm_head(h[s : s + chunk])                             # [n, V]
        z_teacher = logits if teacher is None else no_grad_logits(teacher.lm_head,
                                                                  h_teacher[s : s + chunk])
        lq, teacher_diag = cl.teacher_log_prob(z_teacher, y[s : s + chunk], cfg)
        _, student_diag = cl.curio_sft_loss(logits, y[s : s + chunk], lq, cfg)   # lp, weight
        delta = cl.entropy_increment(teacher_diag["teacher_entropy"], cfg)
        parts.append(teacher_diag | student_diag | {"delta": delta, "target": y[s : s + chunk]})
    return cat_diags(parts)


def load_token_example(data: str, row: int) -> Example:
    """The example of the page: row `row` of an SFT file, with its expert response."""
    examples = load_examples(data, require_response=True)
    if row >= len(examples):
        raise ValueError(f"--row {row}: {data} has rows 0 to {len(examples) - 1}")
    return examples[row]


def write_token_page(args: TokensArgs, example: Example, cfg: cl.LossConfig) -> dict:
    """The page of one SFT example (curio_token_view), written to args.out; returns the view.
    args.model is a directory and args.system_prompt a mode (evaluate.run_tokens settles both)."""
    student, tokenizer = load_engine(args.model, "hf", args.dtype)
    teacher = None
    if args.teacher:
        teacher = load_engine(resolve_model(args.teacher), "hf", args.dtype)[0].model
        if teacher.config.vocab_size != student.model.config.vocab_size:
            raise ValueError(f"--teacher {args.teacher}: vocabulary {teacher.config.vocab_size}, "
                             f"the model's {student.model.config.vocab_size}")
    prompt = example_prompt(example, tokenizer, args.system_prompt)
    ids, mask = tokenize_sft(tokenizer, prompt, example.response)
    device = next(student.model.parameters()).device
    batch = collate([(ids, mask)], tokenizer.pad_token_id, device)
    view = {k: v.cpu() for k, v in curio_token_view(student.model, teacher, batch, cfg,
                                                    args.loss_chunk).items()}
    summary = cl.summarize(view, cfg.alpha)        # what sft.py logs, over this example's tokens
    page = token_page.render(tokenizer, ids, mask, view, summary, cfg, {
        "model": args.model, "teacher": args.teacher or "the model itself (self-teacher)",
        "example": f"{args.data}, row {args.row} ({example.data_source})",
        "system_prompt": args.system_prompt})
    Path(args.out).absolute().parent.mkdir(parents=True, exist_ok=True)
    write_atomic(Path(args.out), page)
    print(f"{args.out}: {len(view['lp'])} response tokens; w_t {summary['w_top20']:.3f} at the top "
          f"20% teacher-entropy tokens, {summary['w_bottom80']:.3f} at the rest")
    return view
