"""The device checks the open issues still wait for, as one catalogue the GPU calls run from.

    python3 tools/gpu_pending.py --list                      # steps, issue, seconds, wheels
    python3 tools/gpu_pending.py --plan [--call-s 540]       # device calls and sessions, in
                                                             # PRIORITY order
    python3 tools/gpu_pending.py --out $OUT STEP [STEP ...]  # run them (on the GPU machine)
    python3 tools/gpu_pending.py --out /tmp/o --pack $OUT/call.tgz STEP ...  # more than 8 files

A device call runs at most 10 minutes and a session has 30 minutes of device time, so the
checks are named steps with an estimate each (seconds of device time, from the last H200
runs of the same tools) and run in the order given, each under its own ``timeout`` and inside
``--budget-s`` for the whole call: a step that no longer fits is reported "not run (budget)",
never cut half-way without saying so. Every step writes its log to OUT/STEP/log.txt (what
the closing notes quote) and its tables beside it; OUT/summary.md is one row per step:
exit status, wall seconds, the last lines, and the processes of ours left after it.

A step that needs the field libraries unpacks ``.field/field-site.tar.xz`` (tools/field_bundle.py
packs the wheels of ../shared/device/README.md small enough to travel with the tree and the DSL
bundle: carry ".field") or installs the wheels carried in ``.whl``; without either it is "not
run (no .whl)".

The commands are shell lines run from the repository root with ``$STEP_OUT`` set to the
step's folder; they call only the project's CLI and tools/, so what they print is what a user
would see. tests/test_gpu_pending.py checks on CPU that every file they name exists.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from gpu_scale_run import ours_left  # noqa: E402  (the orphan count, after a grace)

ROOT = Path(__file__).resolve().parent.parent
S = "scenarios"
# The sm_90 families of the project's own matrix (field and sm100 apart: the field needs the
# wheels; sm100 runs are UNSUPPORTED on sm_90 and compile-only items cover them).
FAMILIES = ("bisect", "cluster_reduce", "minimal", "sm90_attention", "sm90_gemm", "tma_stream")
S3_MATRIX = "reports/2026-11-30-h200-s3/matrix.json.gz"

# Faulted scenarios that PASS on the H200 without perturbation (the s3 matrix): issue 20's
# population for "exposed within 32 seeds".
LATENT = [
    "tma_stream/drop_sync",
    "tma_stream/missing_init_fence",
    "tma_stream/skip_producer_tail",
    "cluster_reduce/skip_cluster_tail",
    "cluster_reduce/skip_init_cluster_sync",
    "cluster_reduce/missing_init_fence",
    "cluster_reduce/cta_scope_sync",
    "sm90_gemm/missing_init_fence",
    "sm90_gemm/missing_init_fence_cluster",
    "sm90_gemm/skip_producer_tail",
    "sm90_gemm/skip_producer_tail_cluster",
    "sm90_gemm/skip_init_cluster_sync_cluster",
    "sm90_gemm/wrong_arrive_count_empty_minus_cluster",
    "sm90_attention/skip_producer_tail_k",
    "sm90_attention/skip_producer_tail_v",
    "sm90_attention/missing_init_fence",
    "sm90_attention/wrong_arrive_count_empty_minus_k",
    "sm90_attention/wrong_arrive_count_empty_minus_v",
    "sm90_attention/drop_sync_epilogue",
]
# The faulted FIELD scenarios (quack 0.6.5, FlashAttention-4 4.0.0b36) that PASS on the H200
# without perturbation (field_quack / field_fa4, reports/2026-12-02-h200 call2 / call3): the
# rest of #20's population, never perturbed yet; they need the wheels. Each note gives its
# prediction: those predicted exposable first (a budget cut drops the benign ones).
LATENT_FIELD_QUACK = [
    "field/quack_gemm_sm90/missing_init_fence",
    "field/quack_rmsnorm_bwd/skip_producer_tail",
    "field/quack_rmsnorm_bwd/wrong_arrive_count_empty_minus",
    "field/quack_gemm_sm90/drop_sync_warp",
    "field/quack_gemm_sm90/skip_producer_tail",
    "field/quack_rmsnorm_bwd/drop_sync_warp",
    "field/quack_rmsnorm_bwd/missing_init_fence",
    "field/quack_rmsnorm_fwd/missing_init_fence",
]
LATENT_FIELD_FA4 = [
    "field/fa4_fwd_sm90/drop_sync",
    "field/fa4_fwd_sm90/missing_init_fence",
    "field/fa4_fwd_sm90/skip_producer_tail",
    "field/fa4_fwd_sm90/wrong_arrive_count_empty_minus",
]
LATENT_FIELD = LATENT_FIELD_QUACK + LATENT_FIELD_FA4
# The dump flags the coredump step compares with the default (coredump.SKIP_FLAGS: all)
LIGHT = (
    "skip_nonrelocated_elf_images,skip_global_memory,skip_shared_memory,skip_local_memory,"
    "skip_constbank_memory"
)
CLEAN = ["tma_stream/clean", "cluster_reduce/clean", "minimal/clean", "sm90_gemm/clean"]
# The one schedule each latent scenario's note predicts exposes it (for sm90_gemm's and
# sm90_attention's missing_init_fence: the one that decides whether setmaxnreg hides it):
# (json name, flags, ids). The field ids run in perturb_field_checks (the wheels), the others in
# perturb; tests/test_perturb_field.py compiles each field kernel and checks that the position
# and scope a schedule names exist there and are the op its note names.
PERTURB_CHECKS = [
    (
        "warp0_before_init",  # warp 0 inits the barriers late (position 0: before create)
        "--policy targeted --target 0 --scope warp=0 --delay-us 200",
        [
            "tma_stream/missing_init_fence",
            "sm90_gemm/missing_init_fence",
            "sm90_attention/missing_init_fence",
            # warp 0 an MMA warp, the TMA producer warp 8: tma_stream's layout
            "field/quack_gemm_sm90/missing_init_fence",
            # warp 0 inits and loads (sm90_attention's layout): predicted exposed at seed 1,
            # after seed 0's launch left its barrier words (a replay needs that history)
            "field/fa4_fwd_sm90/missing_init_fence",
        ],
    ),
    (
        "rank1_before_init",  # one cluster rank inits late (position 0: before init / create)
        "--policy targeted --target 0 --scope rank=1 --delay-us 50",
        [
            "cluster_reduce/skip_init_cluster_sync",
            "sm90_gemm/missing_init_fence_cluster",
            "sm90_gemm/skip_init_cluster_sync_cluster",
        ],
    ),
    (
        "rank1_consumers_slow",  # rank 0 exits while rank 1's last remote releases are due
        "--policy role --role consumer --scope rank=1 --delay-us 50",
        ["sm90_gemm/skip_producer_tail_cluster", "field/quack_rmsnorm_bwd/skip_producer_tail"],
    ),
    (
        "lanes_after_wait",  # lanes 1-31 read late, lane 0 releases (position 5: consumer_wait)
        "--policy targeted --target 5 --scope lane=nonelected --delay-us 20",
        ["tma_stream/drop_sync"],
    ),
    (
        # warps 4-7 of rank 1 release 50 us late: the other ranks' drain, short by 4 releases a
        # phase after 3 phases (empty count 31 for 32), lets them exit before those arrive
        "rank1_wg1_consumers_slow",
        "--policy role --role consumer --scope 'rank=1 warpgroup=1' --delay-us 50",
        ["field/quack_rmsnorm_bwd/wrong_arrive_count_empty_minus"],
    ),
    (
        # the second consumer warpgroup late into the epilogue (position 25: before its last V
        # release): warp 4 TMA-stores rows 64-127 before warps 8-11 wrote them
        "wg2_before_epilogue",
        "--policy targeted --target 25 --scope warpgroup=2 --delay-us 20",
        ["field/fa4_fwd_sm90/drop_sync"],
    ),
]


def _checks(field: bool) -> list[tuple[str, str, list[str]]]:
    """PERTURB_CHECKS for the field scenarios (the wheels) or for the others."""
    out = []
    for name, flags, ids in PERTURB_CHECKS:
        mine = [i for i in ids if i.startswith("field/") == field]
        if mine:
            out.append((name, flags, mine))
    return out


def _toml(names: list[str]) -> str:
    return " ".join(f"{S}/{n}.toml" for n in names)


# issue #25: what the H200 has not yet localized from a core alone (tools/coredump_coverage.py
# --pending). Done: the 60 own HANG scenarios (reports/2026-12-01-h200-s4/call3,
# reports/2026-12-02-h200-s2/call2) and, in reports/2026-12-02-h200-s2/call4 (this step's first
# list), minimal/oob_store's crash core and CORE_DONE_FIELD. Next by value, for one call of
# <= 120 s: the five that call's budget skipped - quack GEMM's and RMSNorm-bwd's producer hangs
# first (graded with e4a724b's producer/consumer vocabulary, never on a real quack core), then
# FA-4 bwd and fwd and softmax - and tma_stream's small hang last, whose 2.6 MB core comes back
# as a fixture (the field cores are 15-120 MB). ~16-25 s each on the H200 (call4: field compile
# 8-10 s, 2 s deadline, dump 1.6-7.8 s: the driver spends 45-65 ms per SM holding warps).
# the phase-flip, arrive-count and expect_tx faults whose hangs both quack kernels dumped in s5
_PROTOCOL_HANGS = [
    "missing_phase_flip_consumer",
    "missing_phase_flip_producer",
    "wrong_arrive_count_empty_plus",
    "wrong_arrive_count_full_plus",
    "wrong_expect_tx_minus",
    "wrong_expect_tx_plus",
]
CORE_DONE_FIELD = [
    "field/fa4_fwd_sm90/wrong_barrier_threads_plus",
    "field/fa4_fwd_sm90/wrong_barrier_threads_minus",
    "field/quack_rmsnorm_fwd/wrong_expect_tx_plus",
    # reports/2026-12-02-h200-s3/call3: localized as expected 4/4
    "field/quack_gemm_sm90/skip_consumer_release",
    "field/quack_rmsnorm_bwd/skip_consumer_release",
    "field/fa4_bwd_sm90/wrong_expect_tx_plus",
    "field/fa4_fwd_sm90/wrong_expect_tx_plus",
    # reports/2026-12-02-h200-s5/calls 2-3 (coredump_field, coredump_field_gemm): 24 dumped,
    # localized as expected 22/22 graded (the other two name no place: a CRASH and a HANG
    # whose TOML gives none)
    *(
        f"field/{k}/{n}"
        for k, names in {
            "fa4_bwd_sm90": ["skip_consumer_release"],
            "fa4_fwd_sm90": [
                "early_exit_consumer",
                "early_exit_producer",
                "missing_phase_flip_consumer",
                "skip_consumer_release",
                "wrong_arrive_count_empty_plus",
                "wrong_arrive_count_full_plus",
                "wrong_expect_tx_minus",
            ],
            "quack_gemm_sm90": [
                "early_exit_consumer",
                "early_exit_producer",
                "extra_consumer_release",
                *_PROTOCOL_HANGS,
            ],
            "quack_rmsnorm_bwd": ["extra_consumer_release", *_PROTOCOL_HANGS],
        }.items()
        for n in names
    ),
]
# Next by value: quack GEMM's two named-barrier hangs, graded False in s2/call4 (the core named
# the epilogue's warp role `epilogue_split_k`; 8040c07 names it consumer, confirmed on a quack
# producer hang in s3/call3 but not on these two); then what s3/call3's budget skipped
CORE_REST = [
    "field/quack_gemm_sm90/wrong_barrier_threads_plus",
    "field/quack_gemm_sm90/wrong_barrier_threads_minus",
    "field/quack_softmax/wrong_expect_tx_plus",
    "tma_stream/wrong_expect_tx_plus",
]


def _field_hangs(under: str = "field") -> list[str]:
    """The field scenarios (or those of other families under ``S``) that may HANG on sm_90a
    (HANG among expect.verdict / expect.also), read from their TOML files as the loader reads
    those keys."""
    import tomllib

    out = []
    for f in sorted((ROOT / S / under).glob("*/*.toml") if under else ()):
        d = tomllib.loads(f.read_text())
        e = d.get("expect", {})
        if "HANG" in [e.get("verdict"), *e.get("also", [])] and "sm_90a" in d.get(
            "requires", {}
        ).get("arch", ["sm_90a"]):
            out.append(d["id"])
    return out


def _own_hangs() -> list[str]:
    """The own families' HANG scenarios on sm_90a."""
    return [n for fam in FAMILIES for n in _field_hangs(".") if n.startswith(fam + "/")]


