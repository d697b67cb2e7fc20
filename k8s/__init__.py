"""The RollMux Kubernetes scheduler: binds opted-in job pods to the nodes the coordinator's policy chose."""
