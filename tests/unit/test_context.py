from policies.context import ContextTooLong, OutputBudget, OutputTooLong, plan_output


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
