"""GSM8K rule reward and the data_source dispatcher: the scores upstream verl gives for the same text."""

import json

import pytest
from shared_data import real_data

from verl.utils import reward_score
from verl.utils.reward_score import default_compute_score, gsm8k



@pytest.mark.parametrize(
    "text, expected",
    [
        ("so she sold 72 clips.\n#### 72", "72"),
        ("#### 3 first, then corrected: #### 5", "5"),  # the last one counts
        ("#### 1,234", "1234"),  # thousands separators removed
        ("#### -17", "-17"),
        ("#### 2.50", "2.50"),  # kept verbatim, compared as a string
        ("the answer is 72", None),  # no #### marker
        ("####72", None),  # the marker needs its space
        ("#### $5", None),  # a currency sign before the number is not an answer
    ],
)
def test_strict_extraction(text, expected):
    assert gsm8k.extract_solution(text, method="strict") == expected


@pytest.mark.parametrize(
    "text, expected",
    [
        ("first 3 then 72", "72"),
        ("total: 1,234 apples", "1,234"),  # flexible keeps commas
        ("it is -4 degrees", "-4"),
        ("The answer is 72.", "72."),  # the trailing full stop is part of the match, as upstream
        ("3 . . .", "3"),  # bare dots are skipped
        ("no digits at all", None),
    ],
)
def test_flexible_extraction(text, expected):
    assert gsm8k.extract_solution(text, method="flexible") == expected


def test_only_the_last_300_characters_are_searched():
    early = "#### 5" + " filler" * 50  # the marker ends up more than 300 characters from the end
    assert len(early) > gsm8k.CLIP_CHARS
    assert gsm8k.extract_solution(early) is None
    late = " filler" * 50 + "#### 5"
    assert gsm8k.extract_solution(late) == "5"


def test_unknown_method_is_rejected():
    with pytest.raises(ValueError, match="strict"):
        gsm8k.extract_solution("#### 1", method="loose")


def test_compute_score_right_wrong_and_missing():
    assert gsm8k.compute_score("#### 72", "72") == 1.0
    assert gsm8k.compute_score("#### 71", "72") == 0.0
    assert gsm8k.compute_score("#### 72.0", "72") == 0.0  # exact string comparison
    assert gsm8k.compute_score("#### 71", "72", format_score=0.1) == 0.1
    assert gsm8k.compute_score("no answer", "72", format_score=0.1) == 0  # unformatted gets nothing
    assert gsm8k.compute_score("#### 72", "72", score=2.5) == 2.5
    assert gsm8k.compute_score("#### 1,234", "1234") == 1.0
    assert gsm8k.compute_score("it is 72", "72", method="flexible") == 1.0


def test_every_reference_solution_scores_full_marks():
    """The label of each real training row, scored on its own reference solution, must give 1.0."""
    with open(real_data("gsm8k") / "train.jsonl") as handle:
        rows = [json.loads(line) for line in handle]
    assert len(rows) == 7473
    for row in rows:
        label = row["answer"].split("#### ")[-1].replace(",", "")
        assert gsm8k.compute_score(row["answer"], label) == 1.0, row["answer"][-80:]


def test_dispatcher_scores_gsm8k_as_float():
    result = default_compute_score("openai/gsm8k", "#### 4", "4")
    assert result == 1.0 and isinstance(result, float)
    assert default_compute_score("openai/gsm8k", "#### 4", "5", extra_info={"split": "test"}) == 0.0


def test_dispatcher_passes_dict_results_through():
    assert default_compute_score("math_dapo", "Answer: 4", "4") == {"score": 1.0, "acc": True, "pred": "4"}


def test_unknown_data_source_says_what_to_set():
    with pytest.raises(NotImplementedError) as err:
        default_compute_score("my/own_task", "x", "y")
    assert "my/own_task" in str(err.value)
    assert "custom_reward_function.path" in str(err.value)


def test_old_name_still_works_with_a_warning():
    with pytest.warns(DeprecationWarning, match="default_compute_score"):
        assert reward_score._default_compute_score("openai/gsm8k", "#### 4", "4") == 1.0
