"""The domain every other part builds on: the job and cluster model, error codes, lifecycle state
machines and port defaults. It imports nothing else from RollMux, so every floor above may use it."""
