"""torch.nn.Module -> latpred Graph, as a PyTorch-to-TFLite converter would write it.

    graph = latpred.from_torch(model, torch.randn(1, 3, 224, 224))

The module is exported with `torch.export` (eval mode, static shapes) and the exported
program's ATen graph is lowered op by op (`lowering.py`) through a `GraphBuilder`, the way the
deployment converters (onnx2tf, litert-torch) lay it out: NCHW activations become NHWC (the graph
input too), BatchNorm after a convolution or linear layer is folded into its weights and bias,
ReLU/ReLU6 fold into their producer (the builder does it as the MLIR converter does), nn.Linear is
FULLY_CONNECTED, a global adaptive average pool is MEAN, dropout disappears, a padding that SAME
cannot express is an explicit PAD before a VALID window. Torch's permutes and transposes move no
data: a tensor's layout (`layout.py`) follows them, and a TRANSPOSE is written only where an op
needs another order: views, reductions to fewer axes and layer norms work on torch's order, as
litert-torch's layout pass leaves them (`movement.py`).

`export_with_weights` also returns the folded weights, so `to_tflite` writes a file that LiteRT
runs with the module's own numbers. An op without a lowering raises `UnsupportedOpError` naming
the ATen op and the module path it comes from.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import torch

from latpred.builder import GraphBuilder
from latpred.errors import LatpredError, UnsupportedModelError, UnsupportedOpError
from latpred.graph import Graph
from latpred.pytorch.layout import Perm, canonical, graph_shape, is_trivial, transpose_perm

RUNTIMES = ("tflite",)


@dataclass(frozen=True)
class Val:
    """A torch tensor held by graph tensor `tid`: torch shape `shape`, graph axis i is torch
    axis perm[i]."""

    tid: int
    shape: tuple[int, ...]
    perm: Perm

    @property
    def rank(self) -> int:
        return len(self.shape)


def from_torch(module: Any, example_inputs: Any = None, *, target_runtime: str = "tflite"
               ) -> Graph:
    """The Graph the deployment converter writes for `module` run on `example_inputs` (a
    tensor or a tuple of tensors, NCHW); `module` may also be a `torch.export.ExportedProgram`
    (then `example_inputs` may be left out)."""
    return export_with_weights(module, example_inputs, target_runtime=target_runtime)[0]


def export_with_weights(module: Any, example_inputs: Any = None, *,
                        target_runtime: str = "tflite"
                        ) -> tuple[Graph, dict[int, np.ndarray]]:
    """`from_torch` plus the data of the constant tensors it made (graph index -> array)."""
    if target_runtime not in RUNTIMES:
        raise LatpredError(f"from_torch supports target_runtime {', '.join(RUNTIMES)}, "
                           f"not {target_runtime!r}.")
    program = export_program(module, example_inputs)
    name = type(module).__name__ if isinstance(module, torch.nn.Module) else "exported"
    lowering = Lowering(program, name)
    graph = lowering.run()
    index = {t.name: i for i, t in enumerate(graph.tensors)}
    data = {index[n]: a for n, a in lowering.data.items() if n in index}
    return graph, data


def to_tflite(module: Any, example_inputs: Any = None, path: str | None = None) -> bytes:
    """The .tflite bytes of `from_torch(module, example_inputs)` with the module's weights
    (BatchNorm folded); written to `path` when given."""
    from latpred.tflite.weights import constant_data
    from latpred.tflite.writer import _write_atomic, serialize

    graph, data = export_with_weights(module, example_inputs)
    full = constant_data(graph, 0)
    full.update(data)
    out = serialize(graph, full, description="latpred.from_torch")
    if path is not None:
        _write_atomic(str(path), out)
    return out


def export_program(module: Any, example_inputs: Any = None):
    """`torch.export.export` of `module` in eval mode (its mode is restored afterwards)."""
    if isinstance(module, torch.export.ExportedProgram):
        return module
    if not isinstance(module, torch.nn.Module):
        raise LatpredError(f"from_torch needs a torch.nn.Module or an ExportedProgram, got "
                           f"{type(module).__name__}.")
    if example_inputs is None:
        raise LatpredError("from_torch needs example inputs for a torch.nn.Module (e.g. "
                           "torch.randn(1, 3, 224, 224)).")
    args = tuple(example_inputs) if isinstance(example_inputs, (tuple, list)) \
        else (example_inputs,)
    was_training = module.training
    module.eval()
    try:
        with torch.no_grad():
            return torch.export.export(module, args)
    except LatpredError:
        raise
    except Exception as e:  # torch's many export errors: one sentence, not a traceback
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UnsupportedModelError(f"torch.export could not export {type(module).__name__}: "
                                    f"{first}") from e
    finally:
        module.train(was_training)


def module_path(node: Any) -> str:
    """The module path ('features.3.conv.1') a node of an exported graph comes from."""
    stack = node.meta.get("nn_module_stack") or {}
    if not stack:
        return "<top level>"
    path, kind = list(stack.values())[-1]
    path = str(path).replace("L['self'].", "").replace("L['self']", "") or "<top level>"
    kind = getattr(kind, "__name__", str(kind).rsplit(".", 1)[-1].strip("'>"))
    return f"{path} ({kind})"


def op_name(node: Any) -> str:
    """'conv2d' for aten.conv2d.default (in-place variants lose their trailing '_')."""
    target = node.target
    packet = getattr(target, "_overloadpacket", None)
    name = packet.__name__ if packet is not None else getattr(target, "__name__", str(target))
    return name[:-1] if name.endswith("_") and not name.startswith("_") else name


class Lowering:
    """Walks one exported program's graph and builds the Graph (a working object)."""

    def __init__(self, program: Any, name: str) -> None:
        self.program = program
        self.b = GraphBuilder(name)
        self.data: dict[str, np.ndarray] = {}   # builder tensor name -> data
        self.env: dict[str, Any] = {}
        self.node: Any = None
        self.folded: dict[str, Any] = {}        # conv/linear node name -> its batch norm node
        self.origin: dict[int, Any] = {}        # graph tensor id -> the node whose value it is
        self.producer: dict[int, Any] = {}      # graph tensor id -> the node that first held it
        self.no_fold: set[int] = set()          # RESHAPE outputs a FULLY_CONNECTED must not skip
        self.relayouts: dict[tuple[int, Perm], int] = {}   # (tensor, layout) -> its relayout

    # -- the walk ------------------------------------------------------------------------------
    def run(self) -> Graph:
        from latpred.pytorch.lowering import BATCH_NORMS, FOLDS_BN, HANDLERS, SKIP

        gm = self.program.graph_module
        specs = {s.arg.name: s for s in self.program.graph_signature.input_specs
                 if hasattr(s.arg, "name")}
        nodes = list(gm.graph.nodes)
        for n in nodes:   # a batch norm whose input is a conv/linear used once folds into it
            if n.op == "call_function" and op_name(n) in BATCH_NORMS:
                src = n.args[0]
                if getattr(src, "op", "") == "call_function" and op_name(src) in FOLDS_BN \
                        and len(src.users) == 1 and not _bn_training(n):
                    self.folded[src.name] = n
        outputs: list[Any] = []
        for n in nodes:
            self.node = n
            if n.op == "placeholder":
                self.env[n.name] = self._placeholder(n, specs.get(n.name))
            elif n.op == "get_attr":
                self.env[n.name] = _attr(gm, n.target)
            elif n.op == "output":
                outputs = list(_flatten(n.args[0]))
            elif n.target is operator.getitem:
                self.env[n.name] = self.env[n.args[0].name][n.args[1]]
                self._note(n)
            else:
                name = op_name(n)
                if name in SKIP or name.startswith("_assert"):
                    self.env[n.name] = None   # checks and shape queries: no data
                    continue
                args, kwargs = self.args(n.args), self.args(dict(n.kwargs))
                if not any(isinstance(v, Val) for v in _flatten((args, kwargs))):
                    self.env[n.name] = _evaluate(n, args, kwargs)   # constant folding
                    continue
                handler = HANDLERS.get(name)
                if handler is None:
                    raise UnsupportedOpError(
                        f"from_torch has no TFLite lowering for aten.{name} (from "
                        f"{module_path(n)}).")
                self.env[n.name] = self._checked(n, handler(self, n, args, kwargs))
                self._note(n)
        outs = [self.env.get(o.name) if hasattr(o, "name") else None for o in outputs]
        if not outs or not all(isinstance(v, Val) for v in outs):
            raise UnsupportedModelError("from_torch needs a module whose outputs are tensors "
                                        "computed from its inputs.")
        # outputs as litert_torch.to_channel_last_io gives them: 4-D NHWC, others torch order
        self.b.output(*[self.to_layout(v, canonical(v.rank)).tid for v in outs])
        return self.b.build()

    def _note(self, n: Any) -> None:
        v = self.env[n.name]
        if isinstance(v, Val):
            self.origin[v.tid] = n
            self.producer.setdefault(v.tid, n)

    def sole_reader(self, tid: int) -> bool:
        """True when the node being lowered is the only reader of graph tensor `tid`: every
        node from its producer to this one (permutes, views that wrote nothing) has one user."""
        node = self.producer.get(tid)
        while node is not None and node is not self.node:
            users = list(node.users)
            if len(users) != 1:
                return False
            node = users[0]
        return node is self.node

    def _placeholder(self, n: Any, spec: Any) -> Any:
        kind = getattr(getattr(spec, "kind", None), "name", "USER_INPUT")
        if kind == "USER_INPUT":
            val = n.meta.get("val")
            if not isinstance(val, torch.Tensor):
                raise UnsupportedModelError(f"from_torch takes tensor inputs only; input "
                                            f"{n.name!r} is {type(val).__name__}.")
            shape = _static(val.shape, n.name)
            perm = canonical(len(shape))
            tid = self.b.input(graph_shape(shape, perm), name=n.name)
            return Val(tid, shape, perm)
        target = spec.target
        found = self.program.state_dict.get(target)
        if found is None:
            found = self.program.constants.get(target)
        if found is None:
            raise UnsupportedModelError(f"from_torch found no value for {target!r}.")
        return found.detach()

    def _checked(self, n: Any, out: Any) -> Any:
        """Each lowered tensor's graph shape must be its torch shape in its layout."""
        val = n.meta.get("val")
        if isinstance(out, Val) and isinstance(val, torch.Tensor):
            want = graph_shape(_static(val.shape, n.name), out.perm)
            got = self.b.shape(out.tid)
            if got != want or tuple(out.shape) != tuple(val.shape):
                raise RuntimeError(f"from_torch lowered {n.name} ({op_name(n)}) to shape {got}, "
                                   f"expected {want}: a latpred bug.")
        return out

    def args(self, a: Any) -> Any:
        """Node arguments with exported nodes replaced by their lowered values."""
        if hasattr(a, "op") and hasattr(a, "name"):
            return self.env[a.name]
        if isinstance(a, (list, tuple)):
            return type(a)(self.args(x) for x in a)
        if isinstance(a, dict):
            return {k: self.args(v) for k, v in a.items()}
        return a

    # -- helpers for the handlers --------------------------------------------------------------
    @property
    def name(self) -> str:
        return self.node.name

    def out_shape(self) -> tuple[int, ...]:
        return _static(self.node.meta["val"].shape, self.node.name)

    def val(self, tid: int, shape: Sequence[int], perm: Perm) -> Val:
        return Val(tid, tuple(int(d) for d in shape), tuple(perm))

    def constant(self, array: np.ndarray, name: str) -> int:
        """A float32 constant tensor of the graph holding `array`."""
        array = np.array(array, dtype=np.float32, order="C")   # 0-d stays 0-d
        tid = self.b.constant(array.shape, name=self.b._base(name, "const"))
        self.data[self.b._tensors[tid].name] = array
        return tid

    def set_data(self, tid: int, array: Any) -> None:
        if tid >= 0:
            arr = array.detach().numpy() if isinstance(array, torch.Tensor) else array
            self.data[self.b._tensors[tid].name] = np.array(arr, dtype=np.float32, order="C")

    def last_inputs(self) -> tuple[int, ...]:
        """Input ids of the op the builder added last (to attach weight data)."""
        return self.b._ops[-1].inputs

    def to_layout(self, v: Val, perm: Perm) -> Val:
        """`v` with layout `perm`: a TRANSPOSE, or a RESHAPE when only size-1 axes move."""
        perm = tuple(perm)
        if v.perm == perm:
            return v
        done = self.relayouts.get((v.tid, perm))   # one TRANSPOSE for all readers (CSE)
        if done is not None:
            return Val(done, v.shape, perm)
        shape = graph_shape(v.shape, perm)
        if is_trivial(v.shape, v.perm, perm):
            tid = self.b.reshape(v.tid, shape, name=f"{self.name}/relayout")
        else:
            tid = self.b.transpose(v.tid, transpose_perm(v.perm, perm),
                                   name=f"{self.name}/transpose")
        self.relayouts[(v.tid, perm)] = tid
        return Val(tid, v.shape, perm)

    def nhwc(self, v: Val) -> Val:
        if v.rank != 4:
            raise UnsupportedOpError(f"from_torch lowers aten.{op_name(self.node)} on 4-D (NCHW) "
                                     f"tensors only, got shape {v.shape} (from "
                                     f"{module_path(self.node)}).")
        return self.to_layout(v, canonical(4))

    def operand(self, x: Any, like: Val) -> Val:
        """A binary op's operand in `like`'s layout: a graph tensor, a constant or a number."""
        if isinstance(x, Val):
            if x.rank == like.rank:
                return self.to_layout(x, like.perm)
            if x.rank < like.rank and like.perm == tuple(range(like.rank)):
                return x if x.perm == tuple(range(x.rank)) else \
                    self.to_layout(x, tuple(range(x.rank)))
            raise UnsupportedOpError(f"from_torch cannot broadcast a {x.shape} tensor against "
                                     f"{like.shape} in aten.{op_name(self.node)} (from "
                                     f"{module_path(self.node)}).")
        arr = x.detach().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)
        arr = np.asarray(arr, dtype=np.float32)
        if arr.ndim and arr.ndim <= like.rank:
            arr = arr.reshape((1,) * (like.rank - arr.ndim) + arr.shape).transpose(like.perm)
            while arr.ndim and arr.shape[0] == 1:   # (1, 1, 1, C) broadcasts as (C,)
                arr = arr.reshape(arr.shape[1:])
        tid = self.constant(arr, f"{self.name}/const")
        return Val(tid, tuple(arr.shape), tuple(range(arr.ndim)))


