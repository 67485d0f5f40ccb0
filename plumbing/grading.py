# Plumbing (a reader of the method may skip this file): grading of model responses for evaluate.py
# and the RL reward (paper Sec. 5.1, App. E). It imports no torch, so its worker processes start
# several times faster than ones importing torch would, and take 58 MiB instead of 334.
"""Is a response right? Three modes (`evaluate.py --grading`, `rl.py --reward`):

- "paper" (default): the paper's rule, for its evaluation and its RL reward (App. E): only the text
  after the last `</think>` counts and a response without one is wrong. Math answers are judged by
  math-verify after both sides are normalised the same way (`normalize_answer`, `gold_latex`),
  numbers by their relative error too; multiple choice by the option label the text names
  (`mc_answer`).
- "authors": the authors' validation reward (reward_impl_version=0, which their eval scripts
  scripts/3_eval_math.sh and 4_eval_ood_*.sh get from main_ppo.py line 218), which produced the
  paper's tables: the WHOLE response, no `</think>` needed, scored by math-verify (reward_api.py
  lines 22-31, 61-68) and by a boxed-answer grader (oat_math_grader.py `boxed_reward_fn`, lines
  1006-1023), the better of the two (lines 71-76). Multiple choice goes through the same code: a
  letter counts when math-verify or the boxed grader reads it.
- "authors_rl": the authors' RL training reward (reward_impl_version=1, scripts/2_rl.sh line 81):
  math-verify on the text after the last `</think>` (none: 0, reward_api.py lines 47-59), or the
  boxed grader on the last `\\boxed{}` of the WHOLE response, reasoning included (reward_manager.py
  line 58 always sets oat_grader).

The authors' modes grade the text with its end token (`graded_text`) and reproduce their grader's
mistakes: what it misses (a ground truth `4.5e33`, an unboxed `7/12` just before the end token) and
what it wrongly accepts (its unit words are unescaped regular expressions: `\\boxed{a + b}` is right
for `b`). They do not reproduce their time limits within a response (5 s for math-verify, 1 s in the
boxed grader's math-verify step; here `grader_timeout` bounds the whole response, as their server's
10 s does), their guard against long repetitive answers, or pylatexenc's LaTeX-to-text step, which
`_latex_to_plain` approximates for the commands answers use.

math-verify can hang (huge expressions); its own timeouts use signal.alarm, which only works in a
main thread and not inside long C calls. So `grade` grades in worker processes under a wall-clock
deadline; an overrunning worker is killed and replaced. Workers persist between calls (rl.py grades
every step), never outlive their parent, and grade() may be called from any thread.
"""
import atexit
import ctypes
import dataclasses
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import unicodedata
from collections import deque
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from pathlib import Path

import sympy
from latex2sympy2_extended.math_normalization import _fix_a_slash_b, _fix_fracs
from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
from sympy.parsing.sympy_parser import (implicit_multiplication_application, parse_expr,
                                        standard_transformations)
from tqdm import tqdm

# math-verify logs every timeout together with the whole (possibly huge) input.
logging.getLogger("math_verify").setLevel(logging.ERROR)

GRADING_MODES = ("paper", "authors", "authors_rl")
# option labels; 22 ARC-Challenge questions number their options 1-4
MC_LABEL = re.compile(r"[A-J1-9]")


def answer_kind(data_source: str, ground_truth: str) -> str:
    """"mc" for a multiple-choice benchmark whose ground truth is an option label, else "math"."""
    mc = data_source.lower().startswith(("arc", "gpqa", "mmlu"))
    return "mc" if mc and MC_LABEL.fullmatch(ground_truth.strip()) else "math"


def graded_text(text: str, stop_text: str, grading: str) -> str:
    """The text `grading` grades of a response decoded without its end token (`stop_text`, "" when
    none ended it). The authors' modes grade it with the end token: their rollouts stop on it
    (agent_loop/custom_loop.py line 97), vLLM keeps it, and their reward manager decodes without
    skipping special tokens (reward_manager.py line 106). That changes what math-verify reads at the
    very end: "is 7/12<|im_end|>" reads as 7."""
    return text if grading == "paper" else text + stop_text


def final_answer_text(response: str) -> str | None:
    """The text after the last </think>; None when the model never closed its reasoning (scored
    wrong)."""
    _, sep, tail = response.rpartition("</think>")
    return tail if sep else None


