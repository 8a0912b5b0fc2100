"""Settings split: base (shared), dev (the embedded default), test, production."""
