"""grading.py: the paper's grader on every class of answer and ground-truth form found in the real benchmark files
(each class with right answers in many forms and wrong answers that must stay wrong), the authors' evaluation
grader, and the worker processes (time bounds, threads, never outliving their parent, quiet exits)."""
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from decimal import Decimal
from pathlib import Path

import pandas as pd
import pytest
import sympy
from math_verify import parse

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from data import load_examples  # noqa: E402
from plumbing import grading as gr  # noqa: E402

T = "<think>\nlet me think\n</think>\n"

# ---------------------------------------------------------------------------------------------------------
# Paper mode, math: (answer after </think>, ground truth, expected score), one list per class
# ---------------------------------------------------------------------------------------------------------
GENERAL = [
    ("The answer is $\\boxed{0.5}$.", "\\frac{1}{2}", 1), ("\\boxed{\\frac{1}{2}}", "0.5", 1),
    ("\\boxed{1/2}", "\\frac12", 1),
    ("\\boxed{\\dfrac{1}{2}}", "\\frac{1}{2}", 1), ("\\boxed{0.6}", "\\frac{1}{2}", 0),
    ("\\boxed{(3, \\frac{\\pi}{2})}", "\\left( 3, \\frac{\\pi}{2} \\right)", 1),
    ("\\boxed{(3, \\pi)}", "\\left( 3, \\frac{\\pi}{2} \\right)", 0), ("\\boxed{[2,5)}", "[2, 5)", 1),
    ("\\boxed{(2,5)}", "[2, 5)", 0), ("\\boxed{(1, 2)}", "(1,2)", 1), ("\\boxed{(2, 1)}", "(1,2)", 0),
    ("\\boxed{1+x^2}", "x^2+1", 1), ("\\boxed{\\sqrt 2}", "\\sqrt{2}", 1), ("\\boxed{\\text{10}}", "10", 1),
    ("\\boxed{4}", "3", 0), ("no idea", "3", 0), ("\\boxed{52_8}", "52_8", 1), ("\\boxed{10080}", "10,\\!080", 1),
]
SCIENTIFIC_NOTATION = [  # a fifth of Minerva's ground truths are written 4.5e33
    ("\\boxed{4.5 \\times 10^{33}}", "4.5e33", 1), ("\\boxed{4.5\\times10^{33}}", "4.5e33", 1),
    ("\\boxed{4.5 \\cdot 10^{33}}", "4.5e33", 1), ("\\boxed{4.5e33}", "4.5e33", 1), ("\\boxed{4.5E+33}", "4.5e33", 1),
    ("\\boxed{4.5 x 10^33}", "4.5e33", 1), ("\\boxed{4.5 × 10³³}", "4.5e33", 1),
    ("\\boxed{45 \\times 10^{32}}", "4.5e33", 1),
    ("$L = 4.5 \\times 10^{33}$ erg/s", "4.5e33", 1), ("\\boxed{4.5 \\times 10^{33} \\text{ erg s}^{-1}}", "4.5e33", 1),
    ("\\boxed{4.5 \\times 10^{34}}", "4.5e33", 0), ("\\boxed{4.5e34}", "4.5e33", 0),
    ("\\boxed{4.6 \\times 10^{33}}", "4.5e33", 0),
    ("\\boxed{33}", "4.5e33", 0), ("\\boxed{4.5}", "4.5e33", 0), ("\\boxed{4.5 e^{33}}", "4.5e33", 0),
    ("\\boxed{10^{-5}}", "1e-5", 1), ("\\boxed{1.0 \\times 10^{-5}}", "1e-5", 1), ("\\boxed{0.00001}", "1e-5", 1),
    ("\\boxed{1 \\times 10^{5}}", "1e-5", 0), ("\\boxed{1 \\times 10^{-6}}", "1e-5", 0),
    ("\\boxed{2.7778 \\times 10^{-6}}", "2.7778e-6", 1), ("\\boxed{-2.7778 \\times 10^{-6}}", "2.7778e-6", 0),
    ("\\boxed{1.7 \\times 10^4}", "1.70e4", 1), ("\\boxed{17000}", "1.70e4", 1), ("\\boxed{1700}", "1.70e4", 0),
]
PYTHON_SYNTAX = [
    ("\\boxed{\\arcsin\\left(\\frac{10}{13}\\right)}", "np.arcsin(10/13)", 1),
    ("\\boxed{\\sin^{-1}(10/13)}", "np.arcsin(10/13)", 1), ("\\boxed{\\arccos(10/13)}", "np.arcsin(10/13)", 0),
    ("\\boxed{\\arcsin(13/10)}", "np.arcsin(10/13)", 0),
    ("\\boxed{-\\frac{1}{3}}", "-1./3", 1), ("\\boxed{-1/3}", "-1./3", 1), ("\\boxed{-1}", "-1./3", 0),
    ("\\boxed{-\\frac{3}{2}}", "-3./2", 1), ("\\boxed{-1.5}", "-3./2", 1), ("\\boxed{-3}", "-3./2", 0),
    ("\\boxed{\\ln 2}", "np.log(2)", 1), ("\\boxed{\\log 2}", "np.log(2)", 0),  # numpy's log is natural
]
UNICODE = [
    ("\\boxed{90°}", "90^\\circ", 1), ("\\boxed{90°}", "90", 1), ("\\boxed{90 °}", "90", 1),
    ("\\boxed{90^\\circ}", "90", 1),
    ("\\boxed{91°}", "90^\\circ", 0), ("\\boxed{25°C}", "25", 1), ("\\boxed{25℃}", "25", 1), ("\\boxed{26°C}", "25", 0),
    ("\\boxed{９０}", "90", 1), ("\\boxed{９１}", "90", 0), ("答案是 \\boxed{１２.５}", "12.5", 1),
    ("\\boxed{（１，２）}", "(1,2)", 1),
    ("\\boxed{−3}", "-3", 1), ("\\boxed{−3}", "3", 0), ("\\boxed{2π}", "2\\pi", 1), ("\\boxed{3π}", "2\\pi", 0),
    ("\\boxed{x²+1}", "x^2+1", 1), ("\\boxed{x³+1}", "x^2+1", 0), ("\\boxed{√2}", "\\sqrt{2}", 1),
    ("\\boxed{7 · 6}", "42", 1),
]
DOLLARS_IN_GROUND_TRUTH = [  # OlympiadBench and Minerva write some ground truths with dollars, lists, prose
    ("\\boxed{x_0\\cos(\\omega t)+\\frac{\\dot{x}_0}{\\omega}\\sin(\\omega t)}",
     "x_{0} \\cos (\\omega t)+$ $\\dot{x}_{0} \\sin (\\omega t) / \\omega", 1),
    ("\\boxed{\\frac{\\dot{x}_0}{\\omega}\\sin(\\omega t)}",
     "x_{0} \\cos (\\omega t)+$ $\\dot{x}_{0} \\sin (\\omega t) / \\omega", 0),
    ("\\boxed{\\frac{1}{2n+2}}", "$\\frac{1}{2 n+2}$", 1), ("\\boxed{\\frac{1}{2n+1}}", "$\\frac{1}{2 n+2}$", 0),
    ("\\boxed{69, 84}", "$69$,$84$", 1), ("\\boxed{84, 69}", "$69$,$84$", 1), ("\\boxed{69}", "$69$,$84$", 0),
    ("\\boxed{8, 221}", "$221,$8$", 1), ("\\boxed{f(n)=n, g(n)=1}", "$f(n)=n$, $g(n)=1$", 1),
    ("\\boxed{f(x) = ax + b}", "$f(x)=a x+b$, where $b$ is an arbitrary integer, and $a$ is a positive integer", 1),
    ("\\boxed{f(x) = ax}", "$f(x)=a x+b$, where $b$ is an arbitrary integer, and $a$ is a positive integer", 0),
    ("\\boxed{(-\\infty, 0) \\cup \\{1\\}}", "$(-\\infty, 0) \\cup\\{1\\}$.", 1),
    ("\\boxed{32348}", "\\$32,\\!348", 1), ("\\boxed{\\$32,348}", "\\$32,\\!348", 1),
    ("\\boxed{32349}", "\\$32,\\!348", 0),
]
SYMBOLS = [  # subscripts with commands or text, energies E_n, a Lorentz factor
    ("\\boxed{\\frac{\\lambda_{\\rm red}}{\\sqrt 2}}", "\\lambda_{\\text {red}} / \\sqrt{2}", 1),
    ("\\boxed{\\frac{\\lambda_{\\text{red}}}{\\sqrt{2}}}", "\\lambda_{\\text {red}} / \\sqrt{2}", 1),
    ("\\boxed{\\lambda_\\mathrm{red}/\\sqrt2}", "\\lambda_{\\text {red}} / \\sqrt{2}", 1),
    ("\\boxed{\\lambda_{\\text{red}}}", "\\lambda_{\\text {red}} / \\sqrt{2}", 0),
    ("\\boxed{\\frac{\\lambda_{\\text{blue}}}{\\sqrt{2}}}", "\\lambda_{\\text {red}} / \\sqrt{2}", 0),
    ("\\boxed{n^2-n-1}", "$m_{\\max }=n^{2}-n-1$", 1), ("\\boxed{m_{\\max} = n^2-n-1}", "$m_{\\max }=n^{2}-n-1$", 1),
    ("\\boxed{n^2-n}", "$m_{\\max }=n^{2}-n-1$", 0),
    ("\\boxed{\\frac{10^5 L_\\odot}{0.007 c^2 M_\\odot^6} M^6}",
     "\\frac{10^{5} L_{\\odot}}{0.007 c^{2} M_{\\odot}^{6}} M^{6}", 1),
    ("\\boxed{\\frac{10^5 L_\\odot}{0.007 c^2 M_\\odot^6} M^5}",
     "\\frac{10^{5} L_{\\odot}}{0.007 c^{2} M_{\\odot}^{6}} M^{6}", 0),
    ("\\boxed{\\frac{E_1 + 2E_2}{3}}", "\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}", 1),
    ("\\boxed{\\frac{2E_1 + E_2}{3}}", "\\frac{1}{3} E_{1}+\\frac{2}{3} E_{2}", 0),
    ("\\boxed{E_1, E_2}", "E_{1},E_{2}", 1), ("\\boxed{E_2, E_1}", "E_{1},E_{2}", 1),
    ("\\boxed{E_1}", "E_{1},E_{2}", 0),
    ("\\boxed{\\hbar\\omega\\left(v+\\frac{1}{2}\\right)-\\frac{e^2E_0^2}{2m\\omega^2}}",
     "\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}", 1),
    ("\\boxed{2}", "\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}", 0),
    ("\\boxed{\\hbar\\omega(v+\\frac{1}{2})}", "\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}", 0),
    ("\\boxed{(\\gamma^2-1) m_p c^2 \\sin^2\\theta}", "m_{p} c^{2}\\left(\\gamma^{2}-1\\right) \\sin ^{2} \\theta", 1),
    ("\\boxed{m_p c^2\\gamma^2\\sin^2\\theta - m_p c^2 \\sin^2\\theta}",
     "m_{p} c^{2}\\left(\\gamma^{2}-1\\right) \\sin ^{2} \\theta", 1),
    ("\\boxed{(\\gamma^2+1) m_p c^2 \\sin^2\\theta}", "m_{p} c^{2}\\left(\\gamma^{2}-1\\right) \\sin ^{2} \\theta", 0),
]
VARIABLES_NOT_UNITS = [  # a bare letter after the expression is a variable of the question, not metres or tonnes
    ("\\boxed{\\frac{37m}{4}}", "\\frac{37}{4} m", 1), ("\\boxed{\\frac{37}{4}m}", "\\frac{37}{4} m", 1),
    ("\\boxed{9.25 m}", "\\frac{37}{4} m", 1), ("\\boxed{\\frac{37}{4}}", "\\frac{37}{4} m", 0),
    ("\\boxed{\\frac{37}{4} m^2}", "\\frac{37}{4} m", 0),
    ("\\boxed{\\frac{t}{m}}", "\\frac{1}{m} t", 1), ("\\boxed{\\frac{1}{m}}", "\\frac{1}{m} t", 0),
    ("\\boxed{\\frac{c}{\\sqrt 2}}", "\\frac{1}{\\sqrt{2}}c", 1),
    ("\\boxed{\\frac{\\sqrt{2}}{2} c}", "\\frac{1}{\\sqrt{2}}c", 1),
    ("\\boxed{\\frac{1}{\\sqrt 2}}", "\\frac{1}{\\sqrt{2}}c", 0), ("\\boxed{6m}", "$6m$", 1), ("\\boxed{6}", "$6m$", 0),
    ("\\boxed{864}", "864 \\mbox{ inches}^2", 1), ("\\boxed{864 \\text{ in}^2}", "864 \\mbox{ inches}^2", 1),  # units
    ("\\boxed{5.4}", "5.4 \\text{ cents}", 1), ("\\boxed{7.6 Z}", "7.6 Z", 1), ("\\boxed{7.6}", "7.6 Z", 0),
]
PERCENT = [
    ("\\boxed{62.5\\%}", "62.5%", 1), ("\\boxed{62.5}", "62.5%", 1), ("\\boxed{0.625}", "62.5%", 1),
    ("\\boxed{62.5 \\text{ percent}}", "62.5%", 1), ("\\boxed{0.625\\%}", "62.5%", 0), ("\\boxed{6.25}", "62.5%", 0),
    ("\\boxed{8\\%}", "$8 \\%$", 1), ("\\boxed{8}", "$8 \\%$", 1), ("\\boxed{0.08}", "$8 \\%$", 1),
    ("\\boxed{80}", "$8 \\%$", 0),
]
INTERVAL_WITHOUT_IN = [  # OlympiadBench's "t(0,4]" lost its "\in"
    ("\\boxed{(0,4]}", "$t(0,4]$", 1), ("\\boxed{t \\in (0, 4]}", "$t(0,4]$", 1), ("\\boxed{(0,4)}", "$t(0,4]$", 0),
    ("\\boxed{[0,4]}", "$t(0,4]$", 0),
]


