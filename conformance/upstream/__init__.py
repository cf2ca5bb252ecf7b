"""Upstream-ready findings: a plain-JAX script and an issue body per distinct failure.

A hunt (`conformance.hunt`) hands each new finding's shrunk program here (`report.write`). It
writes, in the finding's folder:

* ``upstream.py``: the program as a script with JAX and NumPy only, the device count set inside,
  checking every device's shard against an expected value computed independently of the
  sharding (`conformance.upstream.script`);
* ``UPSTREAM.md``: an issue a JAX or XLA engineer can file as is: title, what happens, expected
  against actual, the script inline, versions, and which partitioners (Shardy, GSPMD) fail, from
  running the script under each in a fresh Python with no project on the path
  (`conformance.upstream.runs`).

Its program is first cut to the fewest ops and devices that still fail
(`conformance.upstream.shrink`). `conformance.upstream.known` says whether the failure is a bug
docs/found-bugs.md lists, and `conformance.upstream.causes` groups findings by root cause.
This package's ``__init__`` imports nothing: `conformance.upstream.helper` must start before JAX.
"""
