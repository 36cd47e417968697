"""Fixtures for tests/helm: render the official chart offline (helpers in helmrender.py)."""

from __future__ import annotations

from helmrender import airflow_config, minihelm, pytest_collection_modifyitems, render  # noqa: F401
