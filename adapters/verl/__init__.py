"""RollMux for unmodified veRL 0.9.x jobs (``pip install rollmux[verl]``, one environment variable).

veRL loads :mod:`rollmux.adapters.verl.plugin` in every process through its ``verl.plugins``
entry point (``VERL_USE_EXTERNAL_MODULES=rollmux.adapters.verl.plugin`` also works). With
``ROLLMUX_SIDECAR_SOCKET`` unset it returns at once and nothing is patched; set, it installs
post-import hooks: the driver registers the job through the node's sidecar before Ray starts
(:mod:`.driver`), and the process that runs the trainer loop gates rollout, train and weight sync on
RollMux permits (:mod:`.runner`, targets in :mod:`.targets`).
"""
