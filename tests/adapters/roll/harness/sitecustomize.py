"""Loaded by every Python process whose PYTHONPATH holds this folder (the harness driver and its Ray
workers): registers the CPU stand-in patches for ROLL (``cpu_patches``), lazily."""

import cpu_patches

cpu_patches.install()
