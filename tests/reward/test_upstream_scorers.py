"""The rule-based scorers upstream 0.9.1 dispatches by data_source, on inputs whose scores follow from
the documented rules: MATH's boxed answer + lm-eval-harness normalisation (1/0), DAPO's Minerva
`Answer:` matching with a strict boxed fallback (+1/-1 with acc and pred), Geometry3K's 0.9 accuracy +
0.1 format, Search-R1's normalised exact match with the answer-tag spam penalty.
"""
import numpy as np
import pytest

from verl.utils.reward_score import default_compute_score, math_dapo, math_reward, search_r1_like_qa_em

MATH_SOURCES = ["lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500"]


@pytest.mark.parametrize("source", MATH_SOURCES)
@pytest.mark.parametrize("response, truth, score", [
    ("so the answer is $\\boxed{\\dfrac{1}{2}}$.", "\\frac{1}{2}", 1.0),       # dfrac -> frac
    ("first \\boxed{3}, then \\boxed{4}", "4", 1.0),                          # the last box counts
    ("first \\boxed{3}, then \\boxed{4}", "3", 0.0),
    ("\\boxed{0.5}", "\\frac12", 1.0),                                        # 0.5 and \frac12 -> \frac{1}{2}
    ("\\boxed{3/4}", "\\frac{3}{4}", 1.0),                                    # a/b -> \frac{a}{b}
    ("\\boxed{x = 5}", "5", 1.0),                                             # short left-hand side dropped
    ("\\boxed{10 \\text{ cm}}", "10", 1.0),                                   # trailing units dropped
    ("\\boxed{90^\\circ}", "90", 1.0),
    ("\\boxed{\\left( 1, 2 \\right)}", "(1,2)", 1.0),
    ("\\boxed{\\sqrt2}", "\\sqrt{2}", 1.0),
    ("the answer is \\boxed 7$ done", "7", 1.0),                              # space form runs to the next $
    ("\\fbox{7}", "7", 0.0),                                                  # found, but only \boxed unwraps
    ("no box here: 7", "7", 0.0),
    ("\\boxed{7", "7", 0.0),                                                  # never closed
])
def test_math_family(source, response, truth, score):
    assert default_compute_score(source, response, truth) == score


def test_math_strip_string_and_is_equiv():
    assert math_reward.strip_string(".25") == "0.25" and math_reward.strip_string(" .5") == "\\frac{1}{2}"
    assert math_reward.strip_string("\\frac1{2}") == "\\frac{1}{2}"
    assert math_reward.is_equiv(None, None) and not math_reward.is_equiv("1", None)
    # two "\text{ " units make the normaliser give up: the raw strings are compared
    assert not math_reward.is_equiv("1\\text{ a}\\text{ b}", "1") and math_reward.is_equiv("a\\text{ b}\\text{ c}",
                                                                                           "a\\text{ b}\\text{ c}")
    assert math_reward.last_boxed_only_string("a \\boxed{\\frac{1}{2}} b") == "\\boxed{\\frac{1}{2}}"


@pytest.mark.parametrize("source", ["math_dapo", "math", "math_dapo_reasoning", "aime2024", "aime_2025"])
def test_dapo_sources_dispatch(source):
    assert default_compute_score(source, "reasoning...\nAnswer: 1,000 dollars", "1000") == {
        "score": 1.0, "acc": True, "pred": "1000"}


@pytest.mark.parametrize("response, truth, expected", [
    ("Answer: $\\frac12$", "\\frac{1}{2}", (1.0, True, "\\frac{1}{2}")),    # $...$, one-char frac braced
    ("Answer: x = 5", "5", (1.0, True, "5")),                               # after the last '='
    ("Answer: 5 degrees", "5", (1.0, True, "5")),
    ("Answer: \\text{(B)}", "(B)", (1.0, True, "(B)")),
    ("answer : 6\nAnswer: 7", "6", (-1.0, False, "7")),                      # the last Answer: line counts
    ("so \\boxed{12}", "12", (1.0, True, "12")),                             # no Answer: -> strict box
    ("so \\boxed{ 12}", "12", (-1.0, False, " 12")),                         # strict: no normalisation
    ("nothing", "12", (-1.0, False, "[INVALID]")),
])
def test_math_dapo_rules(response, truth, expected):
    result = math_dapo.compute_score(response, truth)
    assert (result["score"], result["acc"], result["pred"]) == expected


def test_math_dapo_looks_only_at_the_tail():
    padding = "x" * 400
    assert math_dapo.compute_score("Answer: 3\n" + padding, "3")["pred"] == "[INVALID]"     # beyond 300 chars
    assert math_dapo.compute_score("\\boxed{3}" + "y" * 150, "3")["acc"] is False        # box beyond 100 chars
    assert math_dapo.compute_score("\\boxed{3}" + "y" * 150, "3", strict_box_verify=True)["pred"] is None
    assert math_dapo.normalize_final_answer("\\boxed{1,234}") == "1234"


def test_geo3k_weights_accuracy_and_format():
    pytest.importorskip("mathruler")
    pytest.importorskip("pylatexenc")
    assert default_compute_score("hiyouga/geometry3k", "<think>ok</think> so \\boxed{\\frac{1}{2}}", "0.5") == 1.0
    assert default_compute_score("hiyouga/geometry3k", "so \\boxed{3}", "3") == pytest.approx(0.9)
    assert default_compute_score("hiyouga/geometry3k", "<think>ok</think> \\boxed{4}", "3") == pytest.approx(0.1)


SEARCH_SOURCES = ["searchR1_nq", "searchR1_triviaqa", "searchR1_popqa", "searchR1_hotpotqa",
                  "searchR1_2wikimultihopqa", "searchR1_musique", "searchR1_bamboogle"]


@pytest.mark.parametrize("source", SEARCH_SOURCES)
def test_search_r1_sources_dispatch(source):
    truth = {"target": np.array(["The Eiffel Tower", "eiffel tower"], dtype=object)}   # as read from parquet
    assert default_compute_score(source, "<search>q</search><answer> the eiffel  tower! </answer>", truth) == 1.0
    assert default_compute_score(source, "<answer>Louvre</answer>", truth) == 0.0


def test_search_r1_rules():
    truth = {"target": "Paris"}
    em = search_r1_like_qa_em
    assert em.compute_score("<answer>a</answer> then <answer>paris.</answer>", truth) == 1   # last answer counts
    assert em.compute_score("no tags: Paris", truth) == 0
    assert em.compute_score("<answer>Rome</answer>", truth, format_score=0.2) == 0.2
    assert em.compute_score("<answer>paris</answer>" * 11, truth) == 0.25                    # tag spam
    assert em.compute_score_subem("<answer>in Paris, France</answer>", truth) == 1
    assert em.compute_score("<answer>in Paris, France</answer>", truth) == 0
    assert em.normalize_answer("The  Cat's  hat!") == "cats hat"


def test_unknown_source_says_what_is_built_in():
    with pytest.raises(NotImplementedError, match="numina_olympiads"):
        default_compute_score("my_private_set", "x", "y")