def number_forms(mantissa: str, exponent: int) -> list[tuple[str, str, int]]:
    """(answer, ground truth, expected) for the ground truth `mantissa`e`exponent`, as Minerva writes it: the number
    however written is right; another exponent, mantissa or sign is wrong."""
    m, e = Decimal(mantissa), exponent
    right = [f"{m}e{e}", f"{m}E{e:+d}", f"{m} \\times 10^{{{e}}}", f"{m}\\times10^{{{e}}}", f"{m} \\cdot 10^{{{e}}}",
             f"{m} x 10^{e}", f"{m * 10} \\times 10^{{{e - 1}}}", f"{m / 10} \\times 10^{{{e + 1}}}",
             f"{m.scaleb(e):f}", f"\\frac{{{m}}}{{10^{{{-e}}}}}" if e < 0 else f"{m}\\cdot10^{{{e}}}",
             f"{m} \\times 10^{{{e}}} \\text{{ J}}", f"x = {m} \\times 10^{{{e}}}"]
    wrong = [f"{m} \\times 10^{{{e + 1}}}", f"{m} \\times 10^{{{e - 1}}}", f"{m}e{e + 2}", f"{m} \\times 10^{{{-e}}}",
             f"{m * 10} \\times 10^{{{e}}}", f"{m.scaleb(e - 1):f}", f"{m + Decimal('0.01')} \\times 10^{{{e}}}",
             f"-{m} \\times 10^{{{e}}}", "0"]
    return [(f"\\boxed{{{a}}}", f"{mantissa}e{exponent}", int(a in right)) for a in right + wrong]


