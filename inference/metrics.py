"""The one Prometheus registry, with vLLM's metric names and meanings.

Grafana dashboards written for vLLM work against /metrics unchanged. When several
processes serve (PROMETHEUS_MULTIPROC_DIR set, as prometheus_client requires), every
process writes its samples to that folder and /metrics merges them.

Request histograms are observed when a request ends (chatapp/observability/recording.py);
the engine gauges and counters are refreshed from the engine's stats by
chatapp/observability/engine_samples.py, one series per engine: labelled `worker` with
the engine worker's id in distributed mode, and `embedded` (or `upstream`) for the one
engine of the other modes.
"""

from __future__ import annotations

import os
from typing import Any

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)
from prometheus_client.multiprocess import MultiProcessCollector

REGISTRY = CollectorRegistry()
L = ["model_name"]
# The engine gauges and counters: one series per engine (worker).
ENGINE_L = [*L, "worker"]
# The `worker` label of the one engine in embedded and upstream mode: stable across
# restarts, so a restart continues the same series instead of starting a new one.
EMBEDDED_WORKER = "embedded"
UPSTREAM_WORKER = "upstream"

# vLLM's bucket bounds for each histogram.
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
                2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)  # fmt: skip
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5,
               5.0, 7.5, 10.0, 20.0, 40.0, 80.0)  # fmt: skip
LATENCY_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0,
                   50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)  # fmt: skip


def _hist(name: str, doc: str, buckets: tuple[float, ...], labels: list[str] = L) -> Histogram:
    return Histogram(name, doc, labels, buckets=buckets, registry=REGISTRY)


def _counter(name: str, doc: str, labels: list[str] = L) -> Counter:
    return Counter(name, doc, labels, registry=REGISTRY)


time_to_first_token = _hist(
    "vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", TTFT_BUCKETS
)
inter_token_latency = _hist(
    "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds.", ITL_BUCKETS
)
time_per_output_token = _hist(
    "vllm:request_time_per_output_token_seconds",
    "Histogram of time_per_output_token_seconds per request (TPOT).",
    ITL_BUCKETS,
)
e2e_request_latency = _hist(
    "vllm:e2e_request_latency_seconds",
    "Histogram of e2e request latency in seconds.",
    LATENCY_BUCKETS,
)
request_queue_time = _hist(
    "vllm:request_queue_time_seconds",
    "Histogram of time spent in WAITING phase for request.",
    LATENCY_BUCKETS,
)
request_prefill_time = _hist(
    "vllm:request_prefill_time_seconds",
    "Histogram of time spent in PREFILL phase for request.",
    LATENCY_BUCKETS,
)
request_decode_time = _hist(
    "vllm:request_decode_time_seconds",
    "Histogram of time spent in DECODE phase for request.",
    LATENCY_BUCKETS,
)
prompt_tokens = _counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
generation_tokens = _counter("vllm:generation_tokens", "Number of generation tokens processed.")
request_success = _counter(
    "vllm:request_success", "Count of successfully processed requests.", [*L, "finished_reason"]
)
request_errors = _counter(
    "chatapp:request_errors", "Requests that ended with an error, by code.", [*L, "code"]
)
spec_decode_drafts = _counter(
    "vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", ENGINE_L
)
spec_decode_draft_tokens = _counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.")
spec_decode_accepted_tokens = _counter(
    "vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens."
)

# The response cache (inference/response_cache.py): lookups by deterministic requests,
# the hits among them, and the TTFT a replay gave. Replays did no engine work, so they are
# kept out of the vllm:* latency histograms and token counters.
response_cache_lookups = _counter(
    "chatapp:response_cache_lookups", "Response-cache lookups by deterministic requests."
)
response_cache_hits = _counter(
    "chatapp:response_cache_hits", "Requests answered by replaying a cached response."
)
response_cache_ttft = _hist(
    "chatapp:response_cache_ttft_seconds",
    "Histogram of time to first token of replayed responses in seconds.",
    TTFT_BUCKETS,
)

