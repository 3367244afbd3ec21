"""Rule sets per runtime version; a device profile names the one its runtime follows.

A GPU rule set fixes which ops the delegate accepts, which it links, how it picks convolution
kernels and how its graph passes behave. A CPU rule set fixes which ops TFLite spreads over
threads. Adding a runtime version means adding an entry here, citing its source.
"""

from __future__ import annotations

from dataclasses import dataclass

from latpred.deduce import conv_selection as cs
from latpred.deduce import gpu_support as gs


@dataclass(frozen=True, eq=False)  # registry singletons: identity equality keeps hashing cheap
class GpuRuleSet:
    """How one GPU delegate version turns a graph into kernels.

    - `max_partitions`: how many GPU partitions the delegate takes (the largest first); None for
      all of them.
    - `associative_reorder`: ADD/MUL put their most recently written input first before linking
      (IsAssociativeLinkableOp in ConvertOperations, common/gpu_model.cc).
    - `merge_elementwise`: ML Drift's MergeElementwiseNodes pass, which fuses element-wise ops
      with each other before linking them into their producer (ml_drift/common/merge_nodes.cc).
    - `link_first_output`: ML Drift's LinkNodes links through the first output of a node that
      has several (a SPLIT's first part); TFLite 2.9's MergeNodes refuses such nodes.
    - `conv_as_fc`, `grouped_as_depthwise`: convolution rewrites of the ML Drift frontend.
    - `spatial_mean_only`: MEAN is accepted only over height and width.
    - `cpu_fallback`: ops the delegate does not take run on TFLite's CPU kernels; without it
      a model the delegate does not take whole is refused (`gpu.gpu_parts`).
    - `split_group_max_inputs`: a grouped convolution split into per-group convolutions
      crashes the runtime when a group has more input channels than this (None: no limit).
    """

    name: str
    label: str
    supported: frozenset[str]
    linkable: frozenset[str]
    winograd: cs.WinogradRule
    max_partitions: int | None
    associative_reorder: bool
    merge_elementwise: bool
    link_first_output: bool
    conv_as_fc: bool
    grouped_as_depthwise: bool
    spatial_mean_only: bool
    cpu_fallback: bool
    split_group_max_inputs: int | None


@dataclass(frozen=True, eq=False)  # registry singletons, hashed per kernel by deduce_cpu's cache
class CpuRuleSet:
    """A CPU runtime: its name for explanations and the op types it runs on several threads."""

    name: str
    label: str
    multithreaded: frozenset[str]
    # A CONV_2D whose groups each read and write one channel (Keras 3 writes ConvNeXt's 7x7
    # depthwise convolution that way) runs as a depthwise convolution: XNNPACK's
    # create_convolution2d_nhwc picks its dwconv microkernels when group_input_channels == 1,
    # group_output_channels == 1 and groups > 1 (google/XNNPACK src/operators/convolution-nhwc.c).
    channelwise_as_depthwise: bool = False
    # A zero PAD of height/width read only by a convolution is folded into the convolution's
    # padding: XNNPACK's xnn_subgraph_fusion (google/XNNPACK src/subgraph.c) turns static
    # constant pad + convolution_2d / depthwise_convolution_2d into one node, so the PAD costs
    # nothing (the in-context profiler reads 0 for it).
    fuses_pad: bool = False
    # 8-bit quantized ops the XNNPACK delegate declines run as TFLite's builtin integer kernels,
    # single-threaded, as `builtin_<type>` kernels (`latpred.deduce.xnnpack_int8`).
    int8_declines: bool = False
    # A depthwise convolution (or a CONV_2D with one channel per group, above) runs with a
    # depthwise microkernel only when each group reads one channel and writes one and its
    # kernel has at most this many taps (kernel_h * kernel_w); any other one runs as a grouped
    # IGEMM, the `dwconv2d_igemm` kernel type (0: no such rule). XNNPACK's
    # select_microkernel_type picks xnn_microkernel_type_dwconv when group_input_channels == 1,
    # group_output_channels == 1 and find_dwconv_ukernel found a unipass dwconv config whose
    # primary_tile >= kernel_size, else xnn_microkernel_type_igemm; the f32 configs' largest
    # primary tile is 25 (3/4/9/25), and qs8_qc8w's (3/9/25), on x86 and ARM
    # (google/XNNPACK src/operators/convolution-nhwc.c select_microkernel_type and
    # find_dwconv_ukernel, src/configs/dwconv-config.c; the same from 206ca4e151, 2025-10-22, to
    # b0db58b43, 2026-08-14, the day of LiteRT 2.3.0's version bump; multipass dwconv, which
    # took any size, was removed in 1994a019c9, 2025-02). Checked against LiteRT 2.3.0's
    # profiler: tests/test_deduce_dwconv_igemm_litert.py.
    dwconv_max_taps: int = 0


