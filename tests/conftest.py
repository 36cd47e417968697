"""Real parts shared by every test directory: one embedded PostgreSQL server started from the
cached migrated template, and one Kubernetes API emulator, reset per test."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="session")
def pg_server():
    """One PostgreSQL server for the session, started from the cached migrated template."""
    from fenced_k8s_executor.lab.postgres import start_from_template

    server = start_from_template()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def emulator_session():
    from fenced_k8s_executor.lab.kubeapi import Emulator

    emu = Emulator()
    emu.start()
    yield emu
    emu.stop()


@pytest.fixture
def emulator(emulator_session):
    """The session emulator, reset for this test (objects, logs, faults, audit)."""
    emulator_session.reset()
    yield emulator_session
    emulator_session.clear_faults()