def _braced(text: str, open_brace: int) -> str | None:
    """The text inside the balanced braces that open at text[open_brace], or None if they never
    close."""
    depth = 0
    for i in range(open_brace, len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return text[open_brace + 1 : i]
    return None


# ================================================================================================
# Paper mode, math: one normalisation for the answer and the ground truth, then math-verify
# ================================================================================================
_UNICODE = str.maketrans({
    # full-width ASCII (１２, （, ，) -> ASCII
    **{chr(c): chr(c - 0xFEE0) for c in range(0xFF01, 0xFF5F)},
    "\u3000": " ", "\u00a0": " ", "\u2009": " ", "\u202f": " ", "\u2212": "-",
    "×": r"\times ", "·": r"\cdot ", "÷": r"\div ", "°": r"^{\circ}", "℃": r"^{\circ}",
    "π": r"\pi ", "∞": r"\infty ", "√": r"\sqrt", "≤": r"\le ", "≥": r"\ge ",
    "≠": r"\ne "})
_SUPERSCRIPTS = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺", "0123456789-+")
_TEXT_COMMANDS = r"\\(?:text|textrm|mathrm|mathit|operatorname|rm)"
_ANSWER_REWRITES = [  # (pattern, replacement), applied in order
    # 25°C: a temperature, not 25 C
    (re.compile(r"(?:°|\^\{?\\circ\}?)\s*[CF](?![A-Za-z])"), r"^{\\circ}"),
    # m² -> m^{2}
    (re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁻⁺]+"),
     lambda m: "^{" + m.group().translate(_SUPERSCRIPTS) + "}"),
    # Scientific notation: 4.5e33 would parse as Euler's e times 33; 4.5 x 10^33 as a variable x.
    (re.compile(r"(?<![\w.\\])(\d+(?:\.\d*)?|\.\d+)[eE]([+-]?\d+)(?!\w)(?!\.\d)"),
     r"\1\\times 10^{\2}"),
    (re.compile(r"(\d)\s*x\s*(?=10\s*\^)"), r"\1\\times "),
    (re.compile(r"\^\s*([-+])\s*(\d+(?:\.\d+)?)"), r"^{\1\2}"),  # 10^-27: only the sign is raised
    # Python/NumPy syntax: np.arcsin(10/13), -1./3 (which would read as -1).
    (re.compile(r"\b(?:np|numpy|math|sp|sympy)\."
                r"(arcsin|arccos|arctan|sinh|cosh|tanh|sin|cos|tan|exp|sqrt|pi)\b"),
     r"\\\1"),
    # natural log; math-verify reads \log as base 10
    (re.compile(r"\b(?:np|numpy|math|sp|sympy)\.log\b"), r"\\ln"),
    (re.compile(r"(?<=\d)\.(?=\s*[/*])"), ""),
    # Subscripts math-verify cannot parse: \lambda_{\text{red}}, L_{\odot}, m_{\max}.
    (re.compile(r"_\s*\{\s*" + _TEXT_COMMANDS + r"\s*\{([^{}]*)\}\s*\}|_\s*" + _TEXT_COMMANDS
                + r"\s*\{([^{}]*)\}" r"|_\s*\{\s*\\rm\s+([^{}]*)\}"),
     lambda m: "_{" + "".join(m.groups("")).replace(" ", "") + "}"),
    (re.compile(r"_\s*\{\s*\\([A-Za-z]+)\s*\}|_\s*\\([A-Za-z]+)"),
     lambda m: "_{" + (m.group(1) or m.group(2)) + "}"),
    # E_{1} and e_{1} (energy levels) fail as Euler's e with a subscript; \gamma (a Lorentz factor)
    # parses as the Euler-Mascheroni constant or the gamma function. Both become plain symbols.
    (re.compile(r"(?<![\\A-Za-z])(?<!\\mathsf\{)([Ee])(?=\s*_)"), r"\\mathsf{\1}"),
    (re.compile(r"\\gamma(?![A-Za-z])"), "g_{gamma}"),
]


def normalize_answer(text: str) -> str:
    """Rewrite forms math-verify misreads into ones it reads right, the same for a response and a
    ground truth: Unicode (full-width digits, degree sign, minus, times, superscripts), scientific
    notation (4.5e33, 4.5 x 10^33, 10^-27), Python/NumPy syntax (np.arcsin, -1./3), subscripts with
    commands or text, E_1, \\gamma."""
    text = text.translate(_UNICODE) if not text.isascii() else text
    for pattern, replacement in _ANSWER_REWRITES:
        text = pattern.sub(replacement, text)
    return text


_DOLLAR = re.compile(r"(?<!\\)\$")
# t(0,4]: an interval that lost "\in"
_VARIABLE_INTERVAL = re.compile(r"([A-Za-z])\s*(\([^()=]*\]|\[[^\[\]=]*\))")


def gold_latex(ground_truth: str) -> str:
    """A ground truth as one LaTeX expression without delimiters. Ground truths come as bare LaTeX
    ("x^2+1"), in dollars ("$\\frac{1}{2}$"), as a list of dollar pieces ("$69$,$84$"), with a stray
    "$ $" inside ("a+$ $b"), or with prose after the answer ("$f(x)=ax+b$, where $b$ is ..."): the
    prose is dropped."""
    pieces = _DOLLAR.split(ground_truth.strip())
    prose = pieces[0] == "" and any(re.search(r"[A-Za-z]{2}", outside) for outside in pieces[2::2])
    gold = pieces[1] if prose else "".join(pieces)
    gold = gold.strip().rstrip(".").strip()
    interval = _VARIABLE_INTERVAL.fullmatch(gold)
    if interval:
        gold = f"{interval[1]} \\in {interval[2]}"
    return normalize_answer(gold)


# math-verify's default: drops units, e.g. a final "m" or "t" after a number
_WITH_UNITS = LatexExtractionConfig()
_WITHOUT_UNITS = LatexExtractionConfig(
    normalization_config=dataclasses.replace(_WITH_UNITS.normalization_config, units=False))
