"""The fences, one module per path, mixed into FencedKubernetesExecutor: creation (a1-a3),
events (b1-b5), hand-over (c, revoke). Each asks ``verdicts`` and otherwise calls ``super()``."""