# math-verify compared numbers with absolute tolerances (1.325e-26 passed for 1.325e-27); Minerva's physics answers
# live down there. Real ground truths from 1e-27 to 1e33, and one far below any of them.
NUMBERS_BY_RELATIVE_ERROR = [case for m, e in [("1.325", -27), ("4.6", -24), ("2.88", -19), ("7.4", -12), ("3.89", -10),
                                               ("1", -8), ("5.89", -7), ("1.45", -5), ("6.5", -2), ("1.7", 4),
                                               ("4.5", 33), ("2.5", -40)] for case in number_forms(m, e)] + [
    ("\\boxed{0.0000002}", "1e-7", 0), ("\\boxed{0.0000001}", "1e-7", 1),  # floats were rounded to 6 decimals
    ("\\boxed{0.000067}", ".0000672", 0), ("\\boxed{6.72 \\times 10^{-5}}", ".0000672", 1),
    ("\\boxed{0.0000001}", "0", 0), ("\\boxed{1.3 \\times 10^{-27}}", "1.325e-27", 0),
    # from 0.01 up math-verify's verdict stands: six decimals, a percentage read either way
    ("\\boxed{0.333333}", "\\frac{1}{3}", 1), ("\\boxed{0.333}", "\\frac{1}{3}", 0),
    ("\\boxed{0.012346}", "0.01234567", 1),
    ("\\boxed{8\\%}", "8", 1), ("\\boxed{2^-10}", "\\frac{1}{1024}", 1), ("\\boxed{2^-9}", "\\frac{1}{1024}", 0),
]
OPTION_WITH_VALUE = [  # AMC's ground truths are numbers ("142.0"); a boxed answer may name its option too
    ("\\boxed{\\textbf{(B) }142}", "142.0", 1), ("\\boxed{\\text{(B) } 142}", "142.0", 1),
    ("\\boxed{(B) 142}", "142.0", 1), ("\\boxed{\\textbf{(B)}\\ 142}", "142.0", 1),
    ("\\boxed{\\mathrm{(B)}\\quad 142}", "142.0", 1), ("\\boxed{(B)~142}", "142.0", 1),
    ("\\boxed{\\textbf{(B) } 142.0}", "142.0", 1), ("$\\textbf{(B) }142$", "142.0", 1),
    ("\\(\\textbf{(E)}\\ 8178\\)", "8178.0", 1), ("\\boxed{\\textbf{(A) }-4}", "-4.0", 1),
    ("\\boxed{\\textbf{(C) }\\frac{1}{2}}", "0.5", 1), ("\\boxed{（Ｂ） 142}", "142.0", 1),
    ("\\boxed{\\textbf{(B) }143}", "142.0", 0), ("\\boxed{\\textbf{(B) }1420}", "142.0", 0),
    ("\\boxed{\\textbf{(A) }4}", "-4.0", 0), ("\\boxed{\\textbf{(B)}}", "142.0", 0), ("\\boxed{B}", "142.0", 0),
    # a ground truth that is itself an option keeps the label
    ("\\boxed{\\text{(C)}}", "\\text{(C)}", 1), ("\\boxed{(C)}", "\\text{(C)}", 1),
    ("\\boxed{\\text{(B)}}", "\\text{(C)}", 0),
]
NOT_UNITS = [  # the authors' grader reads "a + b" as "b" (unit words as unescaped regexes); here it stays wrong
    ("\\boxed{a + b}", "b", 0), ("\\boxed{c + 1}", "1", 0), ("\\boxed{e + 5}", "5", 0), ("\\boxed{a + b}", "a + b", 1),
]
MATH_CASES = [(T + a, gt, "math", e) for cases in (GENERAL, SCIENTIFIC_NOTATION, PYTHON_SYNTAX, UNICODE,
                                                   DOLLARS_IN_GROUND_TRUTH, SYMBOLS, VARIABLES_NOT_UNITS, PERCENT,
                                                   INTERVAL_WITHOUT_IN, NUMBERS_BY_RELATIVE_ERROR, OPTION_WITH_VALUE,
                                                   NOT_UNITS) for a, gt, e in cases]
