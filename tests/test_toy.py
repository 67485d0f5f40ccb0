"""demo/toy.py: the floor task (questions, responses, the share of dead ends, the classifier) and the tokenizer."""
import collections

import pytest

import data
from plumbing.grading import grade
from demo import toy


def question_of(row):
    return row["prompt"][1]["content"]


def response_of(row):
    return row["target"][0]["content"]


def test_floor_questions_have_the_stated_shape_and_share_of_dead_ends():
    rows = toy.make_floor_task(400, seed=5, style="prompt", expert_fails=0.5, n_terms=5)
    assert rows == toy.make_floor_task(400, seed=5, style="prompt", expert_fails=0.5)  # deterministic, defaults
    for r in rows:
        numbers = toy.parse_floor(question_of(r))
        negative = [v for v in numbers if v < 0]
        assert len(numbers) == 5 and len(negative) == 1 and -negative[0] in toy.NEGATIVE and numbers[0] > 0
        assert len(set(numbers)) == 5 and all(v in toy.POSITIVE for v in numbers if v > 0)  # a digit tells its sign
        assert question_of(r) == f"Add: {','.join(map(str, numbers))}"
        assert r["reward_model"]["ground_truth"] == str(sum(numbers)) and sum(numbers) >= 1
        assert "target" not in r and r["prompt"][0]["content"] == toy.FLOOR_SYSTEM
        # data_source says whether the expert's order (the question's) gets through; the negative number last
        # always does
        expert_works = toy.add_in_order(numbers)[1]
        assert r["data_source"] == (toy.EXPERT_WORKS if expert_works else toy.EXPERT_FAILS)
        assert toy.add_in_order([v for v in numbers if v > 0] + negative)[1]
    assert collections.Counter(r["data_source"] for r in rows) == {toy.EXPERT_FAILS: 200, toy.EXPERT_WORKS: 200}
    assert sum(r["data_source"] == toy.EXPERT_FAILS for r in toy.make_floor_task(100, 1, "prompt", 0.3)) == 30
    natural = sum(r["data_source"] == toy.EXPERT_FAILS for r in toy.make_floor_task(1000, 1, "prompt"))
    assert 300 < natural < 500  # about 2 in 5 as the questions fall
    # The same questions in every style; only the response differs
    expert = toy.make_floor_task(50, seed=2, style="expert")
    for style in ("pretrain", "prompt"):
        assert [question_of(r) for r in toy.make_floor_task(50, 2, style, 0.0)] == [question_of(r) for r in expert]


def test_the_small_toys_questions_all_hold_1_to_4():
    """--positives 4 (the small demo): every question holds the positive numbers 1-4, in its own order, and one
    negative number; the defaults draw what they drew before the option."""
    rows = toy.make_floor_task(300, seed=5, style="prompt", expert_fails=0.5, positives=4)
    for r in rows:
        numbers = toy.parse_floor(question_of(r))
        assert sorted(v for v in numbers if v > 0) == [1, 2, 3, 4] and numbers[0] > 0
        assert [-v for v in numbers if v < 0][0] in toy.NEGATIVE
        assert r["data_source"] == (toy.EXPERT_WORKS if toy.add_in_order(numbers)[1] else toy.EXPERT_FAILS)
    assert collections.Counter(r["data_source"] for r in rows) == {toy.EXPERT_FAILS: 150, toy.EXPERT_WORKS: 150}
    assert len({question_of(r) for r in rows}) > 150            # of the 288 questions there are
    assert toy.make_floor_task(50, 2, "pretrain") == toy.make_floor_task(50, 2, "pretrain", positives=6)
    with pytest.raises(ValueError, match="positives 3: expected 4..6"):
        toy.make_floor_task(10, 0, "prompt", positives=3)
    # the test split draws each question once (--distinct_test); a kind that runs out is an error, not a hang
    assert len({question_of(r) for r in toy.make_floor_task(64, 3, "prompt", 0.5, positives=4, distinct=True)}) == 64
    assert len({question_of(r) for r in toy.make_floor_task(64, 3, "prompt", 0.5, positives=4)}) < 64   # else vacuous
    with pytest.raises(ValueError, match="too few of each kind left"):      # 115 of the 112 where the order works
        toy.make_floor_task(230, 3, "prompt", 0.5, positives=4, distinct=True)