_UNIT_MARKUP = re.compile(r"\\(?:text|mbox|mathrm)")


# An option label before its value, as AMC answers are often boxed: \boxed{\textbf{(B) }142} is 142.
_OPTION_BEFORE_VALUE = re.compile(
    r"(\\boxed\s*\{|\$|\\\(|\\\[)\s*"
    r"(?:\\(?:textbf|text|textrm|mathrm|mathbf)\s*\{\s*\([A-E]\)\s*\}|\([A-E]\))"
    r"(?:\s|~|\\[ ,;:!]|\\q?quad(?![A-Za-z]))*(?=[-+.\d]|\\(?:[dt]?frac|sqrt|pi)(?![A-Za-z]))")
_OPTION_LABEL = re.compile(r"\([A-E]\)")
_RELATIVE_TOLERANCE = 1e-4


def _real_value(expr) -> sympy.Float | None:
    """The value of a parsed answer that is a real number (of an equation's right side: "x = 5"),
    else None."""
    if isinstance(expr, sympy.Eq):
        expr = expr.rhs
    if not isinstance(expr, sympy.Expr) or not expr.is_number:
        return None
    value = sympy.N(expr, 30)
    return value if value.is_real else None


def _numbers_disagree(gold: list, predicted: list) -> bool:
    """Both sides are real numbers, further apart than _RELATIVE_TOLERANCE of the larger.
    math-verify compares numbers with absolute tolerances (floats rounded to 6 decimals; other
    expressions evaluated to 15 digits, with anything below about 1e-15 chopped to 0), so 1.325e-26
    passed for 1.325e-27 and 0.0000002 for 1e-7. From about 0.01 up its rounding is as tight as
    this, so its verdict stands there. Percentages keep math-verify's reading (9% is 9 or 0.09)."""
    if not gold or not predicted or "%" in str(gold[-1]) + str(predicted[-1]):
        return False
    g, p = _real_value(gold[0]), _real_value(predicted[0])
    return g is not None and p is not None \
        and abs(g - p) > _RELATIVE_TOLERANCE * max(abs(g), abs(p))


def math_answer_correct(answer: str, ground_truth: str, timeout_s: int | None = None) -> bool:
    """math-verify's verdict on `answer` (a response tail) against `ground_truth`, both normalised
    alike, where two numbers must also agree to a relative 1e-4 (`_numbers_disagree`). Raises
    ValueError if the ground truth parses to nothing. timeout_s: math-verify's own signal.alarm
    limits (only possible in a main thread); None = unbounded, the caller bounds the time.

    Three classes need more than rewriting. A bare letter after an expression ("\\frac{37}{4} m",
    "\\frac{1}{\\sqrt{2}} c", "6m") is a variable of the question, which math-verify drops as a unit
    (m = metres); when the ground truth writes no unit markup, both sides are then parsed with units
    kept. A percentage ("62.5%") also accepts the bare number (62.5) besides the fraction (0.625).
    An option label before a value ("\\textbf{(B) }142") is dropped unless the ground truth is
    itself an option ("\\text{(C)}")."""
    gold = gold_latex(ground_truth)
    config = _WITH_UNITS
    golds = [parse(f"${gold}$", [config, ExprExtractionConfig()], parsing_timeout=timeout_s)]
    if not _UNIT_MARKUP.search(gold):
        kept = parse(f"${gold}$", [_WITHOUT_UNITS, ExprExtractionConfig()],
                     parsing_timeout=timeout_s)
        # [-1]: the extracted string; units were dropped
        if kept and golds[0] and kept[-1] != golds[0][-1]:
            config, golds = _WITHOUT_UNITS, [kept]
    if not golds[0]:
        raise ValueError(f"math-verify cannot parse the ground truth {ground_truth!r}")
    if "%" in gold:
        golds.append(parse("$" + gold.replace("\\%", "").replace("%", "") + "$",
                           parsing_timeout=timeout_s))
    answer = normalize_answer(answer)
    if not _OPTION_LABEL.search(gold):
        answer = _OPTION_BEFORE_VALUE.sub(r"\1", answer)
    predicted = parse(answer, [config, ExprExtractionConfig()], parsing_timeout=timeout_s)
    return any(verify(g, predicted, timeout_seconds=timeout_s)
               and not _numbers_disagree(g, predicted)
               for g in golds)  # gold first


# ================================================================================================
# Paper mode, multiple choice: the option label the text names
# ================================================================================================
_MC_TOKEN = re.compile(r"(?<![A-Za-z0-9\\^_.\-])([A-Ja-j1-9])(?![A-Za-z0-9])")  # a lone label
# "I think", "A planet", "I'm": a word, not a label
_MC_PROSE_AFTER = re.compile(r"\s+[a-z]|['’][A-Za-z]")
_MC_COPULA_AFTER = re.compile(r"\s+(?:is|was|seems|appears|looks)\b")  # "B is correct"
_MC_ANCHOR = re.compile(r"(?i)\banswer\b(?!\s+(?:choices?|options?))")
_MC_MARKUP = re.compile(r"\\(?:text(?:bf|it|rm)?|math(?:rm|bf)|mbox|bf)\s*|\\[()\[\]]|[{}$]")