# the field hangs coredump_rest leaves for coredump_field
CORE_FIELD_REST = [n for n in _field_hangs() if n not in CORE_REST + CORE_DONE_FIELD]


# The copy of the sm_90 families: a folder directly under the repository root (the steps run
# there), so each TOML's `../../kernels/X.py` still names the project's kernel file.
MATRIX_DIR = "matrix_sm90"


def _matrix_copy(dest: str) -> str:
    """Copy the sm_90 families into one folder (triage and pytest take one directory)."""
    assert "/" not in dest, "one level below the repository root: ../../kernels must resolve"
    dirs = " ".join(f"{S}/{d}" for d in FAMILIES)
    return f"rm -rf {dest}; mkdir -p {dest}; cp -r {dirs} {dest}/"


def _field_copy(dest: str, pattern: str) -> str:
    """The field scenarios of some kernels with their adapters (the TOML files name
    ``../adapter.py``, so the folders keep their places)."""
    return f"rm -rf {dest}; mkdir -p {dest}; cp {S}/field/*.py {dest}/; cp -r {S}/field/{pattern} {dest}/"


def _triage(src: str, out: str, flags: str) -> str:
    """The sm_90 matrix through `cutedebug triage --gpus all` (+ ``flags``): its wall, its
    seconds (tools/triage_overlap.py: own time, waits for the GPU, compiled twice), its
    verdicts against the s3 matrix; matrix.md and matrix.json.gz kept in $STEP_OUT."""
    return (
        _matrix_copy(src)
        + f"; s=$(date +%s.%N); python3 -m cutedebug triage {src} --out {out} --gpus all{flags}; "
        "echo rc=$?; python3 -c \"import time,sys; print('triage wall %.1f s' % "
        '(time.time()-float(sys.argv[1])))" $s; '
        f"cp {out}/matrix.md $STEP_OUT/; gzip -c {out}/matrix.json > $STEP_OUT/matrix.json.gz; "
        f"python3 tools/triage_overlap.py {out}; "
        f"python3 tools/compare_verdicts.py {out} {S3_MATRIX}"
    )


def _keep(pattern: str, dest: str) -> str:
    """A shell loop copying the files ``pattern`` matches to ``dest`` (an expression of $f);
    a pattern that matches nothing copies nothing (cp says so in the log)."""
    return f'for f in {pattern}; do cp "$f" "{dest}"; done'


# a sanitize report's name in $STEP_OUT/md: its run folder's name
SAN_MD = "$STEP_OUT/md/$(basename $(dirname $(dirname $f)))-$(basename $f)"


@dataclass(frozen=True)
class Step:
    name: str
    issues: str
    seconds: int  # estimated device seconds (the step's timeout is 1.5x, within the budget)
    wheels: bool
    command: str
    what: str


# What the 2026-12-02 calls left to settle: the perturbed scenarios that read HARNESS_ERROR or
# an unperturbed PASS (fixed since: a CUDA error is a CRASH wherever it surfaces, a perturbed
# hang's rerun replays its seed), and the quack verdicts that differed from their predictions.
RECHECK_PERTURB = [
    "tma_stream/missing_init_fence",
    "sm90_gemm/missing_init_fence",
    "sm90_gemm/missing_init_fence_cluster",
    "sm90_gemm/skip_producer_tail_cluster",
    "sm90_attention/missing_init_fence",
]
RECHECK_SHRINK = ["sm90_attention/drop_sync_epilogue", "cluster_reduce/skip_init_cluster_sync"]
RECHECK_FIELD = [
    "quack_rmsnorm_bwd/extra_consumer_release",
    "quack_rmsnorm_bwd/missing_phase_flip_consumer",
    "quack_rmsnorm_fwd/wrong_expect_tx_minus",
]

# #20's replay: the missing-init-fence faults whose perturbed CRASH read HARNESS_ERROR before
# 4bc737a (reports/2026-12-02-h200 call1 + call5): tma_stream at seed 0 (replay alone 3/3, 5/5),
# sm90_gemm at seed 9 after seeds 0-8 (alone 0/3, 0/5), sm90_attention at seed 1 after seed 0
# (alone 0/5): each replayed alone and with the seeds that ran before it (--replay-from).
REPLAY_CRASH = [
    "tma_stream/missing_init_fence",
    "sm90_gemm/missing_init_fence",
    "sm90_attention/missing_init_fence",
]

