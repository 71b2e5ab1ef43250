"""exec target without a GPU: compiles kernels/tma_stream.py for sm_90a and prints the Python
names of the kernels the compiled function was tagged with, and whether launches go through
cutedebug's launch wrapper (where a launch is noted for the exit query): before any trace, and
the compiled function's class after."""

import os
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path[:0] = [os.path.join(ROOT, "kernels")]

import cutlass.cute as cute  # noqa: E402
from cutlass.base_dsl.jit_executor import JitCompiledFunction  # noqa: E402
from tma_stream import TmaStream  # noqa: E402

# a @cute.jit function called directly launches inside its first trace: wrapped before it
early = getattr(JitCompiledFunction.run_compiled_program, "_cutedebug_gpu_guarded", False)
print(f"launch wrapped before any trace {early}")

kernel = TmaStream(m=256, n=512)
compiled = cute.compile[cute.GPUArch("sm_90a")](kernel, *kernel.fake_args())
wrapped = getattr(type(compiled).__call__, "_cutedebug_gpu_guarded", False)
print(f"kernels {getattr(compiled, '_cutedebug_kernels', None)} launch wrapped {wrapped}")