def _label_in(text: str, at_start: bool = False) -> str | None:
    """The option label a short text names: the first label not followed by a word ("C", "(C)",
    "C)", "C.", "$C$", "**C**", "c"); failing that an upper-case label followed by "is" ("B is
    correct"). None for prose ("I think it is..." alone, "A planet..."). at_start: the label must
    open the text (a boxed answer)."""
    fallback = None
    for m in _MC_TOKEN.finditer(text):
        if at_start and text[: m.start()].strip(" (*["):
            break
        rest = text[m.end():]
        if not _MC_PROSE_AFTER.match(rest):
            return m[1].upper()
        if fallback is None and not m[1].islower() and _MC_COPULA_AFTER.match(rest):
            fallback = m[1]
        if at_start:
            break
    return fallback


def mc_answer(text: str) -> str | None:
    """The option label `text` gives as its answer: the last of every \\boxed{...} that opens with a
    label (\\boxed{C}, \\boxed{(C)}, \\boxed{C) text}, \\boxed{\\textbf{(B) }142}, \\boxed{c}) and
    every "answer" line ("ANSWER: C", "ANSWER: $C$" as the GPQA prompt asks, "The answer is (C).",
    "**Answer:** C", "ANSWER: I think it is B" -> B); failing both, a last line that is just a label
    ("**C**")."""
    text = text.translate(_UNICODE)  # full-width letters and digits
    found = []  # (position, label)
    for m in re.finditer(r"\\boxed\s*(?=\{)", text):
        inside = _braced(text, m.end())
        label = inside is not None and _label_in(_MC_MARKUP.sub("", inside).strip(), at_start=True)
        if label:
            found.append((m.start(), label))
    for m in _MC_ANCHOR.finditer(text):
        line = text[m.end():].lstrip(" \t\n*:").split("\n", 1)[0][:200]
        label = _label_in(_MC_MARKUP.sub(" ", line))
        if label:
            found.append((m.start(), label))
    if found:
        return max(found)[1]
    lines = text.strip().splitlines()
    last = re.sub(r"(?i)^(?:option|choice)\s*", "",
                  _MC_MARKUP.sub("", lines[-1]).strip(" *.:()[]")) if lines else ""
    return last.upper() if MC_LABEL.fullmatch(last.upper()) else None


# ================================================================================================
# Authors mode: math-verify on the whole response, or their boxed-answer grader (oat_math_grader.py)
# ================================================================================================
# oat_math_grader.py's unit words (lines 52-185), in their order, then each with an "s" (line 187).
# They are used as regular expressions, unescaped (line 302): "a ." is "a", a space and any
# character.
_OAT_UNIT_TEXTS = (
    "east", "degree", "mph", "kmph", "ft", "m sqaure", " m east", "sq m", "deg", "mile", "q .",
    "monkey", "prime", "ratio", "profit of rs", "rd", "o", "gm", "p . m", "lb", "tile", "per", "dm",
    "lt", "gain", "ab", "way", "west", "a .", "b .", "c .", "d .", "e .", "f .", "g .", "h .", "t",
    "a", "h", "no change", "men", "soldier", "pie", "bc", "excess", "st", "inches", "noon",
    "percent", "by", "gal", "kmh", "c", "acre", "rise", "a . m", "th", "π r 2", "sq", "mark", "l",
    "toy", "coin", "sq . m", "gallon", "° f", "profit", "minw", "yr", "women", "feet", "am", "pm",
    "hr", "cu cm", "square", "v â € ™", "are", "rupee", "rounds", "cubic", "cc", "mtr", "s",
    "ohm", "number", "kmph", "day", "hour", "minute", "min", "second", "man", "woman", "sec",
    "cube", "mt", "sq inch", "mp", "∏ cm ³", "hectare", "more", "sec", "unit", "cu . m", "cm 2",
    "rs .", "rs", "kg", "g", "month", "km", "m", "cm", "mm", "apple", "liter", "loss", "yard",
    "pure", "year", "increase", "decrease", "d", "less", "Surface", "litre", "pi sq m", "s .",
    "metre", "meter", "inch")
_OAT_UNIT_PATTERNS = [re.compile(r"(^|\W)" + unit + r"($|\W)")
                      for unit in (*_OAT_UNIT_TEXTS, *(u + "s" for u in _OAT_UNIT_TEXTS))]
_LOOSE_UNIT_WORDS = re.compile(  # no word boundaries, as there: "parameter" loses its "meter"
    r"(?:degree|cm|centimeter|meter|mile|second|minute|hour|day|week|month|year|"
    r"foot|feet|inch|yard)"
    r"(es)?(s)? *(\^[0-9]+)?")


def _oat_fix_sqrt(s: str) -> str:
    """oat_math_grader.py `_fix_sqrt`, lines 245-257: \\sqrt3 -> \\sqrt{3}; "\\sqrt 3" -> "\\sqrt{
    }3" (spaces go later), and an IndexError for a "\\sqrt" at the very end."""
    head, *pieces = s.split("\\sqrt")
    return head + "".join("\\sqrt" + (p if p[0] == "{" else "{" + p[0] + "}" + p[1:])
                          for p in pieces)