# Bytecode first, as a pip install leaves it (the tree and the DSL bundle travel without it and
# the machine's torch is installed without it; where PYTHONDONTWRITEBYTECODE is set every
# interpreter compiles them again: s3's cold 7.11 s against s5's 4.69 s): pool_bench's first
# line says whether it is cached. It stays for the machine's life.
BYTECODE = (
    "python3 -m compileall -q -j 0 $(python3 -c 'import importlib.util as u, os; "
    'print(*(os.path.dirname(s.origin) for s in map(u.find_spec, ("cutlass", "iket", '
    '"torch")) if s and s.origin))\') cutedebug kernels > /dev/null; echo compileall rc=$?; '
)
STEPS = [
    Step(
        "smoke",
        "17,18",
        40,  # s4: 33 s
        False,
        f"python3 -m cutedebug run {S}/minimal/spin_hang.toml --runs-dir /tmp/sm; echo rc=$?; "
        f"python3 -m cutedebug run {S}/minimal/spin_hang.toml --stall 5 --runs-dir /tmp/sm5; "
        "echo rc=$?",
        "the minimal/spin_hang localization (regression seen in the last triage)",
    ),
    Step(
        "pytest_gpu",
        "18",
        # s4: 199 s (8 GPU tests + the lifeline attacks); + 2 cold runs (test_run_seconds);
        # + ~20 s: test_exec_names_a_fault_that_surfaces_in_cublas (two execs, estimated);
        # + ~15 s: test_pool_spare's GPU test (a pool start, two warm HANG runs, estimated)
        275,
        False,
        "python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=15; echo rc=$?; "
        "python3 tools/gpu_trust_check.py --out $STEP_OUT/trust; echo rc=$?",
        "every GPU test on the final code, then the lifeline attacked on a real GPU hang",
    ),
    Step(
        "pytest_gpu_only",
        "18",
        # 2026-12-02 call5: 165.96 s for the 10 GPU tests; + ~20 s for the exec fault-naming
        # test (two execs of minimal, estimated); + ~15 s for test_pool_spare's (estimated)
        215,
        False,
        # for a call short of device time when the lifeline's code did not change: the GPU
        # tests alone, without pytest_gpu's attacks on a real GPU hang (tools/gpu_trust_check.py)
        "python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs --durations=15; echo rc=$?",
        "every GPU test on the final code (without the lifeline attacks)",
    ),
    Step(
        "triage",
        "17,21,22,23",
        160,  # s4: 138 s (114 scenarios)
        False,
        _triage(MATRIX_DIR, "/tmp/tri", ""),
        "the whole sm_90 matrix on one GPU through --gpus all, compiles overlapping launches "
        "(the default): wall (target <= 150 s, #22), compiled twice = 0, verdicts vs s3",
    ),
    Step(
        "xdist",
        "22,23",
        290,  # s4: 272 s (pytest -n 1, 228 items)
        False,
        _matrix_copy(MATRIX_DIR) + "; s=$(date +%s.%N); "
        f"python3 -m pytest -n 1 --dist worksteal -q -p no:cacheprovider {MATRIX_DIR} "
        "--junitxml=$STEP_OUT/pytest-n1.xml; echo rc=$?; "
        "python3 -c \"import time,sys; print('pytest -n 1 wall %.1f s' % "
        '(time.time()-float(sys.argv[1])))" $s; '
        f"python3 tools/triage_overlap.py {S3_MATRIX} --pytest --families {','.join(FAMILIES)}; "
        "python3 tools/compare_verdicts.py /tmp/tri $STEP_OUT/pytest-n1.xml; "
        f"python3 tools/compare_verdicts.py $STEP_OUT/pytest-n1.xml {S3_MATRIX}",
        "pytest -n 1 over the same matrix with the prefetch (the default: each item's next one "
        "compiles while it runs, one launch at a time; ESTIMATE from s3 ~226 s + start, 415 s in "
        "turn): wall, verdicts vs the triage step's and vs s3",
    ),
    Step(
        "perturb",
        "20",
        350,  # 2026-12-02 call1: 345 s (s4: 130 s before the keys, positions and targeted checks)
        False,
        f"python3 tools/perturb_table.py --seeds 32 --replays 5 --budget-s 200 "
        f"--json $STEP_OUT/latent.json {_toml(LATENT)}; "
        f"python3 tools/perturb_table.py --clean --seeds 64 --replays 0 --budget-s 60 "
        f"--json $STEP_OUT/clean.json {_toml(CLEAN + ['sm90_attention/clean'])}; "
        + "; ".join(
            f"python3 tools/perturb_table.py --seeds 1 --replays 3 --budget-s 40 {flags} "
            f"--json $STEP_OUT/{name}.json {_toml(names)}"
            for name, flags, names in _checks(field=False)
        ),
        "latent faults exposed within 32 seeds (and among those not predicted benign by "
        "construction), replay rate, 0 false alarms over 64 seeds; each scenario note's "
        "perturbation prediction checked by its one targeted schedule",
    ),
    Step(
        "recheck",
        "17,20",
        170,  # 5 x 32 seeds (~4 s each) + 3 replays; 2 shrinks; 3 field scenarios once each
        True,
        f"python3 tools/perturb_table.py --seeds 32 --replays 3 --budget-s 80 "
        f"--json $STEP_OUT/latent.json {_toml(RECHECK_PERTURB)}; echo rc=$?; "
        # --shrink on the GPU (never run there yet): the minimal delay set of two exposures
        f"python3 tools/perturb_table.py --seeds 4 --replays 2 --shrink --budget-s 60 "
        f"--json $STEP_OUT/shrunk.json {_toml(RECHECK_SHRINK)}; echo rc=$?; "
        # each run's report kept as soon as it is written (a step cut by its timeout keeps
        # those before): <runs-dir>/<run>/report.md
        + "mkdir -p $STEP_OUT/reports; "
        + "; ".join(
            f"python3 -m cutedebug run {S}/field/{n}.toml --runs-dir /tmp/rck; "
            + _keep("/tmp/rck/*/report.md", "$STEP_OUT/reports/$(basename $(dirname $f)).md")
            for n in RECHECK_FIELD
        ),
        "the perturbed scenarios that read HARNESS_ERROR / an unperturbed PASS, with the "
        "fixes; the quack verdicts that differed from their predictions, once more each, "
        "with their reports (the mechanism)",
    ),
    Step(
        "tail_cluster",
        "20",
        # 2026-12-02 call1: seed 8 and the rank-1-consumers-slow schedule ended its perturbed
        # runs before 4bc737a (read HARNESS_ERROR); recheck's budget skipped it twice since.
        # One schedule + 3 replays (~15 s), then up to 12 seeds + 2 replays with history (~40 s)
        60,
        False,
        "python3 tools/perturb_table.py --seeds 1 --replays 3 --budget-s 25 "
        "--policy role --role consumer --scope rank=1 --delay-us 50 "
        f"--json $STEP_OUT/role.json {_toml(['sm90_gemm/skip_producer_tail_cluster'])}; "
        "echo rc=$?; python3 tools/perturb_table.py --seeds 12 --replays 2 --budget-s 40 "
        f"--json $STEP_OUT/seeds.json {_toml(['sm90_gemm/skip_producer_tail_cluster'])}; "
        "echo rc=$?",
        "sm90_gemm/skip_producer_tail_cluster perturbed with the fixes (never read since "
        "4bc737a): its predicted schedule (rank 1's consumers slow) and random seeds, the "
        "verdict read (CRASH predicted), replay alone and with history",
    ),
    Step(
        "perturb_crash",
        "20",
        # 2026-12-02 call1/call5 (fork server warm): exposing runs tma 2.1-2.2 s, gemm 3.5-3.6 s
        # (10 seeds), attention 5.0 s (2 seeds); a CRASH adds its health check (~0.5 s). tma:
        # 1 + 3 alone (no history: seed 0) ~10 s; gemm: 1 + 3 alone + 3 x 10 seeds ~25 s;
        # attention 1 + 3 + 3 ~35 s (started only if 50 s are not yet spent); the fork server
        # ~8 s; the CLI run ~8 s (its own interpreter, compile, <= 16 seeds)
        90,
        False,
        f"python3 tools/perturb_table.py --seeds 32 --replays 3 --history-replays 3 "
        f"--budget-s 50 --json $STEP_OUT/crash.json {_toml(REPLAY_CRASH)}; echo rc=$?; "
        # what a user sees: the terminal line and report.md with the exact replay command
        f"python3 -m cutedebug run {S}/sm90_gemm/missing_init_fence.toml --perturb 16 "
        "--runs-dir /tmp/pcr; echo rc=$?; "
        + _keep("/tmp/pcr/*/report.md", "$STEP_OUT/gemm_report.md"),
        "(a) a perturbed CRASH reads CRASH (4bc737a, never run on a GPU; before it every one "
        "read HARNESS_ERROR); (b) the replay rate of the exposing seed alone and with the seeds "
        "that ran before it in its process (--replay SEED --replay-from FIRST), two columns; the "
        "report's replay line as cutedebug run prints it",
    ),
    Step(
        "sanitize_rest",
        "17",
        # 2026-12-02-h200-s2: quack GEMM racecheck 36.3 s (call4), fa4_bwd racecheck 80.5 s
        # at its default shape (call1; memcheck CLEAN there, 23.6 s)
        150,
        True,
        # The two clean field kernels racecheck called RACE, under the rules that came after:
        # quack's GEMM (WAR tile_scheduler.py:683 / :940, the scheduler pipeline's hand-off:
        # `pipeline-ordered`, 3ef76bd) and FA-4's backward at its default shape (WAR
        # flash_bwd_sm90.py:1527 / copy_utils.py:1093, a bulk copy's write: `tma`, ff18fcf).
        # Expected CLEAN with those records filtered; each report kept as soon as written.
        "mkdir -p $STEP_OUT/md; "
        f"python3 -m cutedebug sanitize {S}/field/quack_gemm_sm90/clean.toml --tool racecheck "
        "--no-plain --expect PASS --deadline-scale 6 --runs-dir /tmp/fs2 | tail -6; "
        f"{_keep('/tmp/fs2/*/sanitize/*.md', SAN_MD)}; "
        f"python3 -m cutedebug sanitize {S}/field/fa4_bwd_sm90/clean.toml --tool racecheck "
        "--no-plain --expect PASS --deadline-scale 6 --runs-dir /tmp/fs1 | tail -6; "
        f"{_keep('/tmp/fs1/*/sanitize/*.md', SAN_MD)}",
        "quack's GEMM and FA-4's backward (default shape) under racecheck with the "
        "pipeline-ordered and bulk-copy rules: CLEAN, their hazards filtered with the reason",
    ),
    Step(
        "referee",
        "17",
        40,  # 2026-12-02-h200-s2 call4: racecheck 8-10 s + referee ~7 s per sample
        True,
        # The sanitizer's referee (analyses/sanitizer/referee.py) on its two references, raw
        # mbarrier kernels the pipeline-ordered rule does not speak for: the real race (must
        # be CONFIRMED) and the correct hand-off (UNCONFIRMED: no schedule breaks it). The
        # clean field kernels it refereed in call4 are sanitize_rest's now.
        "mkdir -p $STEP_OUT/md; "
        "python3 -m cutedebug sanitize tools/sanitizer_samples/mbarrier_handoff_nowait.toml "
        "--tool racecheck --no-plain --expect RACE --referee 16 --runs-dir /tmp/rf1 | tail -6; "
        f"{_keep('/tmp/rf1/*/sanitize/*.md', SAN_MD)}; "
        "python3 -m cutedebug sanitize tools/sanitizer_samples/mbarrier_handoff_clean.toml "
        "--tool racecheck --no-plain --expect RACE --referee 32 --runs-dir /tmp/rf2 | tail -6; "
        f"{_keep('/tmp/rf2/*/sanitize/*.md', SAN_MD)}",
        "racecheck's RACE refereed by perturbed runs: the sample's real race CONFIRMED, its "
        "correct mbarrier hand-off UNCONFIRMED",
    ),
    Step(
        "coredump_lite",
        "25",
        70,  # spin_hang ~25 s (compile, 1 s deadline, dump + reading); tma_stream ~12 s each
        False,
        # the coredump step's first part alone, for a call short of device time: the big grid
        # (dump / reading split) and one small hang, default flags, then the big grid light
        f"python3 tools/gpu_coredump_table.py --deadline 1 --out /tmp/core "
        f"--json $STEP_OUT/rows.json {S}/minimal/spin_hang.toml "
        f"{S}/tma_stream/wrong_expect_tx_plus.toml; "
        f"CUTEDEBUG_COREDUMP_FLAGS={LIGHT} python3 tools/gpu_coredump_table.py --deadline 1 "
        f"--out /tmp/corl --json $STEP_OUT/rows_light.json {S}/minimal/spin_hang.toml",
        "minimal/spin_hang's seconds added (dump / reading) with one cuda-gdb process, one "
        "small hang, and the big grid with the lightweight dump flags",
    ),
    Step(
        "variant",
        "20",
        75,  # 2 plain runs (~10 s), 2 x 16 random seeds + 2 x 1 role schedule, replays
        False,
        # sm90_attention/wrong_arrive_count_empty_minus_k/v are benign by construction at
        # seqlen 1000 (8 key blocks a CTA; their notes): the same fault with >= 9 key blocks,
        # the second consumer warpgroup late, is the exposable variant the notes name. Made
        # here (not in the matrix) by changing seqlen and id; var/ sits at the repository
        # root so their ../../kernels path still holds.
        "mkdir -p var/sm90_attention; for x in k v; do "
        f"sed -e 's/^seqlen = 1000$/seqlen = 2048/' -e 's/^id = \"\\(.*\\)\"$/id = \"\\1_seqlen2048\"/' "
        f"{S}/sm90_attention/wrong_arrive_count_empty_minus_$x.toml "
        "> var/sm90_attention/wrong_arrive_count_empty_minus_$x.toml; "
        "grep -E '^(id|seqlen)' var/sm90_attention/wrong_arrive_count_empty_minus_$x.toml; "
        "python3 -m cutedebug run var/sm90_attention/wrong_arrive_count_empty_minus_$x.toml "
        "--runs-dir /tmp/var; done; "
        "python3 tools/perturb_table.py --seeds 16 --replays 2 --budget-s 40 "
        "--json $STEP_OUT/random.json var/sm90_attention/*.toml; "
        "python3 tools/perturb_table.py --seeds 1 --replays 2 --policy role --role consumer "
        "--scope warpgroup=2 --delay-us 20 --budget-s 30 --json $STEP_OUT/role.json "
        "var/sm90_attention/*.toml",
        "the exposable variant of sm90_attention's wrong_arrive_count_empty_minus_k/v (seqlen "
        "2048): plain, 16 random seeds, and the second consumer warpgroup slowed throughout",
    ),
    Step(
        "warm_reuse",
        "22",
        # compileall (5-10 s, as warm_lite); the HANG: a pool start (~5 s), one untimed warm
        # run (~2.8 s), a second pool's start inside its untimed run (~7 s), 6 rounds of
        # warm_fresh (~2.5 s: s3 call4's warm), warm and warm_nospare (~2 s each, estimated)
        # ~39 s; the clean scenario: a pool start, an untimed run, 2 rounds of two sides ~17 s;
        # the GPU test of tests/test_pool_spare.py: a pool start and two HANG runs ~15 s
        105,
        False,
        "python3 -m compileall -q -j 0 $(python3 -c 'import importlib.util as u, os; "
        'print(*(os.path.dirname(s.origin) for s in map(u.find_spec, ("cutlass", "iket")) '
        "if s and s.origin))') cutedebug kernels "
        "> /dev/null; echo compileall rc=$?; "
        "python3 tools/pool_bench.py --reuse --spare --no-cold --rounds 6 "
        "--keep-cache $STEP_OUT/cache --json $STEP_OUT/pool.json; "
        "python3 tools/pool_bench.py scenarios/tma_stream/clean.toml --reuse --no-cold "
        "--rounds 2 --json $STEP_OUT/pool_clean.json; "
        "python3 -m pytest -m gpu -q -p no:cacheprovider -rfEs -s tests/test_pool_spare.py; "
        "echo rc=$?",
        "cutedebug run of a probed HANG in the warm pool, alternated in one loop: warm (the "
        "compile reused: the same traced IR, engine/compile_cache.py, the probe buffer at the "
        "pool's fixed address; the run in the spare worker whose CUDA context was made ahead, "
        "engine/pool_spare.py), warm_fresh (--no-compile-cache) and warm_nospare (a second pool "
        "without the spare), each side's median against the 2 s target, every row saying "
        "whether it reused, why not, and whether a spare ran it; then tma_stream/clean the same "
        "way (PASS: a reused kernel's output checked); then the GPU test of "
        "tests/test_pool_spare.py (two HANG runs in spares, the second reused with its probe "
        "buffer at the fixed address, both localized, the same PTX)",
    ),
    Step(
        "warm_lite",
        "22",
        # compileall with -j 0 on 16 cores (cold_parts in 2026-12-02-h200-s5 call1: cutlass,
        # torch and ours in ~15 s), the pool's start ~2.3 s, 5 rounds of cold (4.69 s) and warm
        # (1.72 s) alternated: ~50 s
        70,
        False,
        # Bytecode first, as a pip install leaves it (the tree and the DSL bundle travel without
        # it and the machine's torch is installed without it; where PYTHONDONTWRITEBYTECODE is
        # set every interpreter compiles them again: s3's cold 7.11 s against s5's 4.69 s):
        # pool_bench's first line says whether it is cached. It stays for the machine's life.
        BYTECODE + "python3 tools/pool_bench.py --rounds 5 --json $STEP_OUT/pool.json",
        "cutedebug run of a probed HANG with bytecode cached (as pip leaves it, torch's too): "
        "cold and warm alternated, 5 rounds, every phase from the process's start "
        "(cli_start_s) to its exit (rest_s), each side's median against the 5 s / 2 s targets",
    ),
    Step(
        "cold_cuts",
        "22",
        # compileall ~15 s, the pool's start ~3 s, one cold run stored ~4.5 s, 8 rounds of cold
        # (~4 s), cold_fresh (~4.3 s) and warm (~1.5 s): ~100 s
        115,
        False,
        BYTECODE + "python3 tools/pool_bench.py --rounds 8 --cold-fresh --json $STEP_OUT/pool.json",
        "the cold run's compile reused from the user's folder, against cold_fresh "
        "(--no-compile-cache), alternated in one loop with warm, 8 rounds, against the 5 s / "
        "2 s targets",
    ),
    Step(
        "cold_parts",
        "22",
        # compileall of cutlass, torch and ours on 16 cores (ESTIMATE ~30 s with torch's ~2000
        # files), cold_breakdown's 3 reps of its pieces (~45 s), pool_bench's 2 rounds of cold
        # and warm with the pool's start (~35 s). 2026-12-02-h200-s4 call4 ran cold_breakdown
        # without the bytecode and got nothing in 45 s: the compileall comes first here
        130,
        False,
        # the state before (does the machine's torch have its bytecode? the cold runs' 3.2-4.9 s
        # of torch import and context rest on it), then everything compiled as a pip install
        # leaves it, then a fresh interpreter's pieces and the cold run itself
        'python3 -c \'import sys; sys.path.insert(0, "tools"); import pool_bench; '
        'print("before:", pool_bench.bytecode_state())\'; '
        + BYTECODE
        + "timeout 100 python3 tools/cold_breakdown.py --reps 3 --json $STEP_OUT/parts.json; "
        "echo rc=$?; python3 tools/pool_bench.py --rounds 2 --json $STEP_OUT/pool.json",
        "where a cold run's seconds go on the H200 with the DSL's, torch's and our bytecode "
        "cached: whether the machine's torch had it, a fresh interpreter's pieces (torch, a "
        "CUDA context, cutlass, in turn and side by side), then cold and warm alternated "
        "against the 5 s / 2 s targets",
    ),
    Step(
        "perturb_keys",
        "20",
        45,  # ESTIMATE: one small compile, 10 launches; a run refused before launch; health
        False,
        # does each rule delay exactly the CTAs / ranks / warps it names (a lane subset: its
        # whole warp, the SASS reconverges after every delay)? a scope outside the launch:
        # UNSUPPORTED, nothing launched; the health check answered by the driver, no torch
        "python3 tools/perturb_keys_probe.py; echo rc=$?; "
        f"python3 -m cutedebug run {S}/minimal/clean.toml --perturb 2 --perturb-scope rank=1 "
        "--runs-dir /tmp/pks; echo rc=$?; "
        "for d in 1 0 1 0; do s=$(date +%s.%N); CUTEDEBUG_HEALTH_DRIVER=$d python3 -m "
        'cutedebug.engine.health; echo rc=$?; python3 -c "import time,sys; print('
        "'health check (driver first: %s) %.2f s' % (sys.argv[2], time.time()-float("
        'sys.argv[1])))" $s $d; done',
        "perturbation keys on the hardware (exact / whole warps / MISMATCH per scope, 0 delayed "
        "with a zero table); --perturb-scope rank=1 on a cluster-less kernel says 'perturbation "
        "not run' (UNSUPPORTED); the health check, alternated: driver first (opt-in: via driver, "
        "healthy, well under 1 s) and torch (the default, ~4 s)",
    ),
    Step(
        "racecheck_idiom",
        "17",
        60,
        False,
        # s4: racecheck RACE on quack's GEMM tile scheduler (a thread-written slot handed on
        # by mbarriers); the project's kernels hand slots on by TMA. Does racecheck credit
        # mbarrier ordering of generic shared-memory accesses? The sample in its three modes.
        'for m in mbarrier sync none; do echo "== --mode $m"; compute-sanitizer --tool '
        "racecheck --racecheck-report all --print-limit 12 python3 "
        "tools/sanitizer_samples/mbarrier_handoff.py --mode $m 2>&1 | tail -40; done",
        "racecheck on a correct mbarrier hand-off of thread-written shared memory (and its "
        "sync_threads control and its real race): is the quack GEMM finding the tool's",
    ),
    Step(
        "coredump",
        "25",
        330,
        False,
        # s4 (reports/2026-12-01-h200-s4/call3) did bisect .. sm90_gemm/extra_consumer_release;
        # minimal/spin_hang first: s4's 13.34 s added for its 8,448 warps (dump 5.35 s, two
        # cuda-gdb runs 6.91 s); now one cuda-gdb process, nvdisasm beside it, the dump done
        # when the worker closes the core. Its row splits the added seconds (dump / rounds /
        # nvdisasm) with the driver's own progress lines. Then the same grid with the
        # lightweight flags (+ skip_nonrelocated_elf_images, skip_constbank_memory) and a small
        # kernel with them: smaller, faster, still read?
        f"python3 tools/gpu_coredump_table.py --deadline 1 --budget-s 230 --out /tmp/core "
        f"--json $STEP_OUT/rows.json {S}/minimal/spin_hang.toml {S}/sm90_gemm {S}/tma_stream; "
        f"CUTEDEBUG_COREDUMP_FLAGS={LIGHT} python3 tools/gpu_coredump_table.py --deadline 1 "
        f"--out /tmp/corl --json $STEP_OUT/rows_light.json {S}/minimal/spin_hang.toml "
        f"{S}/tma_stream/wrong_expect_tx_plus.toml",
        "minimal/spin_hang's seconds added (split dump / reading) first, then the HANG "
        "scenarios s4's budget left (sm90_gemm, tma_stream) localized from the core alone, "
        "seconds added, health after dumps; spin_hang and one small hang again with the "
        "lightweight dump flags",
    ),
    Step(
        "coredump_rest",
        "25",
        115,
        True,
        f"python3 tools/gpu_coredump_table.py --deadline 2 --budget-s 90 --out /tmp/corr "
        f"--json $STEP_OUT/rows.json {_toml(CORE_REST)}; "
        # the two smallest real cores (<= 8 MB) with what cuda-gdb listed from them: fixtures
        # for reading a core's warp and lane tables without cuda-gdb
        "mkdir -p $STEP_OUT/cores; for c in $(ls -Sr /tmp/corr/*/coredump.*.nvcudmp "
        "2>/dev/null | head -2); do r=$(dirname $c); n=$(basename $r); "
        "[ $(stat -c %s $c) -le 8388608 ] && gzip -9 -c $c > $STEP_OUT/cores/$n.nvcudmp.gz "
        "&& cp $r/coredump_gdb_pass1.txt $STEP_OUT/cores/$n.pass1.txt; done; "
        "ls -la $STEP_OUT/cores",
        "#25's gaps by value (CORE_REST): quack GEMM's two named-barrier hangs again (graded "
        "False before the role rule 8040c07), then quack softmax; tma_stream's small core kept "
        "as a fixture",
    ),
    # the 25 field hangs no call has dumped, in two steps of one call each: spawn to verdict
    # ~16-17 s a FA-4 forward hang and ~15 s an RMSNorm one (2026-12-02-h200-s2 call4, s3
    # call3), 20-34 s a quack GEMM one (its own compile; 2026-12-02-h200-s4 call1)
    Step(
        "coredump_field",
        "25",
        # each run ~13 s when the kernel does not hang (s5 call2: MISMATCH, 12.7 s), ~20 s with
        # FA-4 forward's dump (1152 warps: 7-8 s) and its reading
        90,
        True,
        # up to four runs of each: a timing-dependent HANG that read otherwise once (FA-4
        # forward's extra_consumer_release: HANG with probes, MISMATCH in s5 call2 without);
        # coredump_coverage takes the newest run that left a core
        f"python3 tools/gpu_coredump_table.py --deadline 2 --budget-s 80 --out /tmp/corf "
        f"--json $STEP_OUT/rows.json {' '.join([_toml(CORE_FIELD_REST)] * 4)}",
        "the field libraries' HANG scenarios no call has dumped yet (FA-4 forward's "
        "extra_consumer_release: MISMATCH in its one unprobed run, s5 call2), each run up to "
        "four times, localized from the core alone (no probes)",
    ),
    Step(
        "coredump_field_gemm",
        "25",
        280,
        True,
        f"python3 tools/gpu_coredump_table.py --deadline 2 --budget-s 260 --out /tmp/corg "
        f"--json $STEP_OUT/rows.json "
        f"{_toml([n for n in _field_hangs() if 'quack_gemm' in n and n not in CORE_REST])}",
        "quack GEMM's HANG scenarios (but the two named-barrier ones, coredump_rest's) again, "
        "localized from the core alone (done in s5 call3: 7/7 graded as expected)",
    ),
    Step(
        "triage_preload",
        "22",
        # the server's start with quack's import (~6 s), 6 scenarios (~3-5 s each): ~50 s
        70,
        True,
        _field_copy("/tmp/ftp", "quack_softmax")
        + f"; cp -r {S}/field/quack_rmsnorm_fwd /tmp/ftp/; "
        "python3 -m cutedebug triage /tmp/ftp --out /tmp/ftpo --gpus all; echo rc=$?; "
        "python3 tools/gpu_field_table.py /tmp/ftpo --json $STEP_OUT/rows.json",
        "triage over quack's softmax and RMSNorm-forward scenarios: the lanes' fork server "
        "imports quack before the first run (the lanes' asks made from their own threads, "
        "engine/lanes.py) and says so with its seconds; verdicts as expected",
    ),
    Step(
        "rmsnorm_minus",
        "17",
        # a fork server with quack (~8 s), 12 runs (~3-5 s each, a HANG ~4 s), 4 fresh runs
        # with --coredump (~8-15 s each): ~130 s
        130,
        True,
        _field_copy("/tmp/frm", "quack_rmsnorm_fwd")
        + "; T=/tmp/frm/quack_rmsnorm_fwd/wrong_expect_tx_minus.toml; "
        "python3 tools/repeat_verdicts.py -n 12 $T --out /tmp/frmr --json $STEP_OUT/repeat.json; "
        "for i in 1 2 3 4; do python3 -m cutedebug run $T --coredump --no-warm "
        "--runs-dir /tmp/frmc 2>&1 | head -4; done; "
        "for d in /tmp/frmc/*/; do cp $d/report.md $STEP_OUT/coredump-$(basename $d).md; done",
        "quack RMSNorm forward's wrong_expect_tx_minus (CRASH in 3 runs of earlier sessions, "
        "HANG in s11 call1's triage_preload): its verdicts' frequencies over 12 runs "
        "(tools/repeat_verdicts.py), then 4 fresh runs with --coredump (where a HANG is "
        "stuck, from the GPU's state), their reports kept",
    ),
    Step(
        "field_quack",
        "17",
        400,  # + quack_softmax (2); quack_gemm_sm100 compiles only on an sm_90 GPU
        True,
        _field_copy("/tmp/fq", "quack_*")
        + "; python3 -m cutedebug triage /tmp/fq --out /tmp/fqo; echo rc=$?; "
        "python3 tools/gpu_field_table.py /tmp/fqo --json $STEP_OUT/rows.json; "
        # advance_iters on hardware: the ping-pong GEMM's consumer state advances by it
        f"python3 -m cutedebug run {S}/field/quack_gemm_sm90/missing_phase_flip_consumer.toml "
        "--param pingpong=true --param tile_m=64 --runs-dir /tmp/fpp; echo rc=$?",
        "the quack field scenarios: verdicts, localization at the library's line",
    ),
    Step(
        "field_fa4",
        "17",
        290,  # + fa4_bwd_sm90 (3); fa4_fwd_sm100 compiles only on an sm_90 GPU
        True,
        _field_copy("/tmp/ff", "fa4_*")
        + "; python3 -m cutedebug triage /tmp/ff --out /tmp/ffo; echo rc=$?; "
        "python3 tools/gpu_field_table.py /tmp/ffo --json $STEP_OUT/rows.json",
        "the FlashAttention-4 field scenarios, re-measured after the instrumentation layer",
    ),
    Step(
        "field_sanitize",
        "17",
        330,  # s4: 5 of the 6 kernels in 276 s (racecheck 15-34 s, memcheck 13-16 s each)
        True,
        "for k in quack_gemm_sm90 quack_rmsnorm_fwd quack_rmsnorm_bwd fa4_fwd_sm90 "
        "quack_softmax fa4_bwd_sm90; do "
        f"python3 -m cutedebug sanitize {S}/field/$k/clean.toml --tool racecheck,memcheck "
        "--no-plain --expect PASS --deadline-scale 6 --runs-dir /tmp/fs/$k | tail -4; done",
        "0 sanitizer findings on the clean field kernels (other kernels counted apart)",
    ),
    Step(
        "exec",
        "19",
        300,
        True,
        # s4: the gemm hang localized in 68 s with the rest; FA-4's compile outlasted a 14 s
        # deadline and the whole field test file's clean run a 30 s one (call4/exec/log.txt)
        "python3 -m cutedebug exec --probes --fault skip_consumer_release --runs-dir /tmp/x1 "
        "-- python3 examples/field_repro.py --only gemm; echo rc=$?; "
        "python3 -m cutedebug exec --probes --fault wrong_barrier_threads --deadline 90 "
        "--runs-dir /tmp/x2 -- python3 examples/field_repro.py --only attention; echo rc=$?; "
        "python3 -m cutedebug mutate --out /tmp/fm --jobs 6 --deadline 120 --faults "
        "skip_consumer_release,extra_consumer_release,wrong_expect_tx,skip_producer_tail,"
        "missing_phase_flip -- python3 -m pytest -q -p no:cacheprovider "
        "examples/test_field_libs.py -k gemm; echo rc=$?; cp /tmp/fm/matrix.md $STEP_OUT/",
        "exec on library hangs (the kernel's line, no adapter), mutate over the field tests",
    ),
    Step(
        "mutate_all",
        "19",
        # 2026-12-02-h200-s2 call1: every mutant ran the whole file (~45 s holding the GPU
        # token): 4 of 31 in 420 s. Now a mutant runs only the test item that traced its kernel
        # (the -k gemm clean run: 23 s) and every fault kind applies (~75 mutants, 8 at a
        # time on 16 cores). s2 call3 on 9ad9f96: 15 mutants in ~150 s after the clean and alone
        # runs: the 77 need more than one call: estimated per call
        360,
        True,
        # bounded inside the step (SIGTERM: mutate kills the mutants under way and stops) so
        # that the per-mutant records (results.jsonl) come back even when the matrix is not
        # finished; the next call on the same warm machine goes on from them (`--resume`: the
        # clean run and finished mutants kept in /tmp/fma)
        "timeout 520 python3 -m cutedebug mutate --out /tmp/fma --resume --jobs 8 --deadline 120 -- "
        "python3 -m pytest -q -p no:cacheprovider examples/test_field_libs.py; echo rc=$?; "
        "cp /tmp/fma/matrix.md /tmp/fma/matrix.json /tmp/fma/results.jsonl /tmp/fma/clean.json "
        "$STEP_OUT/",
        "mutate over the whole field test file (quack RMSNorm forward and backward, GEMM, FA-4's "
        "forward), every fault kind, each mutant running only the test that traced its kernel: "
        "every mutant caught, survived with its site, or not applied; time per mutant; 0 "
        "harness errors, 0 processes left",
    ),
    Step(
        "warm",
        "22",
        # s4: 79 s for pool_bench (cold 12.4 s, warm 2.8 s a round); the cold run no longer
        # starts a health-check interpreter after a probed hang (~8 s, estimated), the overlap
        # side ~7 s: ~18 s a round; cold_breakdown's 3 reps of its 7 pieces ~45 s
        150,
        False,
        "python3 tools/pool_bench.py --rounds 5 --overlap --json $STEP_OUT/pool.json; "
        "python3 tools/cold_breakdown.py --reps 3 --json $STEP_OUT/parts.json",
        "cutedebug run of a probed HANG: cold (<= 5 s), cold with the worker's GPU lookup "
        "beside cutlass's import (CUTEDEBUG_OVERLAP_IMPORTS=1) and warm pool (<= 2 s), "
        "alternated, every phase (health_via: worker); then a fresh interpreter's pieces (torch, a CUDA "
        "context, cutlass, both in turn and side by side in two threads, the CLI) and whether "
        "bytecode is cached",
    ),
    Step(
        "cold_bytecode",
        "22",
        65,  # compileall (~10 s) + pool_bench 2 rounds of cold / cold_overlap / warm (~18 s each)
        False,
        # The DSL bundle (.device) is unpacked without bytecode; where PYTHONDONTWRITEBYTECODE
        # is set every new interpreter compiles cutlass's sources again (3.9 s against 0.7 s
        # on the 2-core CPU machine). pip writes bytecode at install: this is a user's state.
        # It stays for the machine's life: run it last in its call.
        "python3 -m compileall -q -j 0 $(python3 -c 'import cutlass, os; "
        "print(os.path.dirname(cutlass.__file__))') cutedebug kernels > /dev/null; echo rc=$?; "
        "python3 tools/pool_bench.py --rounds 2 --overlap --json $STEP_OUT/pool.json",
        "the warm step's runs again with the DSL's and cutedebug's bytecode compiled, as a pip "
        "install leaves them (only when pool_bench's first line said it was not cached)",
    ),
    Step(
        "bench",
        "22",
        60,  # s4: 19 s (30 rounds)
        False,
        "python3 tools/bench_table.py --rounds 30 --json $STEP_OUT/bench.json",
        "the README's performance table, reproduced (+-3%)",
    ),
]
STEPS.append(
    Step(
        "triage_serial",
        "22",
        330,
        False,
        _triage(MATRIX_DIR, "/tmp/tri_serial", " --no-overlap"),
        "the same matrix with --no-overlap (the earlier order): its wall and verdicts, to set "
        "beside the triage step's if the overlap's wall or verdicts need explaining",
    )
)
STEPS.append(
    Step(
        "crash_name",
        "19",
        # a GPU test of two ~8 s execs (torch, cutlass, minimal's 0.3 s compile, 1 s asleep);
        # the H200's mutant t3.p0.missing_phase_flip.producer (2026-12-02 mutate_all): 35.4 s in
        # mutate, 7.3 s of it waiting for the GPU; the -k gemm clean run alone 23 s
        60,
        True,
        "python3 -m pytest -q -p no:cacheprovider -rfEs -s tests/test_exec_gpu.py "
        "-k surfaces_in_cublas 2>&1 | grep -v '^$' | tail -25; "
        "python3 -m cutedebug exec --probes --deadline 120 "
        "--fault missing_phase_flip:role=producer,pipeline=0 --runs-dir /tmp/xcn -- "
        "python3 -m pytest -q -p no:cacheprovider examples/test_field_libs.py -k gemm; "
        'echo rc=$?; grep -h \'"event": "cuda_\' /tmp/xcn/exec-*/events.jsonl | cut -c1-500; '
        "for f in /tmp/xcn/exec-*/report.md; do cp $f $STEP_OUT/; done",
        "a CuTe DSL kernel's illegal address first heard of in torch's cuBLAS (minimal's "
        "oob_store, then a matmul; its clean twin): CRASH named by the context read at exit "
        "('cudaErrorIllegalAddress: the kernel Minimal.kernel faulted (surfaced later ...)'), "
        "the twin PASS with a healthy context; then the GEMM mutant whose CRASH read "
        "'cudaErrorUnknown: ... CUBLAS_STATUS_INTERNAL_ERROR when calling cublasCreate(handle)', "
        "under exec: its verdict line names the sticky error and GemmSm90.kernel, with the "
        "cuda_context / cuda_error events it came from",
    )
)
# #20 on the field kernels (the wheels): a field run costs 8-23 s before its first launch
# (field_quack / field_fa4 rows, reports/2026-12-02-h200 call2 / call3: compile and inputs),
# each replay the same again (a fresh worker); a seed ~0.3 s (ESTIMATE); a perturbed HANG adds
# the 20 s deadline and its rerun with probes.
STEPS.append(
    Step(
        "perturb_field_quack",
        "20",
        # 3 GEMM x ~32 s + 5 RMSNorm x ~18 s (run + 32 seeds) + ~100 s of replays (3 predicted
        # exposable: 2 alone + 2 with history each, 10-22 s a run)
        300,
        True,
        f"python3 tools/perturb_table.py --seeds 32 --replays 2 --budget-s 220 "
        f"--json $STEP_OUT/latent.json {_toml(LATENT_FIELD_QUACK)}; echo rc=$?",
        "the quack half of the field's latent faults under 32 random seeds each: exposed, "
        "replay alone / with history, each against its note's prediction (exposable or benign "
        "by construction); the combined population: tools/perturb_table.py --combine",
    )
)
STEPS.append(
    Step(
        "perturb_field_fa4",
        "20",
        # 4 x ~30 s (run + 32 seeds) + ~100 s of replays (2 predicted exposable)
        240,
        True,
        f"python3 tools/perturb_table.py --seeds 32 --replays 2 --budget-s 150 "
        f"--json $STEP_OUT/latent.json {_toml(LATENT_FIELD_FA4)}; echo rc=$?",
        "the FlashAttention-4 half of the field's latent faults under 32 random seeds each "
        "(as perturb_field_quack)",
    )
)
# the two quack latent faults perturb_field_quack's 220 s budget left (2026-12-02-h200-s4 call2:
# "skipped (budget)"); both predicted benign by construction. rmsnorm_bwd's drop_sync_warp took
# 63 s for its run and 32 seeds there, rmsnorm_fwd runs shorter (ESTIMATE).
STEPS.append(
    Step(
        "perturb_field_rest",
        "20",
        130,
        True,
        f"python3 tools/perturb_table.py --seeds 32 --replays 2 --budget-s 110 "
        f"--json $STEP_OUT/latent.json {_toml(LATENT_FIELD_QUACK[-2:])}; echo rc=$?",
        "the quack latent faults perturb_field_quack's budget left (rmsnorm_bwd's and "
        "rmsnorm_fwd's missing_init_fence) under 32 random seeds each",
    )
)
STEPS.append(
    Step(
        "perturb_field_checks",
        "20",
        # 5 scenarios: each run + 2 replays alone (~30-65 s), FA-4's missing_init_fence also 2
        # with history (~105 s); 4 fork servers ~8 s each
        330,
        True,
        # two seeds: the targeted / role schedules give every seed the same rules, so seed 1
        # differs from seed 0 only by the launch before it (what fa4's missing_init_fence needs)
        "; ".join(
            f"python3 tools/perturb_table.py --seeds 2 --replays 2 --budget-s 100 {flags} "
            f"--json $STEP_OUT/{name}.json {_toml(names)}; echo rc=$?"
            for name, flags, names in _checks(field=True)
        ),
        "each field scenario note's predicted schedule (PERTURB_CHECKS): exposed by it or not, "
        "the verdict read, replay alone / with history",
    )
)
STEPS.append(
    Step(
        "perturb_init_history",
        "20",
        # 2 scenarios x (2 seeds ~5 s + 2 replays alone + 2 with history ~5 s each) + the fork
        # server ~8 s (2026-12-02-h200-s3 call3: sm90_gemm's runs 3.5-4 s)
        60,
        False,
        # the project's kernels whose roles FA-4's forward shares (warp 0 inits and issues the
        # TMA): their warp-0-before-init schedule gave PASS with one seed in a fresh worker,
        # their random exposures came only after earlier seeds. The same schedule twice in one
        # worker: PASS at seed 0 and an exposure at seed 1, replaying with its history and not
        # alone, says the uninitialised barrier's residue (seed 0's launch) decides, and that
        # setmaxnreg does not hold the consumers (field/fa4_fwd_sm90/missing_init_fence's note)
        "python3 tools/perturb_table.py --seeds 2 --replays 2 --budget-s 35 --policy targeted "
        "--target 0 --scope warp=0 --delay-us 200 --json $STEP_OUT/warp0_two_seeds.json "
        f"{_toml(['sm90_gemm/missing_init_fence', 'sm90_attention/missing_init_fence'])}; "
        "echo rc=$?",
        "sm90_gemm's and sm90_attention's missing_init_fence under warp 0 delayed before its "
        "barrier init, two seeds in one worker: does seed 1 (after seed 0's launch) expose what "
        "seed 0 alone did not, replaying with its history only",
    )
)
STEPS.append(
    Step(
        "dump_resume",
        "25",
        # torch and cutlass's import, one compile (~1 s), two sides of 0.5 s spin + at most
        # 15 s each; the dump of 8 CTAs ~0.5 s (tma_stream's 16: 0.2-0.55 s); the plain control;
        # the pause: 3 s of matmuls twice, one dump of a full GPU (7-10 s)
        80,
        False,
        # s6 call 1: the first try printed nothing in 60 s; each step now says where it is, a
        # plain control (no coredump settings) first, stacks before the timeout
        "timeout 40 python3 tools/dump_resume.py --plain --sides control --stacks-after-s 32 "
        "--out /tmp/drp --json $STEP_OUT/plain.json; echo rc=$?; "
        "timeout 60 python3 tools/dump_resume.py --stacks-after-s 50 --out /tmp/dr "
        "--json $STEP_OUT/rows.json; echo rc=$?; "
        "timeout 60 python3 tools/dump_resume.py --sides pause --stacks-after-s 50 "
        "--out /tmp/drq --json $STEP_OUT/pause.json; echo rc=$?",
        "does a user-triggered coredump (skip_abort) leave a running kernel running: "
        "flag_spin's never_set consumers spinning, released from the host after the dump "
        "(control: released without one); resumed with the right values, a CUDA error, or "
        "halted: whether a dump can be taken before the kill decision, off the verdict's "
        "seconds; then whether a dump pauses running work (3 s of matmuls alone and with a "
        "dump: the extra seconds against the dump's)",
    )
)
STEPS.append(
    Step(
        "coredump_attach",
        "25",
        # 4 scenarios x 2 sides: FA-4's compile in the fork server (~10 s the first), the 2 s
        # deadline, the dump (FA-4 7-8 s, spin_hang 5-6 s) or the attach (0.9 s in call5), the
        # reading (~1-4 s): ~8 x 15 s
        150,
        True,
        "for side in dump attach; do CUTEDEBUG_COREDUMP_READ=$side "
        "python3 tools/gpu_coredump_table.py --deadline 2 "
        "--budget-s 70 --out /tmp/coa_$side --json $STEP_OUT/$side.json "
        + _toml(
            [
                "field/fa4_fwd_sm90/skip_consumer_release",
                "field/fa4_fwd_sm90/wrong_expect_tx_minus",
                "minimal/spin_hang",
                "tma_stream/wrong_expect_tx_plus",
            ]
        )
        + "; done",
        "the hung worker read through cuda-gdb attached to it before the kill "
        "(CUTEDEBUG_COREDUMP_READ=attach) against the driver's dump, on hangs that fill the "
        "H200 and a small one: seconds added after the kill decision (target <= 5 s), the same "
        "localization, the attach's own seconds or why it fell back, healthy, 0 left",
    )
)
# cuda-gdb attached before the kill (the default for --coredump since s7's coredump_attach:
# 1.1-1.9 s added against the dump's 0.6-7.5 s, the same places) over the whole sm_90 HANG
# matrix: each run ~5 s (own: the 2 s deadline, ~1.5 s attached) to ~11 s (FA-4, RMSNorm), quack
# GEMM's with its own compile 20-34 s
# the bisection-only hangs timed against bisection (FA-4's and quack GEMM's named barriers, two
# of ours), alternated library by library
BISECT_ONLY = [
    "field/fa4_fwd_sm90/wrong_barrier_threads_minus",
    "field/quack_gemm_sm90/wrong_barrier_threads_plus",
    "field/fa4_fwd_sm90/wrong_barrier_threads_plus",
    "field/quack_gemm_sm90/wrong_barrier_threads_minus",
    "sm90_gemm/wrong_barrier_threads_minus",
    "bisect/flag_spin_never_set",
]
_ATTACH_RUNS = "python3 tools/gpu_coredump_table.py --deadline 2 --out /tmp/{d} --budget-s {b} "
STEPS += [
    Step(
        "coredump_own_attach",
        "25",
        400,
        False,
        _ATTACH_RUNS.format(d="caown", b=370) + f"--json $STEP_OUT/rows.json {_toml(_own_hangs())}",
        "the 60 own HANG scenarios with --coredump as it is now (cuda-gdb attached to the hung "
        "worker before the kill): localized as expected, read attached (or why it fell back to "
        "the dump), seconds added against the 5 s target, healthy, 0 left",
    ),
    Step(
        "coredump_field_attach",
        "25",
        330,
        True,
        _ATTACH_RUNS.format(d="cafld", b=300)
        + "--json $STEP_OUT/rows.json "
        + _toml([n for n in _field_hangs() if "quack_gemm" not in n]),
        "the field HANG scenarios but quack GEMM's (FA-4 forward and backward, quack RMSNorm, "
        "softmax) with --coredump attached as it is now: as coredump_own_attach",
    ),
    Step(
        "coredump_gemm_attach",
        "25",
        330,
        True,
        _ATTACH_RUNS.format(d="cagem", b=300)
        + "--json $STEP_OUT/rows.json "
        + _toml([n for n in _field_hangs() if "quack_gemm" in n]),
        "quack GEMM's 12 HANG scenarios with --coredump attached as it is now: as "
        "coredump_own_attach",
    ),
    Step(
        "field_preload",
        "25",
        # the fork server's first field run imports the library (FA-4 ~5 s, quack GEMM ~8 s)
        # and checks a forked child on the GPU; each later run of that library ~5-7 s
        150,
        True,
        _ATTACH_RUNS.format(d="capre", b=130)
        + "--json $STEP_OUT/rows.json "
        + _toml(
            [
                "field/fa4_fwd_sm90/wrong_barrier_threads_minus",
                "field/fa4_fwd_sm90/wrong_barrier_threads_plus",
                "field/quack_gemm_sm90/wrong_barrier_threads_minus",
                "field/quack_gemm_sm90/wrong_barrier_threads_plus",
                "field/quack_rmsnorm_fwd/wrong_expect_tx_plus",
                "field/quack_softmax/wrong_expect_tx_plus",
            ]
        )
        + "; echo '--- the fork server log:'; grep -h 'fork server' /tmp/capre/forkserver.log "
        "|| echo 'no fork server message (preloading kept)'",
        "the field workers with their libraries imported by the fork server at its start "
        "(gpu_coredump_table: runner.start_forkserver(preload=the scenarios' modules); the "
        "server's answer printed with its seconds): each run's imports_s and wall from spawn "
        "(the bisection-only four in s8 call3: 10.10 / 7.79 / 8.41 / 6.68 s, the first FA-4 run "
        "paying the library's import, against the 10 s target), whether preloading stopped and "
        "why, the localization as before",
    ),
    Step(
        "pool_preload",
        "25",
        # BYTECODE ~15 s, the pool's start ~3 s, 12 warm runs (~6-10 s each): ~120 s
        120,
        True,
        BYTECODE + "python3 tools/core_vs_bisect.py --no-cold --warm --warm-rounds 2 --deadline 2 "
        "--pool-preload --json $STEP_OUT/rows.json " + _toml(BISECT_ONLY),
        "the bisection-only hangs through the warm pool started as `cutedebug pool start "
        "SCENARIO...` (the scenarios' libraries imported in its server before the first run; "
        "its answer says how long that took): `run --coredump --warm`, two rounds over the six; "
        "each run's wall (s8 call5, the library imported at the pool's first run of it: 4.3-11.2 "
        "s, the first FA-4 run 11.2 s), imports_s, the verdict and localization, the pool's "
        "preload on or why off, processes left",
    ),
    Step(
        "core_vs_bisect",
        "25",
        # BYTECODE ~15 s; per scenario a cold `run --coredump` (FA-4 ~14 s, own ~6 s) and a cold
        # `cutedebug bisect` (ESTIMATE 20-40 s: its fork server with the library, a probed
        # baseline, 4-8 checkpoint reruns, each a compile); then the warm side (~8 s each)
        360,
        True,
        BYTECODE
        + "python3 tools/core_vs_bisect.py --deadline 2 --warm --json $STEP_OUT/rows.json "
        + _toml(BISECT_ONLY),
        "the bisection-only hangs as a user runs them, each command a fresh process, alternated "
        "per scenario: `cutedebug run --coredump --no-warm` (cuda-gdb attached to the hung "
        "worker) against `cutedebug bisect` (its checkpoint reruns): the whole wall of each, "
        "the verdict, the localization against the expected one, bisect/core per scenario; "
        "then `run --coredump --warm` through one pool (the library imported once in its fork "
        "server); processes left after each",
    ),
    Step(
        "attach_neighbours",
        "25",
        90,
        False,
        "python3 tools/attach_neighbours.py --out /tmp/an --json $STEP_OUT/rows.json",
        "two small hangs read by attached cuda-gdb at once while a third process runs checked "
        "cuBLAS matmuls: both localized and read attached? the neighbour's batches right, no "
        "CUDA error, its longest batch against its batches alone",
    ),
]
BY_NAME = {s.name: s for s in STEPS}
# The order a session with device time runs them in (--plan without steps): the checks that
# close the most issues per device second first. The triage alone is what #21 still needs and
# half of #23's; with xdist #23 is done; pytest_gpu is owed whenever GPU code changed; perturb
# and coredump each close one issue; warm + bench finish #22 (with the triage); the field and
# exec steps (#17, #19) carry the wheels and come last.
PRIORITY = (  # after 2026-12-03-h200-s11: #22's cold run 4.56 s median, 14 of 16 runs
    "pytest_gpu_only",  # on the final code (s11 call1: 14 passed on a39a71f)
    "rmsnorm_minus",  # #17: s11 call2 CRASH 11/12, HANG 1/12 (no HANG from --coredump yet)
    "cold_cuts",  # #22: s10 calls 2-3 (4.64 s, 13/16 within 5 s), s11 calls 1-2 (4.56 s, 14/16)
    "triage_preload",  # s11 call1: 5/6 (rmsnorm_fwd/wrong_expect_tx_minus HANG, now expected)
    "warm_lite",  # #22: s9 call2 5/5 within 5 s (4.22 s), call3 0/5 (5.57 s, a slower machine)
    "field_preload",  # #25: done in s9 call1 (preloaded at the server's start: 6.74-9.57 s)
    "pool_preload",  # #25: done in s9 call1 (`pool start SCENARIO...`: 4.64-8.38 s)
    "triage",  # #22: done in s10 call4 (140.1 s, 114 scenarios; s9: 139.3 s)
    "core_vs_bisect",  # #25: done in s8 call3 (core 7.3-16.6 s cold, bisect 9.3-47.9 s)
    "coredump_own_attach",  # done in s7 call2 (60/60 attached, 55/55 graded)
    "attach_neighbours",  # done in s7 call2 (both attached, the neighbour right)
    "coredump_field_attach",  # done in s7 call3 (22 attached, 22/22)
    "coredump_gemm_attach",  # done in s7 call4 (11 attached, 10/10)
    "coredump_attach",  # done in s7 call1 (4/4, attach 1.07-1.88 s added, dump 0.60-7.50 s)
    "coredump_field",  # #25: done in s6 call1 (FA-4 fwd's extra_consumer_release MISMATCH 4/4)
    "dump_resume",  # #25: done in s6 call4 (a dump ends running work: launch failure)
    "mutate_all",  # #19: done in s3 call1 (73/73 applied); again for the own-time baseline
    "warm_reuse",  # #22: done in s5 call1 (warm 1.62 s, fresh 1.74 s, no spare 1.66 s)
    "cold_parts",  # #22: done in s5 call1 (torch had no bytecode; with it cold 4.69 s, n=2)
    "coredump_field_gemm",  # #25: done in s5 call3 (7/7 graded as expected)
    "coredump_rest",  # done in s4 call1 (4/4 localized as expected, quack GEMM's named barriers)
    "perturb_field_checks",  # done in s4 call1 (4 of 5 predicted schedules exposed)
    "perturb_field_quack",  # done in s4 call2 (3/6 exposed, 2 left by the budget)
    "perturb_field_fa4",  # done in s4 call2 (1/4 exposed)
    "perturb_field_rest",  # done in s4 call3 (both PASS over 32 seeds, as predicted)
    "perturb_init_history",  # done in s4 call1 (both exposed at seed 1, with history only)
    "crash_name",  # done in s3 call4 (cudaErrorIllegalAddress / cudaErrorLaunchFailure named)
    "tail_cluster",  # done in s3 call4 (CRASH, seed 0 of its schedule, seed 8 random)
    "sanitize_rest",  # done in s3 call2 (CLEAN, pipeline-ordered / tma filtered)
    "recheck",  # done in 2026-12-02-h200-s3 call3
    "referee",  # done in 2026-12-02-h200-s2 call4 (the samples: CONFIRMED / UNCONFIRMED)
    "perturb_crash",  # done in 2026-12-02-h200-s2 call5 (CRASH; replay as printed 9/9)
    "pytest_gpu",
    "perturb",
    "warm",
    "coredump",
    "cold_bytecode",
    "exec",
    "perturb_keys",
    "racecheck_idiom",
    "field_quack",
    "field_fa4",
    "field_sanitize",
    "coredump_lite",
    "variant",
    "xdist",
    "bench",
    "smoke",
    "triage_serial",
)
# A call that finds no warm machine spends a minute or more starting one (the device README),
# and the machine goes back 30 s after a call: each call of a plan pays a start.
START_S = 120
SESSION_S = 1800


