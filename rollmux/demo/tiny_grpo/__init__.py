"""A real, tiny GRPO job in plain PyTorch on CPU: a rollout process and a trainer process.

See ``job.py`` for the entry point (``python -m rollmux.demo.tiny_grpo.job --help``).
"""