def test_excluded_questions_are_never_drawn(tmp_path):
    held_out = toy.make_floor_task(300, seed=7, style="prompt", expert_fails=0.5)
    exclude = frozenset(question_of(r) for r in held_out)
    rows = toy.make_floor_task(3000, seed=8, style="pretrain", exclude=exclude)
    assert not exclude & {question_of(r) for r in rows}
    assert exclude & {question_of(r) for r in toy.make_floor_task(3000, seed=8, style="pretrain")}  # else vacuous
    # python demo/toy.py: the test questions are in no training split
    toy._main(["--out", str(tmp_path), "--n_pretrain", "2000", "--n_sft", "500", "--n_rl", "300", "--n_test", "64",
               "--vocab_labels", "10", "--vocab_size", "300"])
    questions = {name: {ex.question for ex in data.load_examples(tmp_path / f"{name}.jsonl")}
                 for name in ("train_pretrain", "train_expert", "train_rl", "test")}
    assert len(questions["test"]) > 50 and all(not questions["test"] & questions[name] for name in questions
                                               if name != "test")


def test_expert_and_pretraining_responses():
    expert = toy.make_floor_task(200, seed=3, style="expert")
    assert all(toy.floor_solution_kind(question_of(r), response_of(r)) == "question order, through" for r in expert)
    assert all(r["data_source"] == toy.EXPERT_WORKS for r in expert)
    clean = toy.make_floor_task(2000, seed=3, style="pretrain")
    assert clean == toy.make_floor_task(2000, seed=3, style="pretrain")  # deterministic
    kinds = collections.Counter(toy.floor_solution_kind(question_of(r), response_of(r)) for r in clean)
    assert kinds["mistake"] == 0 and 600 < kinds["question order, stuck"] + kinds["other order, stuck"] < 1100
    firsts = collections.Counter(response_of(r).removeprefix(data.THINK).split("\n")[0] for r in clean)
    assert set(firsts) == {str(v) for v in toy.POSITIVE}  # only positive numbers come first
    same_first = sum(response_of(r).removeprefix(data.THINK).split("\n")[0] == question_of(r).split(",")[0][5:]
                     for r in clean)
    assert 0.2 < same_first / 2000 < 0.3  # the question's first number: 1 in 4
    # Every row grades as the demo's stages grade it: a total that got through is right, a dead end is wrong.
    rows = expert[:8] + clean[:40]
    responses, truths = [response_of(r).removeprefix(data.THINK) for r in rows], [r["reward_model"]["ground_truth"]
                                                                                  for r in rows]
    scores, failures = grade(responses, truths, ["math"] * len(rows), workers=1)
    kinds = [toy.floor_solution_kind(question_of(r), response_of(r)) for r in rows]
    assert failures == 0 and scores == [float(k.endswith("through")) for k in kinds] and 0 < sum(scores) < len(rows)


def test_rows_load_in_the_authors_schema(tmp_path):
    rows = toy.make_floor_task(8, 0, "expert") + toy.make_floor_task(8, 0, "prompt", 0.5)
    examples = data.load_examples(data.write_jsonl(rows, tmp_path / "floor.jsonl"))
    assert [ex.response is None for ex in examples] == [False] * 8 + [True] * 8
    assert all(ex.system == toy.FLOOR_SYSTEM and ex.question.startswith("Add: ") for ex in examples)
    assert examples[0].response.endswith(f"\\boxed{{{examples[0].ground_truth}}}")


NUMBERS = [2, -8, 6, 3, 5]  # in the question's order the -8 comes while the total is 2: a dead end
QUESTION = toy.floor_question(NUMBERS)
THROUGH_FROM_6 = "6\n+2=8\n-8=0\n+3=3\n+5=8"


def test_floor_question_and_responses_read_as_written():
    assert QUESTION == "Add: 2,-8,6,3,5" and toy.parse_floor(QUESTION) == NUMBERS
    assert toy.add_in_order(NUMBERS) == ([2], False) and toy.add_in_order([6, 2, -8, 3, 5]) == ([6, 8, 0, 3, 8], True)
    assert toy.floor_response([6, 2, -8, 3, 5]) == data.THINK + THROUGH_FROM_6 + "\n</think>\n\\boxed{8}"
    assert toy.floor_response(NUMBERS) == data.THINK + "2\n-8: stuck\n</think>\nStuck."