THINK_RULE = [  # the paper grades the text after the LAST </think>; no </think>, no credit
    ("\\boxed{3}", "3", "math", 0), ("<think>\\boxed{3}</think> so the answer is \\boxed{4}", "3", "math", 0),
    ("<think>a</think>\\boxed{4} wait</think>\\boxed{3}", "3", "math", 1), ("\\boxed{C}", "C", "mc", 0),
]

# ---------------------------------------------------------------------------------------------------------
# Paper mode, multiple choice: (answer after </think>, the label it names or None)
# ---------------------------------------------------------------------------------------------------------
MC_FORMS = [
    ("ANSWER: C", "C"), ("answer: d", "D"), ("ANSWER: $C$", "C"), ("ANSWER: $C", "C"), ("ANSWER: **D**", "D"),
    ("**Answer:** C", "C"), ("**Answer: C**", "C"), ("The answer is (C).", "C"), ("The correct answer is C.", "C"),
    ("Final Answer: \\boxed{C}", "C"), ("The answer is \\(\\boxed{B}\\)", "B"), ("answer:\n\nB", "B"),
    ("ANSWER: option C", "C"), ("ANSWER: B) Planetary years will become longer.", "B"), ("ANSWER: B. A planet", "B"),
    ("ANSWER: I think it is B", "B"), ("ANSWER: I'm not sure, maybe B", "B"), ("ANSWER: B is correct", "B"),
    ("ANSWER: I", "I"), ("ANSWER: J", "J"), ("ANSWER: ３", "3"), ("ANSWER: Ｃ", "C"),
    ("\\boxed{C}", "C"), ("\\boxed{c}", "C"), ("\\boxed{\\text{C}}", "C"), ("\\boxed{(C)}", "C"), ("\\boxed{C)}", "C"),
    ("\\boxed{C) Planetary days will become shorter.}", "C"), ("\\boxed{\\textbf{(B) }142}", "B"),
    ("\\boxed{\\text{(B) } 142}", "B"), ("\\boxed{B. 142}", "B"), ("$\\boxed{\\mathrm{D}}$", "D"), ("\\boxed{2}", "2"),
    ("\\boxed{A} hmm, no. ANSWER: C", "C"), ("ANSWER: C. Wait, no: \\boxed{A}", "A"),  # the last one counts
    ("Looking at the answer choices, A is out. \\boxed{D}", "D"), ("The correct option is\n\n**C**", "C"), ("C", "C"),
    # no answer: prose, words, numbers that are not labels, labels out of range
    ("ANSWER: I think so", None), ("ANSWER: A planet", None), ("the answer is a bit unclear", None),
    ("ANSWER: Apples", None), ("\\boxed{Apples}", None), ("\\boxed{10^{-4} \\text{ eV}}", None),
    ("ANSWER: 10^-9 eV", None),
    ("ANSWER: K", None), ("Looking at the answer choices, A is out. So D.", None), ("I'm not sure", None), ("", None),
]
MC_CASES = [(T + text, label or "A", "mc", int(label is not None)) for text, label in MC_FORMS] + [
    (T + "ANSWER: I think it is B", "I", "mc", 0), (T + "ANSWER: I think it is B", "B", "mc", 1),
    (T + "ANSWER: C", "D", "mc", 0), (T + "\\boxed{C}", "c", "mc", 1), (T + "\\boxed{2}", " 2 ", "mc", 1),
    (T + "\\boxed{2}", "B", "mc", 0), (T + "ANSWER: Apples", "A", "mc", 0),
]
PAPER_CASES = MATH_CASES + THINK_RULE + MC_CASES


