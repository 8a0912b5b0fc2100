"""Engine workers that scale out: `manage.py run_engine` processes serve requests over the
Redis channel layer; web processes route to them (docs/workers.md).

    protocol.py  the messages, and (de)serialising deltas, metrics, sampling, errors
    registry.py  heartbeats with each worker's load; session affinity
    server.py    the worker loop around an AsyncEngine
    remote.py    the web side: RemoteEngine, wrapped by inference.client.EngineClient

Nothing here imports Django; inference/client.py and the run_engine command wire it up.
"""
