"""The GPU path: partition the graph, lower ops to delegate kernels, then fuse them.

1. Each op is checked against the delegate's op list (`gpu_support`). The graph is split into
   independent subsets of supported and unsupported ops the way TFLite does
   (PartitionGraphIntoIndependentNodeSubsets, tensorflow/lite/graph_info.cc); the delegate takes
   the largest supported subsets (all, or only the largest one, per rule set), the rest runs on
   the CPU.
2. Inside a delegated subset the delegate's graph passes run: a zero PAD over height/width merges
   into the convolution or pooling that reads it (merge_padding_with.cc), a reshape that keeps
   the BHWC shape disappears (remove_noop.cc), a global average pooling becomes a reduce
   (global_pooling_to_reduce_op.cc), and each op becomes one or more kernels (a Winograd
   convolution is three).
3. Fusion (`fusion.py`) links element-wise kernels into their producers.
"""

from __future__ import annotations

import itertools
from functools import lru_cache

from latpred.deduce import conv_selection as cs
from latpred.deduce.cpu import cpu_kernel
from latpred.deduce.fusion import GpuNode, merge_elementwise_nodes, merge_nodes
from latpred.deduce.gpu_support import unsupported_reason
from latpred.deduce.kernel import Kernel
from latpred.deduce.optypes import bhwc, kernel_type, spatial_zero_pad
from latpred.deduce.rulesets import CPU_RULES, GPU_RULES, GpuRuleSet
from latpred.errors import ShapeError
from latpred.graph import Graph
from latpred.target import GpuSpec, Target

_PAD_INTO = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D")


def deduce_gpu(graph: Graph, target: Target) -> list[Kernel]:
    rules = GPU_RULES[target.device.gpu_rules]
    cpu_rules = CPU_RULES[target.device.cpu_rules]
    reasons = [unsupported_reason(graph, op, rules.supported, rules.spatial_mean_only)
               for op in graph.ops]
    subsets = partition(graph, [r is None for r in reasons])
    delegated = _delegated(subsets, rules.max_partitions)
    kernels: list[Kernel] = []
    for n, (supported, ops) in enumerate(subsets):
        if n in delegated:
            kernels.extend(_delegate(graph, ops, rules, target.device.gpu))
            continue
        for i in ops:
            why = reasons[i] or (f"outside the largest GPU partition ({rules.label} delegates "
                                 f"{rules.max_partitions} partition)")
            kernels.append(cpu_kernel(graph, i, cpu_rules, why))
    return kernels


def partition(graph: Graph, supported: list[bool]) -> list[tuple[bool, list[int]]]:
    """Independent node subsets in execution order, each all-supported or all-unsupported.

    Greedy like TFLite: take every op of the current kind whose inputs are ready, repeating until
    none is left, then switch kind.
    """
    n = len(graph.ops)
    if all(supported):  # the common case, and the cheap one
        return [(True, list(range(n)))] if n else []
    ready = set(graph.inputs) | {i for i, t in enumerate(graph.tensors) if t.is_constant}
    done = [False] * n
    left = n
    kind = supported[0] if n else True
    subsets: list[tuple[bool, list[int]]] = []
    empty = 0
    while left:
        subset: list[int] = []
        grew = True
        while grew:
            grew = False
            for i, op in enumerate(graph.ops):
                if done[i] or supported[i] != kind:
                    continue
                if all(t < 0 or t in ready for t in op.inputs):
                    done[i], grew = True, True
                    subset.append(i)
                    ready.update(op.outputs)
        if subset:
            subsets.append((kind, subset))
            left -= len(subset)
            empty = 0
        else:
            empty += 1
            if empty == 2:  # neither kind can progress: a missing producer or a cycle
                _raise_stuck(done)
        kind = not kind
    return subsets


def _raise_stuck(done: list[bool]) -> None:
    stuck = [i for i, d in enumerate(done) if not d][:5]
    raise ShapeError(f"Operations {stuck} read tensors that no operation produces.")


def _delegated(subsets: list[tuple[bool, list[int]]], limit: int | None) -> set[int]:
    gpu = [n for n, (ok, _) in enumerate(subsets) if ok]
    if limit is not None:
        gpu = sorted(gpu, key=lambda n: (-len(subsets[n][1]), n))[:limit]
    return set(gpu)