def _bn_training(n: Any) -> bool:
    name = op_name(n)
    if name == "_native_batch_norm_legit_no_training":
        return False
    if name in ("batch_norm", "native_batch_norm", "_native_batch_norm_legit"):
        return bool(n.args[5]) if len(n.args) > 5 else False
    return False


def _static(shape: Any, what: str) -> tuple[int, ...]:
    try:
        return tuple(int(d) for d in shape)
    except (TypeError, ValueError):
        raise UnsupportedModelError(f"from_torch needs static shapes; {what} has shape "
                                    f"{tuple(shape)}.") from None


def _attr(gm: Any, target: str) -> Any:
    obj = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj.detach() if isinstance(obj, torch.Tensor) else obj


def _flatten(a: Any):
    if isinstance(a, (list, tuple)):
        for x in a:
            yield from _flatten(x)
    elif isinstance(a, dict):
        for x in a.values():
            yield from _flatten(x)
    else:
        yield a


def _evaluate(n: Any, args: Any, kwargs: Mapping[str, Any]) -> Any:
    """Run an op whose inputs are all constants (weights reshaped, permuted, computed)."""
    with torch.no_grad():
        return n.target(*args, **kwargs)


Handler = Callable[[Lowering, Any, Any, Mapping[str, Any]], Any]


