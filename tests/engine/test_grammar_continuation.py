"""An output written on under its grammar (SamplingParams.structured_given): the grammar
takes the output so far, at the prompt's end, before the first new token."""

from __future__ import annotations

import pytest

from inference.engine.errors import InvalidRequestError
from inference.engine.sampling_params import SamplingParams
from tests.engine.conftest import run_to_completion

CHOICE = '["yes please", "no thanks"]'
QUESTION = [5, 6, 7, 8]


def test_the_output_so_far_is_taken_and_the_grammar_goes_on_from_there(make_engine) -> None:
    engine = make_engine()
    so_far = engine.tokenizer.encode("no", add_special_tokens=False)
    params = SamplingParams(
        max_tokens=20, temperature=0, structured="choice", structured_spec=CHOICE,
        structured_given=len(so_far),
    )  # fmt: skip
    engine.add_request(QUESTION + so_far, params, request_id="on")
    deltas = run_to_completion(engine)["on"]
    assert "".join(d.resolve_text().text for d in deltas) == " thanks"
    assert deltas[-1].finish_reason == "stop"


def test_an_output_so_far_outside_the_grammar_is_refused_at_once(make_engine) -> None:
    engine = make_engine()
    so_far = engine.tokenizer.encode("maybe", add_special_tokens=False)
    for given in (len(so_far), len(QUESTION) + len(so_far) + 1):
        params = SamplingParams(structured="choice", structured_spec=CHOICE, structured_given=given)
        with pytest.raises(InvalidRequestError):
            engine.add_request(QUESTION + so_far, params)
    with pytest.raises(InvalidRequestError):
        engine.add_request(QUESTION, SamplingParams(structured="json", structured_given=-1))