def _hendrycks_normalize(answer: str) -> str:
    """MATH's answer normalisation as oat_math_grader.py applies it (`mathd_normalize_answer` and
    `_strip_string`, lines 37-48 and 190-350), quirks included: unwrap \\text{}, drop
    \\left/\\right, a trailing \\text{...}, unit words, degrees, dollars, percent, a short "x ="
    prefix and spaces; canonical \\frac, \\sqrt and a/b. The unit words are unescaped regular
    expressions there, so "a + b" loses "a +" to the unit "a ." and reads "b". Any error on the way
    (a second "\\text{ ", a "\\sqrt" or "\\frac" at the end) leaves the answer as it was."""
    answer = answer.strip()
    if m := re.fullmatch(r"\\text\{(.+?)\}", answer):
        answer = m[1].strip()
    s = answer.replace("\n", "").replace("\\!", "").replace("\\\\", "\\")
    s = re.sub(r"\\begin\{array\}\{.*?\}", r"\\begin{pmatrix}", s)
    s = s.replace("\\end{array}", "\\end{pmatrix}")
    s = s.replace("bmatrix", "pmatrix").replace("tfrac", "frac").replace("dfrac", "frac")
    s = s.replace("\\neq", "\\ne").replace("\\leq", "\\le").replace("\\geq", "\\ge")
    s = s.replace("\\left", "").replace("\\right", "")
    s = re.sub(r"\\text\{.*?\}$", "", s).strip() or s  # a trailing unit
    for _ in range(2):
        for unit in _OAT_UNIT_PATTERNS:
            s = unit.sub(r"\1\2", s) or s
    s = s.replace("^{\\circ}", "").replace("^\\circ", "").replace("\\$", "")
    if "\\text{ " in s:  # a unit on the right; their assert fails on a second one
        s, *rest = s.split("\\text{ ")
        if len(rest) != 1:
            return answer
    s = s.replace("\\%", "").replace(" .", " 0.").replace("{.", "{0.")
    if s.startswith("."):
        s = "0" + s
    if s.count("=") == 1 and len(s.split("=")[0]) <= 2:
        s = s.split("=")[1]
    try:
        s = _oat_fix_sqrt(s).replace(" ", "")
    except IndexError:
        return answer
    pieces = s.split("\\frac")
    if "" in pieces[1:]:  # their _fix_fracs indexes an empty piece
        return answer
    s = _fix_fracs(s)
    return _fix_a_slash_b("\\frac{1}{2}" if s == "0.5" else s)


_GREEK = ("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho "
          "sigma tau upsilon phi chi psi omega").split()
_PLAIN_MACROS = {  # what pylatexenc writes for the commands answers use; the rest it drops
    # (not \\cot, \\sec, \\det: pylatexenc drops those)
    **{name: name for name in "cos sin tan arccos arcsin arctan cosh sinh tanh arccosh arcsinh "
                              "arctanh ln log exp max min sup inf lim".split()},
    **{g: unicodedata.lookup("GREEK SMALL LETTER " + g.upper().replace("LAMB", "LAM"))
       for g in _GREEK},
    **{g.capitalize(): unicodedata.lookup("GREEK CAPITAL LETTER "
                                          + g.upper().replace("LAMB", "LAM")) for g in _GREEK},
    "phi": "ϕ", "epsilon": "ϵ", "pi": "pi", "infty": "inf", "cup": "U", "cdot": "*", "times": "*",
    "pm": "±", "in": "∈", "le": "≤", "leq": "≤", "ge": "≥", "geq": "≥", "ne": "≠",
    "neq": "≠", "circ": "∘", "prime": "'", "odot": "⊙", "hbar": "ħ", "%": "%"}


def _latex_to_plain(expr: str) -> str:
    """LaTeX to the plain text sympy reads, as the pylatexenc latex2text call of oat_math_grader.py
    lines 687-702 does it for the commands answers use: \\frac{a}{b} -> a/b (no parentheses, as
    pylatexenc writes it), \\sqrt{x} and \\sqrt2 -> sqrt(x), sqrt(2), \\text{x} -> x, braces of sub-
    and superscripts dropped (x^{2+1} -> x^2+1), \\pi -> pi, \\cdot -> *, Greek letters and a few
    symbols -> Unicode, unknown commands dropped."""
    expr = re.sub(r"\\[dt]frac", r"\\frac", expr).replace("\\left", "").replace("\\right", "")
    for _ in range(8):  # innermost first
        # \\frac{a}{b}, \\frac65
        expr = re.sub(r"\\frac\s*(?:\{([^{}]*)\}|([^\s{}\\]))\s*(?:\{([^{}]*)\}|([^\s{}\\]))",
                      lambda m: f" {m[1] or m[2]}/{m[3] or m[4]}", expr)
        # \\sqrt{x}, \\sqrt2
        expr = re.sub(r"\\sqrt\s*(?:\[[^\]]*\])?\s*(?:\{([^{}]*)\}|(\\[A-Za-z]+|[^\s{}\\[]))",
                      lambda m: f"sqrt({m[1] if m[1] is not None else m[2]})", expr)
        expr = re.sub(r"([_^])\s*\{([^{}]*)\}", r"\1\2", expr)  # x_{red} -> x_red, x^{2+1} -> x^2+1
        expr = re.sub(r"\\(?:text|textbf|mathrm|mathbf|mbox)\s*\{([^{}]*)\}", r"\1", expr)
    return re.sub(r"\\([A-Za-z]+|%)", lambda m: _PLAIN_MACROS.get(m[1], ""), expr).strip()


