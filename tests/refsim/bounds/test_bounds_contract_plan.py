"""`products.contract` with its transposes planned once per (ranks, lead dims, dimension numbers)
gives the products the per-call plan gave, bit for bit, and what np.einsum gives up to rounding."""
import math

import numpy as np
import pytest

from refsim.bounds.rules.products import contract

CASES = [  # x shape, y shape, nlead, dimension numbers
    ((3, 4), (4, 5), 0, (((1,), (0,)), ((), ()))),
    ((4, 3), (4, 5), 0, (((0,), (0,)), ((), ()))),
    ((2, 3, 4), (2, 4, 5), 0, (((2,), (1,)), ((0,), (0,)))),
    ((2, 6, 3, 4), (2, 6, 4, 5), 1, (((2,), (1,)), ((0,), (0,)))),
    ((2, 1, 3, 4), (1, 2, 4, 5), 2, (((1,), (0,)), ((), ()))),
    ((5, 2, 3), (3, 2, 7), 0, (((1, 2), (1, 0)), ((), ()))),
    ((2, 3), (3,), 0, (((1,), (0,)), ((), ()))),
]


def contract_long(x, y, nlead, dimension_numbers):
    """contract as it was: the transposes worked out per call."""
    (xc, yc), (xb, yb) = dimension_numbers
    xc, yc = tuple(nlead + d for d in xc), tuple(nlead + d for d in yc)
    xb, yb = tuple(nlead + d for d in xb), tuple(nlead + d for d in yb)
    lead = tuple(range(nlead))
    xf = tuple(d for d in range(nlead, x.ndim) if d not in xb and d not in xc)
    yf = tuple(d for d in range(nlead, y.ndim) if d not in yb and d not in yc)
    xt, yt = x.transpose(lead + xb + xf + xc), y.transpose(lead + yb + yc + yf)
    nb = nlead + len(xb)
    k = math.prod(xt.shape[nb + len(xf):])
    m = math.prod(xt.shape[nb:nb + len(xf)])
    n = math.prod(yt.shape[nb + len(yc):])
    bx, by = xt.shape[:nb], yt.shape[:nb]
    r = np.matmul(xt.reshape(bx + (m, k)), yt.reshape(by + (k, n)))
    free = xt.shape[nb:nb + len(xf)] + yt.shape[nb + len(yc):]
    return r.reshape(np.broadcast_shapes(bx, by) + free), k


@pytest.mark.parametrize("xs, ys, nlead, dn", CASES)
def test_contract_matches_the_per_call_plan_and_einsum(xs, ys, nlead, dn):
    rng = np.random.default_rng(0)
    x, y = rng.standard_normal(xs), rng.standard_normal(ys)
    got, k = contract(x, y, nlead, dn)
    want, k2 = contract_long(x, y, nlead, dn)
    assert k == k2 and got.shape == want.shape and got.strides == want.strides
    assert np.array_equal(got, want)
    got2, _ = contract(x, y, nlead, dn)            # the cached plan, the same products
    assert np.array_equal(got2, want)
    # an independent reference: einsum over named axes
    letters = iter("abcdefghijklmnop")
    xl, yl = [next(letters) for _ in xs], [None] * len(ys)
    (xc, yc), (xb, yb) = dn
    for i in range(nlead):
        yl[i] = xl[i]
    for a, b in zip(xc, yc):
        yl[nlead + b] = xl[nlead + a]
    for a, b in zip(xb, yb):
        yl[nlead + b] = xl[nlead + a]
    yl = [c if c is not None else next(letters) for c in yl]
    lead = xl[:nlead]
    batch = [xl[nlead + a] for a in xb]
    xfree = [c for i, c in enumerate(xl) if i >= nlead and (i - nlead) not in xc and (i - nlead) not in xb]
    yfree = [c for i, c in enumerate(yl) if i >= nlead and (i - nlead) not in yc and (i - nlead) not in yb]
    spec = f"{''.join(xl)},{''.join(yl)}->{''.join(lead + batch + xfree + yfree)}"
    assert np.allclose(got, np.einsum(spec, x, y), rtol=1e-12, atol=1e-12)
    with pytest.raises(TypeError):
        hash([[1], [0]])                           # lists: the unhashable case takes the long way
    lists = [[list(dn[0][0]), list(dn[0][1])], [list(dn[1][0]), list(dn[1][1])]]
    assert np.array_equal(contract(x, y, nlead, lists)[0], want)
