"""A 4-element-per-thread copy in and out with tiled copies predicated on index < 100: the one
shape of kernel that drop_copy_pred acts on (cute.copy with pred=). Imports the DSL."""

import cutlass
import cutlass.cute as cute

N = 100


@cute.kernel
def kernel(x: cute.Tensor, y: cute.Tensor):
    tid, _, _ = cute.arch.thread_idx()
    atom = cute.make_copy_atom(cute.nvgpu.CopyUniversalOp(), cutlass.Float32)
    r = cute.make_rmem_tensor((4,), cutlass.Float32)
    pred = cute.make_rmem_tensor((4,), cutlass.Boolean)
    for i in cutlass.range_constexpr(4):
        pred[i] = tid * 4 + i < N
    cute.copy(atom, cute.local_tile(x, (4,), (tid,)), r, pred=pred)
    cute.copy(atom, r, cute.local_tile(y, (4,), (tid,)), pred=pred)


@cute.jit
def host(x: cute.Tensor, y: cute.Tensor):
    kernel(x, y).launch(grid=(1, 1, 1), block=(32, 1, 1))
