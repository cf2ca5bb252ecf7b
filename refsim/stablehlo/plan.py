"""An MLIR module (text, bytecode or `ir.Module`) compiled into plain Python instructions.

The module is walked once with the MLIR Python bindings that ship in jaxlib; every
operation becomes an `Op` holding integer value slots, its attributes as Python values
(dense elements as ndarrays, enums as their keyword, dimension numbers as tuples), its
result types, its regions and its source location. The interpreter then never touches
MLIR objects, so evaluation costs NumPy calls, not binding calls.
"""
from __future__ import annotations

import dataclasses
import re
from typing import Any

import ml_dtypes
import numpy as np

from refsim import compat


@dataclasses.dataclass(frozen=True)
class TensorType:
    """A result type: `shape` and NumPy `dtype` (dtype None for tokens and tuples)."""

    shape: tuple
    dtype: Any


@dataclasses.dataclass(frozen=True)
class Loc:
    """Where an op came from: `name` (the primitive or HLO op name JAX/XLA gave it, the leaf of
    the name stack) and the user's `file`:`line` (empty when the location has none)."""

    name: str = ""
    file: str = ""
    line: int = 0

    @property
    def source(self) -> str:
        return f"{self.file}:{self.line}" if self.file else ""

    @property
    def key(self) -> tuple:
        return (self.name, self.file, self.line)


@dataclasses.dataclass(eq=False)
class Block:
    """A region's single block: argument slots, ops, and the terminator's operand slots."""

    args: tuple
    ops: list
    returns: tuple


@dataclasses.dataclass(eq=False)
class Op:
    name: str
    operands: tuple
    results: tuple
    types: tuple
    attrs: dict
    regions: tuple
    loc: Loc
    text: str
    index: int  # position in the whole module (pre-order), for reports
    rule: Any = None


@dataclasses.dataclass(eq=False)
class Func:
    name: str
    body: Block
    arg_attrs: list
    result_attrs: list
    arg_types: tuple
    result_types: tuple


@dataclasses.dataclass(eq=False)
class Program:
    """A compiled module: functions by name, module attributes, `sdy.mesh` symbols and every op."""

    funcs: dict
    attrs: dict
    meshes: dict
    ops: list

    @property
    def main(self) -> Func:
        if "main" in self.funcs:
            return self.funcs["main"]
        public = [f for f in self.funcs.values() if not f.name.startswith(("region", "fused", "wrapped"))]
        if len(public) == 1:
            return public[0]
        raise ValueError(f"the module has no @main function (functions: {sorted(self.funcs)}); pass the "
                         "module JAX lowered or XLA compiled for one program.")


# --- types ------------------------------------------------------------------------------------

_DTYPES = {
    "f64": np.float64, "f32": np.float32, "f16": np.float16, "bf16": ml_dtypes.bfloat16,
    "i1": np.bool_, "i8": np.int8, "i16": np.int16, "i32": np.int32, "i64": np.int64,
    "ui8": np.uint8, "ui16": np.uint16, "ui32": np.uint32, "ui64": np.uint64,
    "index": np.int64, "complex<f32>": np.complex64, "complex<f64>": np.complex128,
    "f8E4M3FN": ml_dtypes.float8_e4m3fn, "f8E5M2": ml_dtypes.float8_e5m2,
}


def element_dtype(text: str):
    try:
        return np.dtype(_DTYPES[text])
    except KeyError:
        raise TypeError(f"refsim.stablehlo: element type {text!r} is not supported; supported: "
                        f"{sorted(_DTYPES)}.") from None


_TENSOR = re.compile(r"^tensor<(.*)>$")


def tensor_type(t) -> TensorType:
    text = str(t)
    m = _TENSOR.match(text)
    if not m:
        return TensorType((), None)  # !stablehlo.token, tuple<...>
    body = m.group(1)
    body = re.sub(r",\s*#.*$", "", body)  # encodings (sparse, bounds) do not change the value
    parts = body.split("x")
    dims, elem = [], None
    for i, p in enumerate(parts):
        if p.isdigit():
            dims.append(int(p))
        else:
            elem = "x".join(parts[i:])
            break
    if elem is None or any(p == "?" for p in parts):
        raise TypeError(f"refsim.stablehlo: dynamic or unranked type {text!r} is not supported; "
                        "lower with static shapes.")
    return TensorType(tuple(dims), element_dtype(elem))


# --- attributes -------------------------------------------------------------------------------

def dense_value(attr, ir) -> np.ndarray:
    """A dense elements attribute as an ndarray of its type (bf16 / f8 through the hex or
    splat form, which the buffer protocol does not export)."""
    tt = tensor_type(attr.type)
    try:
        arr = np.array(attr)
        return arr.astype(tt.dtype).reshape(tt.shape) if arr.size else np.zeros(tt.shape, tt.dtype)
    except Exception:  # noqa: BLE001 - narrow float types have no buffer format
        pass
    if attr.is_splat:
        return np.full(tt.shape, float(ir.FloatAttr(attr.get_splat_value()).value), dtype=tt.dtype)
    text = str(attr)
    m = re.search(r'dense<"0x([0-9A-Fa-f]+)">', text)
    if m:
        return np.frombuffer(bytes.fromhex(m.group(1)), dtype=tt.dtype).reshape(tt.shape).copy()
    nums = re.findall(r"[-+]?(?:\d+\.?\d*(?:[eE][-+]?\d+)?|inf|nan|0x[0-9A-Fa-f]+)",
                      text[text.index("<") + 1:text.rindex(">")].rsplit(":", 1)[0])
    return np.array([float(v) for v in nums], np.float64).astype(tt.dtype).reshape(tt.shape)


