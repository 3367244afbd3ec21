"""The GPU path: partition the graph, lower ops to delegate kernels, then fuse them.

0. A model the runtime would not run on the GPU is refused with a `DelegateRefusedError`:
   TFLite applies no GPU delegate to a graph with run-time shapes, LiteRT's GPU accelerator
   alone takes a model whole or not at all, and it crashes on some split grouped convolutions
   (`gpu_parts`, the rule set's `cpu_fallback` and `split_group_max_inputs`).
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

What the delegate does with each op alone (step 1's verdict, step 2's lowering) is looked up per
op in `gpu_plans`, which decides it once per distinct op: NAS candidates repeat the same ops.
"""

from __future__ import annotations

import itertools
from functools import cached_property
from itertools import repeat
from operator import attrgetter, is_

from latpred.deduce import conv_selection as cs
from latpred.deduce.cpu import cpu_kernel, lacks_bias, no_bias_refusal
from latpred.deduce.fusion import GpuNode, merge_elementwise_nodes, merge_nodes
from latpred.deduce.gpu_plans import OpEntry, OpPlan, Plans, plans_for
from latpred.deduce.kernel import Kernel
from latpred.deduce.rulesets import CPU_RULES, GPU_RULES
from latpred.deduce.prepare import first_run_time_shape
from latpred.errors import DelegateRefusedError, ShapeError
from latpred.graph import Graph
from latpred.target import Target

_PAD_INTO = ("CONV_2D", "DEPTHWISE_CONV_2D", "AVERAGE_POOL_2D", "MAX_POOL_2D")
_REASON = attrgetter("reason")


def deduce_gpu(graph: Graph, target: Target) -> list[Kernel]:
    kernels: list[Kernel] = []
    for part in gpu_parts(graph, target):
        kernels.extend(part.kernels())
    return kernels


class GpuPart:
    """One subset of the graph as it runs: on the delegate (`nodes`, its fused kernels in
    execution order, with the tensors they read and write) or op by op on the CPU."""

    __slots__ = ("graph", "ops", "nodes", "_plans", "_entries", "_cpu_rules", "_reasons")

    def __init__(self, graph, ops, nodes, plans, entries, cpu_rules, reasons):
        self.graph, self.ops, self.nodes = graph, ops, nodes
        self._plans, self._entries, self._cpu_rules = plans, entries, cpu_rules
        self._reasons = reasons

    @property
    def delegated(self) -> bool:
        return self.nodes is not None

    def kernels(self) -> list[Kernel]:
        if self.nodes is not None:
            return self._plans.kernels(self.nodes, self._entries)
        rules = self._plans.rules
        return [cpu_kernel(self.graph, i, self._cpu_rules, self._reasons[i] or (
            f"outside the largest GPU partition ({rules.label} delegates {rules.max_partitions} "
            f"partition)")) for i in self.ops]


def gpu_parts(graph: Graph, target: Target) -> list[GpuPart]:
    """The graph's subsets in execution order, each delegated (fused nodes) or on the CPU."""
    parts = _gpu_parts(graph, target)
    # kept with the graph's derived views (ops and nodes only: a part refers to the graph)
    graph._cache[_nodes_key(target)] = [(p.ops, p.nodes) for p in parts if p.delegated]
    return parts


def delegated_nodes(graph: Graph, target: Target) -> list[tuple[list[int], list[GpuNode]]]:
    """The delegated parts' ops and fused nodes, as `gpu_parts` last found them for this
    graph on this target's rules: memory-aware NAS plans the delegate's buffers over the parts
    the latency prediction deduced (`latpred.memory.gpu_delegate`)."""
    nodes = graph._cache.get(_nodes_key(target))
    if nodes is None:
        gpu_parts(graph, target)
        nodes = graph._cache[_nodes_key(target)]
    return nodes


def _nodes_key(target: Target) -> tuple:
    d = target.device
    return ("gpu_nodes", d.gpu_rules, d.cpu_rules, d.gpu, target.precision)


