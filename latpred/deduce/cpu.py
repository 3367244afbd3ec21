"""The CPU path: one operation is one kernel, with its fused activation inside it (but a zero
PAD folded into the convolution after it, and an 8-bit element-wise chain XNNPACK runs as one
table lookup).

TFLite runs a model's operations one after another; threads only split the work of a single
operation, and only for the op types the runtime parallelises (section 3.1.1 of the
operation-wise paper). Each kernel records whether its op is one of those.

A CPU kernel is fixed by its op's position, op type and kernel type, so kernels are shared
(Kernel is immutable): candidates of one NAS space hold the same (index, type) pairs, and
scoring 10,000 of them then allocates almost no new kernels - building ~300,000 of them, and
the garbage collections that many new objects trigger, took half of `predict_many`'s time.
"""

from __future__ import annotations

from functools import lru_cache

from latpred.deduce import xnnpack_int8 as xi
from latpred.deduce.kernel import BUILTIN_PREFIX, KERNEL_TYPES, Kernel, base_type
from latpred.deduce.optypes import TENSOR_DEPENDENT, channelwise, kernel_type, spatial_zero_pad
from latpred.deduce.rulesets import CpuRuleSet
from latpred.errors import UnsupportedModelError
from latpred.graph import Graph


def cpu_kernel(graph: Graph, index: int, rules: CpuRuleSet, why: str = "") -> Kernel:
    """The kernel of op `index` on the CPU; `why` says why a GPU target runs it there."""
    op = graph.ops[index]
    return _kernel(_cpu_type(graph, op, rules), index, op.type, rules, why)


def deduce_cpu(graph: Graph, rules: CpuRuleSet, precision: str | None = None) -> list[Kernel]:
    """Every operation of `graph`, in execution order, as one CPU kernel (a zero PAD that the
    runtime folds into the convolution after it belongs to that convolution's kernel).

    `precision` is the target's: an fp32 graph deduced for int8 is taken as the int8 model it
    will be written as (for `rules.int8_declines`)."""
    whys = _builtin_whys(graph, rules, precision)
    # XNNPACK folds a PAD only into a convolution it runs itself.
    folded = {c: p for c, p in _folded_pads(graph).items() if not (whys and whys[c])} \
        if rules.fuses_pad else {}
    skip = set(folded.values())
    luts = _lut_chains(graph, whys)
    for chain in luts.values():
        skip.update(chain[1:])
    plain = _plain_kernels(rules)
    kernels = []
    for i, (op, ktype) in enumerate(zip(graph.ops, _cpu_types(graph, rules))):
        if i in skip:
            continue
        if i in luts:
            kernels.append(_lut(luts[i], tuple(graph.ops[j].type for j in luts[i]), rules))
        elif whys and whys[i]:
            kernels.append(_builtin(_builtin_type(ktype), i, op.type, rules, whys[i]))
        elif i in folded:
            kernels.append(_with_pad(ktype, i, folded[i], op.type, rules))
        else:   # the common case: a dict of (type, index, op type), not _kernel's lru key
            key = (ktype, i, op.type)
            k = plain.get(key)
            if k is None:
                k = plain[key] = _kernel(ktype, i, op.type, rules, "")
            kernels.append(k)
    return kernels


@lru_cache(maxsize=16)
def _plain_kernels(rules: CpuRuleSet) -> dict[tuple[str, int, str], Kernel]:
    """The kernels made so far for `rules`, by (kernel type, op index, op type): hashing the
    rule set once per graph instead of once per op (its dataclass hash is Python code)."""
    return _Bounded()


class _Bounded(dict):
    """A dict that starts again past `_kernel`'s cache size (a NAS space holds far fewer)."""

    def __setitem__(self, key, value) -> None:
        if len(self) >= 1 << 16:
            self.clear()
        super().__setitem__(key, value)


def _builtin_whys(graph: Graph, rules: CpuRuleSet, precision: str | None
                  ) -> list[str | None] | None:
    """Per op, why it runs as TFLite's builtin kernel ("": XNNPACK runs it on 8-bit tensors;
    None: not quantized); None when no op is quantized (a float graph on a float target, the
    common case, told from its tensors at once)."""
    if not rules.int8_declines or not xi.may_quantize(graph, precision):
        return None
    return [_builtin_why(graph, op, rules, precision) for op in graph.ops]


