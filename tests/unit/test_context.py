from policies.context import ContextTooLong, OutputBudget, OutputTooLong, TruncationTooLong, plan_output, truncate


def test_explicit_max_tokens_that_fits() -> None:
    assert plan_output(prompt_tokens=100, requested=50, max_model_len=200) == OutputBudget(50)


def test_explicit_max_tokens_exactly_fills_context() -> None:
    assert plan_output(prompt_tokens=100, requested=100, max_model_len=200) == OutputBudget(100)


def test_explicit_max_tokens_one_over() -> None:
    r = plan_output(prompt_tokens=100, requested=101, max_model_len=200)
    assert r == ContextTooLong(200, 100, 101)
    assert "200 tokens" in r.message and "201 tokens" in r.message


def test_default_takes_the_rest_of_the_context() -> None:
    assert plan_output(prompt_tokens=100, requested=None, max_model_len=200) == OutputBudget(100)


def test_default_bounded_by_cap() -> None:
    assert plan_output(prompt_tokens=10, requested=None, max_model_len=200, max_output_cap=32) == OutputBudget(32)


def test_prompt_fills_context() -> None:
    r = plan_output(prompt_tokens=200, requested=None, max_model_len=200)
    assert isinstance(r, ContextTooLong) and r.requested_output is None
    assert "200 tokens" in r.message


def test_requested_over_cap() -> None:
    r = plan_output(prompt_tokens=10, requested=64, max_model_len=200, max_output_cap=32)
    assert r == OutputTooLong(32, 64)
    assert "32" in r.message


IDS = tuple(range(10))


def test_truncate_keeps_the_side_asked() -> None:
    assert truncate(IDS, keep=None, side="left", max_model_len=8) == IDS  # not asked: as it is
    assert truncate(IDS, keep=3, side="left", max_model_len=100) == (7, 8, 9)
    assert truncate(IDS, keep=3, side="right", max_model_len=100) == (0, 1, 2)
    assert truncate(IDS, keep=10, side="left", max_model_len=100) == IDS


def test_truncate_minus_one_leaves_a_token_for_output() -> None:
    assert truncate(IDS, keep=-1, side="left", max_model_len=5) == (6, 7, 8, 9)
    assert truncate(IDS, keep=-1, side="right", max_model_len=50) == IDS


def test_truncate_to_more_than_the_context_is_a_value() -> None:
    too_long = truncate(IDS, keep=101, side="left", max_model_len=100)
    assert too_long == TruncationTooLong(101, 100)
    assert "truncate_prompt_tokens=101" in too_long.message and "100" in too_long.message