@pytest.mark.parametrize("response,gt,kind,expected", PAPER_CASES)
def test_paper_grading(response, gt, kind, expected):
    assert gr.grade_one(response, gt, kind) == expected


@pytest.mark.parametrize("text,label", MC_FORMS)
def test_mc_answer_names_the_label(text, label):
    assert gr.mc_answer(text) == label


def test_answer_kind():
    assert gr.answer_kind("gpqa", "A") == "mc" and gr.answer_kind("arc_c", " 3 ") == "mc"
    assert gr.answer_kind("mmlu_pro", "J") == "mc" and gr.answer_kind("arc_c", "K") == "math"
    assert gr.answer_kind("math", "C") == "math" and gr.answer_kind("gpqa", "12") == "math"


# ---------------------------------------------------------------------------------------------------------
# Every ground-truth form of the real files parses to a value and grades itself right (fixtures in their schema)
# ---------------------------------------------------------------------------------------------------------
GROUND_TRUTH_FORMS = {  # data_source -> ground truths of each form found in the benchmark files
    "math": ["\\left( 3, \\frac{\\pi}{2} \\right)", "\\text{Evelyn}", "90^\\circ", "52_8", "\\frac43", "10,\\!080",
             "\\$32,\\!348", "864 \\mbox{ inches}^2", "\\begin{pmatrix} -1/3 \\\\ 2/3 \\\\ 5/3 \\end{pmatrix}",
             "x \\in [-2,7]", "1 \\pm \\sqrt{19}", ".0000672", "\\text{(C)}", "(-\\infty, 2) \\cup (3, \\infty)"],
    "minerva": ["4.5e33", "1e-5", "2.7778e-6", "-1./3", "np.arcsin(10/13)", "\\frac{37}{4} m", "\\frac{1}{m} t",
                "x_{0} \\cos (\\omega t)+$ $\\dot{x}_{0} \\sin (\\omega t) / \\omega", "E_{1},E_{2}",
                "\\lambda_{\\text {red}} / \\sqrt{2}", "m_{p} c^{2}\\left(\\gamma^{2}-1\\right) \\sin ^{2} \\theta",
                "\\frac{dM}{dt}=\\frac{10^{5} L_{\\odot}}{0.007 c^{2} M_{\\odot}^{6}} M^{6}",
                "I(0) e^{-\\frac{t}{R C}}",
                "\\hbar \\omega(v+1 / 2)-\\frac{E_{0}^{2} e^{2}}{2 m \\omega^{2}}", "y^{\\prime}+r y-r x(t)=0"],
    "olympiad_bench": ["$\\frac{1}{2 n+2}$", "$69$,$84$", "$221,$8$", "$m_{\\max }=n^{2}-n-1$", "$t(0,4]$", "$6m$",
                       "$f(x)=a x+b$, where $b$ is an arbitrary integer", "62.5%", "$8 \\%$", "$k \\geqslant 2$",
                       "$(-\\infty, 0) \\cup\\{1\\}$.", "$f(x)=x$,$f(x)=2-x$", "(1,-4,-2),(3,2,3),(13,2,-2)"],
    "amc": ["142.0", "-4.0"], "aime": ["204"],
}


def _benchmark_file(tmp_path: Path) -> Path:
    rows = [{"data_source": source, "prompt": [{"role": "user", "content": f"question {i}"}], "ability": "math",
             "reward_model": {"ground_truth": gt, "style": "rule"}, "extra_info": {"index": i, "split": "test"}}
            for source, gts in GROUND_TRUTH_FORMS.items() for i, gt in enumerate(gts)]
    path = tmp_path / "valid.all.parquet"
    pd.DataFrame(rows).to_parquet(path)
    return path


