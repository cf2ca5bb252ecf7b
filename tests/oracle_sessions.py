"""A context manager for tests of oracle mode: a `Session` whose hooks are installed for the block."""
from __future__ import annotations

import contextlib

from conformance.oracle import intercept
from conformance.oracle import session as sess


@contextlib.contextmanager
def installed(context: str = "", repro_dir=None):
    """Yield a fresh oracle `Session` (named `context`) whose hooks check the block's executions."""
    session = sess.Session(repro_dir=repro_dir)
    session.context = context
    intercept.install(session)
    try:
        yield session
    finally:
        intercept.uninstall()