def sessions(calls: list[list[Step]], session_s: int, start_s: int) -> list[list[list[Step]]]:
    """Calls grouped in order into sessions of at most ``session_s`` device seconds, each call
    costing its steps' estimates plus ``start_s``."""
    out: list[list[list[Step]]] = []
    used = session_s  # forces a first session
    for c in calls:
        cost = sum(s.seconds for s in c) + start_s
        if used + cost > session_s:
            out.append([])
            used = 0
        out[-1].append(c)
        used += cost
    return out


def plan(steps: list[Step], call_s: int) -> list[list[Step]]:
    """Steps grouped in order into calls of at most ``call_s`` estimated seconds; a call
    carries the wheels or not at all (only a call that needs .whl pays for carrying it)."""
    calls: list[list[Step]] = []
    cur: list[Step] = []
    for s in steps:
        if cur and (sum(x.seconds for x in cur) + s.seconds > call_s or cur[-1].wheels != s.wheels):
            calls.append(cur)
            cur = []
        cur.append(s)
    if cur:
        calls.append(cur)
    return calls


def run(names: list[str], out: Path, budget_s: float, pack: Path | None = None) -> int:
    out.mkdir(parents=True, exist_ok=True)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    bundle = ROOT / ".field" / "field-site.tar.xz"  # tools/field_bundle.py: fits a call
    wheels = sorted((ROOT / ".whl").glob("*.whl")) if (ROOT / ".whl").is_dir() else []
    have_wheels = bundle.is_file() or bool(wheels)
    if any(BY_NAME[n].wheels for n in names) and have_wheels:
        install = (
            # bytecode compiled as a pip install leaves it (the bundle carries none)
            f"mkdir -p /tmp/site && tar -C /tmp/site -xJf {bundle} && "
            "python3 -m compileall -q -j 0 /tmp/site > /dev/null"
            if bundle.is_file()
            else "python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir "
            "--upgrade --target /tmp/site .whl/*.whl"
        )
        subprocess.run(install, shell=True, cwd=ROOT, check=False)
        env["PYTHONPATH"] = "/tmp/site:" + env.get("PYTHONPATH", "")
    rows = []
    t0 = time.monotonic()
    for n in names:
        s = BY_NAME[n]
        left = budget_s - (time.monotonic() - t0)
        d = out / n
        d.mkdir(exist_ok=True)
        if s.wheels and not have_wheels:
            rows.append((n, "not run (no .whl)", "", "", ""))
            continue
        if left < s.seconds * 0.8:
            rows.append((n, f"not run (budget: {left:.0f} s left, needs ~{s.seconds})", "", "", ""))
            continue
        limit = min(left, s.seconds * 1.5)
        start = time.monotonic()
        with open(d / "log.txt", "w") as log:
            log.write(f"$ {s.command}\n")
            log.flush()
            p = subprocess.Popen(
                ["timeout", "-k", "5", str(int(limit)), "bash", "-c", s.command],
                cwd=ROOT,
                env=dict(env, STEP_OUT=str(d)),
                stdout=log,
                stderr=subprocess.STDOUT,
            )
            rc = p.wait()
        wall = time.monotonic() - start
        tail = (d / "log.txt").read_text(errors="replace").strip().splitlines()[-1:]
        status = "timed out" if rc in (124, 137) else f"rc={rc}"
        left = ours_left(5.0)
        if left:
            with open(d / "log.txt", "a") as log:
                log.write("processes of ours left 5 s after the step:\n" + "\n".join(left) + "\n")
        rows.append((n, status, f"{wall:.0f}", str(len(left)), (tail or [""])[0][:120]))
        print(f"[{n}] {status} in {wall:.0f} s", flush=True)
        _summary(out, rows, pack)
    print("\n".join(_summary(out, rows, pack)))
    return 0


