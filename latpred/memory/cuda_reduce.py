"""MEAN's scratch on CUDA: the global-reduction buffer and semaphores PyTorch's reduction kernel
allocates through the caching allocator when it splits one output's inputs across blocks.

Ported from aten/src/ATen/native/cuda/Reduce.cuh (`setReduceConfig`, `ReduceConfig::
set_block_dimension`, `global_memory_size`, `semaphore_size`, `get_output_vec_size`;
`gpu_reduce_kernel` allocates `global_memory_size()` then `semaphore_size()` bytes and frees
both after the launch) and the TensorIterator layout of a reduction
(aten/src/ATen/TensorIterator.cpp: `reorder_dimensions` puts the reduced dimensions first and
orders the rest by stride, `coalesce_dimensions` merges neighbours whose strides chain). MEAN
runs `mean_kernel_cuda` with a float accumulator (`arg_t`, 4 bytes) for fp16 and fp32, vt0 = 4.
The GPU's figures enter: 132 SMs and 2,048 threads per SM on the H100.
"""

from __future__ import annotations

from functools import lru_cache

MAX_NUM_THREADS = 512
WARP = 32
ARG_BYTES = 4          # sizeof(arg_t): float accumulation for half and float
VT0 = 4
INPUT_VEC = 4


def _last_pow2(n: int) -> int:
    """floor to a power of two (at least 1), as `last_pow2`."""
    return max(1, 1 << (int(n).bit_length() - 1)) if n > 0 else 1


def _div_up(a: int, b: int) -> int:
    return (a + b - 1) // b


def _iter_dims(shape: tuple[int, ...], axes: tuple[int, ...]):
    """(sizes, input strides, output strides), innermost first, after the reduction
    TensorIterator's reorder and coalesce, for a contiguous input."""
    rank = len(shape)
    axes = {a % rank for a in axes} if rank else set()
    in_strides, acc = [0] * rank, 1
    for d in range(rank - 1, -1, -1):
        in_strides[d], acc = acc, acc * shape[d]
    out_shape = [1 if d in axes else shape[d] for d in range(rank)]
    out_strides, acc = [0] * rank, 1
    for d in range(rank - 1, -1, -1):
        out_strides[d], acc = (0 if d in axes else acc), acc * out_shape[d]
    # innermost first; reduced dimensions first (stable within each group)
    order = list(range(rank - 1, -1, -1))
    order = [d for d in order if d in axes] + [d for d in order if d not in axes]
    dims = [[shape[d], in_strides[d], out_strides[d], d in axes] for d in order]
    out: list[list] = []
    for dim in dims:
        if dim[0] == 1:
            continue
        if out:
            prev = out[-1]
            if prev[3] == dim[3] and dim[1] == prev[0] * prev[1] and \
                    dim[2] == prev[0] * prev[2]:
                prev[0] *= dim[0]
                continue
        out.append(dim)
    return out


@lru_cache(maxsize=1 << 12)
def reduce_scratch(shape: tuple[int, ...], axes: tuple[int, ...], elem: int,
                   sm_count: int = 132, threads_per_sm: int = 2048) -> tuple[int, ...]:
    """Bytes of (global buffer, semaphores) a CUDA mean over `axes` allocates, or ()."""
    dims = _iter_dims(tuple(shape), tuple(axes))
    numel = 1
    for s in shape:
        numel *= s
    if not dims:
        return ()
    n_red = sum(1 for d in dims if d[3])
    num_outputs = 1
    for d in dims:
        if not d[3]:
            num_outputs *= d[0]
    inputs_per_output = numel // max(1, num_outputs)
    ndim = len(dims)
    on_fastest = n_red == ndim or (dims[0][1] < dims[n_red][1])
    if on_fastest:
        dim0, dim1, fastest = inputs_per_output, num_outputs, dims[0][1]
    else:
        dim0, dim1, fastest = num_outputs, inputs_per_output, dims[n_red][1]
    output_vec = 1
    if fastest == 1:
        if on_fastest and dim0 > 128 and n_red == 1 and VT0 >= INPUT_VEC:
            dim0 //= INPUT_VEC
        elif not on_fastest:
            vec = 4
            for n in [dims[n_red][0]] + [d[1] for j, d in enumerate(dims) if j != n_red]:
                while n % vec:
                    vec //= 2
            output_vec = vec
            dim0 //= output_vec
    max_threads = MAX_NUM_THREADS // output_vec
    d0 = _last_pow2(dim0) if dim0 < max_threads else max_threads
    d1 = _last_pow2(dim1) if dim1 < max_threads else max_threads
    bw = min(d0, WARP)
    bh = min(d1, max_threads // bw)
    bw = min(d0, max_threads // bh)
    num_threads = bw * bh
    step_in = step_out = 1
    block_x_reduce = False
    if on_fastest:
        step_in *= bw
        block_x_reduce = True
    else:
        step_out *= bw
    vpt = _div_up(inputs_per_output, step_in)
    split_y = False
    if vpt >= bh * 16 or vpt >= 256:
        step_in *= bh
        split_y = True
    else:
        step_out *= bh
    target = sm_count * (threads_per_sm // num_threads)
    grid = _div_up(num_outputs // output_vec, step_out)
    vpt = _div_up(inputs_per_output, step_in)
    if not (split_y and vpt >= 256 and grid <= target):
        return ()
    ctas = max(min(_div_up(target, grid), _div_up(vpt, 16)), _div_up(vpt, 256))
    if ctas <= 1:
        return ()
    size = ARG_BYTES * num_outputs * ctas
    if not block_x_reduce:
        size *= bw * output_vec
    return (size, 4 * grid)