def _lut_chains(graph: Graph, whys: list[str | None] | None) -> dict[int, tuple[int, ...]]:
    """First op -> the chain of 8-bit element-wise ops XNNPACK runs as one table lookup
    (`xnnpack_int8.lut_chains`); none in a float graph on a float target."""
    if whys is None:
        return {}
    return {chain[0]: chain for chain in xi.lut_chains(graph, [w == "" for w in whys])}


@lru_cache(maxsize=1 << 12)
def _lut(chain: tuple[int, ...], op_types: tuple[str, ...], rules: CpuRuleSet) -> Kernel:
    # An activation kernel: XNNPACK runs 8-bit unary ops (LOGISTIC, TANH) as the same lookup
    return Kernel("activation", chain, "cpu", f"activation: {' -> '.join(op_types)} on 8-bit "
                  f"tensors fused into one table lookup, multithreaded ({rules.label}; "
                  "XNNPACK's xnn_subgraph_fuse_unary_quantized_into_lut)", True)


def _cpu_types(graph: Graph, rules: CpuRuleSet) -> list[str]:
    """Per op, its kernel type; looked up once per op type, but for the op types whose kernel
    type depends on their tensors (a NAS candidate has ~150 ops of ~10 types)."""
    of_type: dict[str, str] = {}
    out = []
    for op in graph.ops:
        ktype = of_type.get(op.type)
        if ktype is None:
            ktype = _cpu_type(graph, op, rules)
            if op.type not in _TENSOR_DEPENDENT:
                of_type[op.type] = ktype
        out.append(ktype)
    return out


def _builtin_why(graph: Graph, op, rules: CpuRuleSet, precision: str | None) -> str | None:
    """Why a quantized op runs as TFLite's builtin kernel ("" when XNNPACK runs it, None when
    the op is not quantized)."""
    if not rules.int8_declines or not xi.quantized(graph, op, precision):
        return None
    why = xi.declined(graph, op)
    return why if why and _builtin_type(_cpu_type(graph, op, rules)) in KERNEL_TYPES else ""


def _builtin_type(ktype: str) -> str:
    """The type of TFLite's builtin kernel for an op XNNPACK would run as `ktype` (TFLite has one
    depthwise kernel: `dwconv2d_igemm` -> `builtin_dwconv2d`)."""
    return BUILTIN_PREFIX + base_type(ktype)


def _folded_pads(graph: Graph) -> dict[int, int]:
    """Convolution op -> the zero PAD of H/W it reads and nothing else reads."""
    folded = {}
    for i, op in enumerate(graph.ops):
        if op.type != "PAD" or not spatial_zero_pad(graph, op) or op.outputs[0] in graph.outputs:
            continue
        readers = graph.consumers_of(op.outputs[0])
        if len(readers) == 1 and graph.ops[readers[0]].type in ("CONV_2D", "DEPTHWISE_CONV_2D") \
                and graph.ops[readers[0]].inputs[0] == op.outputs[0]:
            folded[readers[0]] = i
    return folded


@lru_cache(maxsize=1 << 12)
def _with_pad(ktype: str, index: int, pad: int, op_type: str, rules: CpuRuleSet) -> Kernel:
    k = _kernel(ktype, index, op_type, rules, "")
    return Kernel(ktype, (index, pad), "cpu", f"{k.rule}; the zero PAD before it is folded into "
                  "its padding (XNNPACK subgraph fusion)", k.multithreaded)


# Op types whose CPU kernel type depends on their tensors (a depthwise convolution's taps).
_TENSOR_DEPENDENT = TENSOR_DEPENDENT | {"DEPTHWISE_CONV_2D"}


def _cpu_type(graph: Graph, op, rules: CpuRuleSet) -> str:
    if lacks_bias(op):
        raise UnsupportedModelError(no_bias_refusal(graph, op))
    ktype = kernel_type(graph, op)
    if ktype == "grouped_conv2d" and rules.channelwise_as_depthwise and \
            channelwise(graph, op):
        ktype = "dwconv2d"
    if ktype == "dwconv2d" and rules.dwconv_max_taps and \
            not dw_microkernel(graph, op, rules.dwconv_max_taps):
        return "dwconv2d_igemm"
    return ktype