# Refreshed from the engine's stats (chatapp/observability/engine_samples.py), per engine
# (`worker`). In multiprocess mode a gauge is summed over live processes: each engine
# process reports its own queue.
num_requests_running = Gauge(
    "vllm:num_requests_running",
    "Number of requests in model execution batches.",
    ENGINE_L,
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
num_requests_waiting = Gauge(
    "vllm:num_requests_waiting",
    "Number of requests waiting to be processed.",
    ENGINE_L,
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
kv_cache_usage = Gauge(
    "vllm:kv_cache_usage_perc",
    "KV-cache usage. 1 means 100 percent usage.",
    ENGINE_L,
    registry=REGISTRY,
    multiprocess_mode="livemax",
)
prefix_cache_queries = _counter(
    "vllm:prefix_cache_queries",
    "Prefix cache queries, in terms of number of queried tokens.",
    ENGINE_L,
)
prefix_cache_hits = _counter(
    "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens.", ENGINE_L
)
num_preemptions = _counter("vllm:num_preemptions", "Cumulative number of preemption.", ENGINE_L)
refused_requests = _counter(
    "chatapp:requests_refused", "Requests refused as busy by the engine.", ENGINE_L
)
engine_steps = _counter("chatapp:engine_steps", "Engine steps run.", ENGINE_L)
# The engine's step time by the step's kind (inference/engine/engine.py STEP_KINDS, its
# stats' step_seconds_<kind>): decode-only steps, mixed steps (decodes beside prompt
# chunks) and prompt-only chunks.
engine_step_seconds = _counter(
    "chatapp:engine_step_seconds",
    "Seconds the engine spent in steps, by kind (decode, mixed, prompt).",
    [*ENGINE_L, "kind"],
)
# Tokens per engine step: the engine counts them per bucket; the sampler adds what changed.
ITERATION_TOKEN_BUCKETS = (1, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
iteration_tokens = _hist(
    "vllm:iteration_tokens_total", "Histogram of number of tokens per engine_step.",
    ITERATION_TOKEN_BUCKETS, ENGINE_L,
)  # fmt: skip
# The engine reports its last step only; these gauges show it as of the latest sample.
step_tokens = Gauge(
    "chatapp:engine_step_tokens",
    "Tokens in the engine's most recent step (sampled).",
    ENGINE_L,
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
step_batch_size = Gauge(
    "chatapp:engine_step_batch_size",
    "Sequences in the engine's most recent step (sampled).",
    ENGINE_L,
    registry=REGISTRY,
    multiprocess_mode="livesum",
)
ENGINE_GAUGES = (num_requests_running, num_requests_waiting, kv_cache_usage, step_tokens,
                 step_batch_size)  # fmt: skip


def multiprocess() -> bool:
    return bool(os.environ.get("PROMETHEUS_MULTIPROC_DIR"))


class _Labelled:
    """A registry's samples, each with one more label: the web replica that serves them,
    so that a Prometheus scraping several replicas behind one proxy (or one name in DNS)
    keeps their series apart."""

    def __init__(self, source: Any, name: str, value: str) -> None:
        self.source, self.name, self.value = source, name, value

    def collect(self) -> Any:
        for family in self.source.collect():
            family.samples = [
                s._replace(labels={**s.labels, self.name: self.value}) for s in family.samples
            ]
            yield family


def exposition(replica: str = "") -> tuple[bytes, str]:
    """The text a scrape gets, and its content type; every series labelled
    `replica="<replica>"` when one is given."""
    source: Any = REGISTRY
    if multiprocess():
        source = CollectorRegistry()
        MultiProcessCollector(source)
    if replica:
        source = _Labelled(source, "replica", replica)
    return generate_latest(source), CONTENT_TYPE_LATEST


def observe_request(model: str, fig: dict[str, Any], itl: list[float]) -> None:
    """Feed one finished request's figures (a RequestRecord's fields) to the histograms."""
    if fig.get("replayed"):
        if fig.get("ttft") is not None:
            response_cache_ttft.labels(model).observe(fig["ttft"])
        request_success.labels(model, fig.get("finish_reason") or "stop").inc()
        return
    for hist, key in (
        (time_to_first_token, "ttft"),
        (time_per_output_token, "tpot"),
        (e2e_request_latency, "e2e"),
        (request_queue_time, "queue_time"),
        (request_prefill_time, "prefill_time"),
        (request_decode_time, "decode_time"),
    ):
        if fig.get(key) is not None:
            hist.labels(model).observe(fig[key])
    itl_child = inter_token_latency.labels(model)
    for gap in itl:
        itl_child.observe(gap)
    # vLLM counts the prefill the engine did: a request refused before it was scheduled
    # (busy, a worker's refusal) is stored with its prompt's length but prefilled nothing.
    # One cut short after tokens came (its worker lost) may lack the scheduled time.
    if fig.get("queue_time") is not None or fig.get("output_tokens", 0) > 0:
        prompt_tokens.labels(model).inc(fig.get("prompt_tokens", 0))
    generation_tokens.labels(model).inc(fig.get("output_tokens", 0))
    spec_decode_draft_tokens.labels(model).inc(fig.get("drafted_tokens", 0))
    spec_decode_accepted_tokens.labels(model).inc(fig.get("accepted_tokens", 0))
    if fig.get("error_code"):
        request_errors.labels(model, fig["error_code"]).inc()
    else:
        request_success.labels(model, fig.get("finish_reason") or "stop").inc()