def test_every_ground_truth_form_parses_and_grades_itself(tmp_path):
    examples = load_examples(_benchmark_file(tmp_path))
    assert len(examples) == sum(map(len, GROUND_TRUTH_FORMS.values()))
    for ex in examples:
        gold = gr.gold_latex(ex.ground_truth)
        parsed = parse(f"${gold}$", [gr._WITHOUT_UNITS])
        assert parsed and isinstance(parsed[0], (sympy.Basic, sympy.MatrixBase)), (ex.ground_truth, parsed)
        assert not any(a == sympy.E for a in parsed[0].atoms()) or "e^" in gold, (ex.ground_truth, parsed)
        assert gr.grade_one(T + "\\boxed{" + gold + "}", ex.ground_truth) == 1.0, ex.ground_truth


# ---------------------------------------------------------------------------------------------------------
# Authors mode (their validation reward): whole response, math-verify or their boxed grader
# ---------------------------------------------------------------------------------------------------------
AUTHORS_CASES = [  # (response, ground truth, expected)
    ("\\boxed{3}", "3", 1), ("<think>\\boxed{3}</think> so the answer is \\boxed{4}", "3", 0),  # no </think> needed
    ("<think>\\boxed{3}", "3", 1), ("The answer is $\\frac{1}{2}$", "0.5", 1), (T + "\\boxed{4}", "3", 0),
    ("\\boxed{1) some option text}", "1", 1),  # only the boxed grader reads this (an ARC option with its text)
    ("\\boxed{2) some option text}", "1", 0),
    ("ANSWER: $C$", "C", 1),  # only math-verify reads this (no box)
    ("\\boxed{C}", "C", 1), ("\\boxed{c}", "C", 1), ("\\boxed{(C)}", "C", 1), ("\\boxed{\\text{B}}", "B", 1),
    ("\\boxed{D}", "C", 0), ("ANSWER: $D$", "C", 0),
    ("ANSWER: C", "C", 0),  # a bare letter: neither grader reads it, in the authors' own code either
    ("\\boxed{4.5 \\times 10^{33}}", "4.5e33", 0),  # what their grader misses (the paper mode gets it right)
    ("\\boxed{5 \\text{ apples}}", "5", 1), ("\\boxed{k=5}", "5", 1), ("\\boxed{\\text{Evelyn}}", "\\text{Evelyn}", 1),
    # their unit words are unescaped regular expressions: "a .", "c .", "e .", "q ." eat a letter, a space and one more
    ("\\boxed{a + b}", "b", 1), ("\\boxed{c + 1}", "1", 1), ("\\boxed{e + 5}", "5", 1), ("\\boxed{q + r}", "r", 1),
    ("\\boxed{a - b}", "b", 1), ("\\boxed{a + b}", "a", 0), ("\\boxed{a+b}", "b", 0), ("\\boxed{x + y}", "y", 0),
]
END = "<|im_end|>"
END_TOKEN = [  # (response without its end token, ground truth, the authors' score without it, with it)
    ("The probability is 7/12", "\\frac{7}{12}", 1, 0), ("The answer is 2^10", "1024", 1, 0),
    ("x = 3/4", "\\frac{3}{4}", 1, 0), ("The answer is 84/2", "42", 1, 0),  # math-verify reads 7, 2, 3, 84
    ("so 7/12.", "\\frac{7}{12}", 0, 1),  # and the other way round
    ("The answer is $\\frac{7}{12}$.", "\\frac{7}{12}", 1, 1), ("The answer is 7/12 exactly.", "\\frac{7}{12}", 1, 1),
    ("\\boxed{7/12}", "\\frac{7}{12}", 1, 1), ("The answer is 42", "42", 1, 1), ("\\boxed{2^{10}}", "1024", 1, 1),
    ("The answer is 2^10", "2", 0, 1),  # wrong, and right for them
]
AUTHORS_RL_CASES = [  # (response, ground truth, expected): the authors' RL reward
    ("<think>so \\boxed{3}</think> That is all.", "3", 1),  # boxed only in the reasoning: their boxed grader reads it
    ("<think>\\boxed{3}</think> so the answer is \\boxed{4}", "3", 0),  # the last \boxed{} counts
    ("<think>a</think>\\boxed{4} wait</think>\\boxed{3}", "3", 1), ("<think>x</think>\\boxed{4}", "3", 0),
    ("<think>\\boxed{3}", "3", 0), ("\\boxed{3}", "3", 0),  # no </think>: 0 before either grader
    ("<think>x</think> The answer is $3$.", "3", 1),  # math-verify on the text after </think>
    ("<think>The answer is $3$.</think> That is all.", "3", 0),  # ... and only there
    ("<think>x</think> The probability is 7/12" + END, "\\frac{7}{12}", 0),
    ("<think>x</think>\\boxed{a + b}", "b", 1),  # the same boxed grader, unit words included
]


@pytest.mark.parametrize("response,gt,expected", AUTHORS_CASES)
def test_authors_grading(response, gt, expected):
    assert gr.grade_one(response, gt, gr.answer_kind("gpqa", gt), grading="authors") == expected


