"""The ways to reach an engine, each an EngineClient (inference/client.py picks one):

embedded.py  the engine in this process, or (DistributedClient) in the engine workers
remote.py    RemoteEngine: the engine workers as one AsyncEngine, over Redis
upstream.py  another OpenAI-compatible server as the engine
"""
