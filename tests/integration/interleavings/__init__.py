"""A randomized interleaving checker over the integration world (issue 36); see docs/checker.md."""
