"""Placement: the Ray actors, the fleet and the deployment config; the only package that imports ray."""