def load_pt2(path: str) -> Graph:
    """The Graph of a program saved by `torch.export.save` (a .pt2 file)."""
    try:
        program = torch.export.load(str(path))
    except FileNotFoundError:
        raise LatpredError(f"No such file: {path}.") from None
    except Exception as e:
        raise UnsupportedModelError(f"{path} is not a torch.export program "
                                    f"({type(e).__name__}).") from e
    graph = from_torch(program)
    return Graph(graph.tensors, graph.ops, graph.inputs, graph.outputs,
                 str(path).rsplit("/", 1)[-1].removesuffix(".pt2"))


def as_graph(obj: Any, example_inputs: Any = None) -> Graph:
    """A module, an ExportedProgram or a .pt2 path as a Graph (for `LatencyModel.predict`)."""
    if isinstance(obj, torch.export.ExportedProgram):
        return from_torch(obj)
    if isinstance(obj, torch.nn.Module):
        if example_inputs is None:
            raise LatpredError(f"Predicting a torch.nn.Module ({type(obj).__name__}) needs "
                               "example_inputs=, e.g. torch.randn(1, 3, 224, 224).")
        return from_torch(obj, example_inputs)
    raise LatpredError(f"Cannot predict a {type(obj).__name__}: give a Graph, a .tflite or "
                       ".pt2 path, a torch.nn.Module or an ExportedProgram.")
