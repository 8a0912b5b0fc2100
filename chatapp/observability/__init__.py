"""Observability: request records, /metrics, engine samples, rollups, the latency
dashboard, and the tuning and benchmark jobs."""