def _strip_thousands(expr: str) -> str:
    while (stripped := re.sub(r"(\d),(\d\d\d)($|\D)", r"\1\2\3", expr)) != expr:
        expr = stripped
    return expr


def _int_text(expr: str) -> str | None:
    """str(int) when the text is an integer-valued number ("3", "3.0", "1,000"), else None."""
    try:
        value = float(_strip_thousands(expr))
    except ValueError:
        return None
    return str(int(round(value))) if abs(value - round(value)) <= 1e-7 else None


def _loose_normalize(expr: str) -> str:
    """oat_math_grader.py `_normalize`, lines 760-830: lower-case text with units, dollars, percent,
    braces and spaces gone, integers canonical, LaTeX turned into plain text."""
    if m := re.fullmatch(r"\\text\{(.+)\}", expr):
        expr = m[1]
    for old, new in (("\\%", "%"), ("\\$", "$"), ("$", ""), ("%", ""), (" or ", " , "),
                     (" and ", " , "), ("million", "*10^6"), ("billion", "*10^9"),
                     ("trillion", "*10^12")):
        expr = expr.replace(old, new)
    expr = re.sub(r"\^ *\\circ", "", _LOOSE_UNIT_WORDS.sub("", expr))
    if len(expr) > 1 and expr[0] == "{" and expr[-1] == "}":
        expr = expr[1:-1]
    expr = re.sub(r",\\! *", "", expr)
    if re.fullmatch(r"\s*[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?\s*", expr) and _int_text(expr):
        expr = _int_text(expr)
    if "\\" in expr:
        expr = _latex_to_plain(expr)
    expr = re.sub(r"([0-9]) +([0-9])", r"\1+\2", re.sub("- *", "-", expr))  # 7 3/4 -> 7+3/4
    expr = expr.replace(" ", "").replace("{", "").replace("}", "").lower()
    return _int_text(expr) or expr


def _sympy_equal(a: str, b: str) -> bool:
    """oat_math_grader.py `are_equal_under_sympy` with `should_allow_eval`, lines 833-867 and
    669-684: sympy simplifies a - b to 0, tried only on text with at most two distinct letters and
    no large powers (which hang; it also keeps parse_expr, an eval, away from anything but short
    arithmetic)."""
    expr = f"({a})-({b})"
    if len({c for c in expr.replace("sqrt", "").replace("frac", "") if c.isalpha()}) > 2:
        return False
    if "^{" in expr or "^(" in expr or re.search(r"\^[0-9]+\^|\^[0-9][0-9]+", expr):
        return False
    transformations = standard_transformations + (implicit_multiplication_application,)
    try:
        return sympy.simplify(parse_expr(expr.replace("^", "**"),
                                         transformations=transformations)) == 0
    except Exception:
        return False


def _split_tuple(expr: str) -> list[str]:
    expr = _strip_thousands(expr)
    if len(expr) > 2 and expr[0] in "()[]" and expr[-1] in "()[]" \
            and not any(c in expr[1:-1] for c in "()[]"):
        return [e.strip() for e in expr[1:-1].split(",")]
    return [expr] if expr else []


def _sympy_grade(given: str, truth: str) -> bool:
    """oat_math_grader.py `grade_answer_sympy`, lines 934-971: loose-normalised text equal, or equal
    element by element (tuples, intervals) where fractions must match as written, integers must stay
    integers, and the rest is left to sympy."""
    truth, given = _loose_normalize(truth), _loose_normalize(given)
    if truth == given:
        return True
    truth_elems, given_elems = _split_tuple(truth), _split_tuple(given)
    if not given or len(truth_elems) != len(given_elems):
        return False
    if len(truth_elems) > 1 and (truth[0] != given[0] or truth[-1] != given[-1]):
        return False
    fraction = re.compile(r"-?[0-9]+.?/0*[1-9][0-9]*.?")
    for t, g in zip(truth_elems, given_elems):
        if fraction.fullmatch(t) and fraction.fullmatch(g):
            ok = t == g
        elif (_int_text(t) is None) != (_int_text(g) is None):
            ok = False
        else:
            ok = _sympy_equal(t, g)
        if not ok:
            return False
    return True


def _math_verify_boxed_grade(given: str, truth: str, timeout_s: int | None) -> bool:
    """oat_math_grader.py `is_latex_equal`, lines 601-651 (their 1 s limits are timeout_s here, and
    the guard against long repetitive answers is left out): loose-normalised text equal, or
    math-verify on the two answers, each wrapped in $...$ if it has no dollar. Their
    extraction_mode=["first_match"] is a list, which math-verify compares with the string
    "first_match" and so treats as its default, any_match: so does this."""
    if _loose_normalize(truth) == _loose_normalize(given):
        return True
    config = [LatexExtractionConfig(boxed_match_priority=0), ExprExtractionConfig()]

    def parsed(s):
        return parse(s if "$" in s else f"${s}$", config, fallback_mode="no_fallback",
                     parsing_timeout=timeout_s)

    return verify(parsed(truth), parsed(given), timeout_seconds=timeout_s)


