"""The verdict: whether XLA's result agrees with refsim's, and what a disagreement means.

* `conformance.verdict.compare` -- the comparison policy of docs/comparison.md (layout, then `Exact`,
  `SumBound` or `Ulp` per output) and its mismatch reports;
* `conformance.verdict.elements` -- the element check those policies run, NumPy only; every
  reproducer embeds its source text (`ELEMENT_CHECK`), so a reproducer and compare judge an
  element by the same code;
* `conformance.verdict.xfails` -- expected failures per platform, matched by signature;
* `conformance.verdict.platform_models` -- NumPy models of a platform's own semantics, which
  an xfails entry ``model(NAME)`` names.

`conformance.compare`, `conformance.xfails` and `conformance.platform_models` are these same
modules under their older names.
"""
import ast
import inspect

from conformance.verdict import elements


def _embeddable(module) -> str:
    """`module`'s source without its docstring, under a comment naming it: text a reproducer
    pastes at top level (the module imports only NumPy and has no ``from __future__``)."""
    text = inspect.getsource(module)
    body = ast.parse(text).body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        text = "\n".join(text.splitlines()[body[0].end_lineno:]).lstrip("\n")
    return (f"# -- the element check: {module.__name__}, as conformance.compare runs it "
            "(pasted from its source) --\n" + text.rstrip("\n") + "\n\n\n")


#: The source text of `conformance.verdict.elements` that both reproducer templates embed.
ELEMENT_CHECK = _embeddable(elements)

#: How both reproducer templates end: run, check, print the verdict, exit 1 on a mismatch.
REPRO_MAIN = '''if __name__ == "__main__":
    failures = check(run())
    if failures:
        print(f"MISMATCH on {jax.devices()[0].platform} (jax {jax.__version__}):")
        print("\\n".join(failures))
        sys.exit(1)
    print(f"OK: every device matches refsim on {jax.devices()[0].platform} (jax {jax.__version__})")
'''

__all__ = ["ELEMENT_CHECK", "REPRO_MAIN"]
