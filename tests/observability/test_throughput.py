"""The dashboard's throughput chart books a reply's tokens in the buckets in which they
were generated, not all in the bucket where the reply ended."""

from __future__ import annotations

from datetime import datetime, timedelta

import pytest

from chatapp.observability import dashboard
from chatapp.observability.models import EngineSample, RequestRecord

pytestmark = pytest.mark.django_db

NOW = datetime.fromisoformat("2030-01-01T12:00:00+00:00")


def reply(finished_at: datetime, decode_s: float, tokens: int, network_s: float = 0.0) -> None:
    RequestRecord.objects.create(
        finished_at=finished_at,
        source="chat",
        decode_time=decode_s,
        network_time=network_s,
        prefill_time=0.1,
        output_tokens=tokens,
        finish_reason="stop",
    )


def tok_s() -> dict[int, float | None]:
    s = dashboard.data("5m", now=NOW)["series"]
    return dict(zip(s["t"], s["out_tok_s"], strict=True))


def test_a_long_reply_shows_its_rate_in_every_bucket_it_spans() -> None:
    # 1,200 tokens over 50 s: 24 tok/s, ending on a bucket's edge so five buckets are whole.
    end = NOW - timedelta(seconds=60)
    reply(end, decode_s=50.0, tokens=1200)
    # The engine sampled all along (as it does): those buckets exist with no reply ending.
    for k in range(12):
        EngineSample.objects.create(at=end - timedelta(seconds=5 * k + 1), worker="w1")
    rates = tok_s()
    spanned = [int((end - timedelta(seconds=10 * k)).timestamp()) - 10 for k in range(5)]
    assert [rates[t] for t in spanned] == pytest.approx([24.0] * 5)
    assert rates[int(end.timestamp())] == 0.0  # sampled, nothing generated
    assert sum(v or 0 for v in rates.values()) * 10 == pytest.approx(1200)


def test_tokens_generated_before_the_window_are_not_counted_in_it() -> None:
    # Finished 10 s into the 5-minute window after 40 s of decoding: a quarter is inside.
    reply(NOW - timedelta(minutes=5) + timedelta(seconds=10), decode_s=40.0, tokens=400)
    assert sum(v or 0 for v in tok_s().values()) * 10 == pytest.approx(100)


def test_the_time_spent_sending_after_the_engine_finished_holds_no_tokens() -> None:
    end = NOW - timedelta(seconds=30)
    reply(end, decode_s=10.0, tokens=100, network_s=10.0)
    rates = tok_s()
    assert rates[int(end.timestamp()) - 10] is None  # only sending, no tokens, no samples
    assert rates[int(end.timestamp()) - 20] == pytest.approx(10.0)


def test_a_reply_with_no_decode_time_counts_where_it_ended() -> None:
    end = NOW - timedelta(seconds=25)
    reply(end, decode_s=0.0, tokens=30)  # a replayed reply: all at once
    assert tok_s()[int(end.timestamp()) // 10 * 10] == pytest.approx(3.0)