def _last_boxed(text: str) -> str | None:
    """The content of the last \\boxed{...}; None when there is none or it is not followed by "{"
    (as oat_math_grader.py `last_boxed_only_string` + `remove_boxed`, lines 889-931; \\fbox never
    counts there)."""
    start = text.rfind("\\boxed")
    return _braced(text, start + 6) if start >= 0 and text.startswith("{", start + 6) else None


def boxed_answer_correct(response: str, ground_truth: str, timeout_s: int | None = None) -> bool:
    """The authors' boxed-answer grader (oat_math_grader.py `boxed_reward_fn` with fast=False, lines
    1006-1023, and `grade`, lines 990-1003): the last \\boxed{} of the whole response against the
    ground truth by MATH's normalised text, by sympy, or by math-verify."""
    given = _last_boxed(response)
    truth = _last_boxed(ground_truth) if "\\boxed" in ground_truth else ground_truth
    if given is None or truth is None:
        return False
    return (_hendrycks_normalize(given) == _hendrycks_normalize(truth) or _sympy_grade(given, truth)
            or _math_verify_boxed_grade(given, truth, timeout_s))


def _score_authors(solution: str, response: str, ground_truth: str, timeout_s: int | None) -> float:
    """The authors' reward (reward_api.py `process_single_item_worker`, lines 34-84): math-verify on
    `solution`, else their boxed grader on the whole `response` (reward_manager.py line 58 always
    sets oat_grader, lines 71-76 take the better); their errors score 0, as there."""
    try:
        gold = parse("$" + ground_truth + "$", parsing_timeout=timeout_s)
        if verify(gold, parse(solution, parsing_timeout=timeout_s), timeout_seconds=timeout_s):
            return 1.0
    except Exception:
        pass
    try:
        return float(boxed_answer_correct(response, ground_truth, timeout_s))
    except Exception:
        return 0.0


def _score(response: str, ground_truth: str, kind: str, grading: str,
           timeout_s: int | None) -> float:
    """1.0 if the response is right, else 0.0. Raises on grader errors (paper mode)."""
    if grading == "authors":  # reward_impl_version=0: math-verify reads the whole response
        return _score_authors(response, response, ground_truth, timeout_s)
    answer = final_answer_text(response)
    if answer is None:  # every mode but "authors" (reward_api.py lines 49-59)
        return 0.0
    if grading == "authors_rl":  # reward_impl_version=1: math-verify reads the text after </think>
        return _score_authors(answer, response, ground_truth, timeout_s)
    if kind == "mc":
        return float(mc_answer(answer) == ground_truth.strip().upper())
    return float(math_answer_correct(answer, ground_truth, timeout_s))


def ground_truth_unparsable(ground_truth: str, kind: str, grading: str = "paper") -> bool:
    """Does math-verify read nothing in this math ground truth (`\\text{}`, `$`), parsed as
    `grading` parses it? In paper mode every response to the question then scores 0; the authors'
    boxed grader may still match it as text. evaluate.py counts them per benchmark and warns."""
    if kind == "mc":
        return False
    timeout_s = 5 if threading.current_thread() is threading.main_thread() else None
    try:
        if grading == "paper":
            math_answer_correct("", ground_truth, timeout_s)
            return False
        return not parse("$" + ground_truth + "$", parsing_timeout=timeout_s)
    except Exception:
        return True


def _check_grading(grading: str) -> None:
    if grading not in GRADING_MODES:
        raise ValueError(f"unknown grading {grading!r} (one of {', '.join(GRADING_MODES)})")


def grade_one(response: str, ground_truth: str, kind: str = "math", timeout_s: int = 5,
              grading: str = "paper") -> float:
    """Grade in this process: 0.0 on any grader error. math-verify's timeouts are signal based, so
    they only apply in the main thread; elsewhere nothing bounds the time: use grade(), which grades
    in worker processes."""
    _check_grading(grading)
    in_main = threading.current_thread() is threading.main_thread()
    try:
        return _score(response, ground_truth, kind, grading, timeout_s if in_main else None)
    except Exception:
        return 0.0


# ================================================================================================
# Grader worker processes
# ================================================================================================
@dataclass
class _Worker:
    process: subprocess.Popen
    conn: Connection
    ready: bool = False  # sent "ready" once its imports and a warm-up grade are done


_POOL: list[_Worker] = []
_POOL_LOCK = threading.Lock()
_PR_SET_PDEATHSIG = 1  # linux/prctl.h


def _exit_when_orphaned(parent_pid: int, poll_s: float = 0.2) -> None:
    """Portable fallback for PR_SET_PDEATHSIG: a daemon thread that ends this process once its
    parent is gone (getppid changes). It runs whenever the grading code lets go of the GIL, i.e. not
    during one long C call such as a huge integer power; prctl covers that on Linux."""
    def watch():
        while os.getppid() == parent_pid:
            time.sleep(poll_s)
        os._exit(0)

    threading.Thread(target=watch, daemon=True, name="exit-when-orphaned").start()


