"""RollMux for unmodified RL frameworks: post-import patches that enter and leave phases through the
shim (``rollmux.shim``), in the framework's own processes.

* :mod:`rollmux.adapters.common`: what every adapter shares (hooks, the patch registry and version
  guard, phase wrappers, registration through the sidecar, the job's identity for its workers);
* :mod:`rollmux.adapters.verl`: veRL 0.9.x, loaded through its ``verl.plugins`` entry point;
* :mod:`rollmux.adapters.roll`: ROLL, loaded by ``rollmux-roll.pth`` when opted in.
"""