_COMPLEX_DENSE = re.compile(r'dense<(.*?)>\s*:\s*tensor<((?:\d+x)*)complex<f(32|64)>>')
_PAIR = re.compile(r"\(\s*([^,()]+?)\s*,\s*([^,()]+?)\s*\)")


def complex_dense_from_text(op_text: str, name: str) -> np.ndarray:
    """The dense complex attribute `name` of an op, read from the op's printed form: a splat
    ``dense<(re,im)>``, a list ``dense<[(re,im), ...]>`` or hex ``dense<"0x...">`` (the MLIR Python
    bindings raise TypeError when asked for a complex DenseElementsAttr). TypeError if there is none."""
    m = _COMPLEX_DENSE.search(op_text)
    if m is None:
        raise TypeError(f"attribute {name!r} of {op_text.splitlines()[0][:120]!r} is neither readable by the MLIR "
                        "bindings nor a dense complex literal")
    body, dims, bits = m.group(1), m.group(2), m.group(3)
    shape = tuple(int(d) for d in dims.split("x") if d)
    dtype = np.complex64 if bits == "32" else np.complex128
    if body.startswith('"0x'):
        return np.frombuffer(bytes.fromhex(body[3:-1]), dtype=dtype).reshape(shape).copy()
    vals = [complex(float(re_), float(im)) for re_, im in _PAIR.findall(body)]
    if len(vals) == 1:
        return np.full(shape, vals[0], dtype=dtype)
    return np.array(vals, dtype=dtype).reshape(shape)


_ENUM = re.compile(r"^#(?:stablehlo|mhlo)<\w+ (\w+)>$")


def _dims(names, text):
    out = {}
    for n in names:
        m = re.search(rf"\b{n} = \[([^\]]*)\]", text)
        out[n] = tuple(int(v) for v in m.group(1).split(",") if v.strip()) if m else ()
    if names in (_GATHER, _SCATTER):
        # the printer elides index_vector_dim at its default, 0 (StableHLO gather / scatter)
        m = re.search(r"\bindex_vector_dim = (\d+)", text)
        out["index_vector_dim"] = int(m.group(1)) if m else 0
    return out


_DOT = ("lhs_batching_dimensions", "rhs_batching_dimensions", "lhs_contracting_dimensions",
        "rhs_contracting_dimensions")
_GATHER = ("offset_dims", "collapsed_slice_dims", "operand_batching_dims", "start_indices_batching_dims",
           "start_index_map")
_SCATTER = ("update_window_dims", "inserted_window_dims", "input_batching_dims", "scatter_indices_batching_dims",
            "scatter_dims_to_operand_dims")


def attr_value(attr, ir):
    """A Python value for an MLIR attribute (str of it for kinds the interpreter reads as text)."""
    for cls, conv in (
        ("DenseI64ArrayAttr", lambda a: tuple(int(v) for v in a)),
        ("DenseI32ArrayAttr", lambda a: tuple(int(v) for v in a)),
        ("DenseBoolArrayAttr", lambda a: tuple(bool(v) for v in a)),
        ("DenseElementsAttr", lambda a: dense_value(a, ir)),
        ("BoolAttr", lambda a: bool(a.value)),
        ("IntegerAttr", lambda a: int(a.value)),
        ("FloatAttr", lambda a: float(a.value)),
        ("StringAttr", lambda a: str(a.value)),
        ("FlatSymbolRefAttr", lambda a: str(a.value)),
        ("UnitAttr", lambda a: True),
        ("ArrayAttr", lambda a: [attr_value(x, ir) for x in a]),
        ("DictAttr", lambda a: {str(x.name): attr_value(x.attr, ir) for x in a}),
        ("TypeAttr", lambda a: tensor_type(a.value)),
    ):
        kind = getattr(ir, cls, None)
        # the bindings return attributes downcast to their concrete class
        if kind is not None and isinstance(attr, kind):
            return conv(attr)
    text = str(attr)
    m = _ENUM.match(text)
    if m:
        return m.group(1)
    if text.startswith(("#stablehlo.dot<", "#mhlo.dot<")):
        return _dims(_DOT, text)
    if text.startswith(("#stablehlo.gather<", "#mhlo.gather<")):
        return _dims(_GATHER, text)
    if text.startswith(("#stablehlo.scatter<", "#mhlo.scatter<")):
        return _dims(_SCATTER, text)
    return text


# --- locations --------------------------------------------------------------------------------

_LOC_NAME = re.compile(r'loc\("((?:[^"\\]|\\.)*)"')
_LOC_FILE = re.compile(r'"((?:[^"\\]|\\.)+)":(\d+):\d+')


