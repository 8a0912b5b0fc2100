"""Logprobs, penalties and structured outputs through the whole engine (tiny random llama,
exact path): what an OpenAI client sees of them, checked against transformers and a JSON
schema validator."""

from __future__ import annotations

import json

import jsonschema
import pytest
import torch

from inference.engine.errors import InvalidRequestError
from inference.engine.sampling_params import SamplingParams
from tests.engine.conftest import greedy, run_to_completion, token_ids_of


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def test_logprobs_sum_to_the_replys_log_likelihood_under_transformers(make_engine, hf_tiny):
    engine = make_engine()
    prompt = _prompt(12, seed=5)
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=7, logprobs=3, ignore_eos=True)
    engine.add_request(prompt, params, request_id="lp")
    engine.add_request(_prompt(9, seed=6), greedy(10), request_id="plain")
    out = run_to_completion(engine)
    ids = token_ids_of(out["lp"])
    lps = [lp for d in out["lp"] for lp in d.logprobs or []]
    assert [lp.token_id for lp in lps] == ids and all(len(lp.top) == 3 for lp in lps)
    assert all(d.logprobs is None for d in out["plain"])
    with torch.no_grad():
        logits = hf_tiny(torch.tensor([prompt + ids])).logits[0].float()
    theirs = torch.log_softmax(logits[len(prompt) - 1 : -1], -1)
    expected = theirs.gather(1, torch.tensor(ids)[:, None]).sum().item()
    assert sum(lp.logprob for lp in lps) == pytest.approx(expected, abs=1e-3)


def test_a_frequency_penalty_wears_down_a_biased_token_a_presence_penalty_only_once(
    make_engine,
):
    engine = make_engine()
    prompt = _prompt(8, seed=11)
    bias = [(42, 30.0)]  # strong enough that a greedy reply is token 42 again and again
    for rid, extra in {
        "biased": {},
        "frequency": {"frequency_penalty": 2.0},
        "presence": {"presence_penalty": 2.0},
    }.items():
        params = greedy(40, ignore_eos=True, logit_bias=bias, **extra)
        engine.add_request(prompt, params, request_id=rid)
    out = {rid: token_ids_of(d) for rid, d in run_to_completion(engine).items()}
    assert out["biased"] == [42] * 40 and out["presence"] == [42] * 40
    assert 5 < out["frequency"].count(42) < 20


SCHEMAS = [
    {
        "type": "object",
        "properties": {"name": {"type": "string", "maxLength": 12}, "age": {"type": "integer"}},
        "required": ["name", "age"],
        "additionalProperties": False,
    },
    {
        "type": "object",
        "properties": {
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
            "score": {"type": "number", "minimum": 0, "maximum": 1},
            "ok": {"type": "boolean"},
        },
        "required": ["tags", "ok"],
        "additionalProperties": False,
    },
]


@pytest.mark.parametrize("schema", SCHEMAS, ids=["person", "tags"])
def test_a_json_schema_reply_parses_and_validates_greedy_and_sampled(make_engine, schema):
    engine = make_engine()
    spec = json.dumps(schema)
    for i, temperature in enumerate((0.0, 1.0, 1.0)):
        params = SamplingParams(
            max_tokens=200, temperature=temperature, structured="json_schema",
            structured_spec=spec,
        )  # fmt: skip
        engine.add_request(_prompt(10, seed=i), params, request_id=f"s{i}")
    engine.add_request(_prompt(10, seed=9), greedy(20), request_id="free")
    out = run_to_completion(engine)
    for i in range(3):
        assert out[f"s{i}"][-1].finish_reason == "stop", out[f"s{i}"][-1]
        text = "".join(d.resolve_text().text for d in out[f"s{i}"])
        jsonschema.validate(json.loads(text), schema)


def test_json_object_mode_and_a_choice_are_enforced(make_engine):
    engine = make_engine()
    close = engine.tokenizer.convert_tokens_to_ids("}")
    for rid, bias in (("obj", []), ("closing", [(close, 50.0)])):
        params = SamplingParams(max_tokens=60, structured="json", logit_bias=bias, seed=1)
        engine.add_request(_prompt(6, seed=1), params, request_id=rid)
    choice = SamplingParams(max_tokens=20, structured="choice", structured_spec='["yes", "no"]')
    engine.add_request(_prompt(6, seed=2), choice, request_id="choice")
    out = run_to_completion(engine)
    text = {rid: "".join(d.resolve_text().text for d in ds) for rid, ds in out.items()}
    # An object from its first character; closed where the model wants it closed.
    assert text["obj"].startswith("{")
    assert out["closing"][-1].finish_reason == "stop" and json.loads(text["closing"]) == {}
    assert text["choice"] in ("yes", "no") and out["choice"][-1].finish_reason == "stop"


def test_a_schema_that_does_not_compile_is_refused_at_once(make_engine):
    engine = make_engine()
    bad = SamplingParams(structured="grammar", structured_spec="root ::= undefined_rule")
    with pytest.raises(InvalidRequestError):
        engine.add_request([5, 6, 7], bad)
