"""GPU check of cutedebug probes (run on an sm_90 machine; prints "no GPU" and exits 0 elsewhere).

    .venv/bin/python tools/gpu_check_probes.py [--budget-ms 200] [--bench]

1. kernels/minimal.py with spin_hang=True under probes: every warp waits on an mbarrier nobody
   arrives on. The bounded waits must time out, so synchronize returns (~budget); the buffer
   (pinned host memory, read by a thread with no synchronize, while a second stuck launch
   still runs) must hold one stuck record per warp with the right site, block, warp, stage -1
   and phase 0; printf lines appear.
2. The same context afterwards: kernels/minimal.py clean, probes on: correct output, no stuck
   record, one beacon per warp.
3. With --bench and kernels/tma_stream.py present: probes-on vs probes-off kernel time.
Exit status 0 when every check passed, 1 otherwise.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from cutedebug import kernel_api
from cutedebug.instrument import probes
from cutedebug.reporting import stuck_map

FAILURES: list[str] = []


def check(ok: bool, what: str) -> None:
    print(("PASS " if ok else "FAIL ") + what, flush=True)
    if not ok:
        FAILURES.append(what)


def compile_kernel(obj, args, cfg, addr):
    from cutlass import cute

    if cfg is None:
        return cute.compile[cute.GPUArch("sm_90a")](obj, *args), None
    with probes.instrument(cfg, addr) as table:
        compiled = cute.compile[cute.GPUArch("sm_90a")](obj, *args)
    return compiled, table


def hang_check(budget_ns: int) -> None:
    import torch

    print(
        f"== 1. minimal.py spin_hang=True, probes on, budget {budget_ns / 1e6:.0f} ms", flush=True
    )
    cls = kernel_api.load_entry(ROOT / "kernels" / "minimal.py", "Minimal")
    n = 64 * 128  # 64 CTAs x 4 warps = 256 stuck warps
    obj = cls(n=n, spin_hang=True)
    cfg = probes.ProbeConfig(budget_ns=budget_ns)
    buf = torch.zeros(probes.buffer_nbytes(cfg), dtype=torch.uint8, pin_memory=True)
    tensors = obj.make_inputs("cuda")
    compiled, table = compile_kernel(obj, obj.cute_args(tensors), cfg, buf.data_ptr())
    print(probes.site_table_text(table))

    live: list[tuple[float, int]] = []
    stop = threading.Event()

    def monitor():
        while not stop.is_set():
            snap = probes.decode(bytes(buf.numpy()), cfg, None)
            live.append((time.monotonic(), snap.n_stuck_reported))
            time.sleep(0.01)

    # Every warp times out at the same moment and the grid ends microseconds later, so a
    # second stuck launch (its own buffer) keeps the stream busy for one more budget: the
    # first launch's records must reach host memory with no synchronize, as the worker's
    # monitor thread reads them.
    buf2 = torch.zeros_like(buf).pin_memory()  # device-mapped: pinned, like buf
    compiled2, _ = compile_kernel(obj, obj.cute_args(tensors), cfg, buf2.data_ptr())
    th = threading.Thread(target=monitor, daemon=True)
    t0 = time.monotonic()
    th.start()
    compiled(*obj.cute_args(tensors))
    compiled2(*obj.cute_args(tensors))
    launched = time.monotonic()
    torch.cuda.synchronize()
    synced = time.monotonic()
    stop.set()
    th.join()
    print(f"launches returned after {launched - t0:.3f} s, synchronize after {synced - t0:.3f} s")
    check(synced - t0 < 10 * 2 * budget_ns / 1e9 + 5, "synchronize returned (waits are bounded)")
    early = synced - budget_ns / 2e9  # the second launch is still waiting then
    seen_live = [c for t, c in live if t < early and c > 0]
    check(
        bool(seen_live),
        f"stuck counter visible from the host before synchronize, while the "
        f"next launch was still stuck (max seen: {max(seen_live, default=0)})",
    )

    snap = probes.decode(bytes(buf.numpy()), cfg, table)
    warps = (n // 128) * 4
    check(
        len(snap.stuck) == warps and snap.n_stuck_reported == warps,
        f"{len(snap.stuck)} stuck records ({snap.n_stuck_reported} reported), expected {warps}",
    )
    site = table.sites[0]
    pairs = {(r.block[0], r.warp) for r in snap.stuck}
    check(
        pairs == {(b, w) for b in range(n // 128) for w in range(4)}, "one record per (block, warp)"
    )
    check(
        all(
            r.site_id == site.id
            and r.stage == -1
            and r.phase == 0
            and r.block[1:] == (0, 0)
            and r.block_linear == r.block[0]
            for r in snap.stuck
        ),
        "records carry the site, stage -1, phase 0, block id",
    )
    check(
        all(budget_ns <= r.waited_ns < budget_ns + 50_000_000 for r in snap.stuck),
        f"waited_ns within [budget, budget + 50 ms] (min {min(r.waited_ns for r in snap.stuck)}"
        f", max {max(r.waited_ns for r in snap.stuck)})"
        if snap.stuck
        else "waited_ns",
    )
    for r in snap.stuck[:4]:
        print("  ", r)
    print("diagnosis:")
    for line in probes.diagnose(snap, table):
        print("  ", line)
    print(stuck_map.stuck_map_text(snap, table)[:3000])
    Path(os.environ.get("OUT", "/tmp")).joinpath("probes_stuck_map.svg").write_text(
        stuck_map.stuck_map_svg(snap, table)
    )


def clean_check(budget_ns: int) -> None:
    import torch

    print("== 2. minimal.py clean, probes on (same process and context)", flush=True)
    cls = kernel_api.load_entry(ROOT / "kernels" / "minimal.py", "Minimal")
    n = 64 * 128
    obj = cls(n=n)
    cfg = probes.ProbeConfig(budget_ns=budget_ns)
    buf = torch.zeros(probes.buffer_nbytes(cfg), dtype=torch.uint8, pin_memory=True)
    tensors = obj.make_inputs("cuda")
    compiled, table = compile_kernel(obj, obj.cute_args(tensors), cfg, buf.data_ptr())
    compiled(*obj.cute_args(tensors))
    torch.cuda.synchronize()
    out, ref = obj.output(tensors), obj.reference(tensors)
    err = (out - ref).abs().max().item()
    check(torch.allclose(out, ref, atol=1e-6, rtol=1e-6), f"clean output correct (max err {err})")
    snap = probes.decode(bytes(buf.numpy()), cfg, table)
    check(not snap.stuck, f"no stuck records ({len(snap.stuck)})")
    check(
        len(snap.beacons) == (n // 128) * 4
        and all(b.site_id == table.sites[0].id and b.stage == -1 for b in snap.beacons),
        f"one beacon per warp ({len(snap.beacons)})",
    )


def bench(budget_ns: int, iters: int = 50) -> None:
    import torch

    path = ROOT / "kernels" / "tma_stream.py"
    if not path.exists():
        print("== 3. bench skipped: kernels/tma_stream.py not present")
        return
    print("== 3. tma_stream probes-on vs probes-off", flush=True)
    cls = kernel_api.load_entry(path, "TmaStream")
    obj = cls()
    tensors = obj.make_inputs("cuda")
    args = obj.cute_args(tensors)
    launch = getattr(obj, "launch", None)
    times = {}
    for mode in ("off", "on", "on_no_beacons"):
        cfg = (
            None if mode == "off" else probes.ProbeConfig(budget_ns=budget_ns, beacons=mode == "on")
        )
        buf = torch.zeros(
            probes.buffer_nbytes(cfg or probes.ProbeConfig()), dtype=torch.uint8, pin_memory=True
        )
        compiled, _ = compile_kernel(obj, args, cfg, buf.data_ptr())

        def run(compiled=compiled):
            if launch is not None:
                launch(compiled, args)
            else:
                compiled(*args)

        for _ in range(5):
            run()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            run()
        end.record()
        torch.cuda.synchronize()
        times[mode] = start.elapsed_time(end) / iters
        out, ref = obj.output(tensors), obj.reference(tensors)
        atol, rtol = getattr(obj, "TOLERANCE", (1e-5, 1e-5))
        check(
            torch.allclose(out.float(), ref.float(), atol=atol, rtol=rtol),
            f"tma_stream output correct with probes {mode}",
        )
        if cfg is not None:
            snap = probes.decode(bytes(buf.numpy()), cfg, None)
            check(not snap.stuck, f"tma_stream probes {mode}: no stuck records")
    for mode, ms in times.items():
        ratio = times["off"] / ms
        print(f"  {mode:>14}: {ms * 1e3:8.1f} us/launch, throughput ratio vs off {ratio:.3f}")
    check(times["off"] / times["on"] >= 0.97, "probes-on throughput >= 97% of probes-off")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--budget-ms", type=float, default=200.0)
    ap.add_argument("--bench", action="store_true")
    a = ap.parse_args()
    try:
        import torch
    except ImportError:
        print("no GPU (torch is not installed)")
        return 0
    if not torch.cuda.is_available():
        print("no GPU (torch sees no CUDA device)")
        return 0
    print("device:", torch.cuda.get_device_name(0), torch.cuda.get_device_capability(0))
    budget_ns = int(a.budget_ms * 1e6)
    hang_check(budget_ns)
    clean_check(budget_ns)
    if a.bench:
        bench(budget_ns)
    print(f"{len(FAILURES)} check(s) failed" if FAILURES else "all probe checks passed")
    return 1 if FAILURES else 0


if __name__ == "__main__":
    sys.exit(main())
