"""toy.py: the ring task (questions, responses, the stated share of dead ends, the classifier) and the tokenizer."""
import collections

import pytest

import data
import evaluate
import toy


def question_of(row):
    return row["prompt"][1]["content"]


def response_of(row):
    return row["target"][0]["content"]


def test_ring_questions_have_the_stated_shape_and_share_of_dead_ends():
    rows = toy.make_ring_task(400, seed=5, style="prompt", expert_fails=0.5, n_terms=6)
    assert rows == toy.make_ring_task(400, seed=5, style="prompt", expert_fails=0.5)  # deterministic, defaults
    for r in rows:
        ring = toy.parse_ring(question_of(r))
        negative = [v for v in ring if v < 0]
        assert len(ring) == 6 and len(negative) == 1 and -9 <= negative[0] <= -2 and ring[0] > 0
        assert len({abs(v) for v in ring}) == 6 and all(1 <= abs(v) <= 9 for v in ring)  # distinct digits
        assert question_of(r) == f"Ring: {','.join(map(str, ring))},{ring[0]}..."
        assert r["reward_model"]["ground_truth"] == str(sum(ring)) and sum(ring) >= 1
        assert "target" not in r and r["prompt"][0]["content"] == toy.RING_SYSTEM
        # data_source says whether the expert's start (the first number) gets round; some other start always does,
        # the one right after the negative number among them
        expert_works = toy.go_round(ring, 0)[1]
        assert r["data_source"] == (toy.EXPERT_WORKS if expert_works else toy.EXPERT_FAILS)
        after_negative = (ring.index(negative[0]) + 1) % len(ring)
        assert after_negative in toy.working_starts(ring) and (0 in toy.working_starts(ring)) == expert_works
    assert collections.Counter(r["data_source"] for r in rows) == {toy.EXPERT_FAILS: 200, toy.EXPERT_WORKS: 200}
    assert sum(r["data_source"] == toy.EXPERT_FAILS for r in toy.make_ring_task(100, 1, "prompt", 0.3)) == 30
    natural = sum(r["data_source"] == toy.EXPERT_FAILS for r in toy.make_ring_task(1000, 1, "prompt"))
    assert 100 < natural < 200  # about 1 in 7 as the rings fall
    # The same questions in every style; only the response differs
    expert = toy.make_ring_task(50, seed=2, style="expert")
    for style in ("pretrain", "prompt"):
        assert [question_of(r) for r in toy.make_ring_task(50, 2, style, 0.0)] == [question_of(r) for r in expert]


def test_expert_and_pretraining_responses():
    expert = toy.make_ring_task(200, seed=3, style="expert")
    assert all(toy.ring_solution_kind(question_of(r), response_of(r)) == "expert start, round" for r in expert)
    assert all(r["data_source"] == toy.EXPERT_WORKS for r in expert)
    clean = toy.make_ring_task(2000, seed=3, style="pretrain")
    assert clean == toy.make_ring_task(2000, seed=3, style="pretrain")  # deterministic
    kinds = collections.Counter(toy.ring_solution_kind(question_of(r), response_of(r)) for r in clean)
    assert kinds["mistake"] == 0 and kinds["expert start, stuck"] + kinds["other start, stuck"] > 200
    assert 0.15 < (kinds["expert start, round"] + kinds["expert start, stuck"]) / 2000 < 0.25  # 1 start in 5
    starts = collections.Counter(response_of(r).removeprefix(data.THINK).split(",")[0] for r in clean)
    assert set(starts) == {str(v) for v in range(1, 10)}  # only positive numbers start
    # Every row grades as the demo's stages grade it: a round's total is right, a dead end is wrong.
    rows = expert[:8] + clean[:40]
    responses, truths = [response_of(r).removeprefix(data.THINK) for r in rows], [r["reward_model"]["ground_truth"]
                                                                                  for r in rows]
    scores, failures = evaluate.grade(responses, truths, ["math"] * len(rows), workers=1)
    kinds = [toy.ring_solution_kind(question_of(r), response_of(r)) for r in rows]
    assert failures == 0 and scores == [float(k.endswith("round")) for k in kinds] and 0 < sum(scores) < len(rows)


def test_rows_load_in_the_authors_schema(tmp_path):
    rows = toy.make_ring_task(8, 0, "expert") + toy.make_ring_task(8, 0, "prompt", 0.5)
    examples = data.load_examples(data.write_jsonl(rows, tmp_path / "ring.jsonl"))
    assert [ex.response is None for ex in examples] == [False] * 8 + [True] * 8
    assert all(ex.system == toy.RING_SYSTEM and ex.question.startswith("Ring: ") for ex in examples)
    assert examples[0].response.endswith(f"\\boxed{{{examples[0].ground_truth}}}")


RING = [3, -8, 6, 2, 5, 7]  # from 3 the -8 comes at once: the only start that does not get round
QUESTION = toy.ring_question(RING)
ROUND_FROM_6 = "6,2=8\n2,5=13\n5,7=20\n7,3=23\n3,-8=15"