GPU_RULES: dict[str, GpuRuleSet] = {
    # TFLite 2.9 GPU delegate (OpenCL on Android, Metal on iOS): the rules of the paper.
    # max_partitions=1: TfLiteGpuDelegateOptionsV2Default sets max_delegated_partitions = 1, and
    # GetOpsToReplace keeps GetNodesOfFirstNLargestPartitions(1)
    # (tensorflow/lite/delegates/gpu/common/model_builder.cc).
    "tflite-2.9": GpuRuleSet(
        name="tflite-2.9", label="TFLite 2.9", supported=gs.TFLITE_29_OPS,
        linkable=gs.TFLITE_29_LINKABLE, winograd=cs.winograd_tflite29, max_partitions=1,
        associative_reorder=True, merge_elementwise=False, link_first_output=False,
        conv_as_fc=False, grouped_as_depthwise=False, spatial_mean_only=True,
        cpu_fallback=True, split_group_max_inputs=None),
    # LiteRT 2.x GPU accelerator, i.e. ML Drift over WebGPU/Vulkan/OpenCL/Metal (ai-edge-litert
    # 2.3.0 ships libLiteRtWebGpuAccelerator.so); every GPU partition is delegated. latpred
    # compiles for the GPU accelerator alone (profile/litert_gpu.py), and then LiteRT refuses a
    # model with ops left for the CPU (litert/runtime/compiled_model.cc @ f67457790, "Some ops
    # are not accelerated", kLiteRtStatusErrorCompilation): no CPU fallback. Measured: the four
    # ShuffleNetV2 (5-D channel shuffles) failed with status 504 in the latency and the memory
    # campaigns, and every model the rules delegate whole compiled.
    # split_group_max_inputs=4: ResolveGroupedConvolution (LiteRT ml_drift_delegate/tflite/
    # model_builder.cc @ f67457790) gives each group's weights the shape (O, 0, 0, 0) (it sets
    # only `shape.o`; ml_drift/common/shape.h zero-initialises the rest), so their buffer holds
    # XNN_EXTRA_BYTES / 4 = 4 floats, and copying more input channels a group overruns it.
    # Measured: SIGILL on all 33 synthetic models of datasets/h100-gpu-synthetic with 8 to 56
    # input channels a split group and on 12 probes with 7; none of the 33 with 4 crashed.
    "litert-2.3-mldrift": GpuRuleSet(
        name="litert-2.3-mldrift", label="LiteRT 2.3 ML Drift", supported=gs.MLDRIFT_OPS,
        linkable=gs.MLDRIFT_LINKABLE, winograd=cs.winograd_mldrift, max_partitions=None,
        associative_reorder=True, merge_elementwise=True, link_first_output=True,
        conv_as_fc=True, grouped_as_depthwise=True, spatial_mean_only=False,
        cpu_fallback=False, split_group_max_inputs=4),
}

CPU_RULES: dict[str, CpuRuleSet] = {
    # Section 3.1.1 of the operation-wise paper: with TFLite 2.9 on phones only convolution,
    # depthwise convolution and fully connected layers speed up with more threads.
    "tflite-2.9-cpu": CpuRuleSet(
        name="tflite-2.9-cpu", label="TFLite 2.9 CPU",
        multithreaded=frozenset({"CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED"})),
    # LiteRT with XNNPACK: XNNPACK operators run their loops through pthreadpool
    # (xnn_run_operator -> pthreadpool_parallelize_*), so matrix, pooling, element-wise,
    # reduction and data-movement operators are all parallel; ops XNNPACK does not take (it
    # declines e.g. SPLIT_V and some MEANs) fall back to TFLite's single-threaded kernels.
    "litert-xnnpack": CpuRuleSet(
        name="litert-xnnpack", label="LiteRT XNNPACK",
        multithreaded=frozenset({
            "CONV_2D", "DEPTHWISE_CONV_2D", "FULLY_CONNECTED", "BATCH_MATMUL", "TRANSPOSE_CONV",
            "AVERAGE_POOL_2D", "MAX_POOL_2D", "MEAN", "ADD", "SUB", "MUL", "DIV", "MAXIMUM",
            "MINIMUM", "SQUARED_DIFFERENCE", "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU",
            "LOGISTIC", "TANH", "HARD_SWISH", "ELU", "GELU", "SOFTMAX", "PAD", "CONCATENATION",
            "SPLIT", "TRANSPOSE", "RESIZE_BILINEAR", "QUANTIZE", "DEQUANTIZE", "ABS", "NEG",
            "SQRT", "SQUARE", "RSQRT", "EXP", "PRELU"}),
        channelwise_as_depthwise=True, fuses_pad=True, int8_declines=True,
        dwconv_max_taps=25),
}


@dataclass(frozen=True, eq=False)  # registry singletons
class CudaRuleSet:
    """A CUDA runtime (PyTorch eager on cuDNN/cuBLAS): what each op launches is
    `latpred.deduce.cuda`'s rules; `label` names the runtime in explanations."""

    name: str
    label: str


CUDA_RULES: dict[str, CudaRuleSet] = {
    # PyTorch 2.11 eager, channels_last, cuDNN heuristics (cudnn.benchmark off), on the H100;
    # checked against torch.profiler kernel lists (datasets/h100-cuda-*, tests/test_cuda_deduce.py).
    "pytorch-cuda": CudaRuleSet(name="pytorch-cuda", label="PyTorch CUDA (cuDNN)"),
}