def parse_loc(text: str) -> Loc:
    """The op name (leaf of JAX's name stack, HLO's numeric suffix dropped) and the first
    file:line of an MLIR location's text. JAX's frames come first: they name the user's line."""
    m = _LOC_NAME.search(text)
    name = ""
    if m:
        name = m.group(1).rstrip(":").rsplit("/", 1)[-1]
        name = re.sub(r"\.\d+$", "", name)
    f = _LOC_FILE.search(text)
    if f:
        return Loc(name, f.group(1), int(f.group(2)))
    return Loc(name)


# --- the walk ---------------------------------------------------------------------------------

class _Builder:
    def __init__(self, ir):
        self.ir = ir
        self.slots: dict = {}
        self.ops: list = []

    def slot(self, value) -> int:
        s = self.slots.get(value)
        if s is None:
            s = self.slots[value] = len(self.slots)
        return s

    def block(self, region) -> Block:
        blocks = list(region.blocks)
        if len(blocks) != 1:
            raise ValueError(f"refsim.stablehlo: a region with {len(blocks)} blocks is not StableHLO (every "
                             "region of a StableHLO op has one block); pass the module JAX lowers or "
                             "hlo_to_stablehlo's output.")
        blk = blocks[0]
        args = tuple(self.slot(a) for a in blk.arguments)
        ops, returns = [], ()
        for op in blk.operations:
            name = op.operation.name
            if name in ("func.return", "stablehlo.return", "mhlo.return", "sdy.return"):
                returns = tuple(self.slot(v) for v in op.operation.operands)
                continue
            ops.append(self.op(op.operation))
        return Block(args, ops, returns)

    def op(self, op) -> Op:
        ir = self.ir
        attrs = {}
        for n in compat.attribute_names(op):
            try:
                attrs[n] = attr_value(op.attributes[n], ir)
            except TypeError:   # the bindings cannot downcast a dense complex attribute: read its text
                attrs[n] = complex_dense_from_text(str(op), n)
        index = len(self.ops)
        self.ops.append(None)
        regions = tuple(self.block(r) for r in op.regions)
        text = _op_text(op, regions)
        out = Op(op.name, tuple(self.slot(v) for v in op.operands), tuple(self.slot(r) for r in op.results),
                 tuple(tensor_type(r.type) for r in op.results), attrs, regions, parse_loc(str(op.location)),
                 text, index)
        self.ops[index] = out
        return out


def _op_text(op, regions) -> str:
    """The op's first line of assembly for reports. Ops with regions are not printed whole
    (that prints their bodies: quadratic in the nesting): their attributes are listed instead."""
    if not regions:
        # local scope: SSA names are numbered within the op, not by walking the whole module
        asm = op.get_asm(large_elements_limit=16, enable_debug_info=False, use_local_scope=True).strip()
        return asm.splitlines()[0][:400] if asm else op.name
    attrs = ", ".join(f"{n} = {str(op.attributes[n])[:120]}" for n in compat.attribute_names(op))
    return f'"{op.name}"(...) <{{{attrs}}}> ({len(regions)} region(s))'[:400]


def _func_attrs(f, key: str, ir) -> list:
    if key not in compat.attribute_names(f):
        return []
    return [attr_value(d, ir) if not isinstance(d, dict) else d for d in f.attributes[key]]


def _parse_module(module, ir):
    if isinstance(module, ir.Module):
        return module
    if isinstance(module, (bytes, bytearray)):
        return ir.Module.parse(bytes(module))
    if isinstance(module, str):
        return ir.Module.parse(module)
    raise TypeError(f"module must be StableHLO text, bytecode or an ir.Module, got {type(module).__name__}; "
                    "pass jax.jit(f).lower(*args).as_text() or .compiler_ir('stablehlo').")


def compile_module(module) -> Program:
    """Walk `module` once and return its `Program`."""
    ir = compat.mlir_ir()
    if isinstance(module, ir.Module):
        return _compile(module, ir)
    with compat.mlir_context():
        return _compile(_parse_module(module, ir), ir)


def _compile(mod, ir) -> Program:
    b = _Builder(ir)
    top = mod.operation
    attrs = {n: attr_value(top.attributes[n], ir) for n in compat.attribute_names(top)}
    funcs, meshes = {}, {}
    for op in mod.body.operations:
        name = op.operation.name
        if name == "func.func":
            fname = str(ir.StringAttr(op.attributes["sym_name"]).value)
            ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            body = b.block(op.regions[0])
            funcs[fname] = Func(fname, body, _func_attrs(op, "arg_attrs", ir), _func_attrs(op, "res_attrs", ir),
                                tuple(tensor_type(t) for t in ftype.inputs),
                                tuple(tensor_type(t) for t in ftype.results))
        elif name == "sdy.mesh":
            meshes[str(ir.StringAttr(op.attributes["sym_name"]).value)] = str(op.attributes["mesh"])
    return Program(funcs, attrs, meshes, b.ops)


def walk(block: Block):
    """Every op of `block` and of its nested regions, in program order."""
    for op in block.ops:
        yield op
        for r in op.regions:
            yield from walk(r)