def _delegate(graph: Graph, ops: list[int], rules: GpuRuleSet, gpu: GpuSpec) -> list[Kernel]:
    """The kernels of one delegated subset, after the delegate's passes and fusion."""
    lowering = _Lowering(graph, ops, rules, gpu)
    nodes = lowering.run()
    blocked = lowering.blocked()
    if rules.merge_elementwise:
        nodes = merge_elementwise_nodes(nodes, blocked)
    nodes = merge_nodes(nodes, blocked)
    return [Kernel(n.type, tuple(n.ops), "gpu", _rule_text(n, graph), False, n.part)
            for n in nodes]


def _rule_text(node: GpuNode, graph: Graph) -> str:
    fused = [f"{graph.ops[i].type}#{i}" for i in node.ops[1:]]
    return f"{node.rule}; fused {', '.join(fused)}" if fused else node.rule


class _Lowering:
    """Turns the ops of one delegated subset into GpuNodes (one use, then discarded)."""

    def __init__(self, graph: Graph, ops: list[int], rules: GpuRuleSet, gpu: GpuSpec):
        self.graph, self.ops, self.rules, self.gpu = graph, ops, rules, gpu
        self.opset = set(ops)
        self.alias: dict[int, int] = {}
        self.producer_node: dict[int, GpuNode] = {}
        self.written_by = {t: i for i in ops for t in graph.ops[i].outputs}
        self.fresh = itertools.count(-1, -1)

    def resolve(self, t: int) -> int:
        while t in self.alias:
            t = self.alias[t]
        return t

    def blocked(self) -> set[int]:
        """Tensors read outside the subset or returned by the graph."""
        g = self.graph
        if len(self.ops) == len(g.ops):  # the whole graph: only its outputs leave it
            return {self.resolve(t) for t in g.outputs}
        out, consumers, opset = set(g.outputs), g.consumers, self.opset
        return {self.resolve(t) for i in self.ops for t in g.ops[i].outputs
                if t in out or any(c not in opset for c in consumers.get(t, ()))}

    def run(self) -> list[GpuNode]:
        pads = self._mergeable_pads()
        merged_pads = set(pads.values())
        nodes: list[GpuNode] = []
        for i in self.ops:
            if i in merged_pads:
                continue
            if self._absorb_identity_reshape(i):
                continue
            new = self._lower(i)
            if i in pads:
                new[0].ops.append(pads[i])
                new[0].rule += f"; zero padding of PAD#{pads[i]} merged in"
            for node in new:
                for t in node.outputs:
                    self.producer_node[t] = node
            nodes.extend(new)
        return nodes

    def _mergeable_pads(self) -> dict[int, int]:
        """consumer op -> PAD op merged into it (MergePaddingWith2DOperation)."""
        g, merged = self.graph, {}
        for i in self.ops:
            op = g.ops[i]
            if op.type not in ("PAD", "PADV2") or not spatial_zero_pad(g, op):
                continue
            users = g.consumers_of(op.outputs[0])
            if len(users) != 1 or users[0] not in self.opset or op.outputs[0] in g.outputs:
                continue
            user = g.ops[users[0]]
            if user.type in _PAD_INTO and user.inputs[0] == op.outputs[0]:
                merged[users[0]] = i
                self.alias[op.outputs[0]] = op.inputs[0]
        return merged

    def _absorb_identity_reshape(self, i: int) -> bool:
        op = self.graph.ops[i]
        if op.type != "RESHAPE":
            return False
        src = self.resolve(op.inputs[0])
        shape_in = bhwc(self.graph.tensors[op.inputs[0]].shape)
        node = self.producer_node.get(src)
        if node is None or shape_in != bhwc(self.graph.tensors[op.outputs[0]].shape):
            return False
        node.ops.append(i)  # RemoveIdentityReshape: the consumers read the input directly
        self.alias[op.outputs[0]] = src
        return True

    def _inputs(self, i: int) -> list[int]:
        g = self.graph
        return [self.resolve(t) for t in g.ops[i].inputs
                if t >= 0 and not g.tensors[t].is_constant]

    def _lower(self, i: int) -> list[GpuNode]:
        g, op, label = self.graph, self.graph.ops[i], self.rules.label
        ins, outs = self._inputs(i), list(op.outputs)
        shape = bhwc(g.tensors[outs[0]].shape)
        if op.type == "CONV_2D":
            geom = cs.conv_geom(g, op)
            choice = _select_conv(geom, self.gpu, self.rules)
            return self._conv_nodes(i, choice, geom, ins, outs, shape)
        if op.type in ("ADD", "MUL") and self.rules.associative_reorder and len(ins) >= 2:
            ins = self._latest_first(ins, shape)
        ktype = kernel_type(g, op)
        rule = f"{ktype}: {op.type} ({label})"
        if op.type == "AVERAGE_POOL_2D" and _global_pool(g, op):
            ktype, rule = "mean", f"mean: global average pooling runs as a reduce ({label})"
        linkable = op.type in self.rules.linkable and len(outs) == 1
        return [GpuNode(ktype, [i], ins, outs, shape, linkable, rule)]

    def _latest_first(self, ins: list[int], shape: tuple[int, ...]) -> list[int]:
        """IsAssociativeLinkableOp: without broadcasting, read the last-written input first."""
        for t in ins:
            src = bhwc(self.graph.tensors[t].shape) if t >= 0 else shape
            if any(s == 1 and d != 1 for s, d in zip(src, shape)):
                return ins
        written = [self.written_by.get(t, -1) for t in ins]
        latest = max(range(len(ins)), key=lambda k: (written[k], -k))
        ins = list(ins)
        ins[0], ins[latest] = ins[latest], ins[0]
        return ins

    def _conv_nodes(self, i: int, choice: cs.ConvChoice, geom: cs.ConvGeom, ins: list[int],
                    outs: list[int], shape: tuple[int, ...], part: str = "") -> list[GpuNode]:
        if choice.kind == "winograd":
            tiles = -(-geom.out_h // 4) * -(-geom.out_w // 4)
            a, b = next(self.fresh), next(self.fresh)
            sa, sb = (geom.batch, 36, tiles, geom.cin), (geom.batch, 36, tiles, geom.cout)
            pre = f"{part}_" if part else ""
            return [GpuNode("winograd_input_transform", [i], ins, [a], sa, False, choice.rule,
                            pre + "input_transform"),
                    GpuNode("winograd_matmul", [i], [a], [b], sb, False, choice.rule,
                            pre + "matmul"),
                    GpuNode("winograd_output_transform", [i], [b], outs, shape, False,
                            choice.rule, pre + "output_transform")]
        if choice.kind != "split_groups":
            return [GpuNode(choice.kind, [i], ins, outs, shape, False, choice.rule, part)]
        parts = [next(self.fresh) for _ in range(geom.groups)]
        nodes = [GpuNode("split", [i], ins, parts, shape, False, choice.rule, "group_split")]
        results = []
        sub = cs.ConvGeom(geom.batch, geom.in_h, geom.in_w, geom.src_group_size,
                          geom.dst_group_size, geom.kh, geom.kw, geom.out_h, geom.out_w,
                          geom.stride, geom.dilation, 1, geom.padded)
        for k, t in enumerate(parts):
            results.append(next(self.fresh))
            per = cs.ConvChoice(choice.per_group.kind,
                                f"{choice.per_group.rule}; group {k} of {choice.rule}")
            nodes += self._conv_nodes(i, per, sub, [t], [results[-1]],
                                      shape[:3] + (geom.dst_group_size,), f"group{k}")
        nodes.append(GpuNode("concat", [i], results, outs, shape, False, choice.rule,
                             "group_concat"))
        return nodes


@lru_cache(maxsize=4096)
def _select_conv(geom: cs.ConvGeom, gpu: GpuSpec, rules: GpuRuleSet) -> cs.ConvChoice:
    # NAS graphs repeat the same convolution shapes: the choice is a pure function of them.
    return cs.select_conv(geom, gpu, rules.winograd, rules.label, rules.conv_as_fc,
                          rules.grouped_as_depthwise)


def _global_pool(graph: Graph, op) -> bool:
    """IsGlobalPooling: the window covers the whole input and the output is 1x1."""
    _, h, w, _ = graph.tensors[op.inputs[0]].shape
    _, oh, ow, _ = graph.tensors[op.outputs[0]].shape
    return (oh, ow) == (1, 1) and tuple(op.attr("filter", (0, 0))) == (h, w)