@pytest.mark.parametrize("text,gt,without_end,with_end", END_TOKEN)
@pytest.mark.parametrize("end", ["<|im_end|>", "<|endoftext|>"])
def test_the_authors_grade_the_text_with_its_end_token(text, gt, without_end, with_end, end):
    assert gr.grade_one(gr.graded_text(text, "", "authors"), gt, grading="authors") == without_end
    assert gr.grade_one(gr.graded_text(text, end, "authors"), gt, grading="authors") == with_end
    assert gr.grade_one(gr.graded_text(T + text, end, "authors_rl"), gt, grading="authors_rl") == with_end
    assert gr.graded_text(T + text, end, "paper") == T + text  # the paper's rule grades the text alone


@pytest.mark.parametrize("response,gt,expected", AUTHORS_RL_CASES)
def test_authors_rl_reward(response, gt, expected):
    assert gr.grade_one(response, gt, grading="authors_rl") == expected


def test_a_right_answer_boxed_in_the_reasoning_earns_the_authors_reward_only():
    response = "<think>so \\boxed{3}</think> That is all."
    assert (gr.grade_one(response, "3", grading="authors_rl"), gr.grade_one(response, "3")) == (1, 0)


def test_authors_boxed_grader_follows_their_logic():
    # MATH's normalisation: units words, \text{}, a short "x =" prefix, \dfrac, spaces
    assert gr._hendrycks_normalize("\\text{5 inches}") == gr._hendrycks_normalize("5") == "5"
    assert gr._hendrycks_normalize("k = \\dfrac12") == gr._hendrycks_normalize(".5") == "\\frac{1}{2}"
    # their sympy step: fractions must match as written, integers stay integers, sympy for the rest
    assert gr._sympy_grade("(1, \\frac{1}{2})", "(1,0.5)") and not gr._sympy_grade("\\frac{2}{4}", "\\frac{1}{2}")
    assert not gr._sympy_grade("2.5", "2") and gr._sympy_grade("3 million", "3*10^6")
    # their _strip_string as written: unit words as regular expressions, "\sqrt 3" before spaces go, and an error
    # (a second "\text{ ", a "\sqrt" or "\frac" at the end) leaves the answer as it came
    assert gr._hendrycks_normalize("a + b") == "b" and gr._hendrycks_normalize("s . t") == "0."
    assert gr._hendrycks_normalize("\\sqrt 3") == "\\sqrt{}3" and gr._hendrycks_normalize("\\sqrt3") == "\\sqrt{3}"
    for broken in ("k = 2\\text{ x}+\\text{ y}7", "k = x\\sqrt", "k = 1+\\frac"):
        assert gr._hendrycks_normalize(broken) == broken
    # pylatexenc's text: \sqrt2 -> sqrt(2), the braces of a subscript dropped, \frac{a}{b} -> a/b
    assert gr._loose_normalize("\\frac{c}{\\sqrt 2}") == "c/sqrt(2)"
    assert gr._loose_normalize("\\frac{\\lambda_{\\text{red}}}{\\sqrt{2}}") == "λ_red/sqrt(2)"
    # only the last \boxed{...} counts, and only when it is followed by "{"
    assert gr.boxed_answer_correct("\\boxed{4} no, \\boxed{3}", "3")
    assert not gr.boxed_answer_correct("\\boxed{3} \\boxed 4", "3")
    assert not gr.boxed_answer_correct("\\fbox{3}", "3")


# ---------------------------------------------------------------------------------------------------------
# Worker processes
# ---------------------------------------------------------------------------------------------------------
def test_grade_batched_matches_grade_one_in_every_mode():
    cases = PAPER_CASES[::8] + THINK_RULE + [(r, g, "math", e) for r, g, e in AUTHORS_RL_CASES]
    responses, gts, kinds, _ = map(list, zip(*cases))
    by_mode = {}
    for grading in gr.GRADING_MODES:
        by_mode[grading] = [gr.grade_one(r, g, k, grading=grading) for r, g, k in zip(responses, gts, kinds)]
        assert gr.grade(responses, gts, kinds, timeout_s=20, workers=2, grading=grading) == (by_mode[grading], 0)
    assert len({tuple(scores) for scores in by_mode.values()}) == 3  # the modes differ on these cases
    with pytest.raises(ValueError, match="unknown grading 'oat'"):
        gr.grade(responses, gts, kinds, grading="oat")


def test_grader_bounds_time_on_adversarial_input():
    gr.grade([T + "\\boxed{1}"] * 2, ["1"] * 2, ["math"] * 2, workers=2)  # start the workers outside the timing
    start = time.monotonic()  # 9^(9^(9^9)) never finishes without math-verify's signals, absent in workers
    scores, failures = gr.grade([T + "\\boxed{9^{9^{9^{9}}}}", T + "\\boxed{7}", T + "\\boxed{8}"], ["3", "7", "8"],
                                ["math"] * 3, timeout_s=1.5, workers=2)
    assert time.monotonic() - start < 1.5 + 2.5  # killed at its deadline; the other worker graded the rest
    assert (scores, failures) == ([0.0, 1.0, 1.0], 1)
    # A 6000-deep nested expression (17 s to parse) is killed too; an unparsable ground truth is a failure.
    nested = T + "\\boxed{" + "(" * 3000 + "1" + ")" * 3000 + "}"
    scores, failures = gr.grade([nested, T + "\\boxed{1}"], ["1", "\\text{}"], ["math"] * 2, timeout_s=1.5, workers=2)
    assert (scores, failures) == ([0.0, 0.0], 2)
    assert gr.grade([T + "\\boxed{5}"] * 3, ["5"] * 3, ["math"] * 3, workers=2) == ([1.0] * 3, 0)  # replaced workers

    start = time.monotonic()  # in-process, main thread: math-verify's own signal timeouts apply
    assert gr.grade_one(T + "\\boxed{9^{9^{9^{9}}}}", "3", timeout_s=1) == 0.0
    assert time.monotonic() - start < 5