def _gpu_parts(graph: Graph, target: Target) -> list[GpuPart]:
    rules = GPU_RULES[target.device.gpu_rules]
    _check_static_shapes(graph, rules)
    if target.runtime == "litert":
        _check_biases(graph)
    cpu_rules = CPU_RULES[target.device.cpu_rules]
    plans = plans_for(rules, target.device.gpu, target.precision)
    entries = plans.entries(graph)
    reasons = list(map(_REASON, entries))   # C-level passes: a candidate has ~130 ops
    subsets = partition(graph, list(map(is_, reasons, repeat(None))))
    delegated = _delegated(subsets, rules.max_partitions)
    if not rules.cpu_fallback and len(delegated) < len(subsets):
        _refuse_cpu_ops(graph, rules, reasons)
    parts = [GpuPart(graph, ops, _delegate(graph, ops, plans, entries) if n in delegated
                     else None, plans, entries, cpu_rules, reasons)
             for n, (supported, ops) in enumerate(subsets)]
    if rules.split_group_max_inputs is not None:
        _check_split_groups(graph, rules, parts)
    return parts


def _check_biases(graph: Graph) -> None:
    """LiteRT's GPU accelerator did not compile a convolution without a bias (the 8 readings of
    4 bias-less CONV_2D probes, datasets/h100-gpu-memory), nor does its CPU
    (`cpu.no_bias_refusal`)."""
    for op in graph.ops:
        if lacks_bias(op):
            raise DelegateRefusedError(no_bias_refusal(graph, op))


def _check_static_shapes(graph: Graph, rules) -> None:
    """TFLite applies a delegate without kTfLiteDelegateFlagsAllowDynamicTensors (both GPU
    delegates: tflite/delegates/gpu/delegate.cc sets no such flag, nor does LiteRT's GPU
    accelerator) only to a graph whose Prepare finds no dynamic tensor; otherwise
    ModifyGraphWithDelegate fails ("Attempting to use a delegate that only supports
    static-sized tensors with a graph that has dynamic-sized tensors", tflite/core/subgraph.cc
    @ LiteRT f67457790), benchmark_model stops ("Failed to apply GPU delegate.") and LiteRT's
    CompiledModel fails. Measured: the 46 converter-style models and fixtures of
    datasets/h100-gpu-memory with TFLiteConverter's dynamic-batch RESHAPE did not compile
    (status 3), and all 51 without one did."""
    stop = first_run_time_shape(graph)
    if stop is not None:
        op = graph.ops[stop]
        raise DelegateRefusedError(
            f"The {rules.label} GPU delegate refuses this model: TFLite applies it only when "
            f"every tensor's shape is known before the model runs, and op {stop} ({op.type}) "
            f"gets its output's shape at run time (TFLiteConverter writes this for a Keras "
            f"model with a free batch size; convert with a fixed batch size).")


def _refuse_cpu_ops(graph: Graph, rules, reasons: list[str | None]) -> None:
    """A rule set without CPU fallback (see `GpuRuleSet.cpu_fallback`) takes the model whole or
    not at all."""
    left = [i for i, r in enumerate(reasons) if r is not None]
    i = left[0]
    raise DelegateRefusedError(
        f"The {rules.label} GPU accelerator alone runs a model only when it takes every op, "
        f"and {len(left)} of {len(graph.ops)} ops would be left for the CPU (op {i}, "
        f"{graph.ops[i].type}: {reasons[i]}).")


def _check_split_groups(graph: Graph, rules, parts: list[GpuPart]) -> None:
    """A grouped convolution the delegate splits into groups of more input channels than
    `rules.split_group_max_inputs` crashes the runtime (see the rule set)."""
    for part in parts:
        for node in part.nodes or ():
            if node.part != "group_split":
                continue
            op = graph.ops[node.ops[0]]
            per_group = graph.tensors[op.inputs[1]].shape[-1]
            if per_group > rules.split_group_max_inputs:
                raise DelegateRefusedError(
                    f"The {rules.label} GPU accelerator crashes on this model: op "
                    f"{node.ops[0]}, a convolution of {len(node.outputs)} groups with "
                    f"{per_group} input channels each, is split into one convolution a group, "
                    f"whose weights the delegate copies into a buffer of "
                    f"{rules.split_group_max_inputs} values (ResolveGroupedConvolution).")


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