def _summary(out: Path, rows: list[tuple[str, ...]], pack: Path | None) -> list[str]:
    """OUT/summary.md, and with ``pack`` the whole OUT as one .tar.gz, rewritten after every
    step: a device call brings back at most 8 files two folders down (the device README), so a
    call that writes more (2026-12-02's call1 lost two logs) packs its folder into one, and a
    call cut short keeps every step before the cut. Only this run's steps and OUT's own files
    (clocks.txt, summary.md) go in: the device machine can keep /tmp from an earlier call, and
    an earlier step's folder in the same OUT would read as this call's (s7 call1 brought back
    s6 call1's three)."""
    lines = [
        "| step | result | wall s | ours left | last line |",
        "|---|---|---|---|---|",
        *(f"| {' | '.join(r)} |" for r in rows),
    ]
    (out / "summary.md").write_text("\n".join(lines) + "\n")
    if pack is not None:
        import tarfile

        tmp = pack.with_name(pack.name + ".part")
        with tarfile.open(tmp, "w:gz") as tar:
            for p in sorted(out.iterdir()):
                if p.is_file() or p.name in {r[0] for r in rows}:
                    tar.add(p, arcname=f"{out.name}/{p.name}")
        tmp.replace(pack)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("steps", nargs="*", help=f"steps to run, in order ({', '.join(BY_NAME)})")
    ap.add_argument("--list", action="store_true", help="list the steps")
    ap.add_argument("--plan", action="store_true", help="group the steps into device calls")
    ap.add_argument("--call-s", type=int, default=540, help="device seconds per call (plan)")
    ap.add_argument(
        "--session-s", type=int, default=SESSION_S, help="device seconds per session (plan)"
    )
    ap.add_argument(
        "--start-s", type=int, default=START_S, help="device seconds a machine's start costs"
    )
    ap.add_argument("--out", type=Path, help="where the logs go (run)")
    ap.add_argument("--budget-s", type=float, default=570.0, help="the whole call's seconds")
    ap.add_argument(
        "--pack", type=Path, help="also write OUT as one .tar.gz here after every step ($OUT/x.tgz)"
    )
    a = ap.parse_args(argv)
    unknown = [n for n in a.steps if n not in BY_NAME]
    if unknown:
        ap.error(f"unknown step(s) {', '.join(unknown)}; the steps are {', '.join(BY_NAME)}")
    chosen = [BY_NAME[n] for n in a.steps] or STEPS
    if a.list:
        for s in chosen:
            print(f"  {s.name:15} #{s.issues:12} ~{s.seconds:4d} s  {s.what}")
        return 0
    if a.plan:
        ordered = chosen if a.steps else [BY_NAME[n] for n in PRIORITY]
        i = 0
        for k, sess in enumerate(sessions(plan(ordered, a.call_s), a.session_s, a.start_s), 1):
            cost = sum(sum(s.seconds for s in c) + a.start_s for c in sess)
            print(f"session {k}: ~{cost} device s of {a.session_s} ({a.start_s} s a start)")
            for g in sess:
                i += 1
                whl = ", carry .field" if any(s.wheels for s in g) else ""
                names = " ".join(s.name for s in g)
                print(f" call {i} (~{sum(s.seconds for s in g)} s{whl}): {names}")
                for s in g:
                    print(f"  {s.name:15} #{s.issues:12} ~{s.seconds:4d} s  {s.what}")
        return 0
    if not a.out:
        ap.error("--out is needed to run steps (or --list / --plan)")
    return run([s.name for s in chosen], a.out, a.budget_s, a.pack)


if __name__ == "__main__":
    sys.exit(main())
