"""Machinery every framework adapter shares (veRL, ROLL): post-import hooks, the patch registry with
version guard and unpatch, phase-boundary wrappers, registration through the node sidecar and
propagation of the job's identity to its Ray actors.

Importing this package imports no framework, no grpc and no torch.
"""

from __future__ import annotations

from rollmux.adapters.common.api import AdapterError, PatchTarget, Wrapper
from rollmux.adapters.common.hooks import when_imported
from rollmux.adapters.common.patching import Patcher, is_patched
from rollmux.adapters.common.phases import PhaseTracker, begins, ends, spans
from rollmux.adapters.common.registration import opted_in

__all__ = ["AdapterError", "PatchTarget", "Patcher", "PhaseTracker", "Wrapper", "begins", "ends",
           "is_patched", "opted_in", "spans", "when_imported"]