def _delegate(graph: Graph, ops: list[int], plans: Plans, entries: list[OpEntry]
              ) -> list[GpuNode]:
    """The fused nodes of one delegated subset, after the delegate's passes and fusion."""
    lowering = _Lowering(graph, ops, plans, entries)
    nodes = lowering.run()
    blocked = lowering.blocked()
    if plans.rules.merge_elementwise:
        nodes = merge_elementwise_nodes(nodes, blocked)
    return merge_nodes(nodes, blocked, first_output=plans.rules.link_first_output)


class _Lowering:
    """Turns the ops of one delegated subset into GpuNodes (one use, then discarded)."""

    def __init__(self, graph: Graph, ops: list[int], plans: Plans, entries: list[OpEntry]):
        self.graph, self.ops, self.plans, self.entries = graph, ops, plans, entries
        self.whole = len(ops) == len(graph.ops)  # the common case: one subset, the whole graph
        self.alias: dict[int, int] = {}
        self.pads: dict[int, int] = {}  # consumer op -> the PAD op merged into it
        self.producer_node: dict[int, GpuNode] = {}
        self.fresh = itertools.count(-1, -1)

    @cached_property
    def opset(self) -> set[int]:
        return set(self.ops)

    @cached_property
    def written_by(self) -> dict[int, int]:
        """Tensor -> the op of the subset that writes it (not for the whole graph: `writer`)."""
        return {t: i for i in self.ops for t in self.graph.ops[i].outputs}

    def writer(self, t: int) -> int:
        """The op of the subset that writes tensor t, or -1. For the whole graph its producer,
        asked per tensor: a chained graph looks it up in its parts' maps."""
        if self.whole:
            p = self.graph.producer(t)
            return -1 if p is None else p
        return self.written_by.get(t, -1)

    def resolve(self, t: int) -> int:
        while t in self.alias:
            t = self.alias[t]
        return t

    def blocked(self) -> set[int]:
        """Tensors read outside the subset or returned by the graph."""
        g = self.graph
        if self.whole:  # only the graph's outputs leave it
            return {self.resolve(t) for t in g.outputs}
        out, consumers, opset = set(g.outputs), g.consumers, self.opset
        return {self.resolve(t) for i in self.ops for t in g.ops[i].outputs
                if t in out or any(c not in opset for c in consumers.get(t, ()))}

    def run(self) -> list[GpuNode]:
        nodes: list[GpuNode] = []
        graph, plans, entries, alias, producer_node = self.graph, self.plans, self.entries, \
            self.alias, self.producer_node
        for i in self.ops:
            entry = entries[i]
            plan = entry.plan or plans.plan(graph, i, entry)
            # Most ops: one node reading the op's own tensors (none renamed by a graph pass).
            if plan.plain and alias.keys().isdisjoint(entry.ins):
                node = GpuNode(plan.type, (i,), entry.ins, entry.outs, plan.shape,
                               plan.linkable, plan.rule)
                nodes.append(node)
            else:
                new = self._lower(entry, plan, i)
                if not new:
                    continue
                nodes += new
                node = new[-1]
            for t in entry.outs:  # lookups read graph tensors only, which the last node writes
                producer_node[t] = node
        return nodes

    def _merge_pad(self, i: int) -> bool:
        """MergePaddingWith2DOperation: zero PAD `i` merges into the convolution or pooling that
        is its only reader (which comes after it: its entry in `pads` is ready by then)."""
        g, op = self.graph, self.graph.ops[i]
        users = g.consumers_of(op.outputs[0])
        if len(users) != 1 or users[0] not in self.opset or op.outputs[0] in g.outputs:
            return False
        user = g.ops[users[0]]
        if user.type in _PAD_INTO and user.inputs[0] == op.outputs[0]:
            self.pads[users[0]] = i
            self.alias[op.outputs[0]] = op.inputs[0]
            return True
        return False

    def _absorb_identity_reshape(self, i: int) -> bool:
        """RemoveIdentityReshape: a kernel writes the reshape's input, whose consumers read it
        directly."""
        op = self.graph.ops[i]
        src = self.resolve(op.inputs[0])
        node = self.producer_node.get(src)
        if node is None:
            return False
        node.ops += (i,)
        self.alias[op.outputs[0]] = src
        return True

    def _lower(self, entry: OpEntry, plan: OpPlan, i: int) -> list[GpuNode]:
        """The nodes of op `i`; none when a graph pass removes it."""
        if plan.zero_pad and self._merge_pad(i):
            return []
        if plan.identity_reshape and self._absorb_identity_reshape(i):
            return []
        ins = tuple([self.resolve(t) for t in entry.ins]) if self.alias else entry.ins
        if plan.conv is not None:
            geom, choice = plan.conv
            new = self._conv_nodes(i, choice, geom, ins, entry.outs, plan.shape)
        else:
            if plan.reorder:
                ins = self._latest_first(ins)
            new = [GpuNode(plan.type, (i,), ins, entry.outs, plan.shape, plan.linkable,
                           plan.rule)]
        if i in self.pads:
            new[0].ops += (self.pads[i],)
            new[0].rule += f"; zero padding of PAD#{self.pads[i]} merged in"
        return new

    def _latest_first(self, ins: tuple[int, ...]) -> tuple[int, ...]:
        """IsAssociativeLinkableOp: without broadcasting, read the last-written input first."""
        written = [self.writer(t) for t in ins]
        latest = max(range(len(ins)), key=lambda k: (written[k], -k))
        order = list(ins)
        order[0], order[latest] = order[latest], order[0]
        return tuple(order)

    def _conv_nodes(self, i: int, choice: cs.ConvChoice, geom: cs.ConvGeom, ins: tuple[int, ...],
                    outs: tuple[int, ...], shape: tuple[int, ...], part: str = "") -> list[GpuNode]:
        if choice.kind == "winograd":
            tiles = -(-geom.out_h // 4) * -(-geom.out_w // 4)
            a, b = next(self.fresh), next(self.fresh)
            sa, sb = (geom.batch, 36, tiles, geom.cin), (geom.batch, 36, tiles, geom.cout)
            pre = f"{part}_" if part else ""
            return [GpuNode("winograd_input_transform", (i,), ins, (a,), sa, False, choice.rule,
                            pre + "input_transform"),
                    GpuNode("winograd_matmul", (i,), (a,), (b,), sb, False, choice.rule,
                            pre + "matmul"),
                    GpuNode("winograd_output_transform", (i,), (b,), outs, shape, False,
                            choice.rule, pre + "output_transform")]
        if choice.kind != "split_groups":
            return [GpuNode(choice.kind, (i,), ins, outs, shape, False, choice.rule, part)]
        parts = tuple(next(self.fresh) for _ in range(geom.groups))
        nodes = [GpuNode("split", (i,), ins, parts, shape, False, choice.rule, "group_split")]
        results = []
        sub = cs.ConvGeom(geom.batch, geom.in_h, geom.in_w, geom.src_group_size,
                          geom.dst_group_size, geom.kh, geom.kw, geom.out_h, geom.out_w,
                          geom.stride, geom.dilation, 1, geom.padded)
        for k, t in enumerate(parts):
            results.append(next(self.fresh))
            per = cs.ConvChoice(choice.per_group.kind,
                                f"{choice.per_group.rule}; group {k} of {choice.rule}")
            nodes += self._conv_nodes(i, per, sub, (t,), (results[-1],),
                                      shape[:3] + (geom.dst_group_size,), f"group{k}")
        nodes.append(GpuNode("concat", (i,), tuple(results), outs, shape, False, choice.rule,
                             "group_concat"))
        return nodes
