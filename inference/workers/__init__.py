"""Engine workers that scale out: `manage.py run_engine` processes serve requests over the
Redis channel layer; web processes route to them (docs/workers.md).

    protocol.py  the messages, and (de)serialising deltas and their figures, sampling, errors
    registry.py  heartbeats with each worker's load; session affinity
    server.py    the worker loop around an AsyncEngine

The web side is inference/backends/remote.py (RemoteEngine). Nothing here imports Django;
inference/client.py and the run_engine command wire it up.
"""