_CONVOLUTIONS = frozenset({"CONV_2D", "DEPTHWISE_CONV_2D"})


def lacks_bias(op) -> bool:
    """A convolution whose bias input is absent (two inputs) or optional (-1): LiteRT does not
    run it (`no_bias_refusal`)."""
    return op.type in _CONVOLUTIONS and (len(op.inputs) < 3 or op.inputs[2] < 0)


def no_bias_refusal(graph: Graph, op) -> str:
    """Why LiteRT does not run (or latpred cannot predict) a convolution without a bias.

    XNNPACK takes a convolution only with three inputs and a bias tensor (VisitConv2DNode,
    VisitDepthwiseConv2DNode: CheckNumInputsAndOutputs(..., 3, 1, ...), then `bias_tensor_id <
    0` is an error; tflite/delegates/xnnpack/xnnpack_delegate.cc @ LiteRT f67457790), so
    TFLite's builtin kernel gets it, whose Prepare refuses a CONV_2D without one
    (tflite/kernels/conv.cc: TF_LITE_ENSURE(context, has_bias)) and an absent third input of a
    DEPTHWISE_CONV_2D (depthwise_conv.cc reads input 2 when there are three). LiteRT's GPU
    accelerator failed to compile every bias-less CONV_2D probe (four 1x1 convolutions whose
    bias input is -1, in fp16 and fp32: the smallnb_* rows of datasets/h100-gpu-memory). A
    DEPTHWISE_CONV_2D with two inputs does run, on the builtin kernel, which latpred has not
    measured."""
    i = graph.ops.index(op)
    name = graph.tensors[op.outputs[0]].name if op.outputs else ""
    fix = "TFLiteConverter writes a zero bias instead: re-export the model, or add one"
    if op.type == "DEPTHWISE_CONV_2D" and len(op.inputs) == 2:
        return (f"Op {i} ({op.type}, {name!r}) has no bias: XNNPACK declines it, so LiteRT "
                f"runs it on TFLite's builtin kernel, which latpred has no measurements of; "
                f"{fix}.")
    return (f"LiteRT cannot run this model: op {i} ({op.type}, {name!r}) has no bias tensor, "
            f"which TFLite's kernel requires (tflite/kernels/"
            f"{'conv' if op.type == 'CONV_2D' else 'depthwise_conv'}.cc Prepare); {fix}.")


def dw_microkernel(graph: Graph, op, max_taps: int) -> bool:
    """Whether XNNPACK runs depthwise `op` (DEPTHWISE_CONV_2D, or a CONV_2D with one channel per
    group) with a depthwise microkernel: each group writes one channel and the kernel has at
    most `max_taps` taps (`CpuRuleSet.dwconv_max_taps`); else it is a grouped IGEMM."""
    w = graph.tensors[op.inputs[1]].shape   # [1, kh, kw, C*m] or [C*m, kh, kw, 1]
    if len(w) != 4 or w[1] * w[2] > max_taps:
        return False
    out_c = w[3] if op.type == "DEPTHWISE_CONV_2D" else w[0]
    return out_c == graph.tensors[op.inputs[0]].shape[-1]   # depth multiplier 1


@lru_cache(maxsize=1 << 12)
def _builtin(ktype: str, index: int, op_type: str, rules: CpuRuleSet, why: str) -> Kernel:
    return Kernel(ktype, (index,), "cpu", f"{ktype}: int8 {op_type} on TFLite's builtin kernel, "
                  f"single-threaded ({rules.label}): XNNPACK declines it: {why}", False)


@lru_cache(maxsize=1 << 16)
def _kernel(ktype: str, index: int, op_type: str, rules: CpuRuleSet, why: str) -> Kernel:
    threaded = op_type in rules.multithreaded
    rule = (f"{ktype}: {op_type} on the CPU, "
            f"{'multithreaded' if threaded else 'single-threaded'} ({rules.label})")
    if ktype == "dwconv2d_igemm":
        rule = (f"{rule}; a grouped IGEMM: no depthwise microkernel takes more than "
                f"{rules.dwconv_max_taps} taps or a depth multiplier above 1")
    if why:
        rule = f"{rule}; CPU fallback: {why}"
    return Kernel(ktype, (index,), "cpu", rule, threaded)