def test_grade_from_a_thread():
    gr._stop_workers()  # the thread starts its own
    out = {}

    def work():
        gr.grade([T + "\\boxed{1}"], ["1"], ["math"], workers=1)
        # the ready worker grades both while a second one still starts: grade() returns once that one is ready too,
        # else it would not yet have armed PR_SET_PDEATHSIG when this thread ends
        out["batched"] = gr.grade([T + "\\boxed{\\frac{1}{2}}", T + "\\boxed{2}"], ["0.5", "3"], ["math"] * 2,
                                  workers=2)
        out["ready"] = [w.ready for w in gr._POOL]
        out["one"] = gr.grade_one(T + "\\boxed{(1,2)}", "(1, 2)")

    thread = threading.Thread(target=work)
    thread.start()
    thread.join(60)
    assert out == {"batched": ([1.0, 0.0], 0), "ready": [True, True], "one": 1.0}
    if sys.platform.startswith("linux"):  # workers die with the thread that started them (PR_SET_PDEATHSIG) ...
        assert _wait_gone([w.process.pid for w in gr._POOL], 5.0)
    # ... and the next call replaces them
    # (a generous deadline: a full suite on a loaded 2-core machine once scored one of these 0 at the default 10 s)
    assert gr.grade([T + "\\boxed{2}"] * 3, ["2"] * 3, ["math"] * 3, timeout_s=60, workers=2) == ([1.0] * 3, 0)


def test_a_response_whose_worker_dies_under_it_is_graded_again_on_a_fresh_one():
    """A worker that takes a response and exits without an answer (one killed with the thread that started it:
    alive when handed the response, gone before it answers) costs a retry, not a wrong score."""
    gr._stop_workers()
    parent, child = socket.socketpair()
    dying = subprocess.Popen([sys.executable, "-c", "import socket, sys; s = socket.socket(fileno=int(sys.argv[1]));"
                              " s.recv(1 << 16)", str(child.fileno())], pass_fds=[child.fileno()])
    child.close()
    gr._POOL.append(gr._Worker(dying, gr.Connection(parent.detach()), ready=True))
    assert gr.grade([T + "\\boxed{2}", T + "\\boxed{3}"], ["2", "3"], ["math"] * 2, workers=1) == ([1.0] * 2, 0)
    assert dying.poll() is not None and all(w.process is not dying for w in gr._POOL)


def _gone(pid: int) -> bool:
    """No such process, or a zombie (its reaper may not have collected it yet)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "ZX"
    except FileNotFoundError:
        return True


def _wait_gone(pids: list[int], seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if all(map(_gone, pids)):
            return True
        time.sleep(0.1)
    return False


def _python(code: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(code)], cwd=ROOT, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, **kwargs)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_workers_die_with_a_parent_killed_in_the_middle_of_a_hanging_grade():
    parent = _python(f"""
        from plumbing import grading
        grading.grade([{T!r} + "\\\\boxed{{1}}"] * 2, ["1"] * 2, ["math"] * 2, workers=2)  # both workers ready
        print(*[w.process.pid for w in grading._POOL], flush=True)
        grading.grade([{T!r} + "\\\\boxed{{9^{{9^{{9^{{9}}}}}}}}"] * 2, ["3"] * 2, ["math"] * 2, timeout_s=600)
    """)
    workers = [int(pid) for pid in parent.stdout.readline().split()]
    assert len(workers) == 2 and not any(map(_gone, workers))
    time.sleep(1.0)  # both are now deep inside 9^(9^(9^9))
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_gone(workers, 5.0), "a grader worker outlived its parent"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_the_portable_fallback_ends_an_orphaned_worker():
    # The watcher thread alone (no prctl): a process that only runs it exits once its parent is killed.
    parent = _python("""
        import subprocess, sys
        child = subprocess.Popen([sys.executable, "-c", "import os, time; from plumbing import grading; "
                                  "grading._exit_when_orphaned(os.getppid()); print('watching', flush=True); "
                                  "time.sleep(120)"], stdout=subprocess.PIPE, text=True)
        assert child.stdout.readline().strip() == "watching"
        print(child.pid, flush=True)
        child.wait()
    """)
    orphan = int(parent.stdout.readline())
    assert not _gone(orphan)
    parent.send_signal(signal.SIGKILL)
    parent.wait()
    assert _wait_gone([orphan], 5.0), "the watcher thread did not end the orphaned process"


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "os._exit(0)"])  # os._exit: distributed.shutdown, no atexit
def test_an_evaluation_that_ends_while_workers_start_exits_quietly(exit_call):
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(f"""
        import os, sys
        from plumbing import grading
        print(grading.grade([{T!r} + "\\\\boxed{{2}}"], ["2"], ["math"], workers=1), flush=True)
        for _ in range(3):  # still importing when this process ends
            grading._POOL.append(grading._start_worker())
        print(*[w.process.pid for w in grading._POOL], flush=True)
        {exit_call}
    """)], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "([1.0], 0)"
    assert _wait_gone([int(pid) for pid in lines[1].split()], 5.0)
