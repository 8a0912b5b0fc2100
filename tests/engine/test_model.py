"""Our batched paged forward against transformers' LlamaForCausalLM, in float32."""

from __future__ import annotations

import torch

from inference.engine.sampling_params import SamplingParams
from inference.engine.scheduler import ScheduledBatch
from inference.engine.sequence import Sequence

# float32 throughout; the two implementations differ only in summation order.
ATOL = 1e-4
RTOL = 1e-4


def _prompt(n: int, seed: int) -> list[int]:
    g = torch.Generator().manual_seed(seed)
    return torch.randint(3, 49152, (n,), generator=g).tolist()


def _prefill_in_chunks(engine, seq: Sequence, chunk: int) -> torch.Tensor:
    """Compute every position's logits by feeding the prompt in chunks through the cache."""
    rows = []
    while seq.num_computed_tokens < len(seq):
        n = min(chunk, len(seq) - seq.num_computed_tokens)
        assert engine.kv.allocate(seq, seq.num_computed_tokens + n)
        _, logits = engine.runner.run(ScheduledBatch([seq], [n]), all_logits=True)
        rows.append(logits)
        seq.num_computed_tokens += n
    return torch.cat(rows)


def test_logits_match_transformers_at_every_position(make_engine, hf_tiny):
    engine = make_engine()
    prompt = _prompt(70, seed=1)
    expected = hf_tiny(torch.tensor([prompt])).logits[0]
    for chunk in (70, 16, 7, 1):
        seq = Sequence(f"c{chunk}", prompt, SamplingParams())
        got = _prefill_in_chunks(engine, seq, chunk)
        torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)
        engine.kv.free(seq)


def test_logits_match_transformers_across_many_small_blocks(make_engine, hf_tiny):
    """Positions past one block and decode-after-prefill read the paged cache correctly."""
    engine = make_engine(block_size=4)
    prompt = _prompt(23, seed=2)
    expected = hf_tiny(torch.tensor([prompt])).logits[0]
    seq = Sequence("a", prompt, SamplingParams())
    got = torch.cat([_prefill_in_chunks(engine, seq, 20)])
    torch.testing.assert_close(got, expected, atol=ATOL, rtol=RTOL)


def test_batch_composition_changes_logits_only_within_tolerance(make_engine):
    engine = make_engine()
    target = _prompt(40, seed=3)

    def last_logits_with(others: list[list[int]]) -> torch.Tensor:
        seqs = [Sequence("t", target, SamplingParams())]
        seqs += [Sequence(f"o{i}", p, SamplingParams()) for i, p in enumerate(others)]
        # Everyone prefills all but the last token, then decodes it together in one batch.
        for s in seqs:
            assert engine.kv.allocate(s, len(s))
            engine.runner.run(ScheduledBatch([s], [len(s) - 1]))
            s.num_computed_tokens = len(s) - 1
        ran, logits = engine.runner.run(ScheduledBatch(seqs, [1] * len(seqs)))
        for s in seqs:
            engine.kv.free(s)
        return logits[ran.index(seqs[0])]

    alone = last_logits_with([])
    # 700 tokens puts the long one in its own decode group (see _group_by_length).
    crowded = last_logits_with([_prompt(n, seed=10 + n) for n in (5, 17, 33, 64, 700)])
    torch.testing.assert_close(crowded, alone, atol=ATOL, rtol=RTOL)


def test_mixed_prefill_and_decode_step_matches_separate_steps(make_engine, hf_tiny):
    engine = make_engine()
    a, b = _prompt(30, seed=4), _prompt(25, seed=5)
    seq_a, seq_b = Sequence("a", a, SamplingParams()), Sequence("b", b, SamplingParams())
    assert engine.kv.allocate(seq_a, len(a)) and engine.kv.allocate(seq_b, len(b))
    engine.runner.run(ScheduledBatch([seq_a], [len(a) - 1]))
    seq_a.num_computed_tokens = len(a) - 1
    # One step: a decodes its last token while b prefills its whole prompt.
    ran, logits = engine.runner.run(ScheduledBatch([seq_b, seq_a], [len(b), 1]))
    by_id = {s.request_id: row for s, row in zip(ran, logits, strict=True)}
    hf_a = hf_tiny(torch.tensor([a])).logits[0, -1]
    hf_b = hf_tiny(torch.tensor([b])).logits[0, -1]
    torch.testing.assert_close(by_id["a"], hf_a, atol=ATOL, rtol=RTOL)
    torch.testing.assert_close(by_id["b"], hf_b, atol=ATOL, rtol=RTOL)