@pytest.mark.parametrize("reasoning, kind", [
    ("2\n-8: stuck", "question order, stuck"),
    (THROUGH_FROM_6, "other order, through"),
    ("2\n+6=8\n+3=11\n+5=16\n-8=8", "other order, through"),  # the expert's first number, the -8 put off
    ("5\n+3=8\n-8=0\n+2=2\n+6=8", "other order, through"),
    ("3\n-8: stuck", "other order, stuck"),
    ("-8: stuck", "other order, stuck"),                    # the negative number first: below 0 at once
    ("2\n-8=-6\n+6=0\n+3=3\n+5=8", "mistake"),              # went below 0 and on: the rule broken
    ("6\n+2=8\n-8: stuck", "mistake"),                      # a dead end where the total allows the -8
    ("2\n+6=8\n+3=11\n+5=16\n-8: stuck", "mistake"),
    ("6\n+2=8\n-8=0\n+3=3\n+5=9", "mistake"),               # a wrong running total
    ("6\n+2=8\n-8=0\n+3=3\n+3=6", "mistake"),               # 3 twice, 5 never
    ("6\n+2=8\n-8=0\n+3=3", "mistake"),                     # stopped before the end
    (THROUGH_FROM_6 + "\n+1=9", "mistake"),                 # went on past the end
    ("4\n+6=10", "mistake"),                                # a number not in the question
    ("6\n-2=4\n-8: stuck", "mistake"),                      # a number with the wrong sign
    ("6\n2=8\n-8=0\n+3=3\n+5=8", "mistake"),                # a line without its sign
    ("6 \n+2=8\n-8=0\n+3=3\n+5=8", "mistake"),              # a whole line, not a prefix
])
def test_floor_solution_kind(reasoning, kind):
    assert toy.floor_solution_kind(QUESTION, f"{reasoning}\n</think>\n\\boxed{{8}}") == kind
    assert toy.floor_solution_kind(QUESTION, data.THINK + f"{reasoning}\n</think>\n") == kind  # with <think>


def test_floor_solution_kind_reads_up_to_the_last_think():
    through = THROUGH_FROM_6
    assert toy.floor_solution_kind(QUESTION, through) == "mistake"  # never closed
    assert toy.floor_solution_kind(QUESTION, f"{through}\n</think>\n</think>") == "mistake"  # the last one counts
    assert toy.floor_solution_kind(QUESTION, f"{through}\n</think>\n\\boxed{{8}} </think>") == "mistake"
    assert toy.floor_solution_kind(QUESTION, f"6\n+2=8\n</think>\n{through}\n</think>") == "mistake"


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="style"):
        toy.make_floor_task(1, 0, "diverse")
    with pytest.raises(ValueError, match="expert rows"):
        toy.make_floor_task(1, 0, "expert", expert_fails=0.5)
    with pytest.raises(ValueError, match="n_terms"):
        toy.make_floor_task(1, 0, "prompt", n_terms=9)
    with pytest.raises(ValueError, match=r"expert_fails 1.5"):
        toy.make_floor_task(1, 0, "prompt", expert_fails=1.5)
    for question in ("What is 2 + 2?", "Add: 3", "Add: 2, -5,6", "Ring: 3,-8,6,2,5,7,3..."):
        with pytest.raises(ValueError, match="not a floor question"):
            toy.parse_floor(question)


def test_toy_tokenizer_has_a_vocabulary_tail_and_single_token_choices():
    rows = toy.make_floor_task(100, seed=0, style="pretrain")
    tok = toy.build_toy_tokenizer(toy.toy_tokenizer_texts(rows, n_labels=1000), vocab_size=2048)
    # (almost) every pseudo-word is one token: a vocabulary far beyond the digits and words the task uses
    assert len(tok) > 1000 and sum(len(tok.tokenize(" " + w)) == 1 for w in toy.TOY_LABELS[:1000]) >= 990
    assert tok.tokenize("<think>\n")[0] == "<think>"
    # The first number is the response's first token, and each line's sign its own token: the branching tokens
    # the demo measures (the first number; "+" or "-" where the expert's next number hits the floor).
    for v in range(1, 10):
        assert tok.tokenize(f"{v}\n+3={v + 3}")[0] == str(v)
    assert tok.tokenize("2\n+6=8")[2] == "+" and tok.tokenize("2\n-5: stuck")[2] == "-"
    # With the row's one-line system prompt a prompt is under a third of its Table 7 length: the demo's speed.
    ex = data.Example(QUESTION, "8", None, toy.EXPERT_FAILS, 0, toy.FLOOR_SYSTEM)
    row, paper = (len(tok.encode(data.example_prompt(ex, tok, p))) for p in ("row", "paper"))
    assert 3 * row < paper