def _die_with_parent(parent_pid: int) -> None:
    """Never outlive the evaluation: Linux kills this process when the parent exits, even with kill
    -9 and even in the middle of a hanging grade. PR_SET_PDEATHSIG follows the parent THREAD that
    started the worker, so workers started by a grade() call in another thread end with that thread;
    the next call replaces them."""
    if sys.platform.startswith("linux"):
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(0)
    _exit_when_orphaned(parent_pid)


def _grader_worker(fd: int, parent_pid: int) -> None:
    _die_with_parent(parent_pid)
    conn = Connection(fd)
    try:
        # pay the lazy imports (math-verify, sympy) before the first deadline
        for grading in GRADING_MODES:
            _score("</think>\\boxed{1}", "1", "math", grading, None)
        conn.send("ready")
        while True:
            response, ground_truth, kind, grading = conn.recv()
            try:
                reply = (_score(response, ground_truth, kind, grading, None), False)
            except Exception:
                reply = (0.0, True)
            conn.send(reply)
    except (EOFError, OSError):  # the parent closed its end or exited: leave without a traceback
        os._exit(0)


def _start_worker() -> _Worker:
    # A fresh interpreter that imports only this file: unlike fork it is safe with CUDA and threads,
    # and unlike multiprocessing's spawn it never re-runs the caller's __main__ (a nanoGPT-style
    # script runs on import). Its own session: a Ctrl-C in the terminal stops the parent only, whose
    # exit then ends the workers.
    parent, child = socket.socketpair()
    code = (f"import sys; sys.path.insert(0, {str(Path(__file__).resolve().parent)!r}); import "
            f"grading; grading._grader_worker({child.fileno()}, {os.getpid()})")
    process = subprocess.Popen([sys.executable, "-c", code], pass_fds=[child.fileno()],
                               start_new_session=True)
    child.close()
    return _Worker(process, Connection(parent.detach()))


def _kill(worker: _Worker) -> None:
    worker.process.kill()
    worker.process.wait()
    worker.conn.close()


@atexit.register
def _stop_workers() -> None:
    """At a normal exit, end the workers before they notice the closed pipe (some may still be
    starting)."""
    for worker in _POOL:
        _kill(worker)
    _POOL.clear()


def grade(responses: list[str], ground_truths: list[str], kinds: list[str], timeout_s: float = 10.0,
          workers: int = 4, grading: str = "paper") -> tuple[list[float], int]:
    """(scores, n_failures). A response whose grading raises or overruns timeout_s, or whose worker
    dies twice under it, scores 0 and is a failure. grading: one of GRADING_MODES (see the module
    docstring)."""
    _check_grading(grading)
    scores, failures = [0.0] * len(responses), 0
    todo = deque(range(len(responses)))
    busy: dict[int, tuple[int, float]] = {}  # pool slot -> (response index, deadline)
    retried = set()                           # responses whose worker died under them once
    with _POOL_LOCK, tqdm(total=len(responses), desc="grading",
                          disable=len(responses) < 1000) as bar:
        _POOL[:] = [w for w in _POOL if w.process.poll() is None]
        missing = min(max(workers, 1), len(responses)) - len(_POOL)
        _POOL.extend(_start_worker() for _ in range(missing))
        # Called from a thread, also until every worker is ready: one still starting has not armed
        # PR_SET_PDEATHSIG, and would outlive the thread if the thread ended first. (The main thread
        # ends with the process.)
        from_thread = threading.current_thread() is not threading.main_thread()
        while todo or busy or (from_thread and not all(w.ready for w in _POOL)):
            for slot, w in enumerate(_POOL):
                if todo and w.ready and slot not in busy:
                    i = todo.popleft()
                    try:
                        w.conn.send((responses[i], ground_truths[i], kinds[i], grading))
                        busy[slot] = (i, time.monotonic() + timeout_s)
                    except OSError:  # it died while idle (e.g. its starting thread ended)
                        todo.appendleft(i)  # retry elsewhere
                        w.ready = False
            next_deadline = min((d for _, d in busy.values()), default=None)
            timeout = None if next_deadline is None else max(0.0, next_deadline - time.monotonic())
            wait([w.conn for w in _POOL], timeout)
            for slot, w in enumerate(_POOL):
                try:
                    message = w.conn.recv() if w.conn.poll() else None
                except (EOFError, OSError):  # the worker died (out of memory, killed)
                    message = "died"
                if message == "ready":
                    w.ready = True
                elif isinstance(message, tuple):  # (score, failed)
                    i, _ = busy.pop(slot)
                    scores[i], failures = message[0], failures + message[1]
                    bar.update()
                elif message == "died" or (slot in busy and time.monotonic() > busy[slot][1]):
                    # exited with an error before it could grade
                    if not w.ready and w.process.wait() > 0:
                        raise RuntimeError("a grader worker process failed to start (its error is "
                                           "above)")
                    if slot in busy:
                        i, _ = busy.pop(slot)
                        if message == "died" and i not in retried:
                            # once more on a fresh worker: this one may have been dying already
                            # (killed with the thread that started it); a response that kills two
                            # workers scores 0
                            retried.add(i)
                            todo.appendleft(i)
                        else:  # over its deadline: it keeps score 0
                            failures += 1
                            bar.update()
                    _kill(w)
                    _POOL[slot] = _start_worker()
    return scores, failures