def test_ring_question_and_responses_read_as_written():
    assert QUESTION == "Ring: 3,-8,6,2,5,7,3..." and toy.parse_ring(QUESTION) == RING
    assert toy.working_starts(RING) == [2, 3, 4, 5]
    assert toy.go_round(RING, 0) == ([3], False) and toy.go_round(RING, 2) == ([6, 8, 13, 20, 23, 15], True)
    assert toy.ring_response(RING, 2) == data.THINK + ROUND_FROM_6 + "\n</think>\n\\boxed{15}"
    assert toy.ring_response(RING, 0) == data.THINK + "3,-8: stuck\n</think>\nStuck."


@pytest.mark.parametrize("reasoning, kind", [
    ("3,-8: stuck", "expert start, stuck"),
    (ROUND_FROM_6, "other start, round"),
    ("2,5=7\n5,7=14\n7,3=17\n3,-8=9\n-8,6=15", "other start, round"),
    ("3,-8=-5\n-8,6=1\n6,2=3\n2,5=8\n5,7=15", "mistake"),          # went below 0 and on: the rule broken
    ("6,2=8\n2,5=13\n5,7=20\n7,3=23\n3,-8: stuck", "mistake"),     # a dead end where the round goes on
    ("6,2=8\n2,5=13\n5,7=20\n7,3=23\n3,-8=14", "mistake"),         # a wrong running total
    ("6,2=8\n2,7=15\n7,5=20\n5,3=23\n3,-8=15", "out of ring order"),  # every number once, never below 0
    ("3,6=9\n6,2=11\n2,5=16\n5,7=23\n7,-8=15", "out of ring order"),  # the expert's start, the -8 put off
    ("6,2=8\n2,7=15\n7,5=20\n5,5=25\n5,-8=17", "mistake"),         # 5 twice, 3 never
    ("6,2=8\n2,7=15\n7,5=20\n5,3=23\n3,-8: stuck", "mistake"),     # out of order, and a wrong dead end
    ("6,2=8\n7,5=15\n5,2=20\n2,3=23\n3,-8=15", "mistake"),         # a line that does not go on from the last
    ("6,2=8\n2,5=13\n5,7=20\n7,3=23", "mistake"),                  # stopped before the end
    (ROUND_FROM_6 + "\n-8,6=21", "mistake"),                        # went on past the end
    ("-8,6: stuck", "mistake"),                                     # started at the negative number
    ("4,6=10", "mistake"),                                          # a start not in the ring
    ("6,2=8 \n2,5=13\n5,7=20\n7,3=23\n3,-8=15", "mistake"),         # a whole line, not a prefix
])
def test_ring_solution_kind(reasoning, kind):
    assert toy.ring_solution_kind(QUESTION, f"{reasoning}\n</think>\n\\boxed{{15}}") == kind
    assert toy.ring_solution_kind(QUESTION, data.THINK + f"{reasoning}\n</think>\n") == kind  # with the prompt's <think>


def test_ring_solution_kind_reads_up_to_the_last_think():
    round_ = ROUND_FROM_6
    assert toy.ring_solution_kind(QUESTION, round_) == "mistake"  # never closed
    assert toy.ring_solution_kind(QUESTION, f"{round_}\n</think>\n</think>") == "mistake"  # the last one counts
    assert toy.ring_solution_kind(QUESTION, f"{round_}\n</think>\n\\boxed{{15}} </think>") == "mistake"
    assert toy.ring_solution_kind(QUESTION, f"6,2=8\n</think>\n{round_}\n</think>") == "mistake"


def test_bad_arguments_are_clear_errors():
    with pytest.raises(ValueError, match="style"):
        toy.make_ring_task(1, 0, "diverse")
    with pytest.raises(ValueError, match="expert rows"):
        toy.make_ring_task(1, 0, "expert", expert_fails=0.5)
    with pytest.raises(ValueError, match="n_terms"):
        toy.make_ring_task(1, 0, "prompt", n_terms=9)
    with pytest.raises(ValueError, match=r"expert_fails 1.5"):
        toy.make_ring_task(1, 0, "prompt", expert_fails=1.5)
    for question in ("What is 2 + 2?", "Ring: 3,-8,6,2,5,7", "Ring: 3,-8,6,2,5,7,6..."):
        with pytest.raises(ValueError, match="not a ring question"):
            toy.parse_ring(question)


def test_toy_tokenizer_has_a_vocabulary_tail_and_single_digit_tokens():
    rows = toy.make_ring_task(100, seed=0, style="pretrain")
    tok = toy.build_toy_tokenizer(toy.toy_tokenizer_texts(rows, n_labels=1000), vocab_size=2048)
    # (almost) every pseudo-word is one token: a vocabulary far beyond the digits and words the task uses
    assert len(tok) > 1000 and sum(len(tok.tokenize(" " + w)) == 1 for w in toy.TOY_LABELS[:1000]) >= 990
    assert tok.tokenize("<think>\n")[0] == "<think>"
    # Each starting number is one token, the first of the response: the branching token the demo measures.
    for v in range(1, 10):
        assert tok.tokenize(f"{v},3={v + 3}")[0] == str(v)
    # With the row's one-line system prompt a ring prompt is under a third of its Table 7 length: the demo's speed.
    ex = data.Example(toy.ring_question(RING), "15", None, toy.EXPERT_FAILS, 0, toy.RING_SYSTEM)
    row, paper = (len(tok.encode(data.example_prompt(ex, tok, p))) for p in ("row", "paper"))
    assert 3 * row < paper
