"""Scenario files: loading and validation.

A scenario is a TOML file::

    id = "tma_stream/wrong_expect_tx_plus"
    description = "expect_tx 16 B larger than the TMA bytes: full barrier never completes"

    [kernel]
    file = "../../kernels/tma_stream.py"   # relative to this file (or absolute)
    entry = "TmaStream"

    [params]                              # the kernel's PARAMS, checked by name and type
    stages = 4

    [fault]                               # optional; other keys are the fault's arguments
    kind = "wrong_expect_tx"
    delta_bytes = 16

    [expect]
    verdict = "HANG"                      # one of cutedebug.engine.verdict.ALL
    role = "consumer"                     # optional localization, graded when given
    op = "consumer_wait"
    barrier = "full"
    stage = 0
    note = "why this verdict"
    localized_by = "probes"               # or "bisect": only `cutedebug bisect` can check it

    [limits]                              # all optional
    compile_s = 300.0                     # compile deadline
    deadline_s = 30.0                     # launch -> synchronize deadline
    stall_s = 1.0                         # no probe counter moved for this long -> HANG
    wait_budget_ms = 500                  # bounded-wait budget when probes are on

    [requires]
    arch = ["sm_90a"]                     # runs only on these; compiles for the first
    modules = ["quack"]                   # Python modules the kernel file needs (optional
                                          # extras): without them the scenario is UNSUPPORTED

    [probes]
    enabled = false                       # bounded waits + beacons (off: zero overhead)

Every error names the file, the field, the bad value and what is allowed. Unknown keys are
errors. This module runs in the parent: it never imports torch or cutlass.
"""

from __future__ import annotations

import ast
import functools
import io
import re
import tokenize
import tomllib
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from cutedebug.engine.limits import LIMIT_RANGES, LimitError, check_limit, limit_arg  # noqa: F401
from cutedebug.engine.verdict import ALL as VERDICTS

ARCHS = ("sm_90a", "sm_100a")
ROLES = ("producer", "consumer", "any")
OPS = (
    "producer_acquire",
    "producer_commit",
    "consumer_wait",
    "consumer_release",
    "producer_tail",
    "raw_wait",
    "named_barrier",
    "checkpoint",
)
BARRIERS = ("full", "empty", "named", "cluster", "other")


class ScenarioError(ValueError):
    """A scenario that cannot be used. The message is meant for the user as it is."""


@dataclass(frozen=True)
class Limits:
    compile_s: float = 300.0
    deadline_s: float = 30.0
    stall_s: float = 1.0
    wait_budget_ms: int = 500
    import_s: float = 120.0
    check_s: float = 120.0


@dataclass(frozen=True)
class Expect:
    verdict: str = "PASS"
    role: str | None = None
    op: str | None = None
    barrier: str | None = None
    stage: int | None = None
    note: str = ""
    localized_by: str = "probes"  # who can check role/op/barrier/stage: probes | bisect
    also: tuple[str, ...] = ()  # timing-dependent: other verdicts measured for this fault

    @property
    def timing_dependent(self) -> bool:
        return bool(self.also)

    @property
    def verdicts(self) -> tuple[str, ...]:
        """The expected verdict first, then the ones a timing-dependent fault also gives."""
        return (self.verdict, *self.also)

    def accepts(self, verdict: str) -> bool:
        """The expected verdict, or one a timing-dependent fault was also measured to give."""
        return verdict in self.verdicts

    def verdict_text(self) -> str:
        """'MISMATCH', or 'MISMATCH (timing-dependent: also PASS, HANG)'."""
        if not self.also:
            return self.verdict
        return f"{self.verdict} (timing-dependent: also {', '.join(self.also)})"

    def localization(self) -> dict[str, Any]:
        return {
            k: v
            for k, v in (
                ("role", self.role),
                ("op", self.op),
                ("barrier", self.barrier),
                ("stage", self.stage),
            )
            if v is not None
        }


@dataclass(frozen=True)
class Scenario:
    id: str
    kernel_file: str  # absolute path
    kernel_entry: str
    description: str = ""
    params: dict[str, Any] = field(default_factory=dict)
    fault: str | None = None
    fault_args: dict[str, Any] = field(default_factory=dict)
    expect: Expect = Expect()
    limits: Limits = Limits()
    archs: tuple[str, ...] = ("sm_90a",)
    probes: bool = False
    source: str | None = None  # the TOML file, None for ad-hoc runs
    modules: tuple[str, ...] = ()  # Python modules the kernel file needs (requires.modules)

    def missing_modules(self) -> list[str]:
        """The required modules that this interpreter cannot find (found is not importable:
        the worker imports them and says why one fails)."""
        return [m for m in self.modules if not module_findable(m)]

    def to_json(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "description": self.description,
            "source": self.source,
            "kernel": {"file": self.kernel_file, "entry": self.kernel_entry},
            "params": self.params,
            "fault": self.fault,
            "fault_args": self.fault_args,
            "expect": vars(self.expect),
            "limits": vars(self.limits),
            "archs": list(self.archs),
            "probes": self.probes,
            "modules": list(self.modules),
        }

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Scenario:
        """Inverse of to_json (for replaying recorded runs)."""
        return cls(
            id=d["id"],
            description=d.get("description", ""),
            source=d.get("source"),
            kernel_file=d["kernel"]["file"],
            kernel_entry=d["kernel"]["entry"],
            params=d.get("params", {}),
            fault=d.get("fault"),
            fault_args=d.get("fault_args") or {},
            expect=_expect_from_json(d.get("expect", {})),
            limits=Limits(**d.get("limits", {})),
            archs=tuple(d.get("archs", ["sm_90a"])),
            probes=d.get("probes", False),
            modules=tuple(d.get("modules", ())),
        )

    def with_overrides(self, **kw: Any) -> Scenario:
        return replace(self, **kw)


def _expect_from_json(d: dict[str, Any]) -> Expect:
    return Expect(**(d | {"also": tuple(d.get("also", ()))}))


# ---- field schemas ---------------------------------------------------------------------
_TOP = {
    "id": str,
    "description": str,
    "kernel": dict,
    "params": dict,
    "fault": dict,
    "expect": dict,
    "limits": dict,
    "requires": dict,
    "probes": dict,
}
_KERNEL = {"file": str, "entry": str}
_EXPECT = {
    "verdict": str,
    "role": str,
    "op": str,
    "barrier": str,
    "stage": int,
    "note": str,
    "localized_by": str,
    "also": list,
}
LOCALIZERS = ("probes", "bisect")
_LIMITS = {
    "compile_s": float,
    "deadline_s": float,
    "stall_s": float,
    "wait_budget_ms": int,
    "import_s": float,
    "check_s": float,
}
ID_RE = re.compile(r"[A-Za-z0-9_.\-]+(/[A-Za-z0-9_.\-]+)*")
MAX_ID = 120


def check_id(sid: Any, where: str) -> str:
    """A scenario id: ASCII letters, digits, ``_ . -``, segments joined by ``/``; short."""
    if (
        not isinstance(sid, str)
        or not ID_RE.fullmatch(sid)
        or len(sid) > MAX_ID
        or any(seg in (".", "..") for seg in sid.split("/"))
    ):
        raise ScenarioError(
            f"{where}: field id = {str(sid)[:80]!r}"
            f"{'...' if len(str(sid)) > 80 else ''}: expected at most {MAX_ID} "
            "characters of A-Z a-z 0-9 _ . - in segments joined by /"
        )
    return sid


_REQUIRES = {"arch": list, "modules": list}
_PROBES = {"enabled": bool}
_REQUIRED_TOP = ("id", "kernel", "expect")


def module_findable(name: str) -> bool:
    """Whether ``import name`` can find the module, without running it (its parent packages
    are imported: a namespace package such as ``flash_attn`` runs no code)."""
    import importlib.util

    try:
        return importlib.util.find_spec(name) is not None
    except (ImportError, ValueError):
        return False


def _type_ok(value: Any, want: type) -> bool:
    if want is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if want is int:
        return isinstance(value, int) and not isinstance(value, bool)
    return isinstance(value, want)


def _check_table(where: str, table: dict[str, Any], schema: dict[str, type], prefix: str):
    for key, value in table.items():
        name = f"{prefix}{key}"
        if key not in schema:
            raise ScenarioError(f"{where}: unknown field {name!r}; allowed: {sorted(schema)}")
        want = schema[key]
        if not _type_ok(value, want):
            raise ScenarioError(f"{where}: field {name} = {value!r}: expected {want.__name__}")


def _choice(where: str, name: str, value: Any, allowed: tuple) -> None:
    if value not in allowed:
        raise ScenarioError(f"{where}: field {name} = {value!r}: allowed values {list(allowed)}")


def class_constants(cls: ast.ClassDef) -> Iterator[tuple[str, ast.expr]]:
    """``NAME = value`` and ``NAME: T = value`` statements of a class body, as (name, value
    expression): how the kernel interface's class constants (PARAMS, SWITCHES, SHRINKABLE) are
    read from the source without importing it."""
    for stmt in cls.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target = stmt.targets[0]
        elif isinstance(stmt, ast.AnnAssign) and stmt.value:
            target = stmt.target
        else:
            continue
        if isinstance(target, ast.Name):
            yield target.id, stmt.value


@functools.lru_cache(maxsize=32)
def _parsed(filename: str, raw: bytes) -> ast.Module:
    """The source's syntax tree, parsed once per content (the 33 attention scenarios name one
    kernel file: collecting them parsed it 33 times in every pytest worker). Read only."""
    encoding, _ = tokenize.detect_encoding(io.BytesIO(raw).readline)
    return ast.parse(raw.decode(encoding), filename=filename)


def kernel_params_from_source(path: Path, entry: str, where: str) -> dict[str, Any] | None:
    """The entry's PARAMS and SWITCHES read from the source without importing it.

    Switches appear as bool params (default False) and are listed under the key
    ``"__switches__"``. Returns None when PARAMS is not a literal (the worker then validates
    at import time).
    """
    try:
        tree = _parsed(str(path), path.read_bytes())
    except (SyntaxError, ValueError, LookupError) as e:  # UnicodeDecodeError is a ValueError
        raise ScenarioError(f"{where}: kernel file {path} does not parse: {e}") from None
    except OSError as e:
        raise ScenarioError(f"{where}: kernel file {path} cannot be read: {e.strerror}") from None
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    cls = next((c for c in classes if c.name == entry), None)
    if cls is None:
        if any(
            isinstance(n, (ast.Assign, ast.ImportFrom, ast.Import)) and entry in ast.dump(n)
            for n in tree.body
        ):
            return None  # defined by assignment or import: only the worker can tell
        raise ScenarioError(
            f"{where}: field kernel.entry = {entry!r}: no such class in {path}; "
            f"classes there: {[c.name for c in classes]}"
        )
    params: dict[str, Any] | None = None
    switches: list[str] = []
    for name, expr in class_constants(cls):
        try:
            value = _const_eval(expr)
        except ValueError:
            if name == "PARAMS":
                return None
            continue
        if name == "PARAMS" and isinstance(value, dict):
            params = dict(value)
        elif name == "SWITCHES" and isinstance(value, dict):
            switches = list(value)
    if params is None:
        return None
    for s in switches:
        params.setdefault(s, False)
    params["__switches__"] = switches
    return params


_BINOPS = {
    ast.Add: lambda a, b: a + b,
    ast.Sub: lambda a, b: a - b,
    ast.Mult: lambda a, b: a * b,
    ast.FloorDiv: lambda a, b: a // b,
    ast.LShift: lambda a, b: a << b,
    ast.Pow: lambda a, b: a**b,
}


def _const_eval(node: ast.AST) -> Any:
    """literal_eval plus integer arithmetic (``1 << 20``, ``4 * 1024``) in PARAMS."""
    if isinstance(node, ast.Dict):
        return {_const_eval(k): _const_eval(v) for k, v in zip(node.keys, node.values)}
    if isinstance(node, (ast.Tuple, ast.List)):
        items = [_const_eval(e) for e in node.elts]
        return tuple(items) if isinstance(node, ast.Tuple) else items
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        a, b = _const_eval(node.left), _const_eval(node.right)
        if isinstance(a, (int, float)) and isinstance(b, (int, float)) and abs(b) < 4096:
            return _BINOPS[type(node.op)](a, b)
        raise ValueError("not a constant expression")
    try:
        return ast.literal_eval(node)
    except (ValueError, SyntaxError, TypeError):
        raise ValueError("not a constant expression") from None


def _check_params(where: str, given: dict[str, Any], declared: dict[str, Any] | None) -> None:
    if declared is None:
        return
    for name, value in given.items():
        if name not in declared or name == "__switches__":
            raise ScenarioError(
                f"{where}: unknown field params.{name}; the kernel's "
                f"parameters: {sorted(k for k in declared if k[0] != '_')}"
            )
        default = declared[name]
        if not _type_ok(value, type(default)):
            raise ScenarioError(
                f"{where}: field params.{name} = {value!r}: expected "
                f"{type(default).__name__} (default {default!r})"
            )


def _check_fault(where: str, table: dict[str, Any], declared: dict[str, Any] | None):
    from cutedebug.instrument import faults

    switches = (declared or {}).get("__switches__", [])
    allowed = sorted(set(faults.FAULTS) | set(switches))
    if "kind" not in table:
        raise ScenarioError(f"{where}: field fault.kind is missing; allowed: {allowed}")
    kind = table["kind"]
    args = {k: v for k, v in table.items() if k != "kind"}
    if isinstance(kind, str) and kind not in faults.FAULTS and kind in switches:
        if args:
            raise ScenarioError(
                f"{where}: fault {kind} is a kernel-level switch and takes no "
                f"arguments; got {sorted(args)} (set params instead)"
            )
        return kind, {}
    if not isinstance(kind, str) or kind not in faults.FAULTS:
        raise ScenarioError(f"{where}: field fault.kind = {kind!r}: allowed values {allowed}")
    try:
        args = faults.validate(kind, args)
    except faults.FaultSpecError as e:
        raise ScenarioError(f"{where}: fault {kind}: {e}") from None
    if faults.FAULTS[kind].kind == "switch" and declared is not None and kind not in switches:
        raise ScenarioError(
            f"{where}: field fault.kind = {kind!r}: a kernel-level switch that "
            f"this kernel does not declare in SWITCHES (it declares {switches})"
        )
    return kind, args


def build(data: dict[str, Any], where: str, base_dir: Path, source: str | None) -> Scenario:
    if not isinstance(data, dict):
        raise ScenarioError(f"{where}: expected a table at the top level")
    _check_table(where, data, _TOP, "")
    for key in _REQUIRED_TOP:
        if key not in data:
            raise ScenarioError(f"{where}: required field {key!r} is missing")
    sid = check_id(data["id"], where)

    kernel = data["kernel"]
    _check_table(where, kernel, _KERNEL, "kernel.")
    for key in ("file", "entry"):
        if key not in kernel:
            raise ScenarioError(f"{where}: required field kernel.{key} is missing")
    kfile = Path(kernel["file"])
    if not kfile.is_absolute():
        kfile = (base_dir / kfile).resolve()
    if not kfile.is_file():
        raise ScenarioError(
            f"{where}: field kernel.file = {kernel['file']!r}: no such file ({kfile})"
        )
    declared = kernel_params_from_source(kfile, kernel["entry"], where)

    params = data.get("params", {})
    _check_params(where, params, declared)

    fault, fault_args = None, {}
    if "fault" in data:
        fault, fault_args = _check_fault(where, data["fault"], declared)

    expect_t = data["expect"]
    _check_table(where, expect_t, _EXPECT, "expect.")
    if "verdict" not in expect_t:
        raise ScenarioError(
            f"{where}: required field expect.verdict is missing; allowed: {list(VERDICTS)}"
        )
    _choice(where, "expect.verdict", expect_t["verdict"], VERDICTS)
    if "role" in expect_t:
        _choice(where, "expect.role", expect_t["role"], ROLES)
    if "op" in expect_t:
        _choice(where, "expect.op", expect_t["op"], OPS)
    if "barrier" in expect_t:
        _choice(where, "expect.barrier", expect_t["barrier"], BARRIERS)
    if "localized_by" in expect_t:
        _choice(where, "expect.localized_by", expect_t["localized_by"], LOCALIZERS)
    if expect_t.get("stage", 0) < 0:
        raise ScenarioError(f"{where}: field expect.stage = {expect_t['stage']}: must be >= 0")
    for v in expect_t.get("also", []):
        _choice(where, "expect.also", v, tuple(x for x in VERDICTS if x != expect_t["verdict"]))
    if len(set(expect_t.get("also", []))) != len(expect_t.get("also", [])):
        raise ScenarioError(
            f"{where}: field expect.also = {expect_t['also']!r}: names a verdict twice"
        )
    expect = Expect(**(expect_t | {"also": tuple(expect_t.get("also", []))}))

    limits_t = data.get("limits", {})
    _check_table(where, limits_t, _LIMITS, "limits.")
    try:
        limits = Limits(
            **{k: check_limit(k, v, where, f"field limits.{k}") for k, v in limits_t.items()}
        )
    except LimitError as e:
        raise ScenarioError(str(e)) from None

    requires = data.get("requires", {})
    _check_table(where, requires, _REQUIRES, "requires.")
    archs = tuple(requires.get("arch", ["sm_90a"]))
    if not archs:
        raise ScenarioError(f"{where}: field requires.arch is empty; allowed values {ARCHS}")
    for a in archs:
        _choice(where, "requires.arch", a, ARCHS)
    modules = tuple(requires.get("modules", []))
    for m in modules:
        if not isinstance(m, str) or not all(part.isidentifier() for part in m.split(".")):
            raise ScenarioError(
                f"{where}: field requires.modules: {m!r} is not a Python module "
                'name (e.g. "quack" or "flash_attn.cute")'
            )

    probes_t = data.get("probes", {})
    _check_table(where, probes_t, _PROBES, "probes.")

    return Scenario(
        id=sid,
        description=data.get("description", ""),
        kernel_file=str(kfile),
        kernel_entry=kernel["entry"],
        params=dict(params),
        fault=fault,
        fault_args=fault_args,
        expect=expect,
        limits=limits,
        archs=archs,
        probes=probes_t.get("enabled", False),
        source=source,
        modules=modules,
    )


def load(path: str | Path) -> Scenario:
    path = Path(path)
    where = str(path)
    if not path.is_file():
        raise ScenarioError(f"{where}: scenario file not found")
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except OSError as e:
        raise ScenarioError(f"{where}: cannot read the scenario file: {e.strerror}") from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{where}: not UTF-8 text: {e}") from None
    except tomllib.TOMLDecodeError as e:
        raise ScenarioError(f"{where}: not valid TOML: {e}") from None
    return build(data, where, path.parent.resolve(), str(path.resolve()))


def discover(root: str | Path) -> list[Path]:
    root = Path(root)
    if root.suffix == ".toml" or root.is_file():
        if not root.is_file():
            raise ScenarioError(f"{root}: scenario file not found")
        return [root]
    if not root.is_dir():
        raise ScenarioError(f"{root}: no such scenario file or directory")
    try:
        return sorted(p for p in root.rglob("*.toml") if p.is_file())
    except OSError as e:
        raise ScenarioError(f"{root}: cannot list the scenario files: {e}") from None


def parse_value(text: str) -> Any:
    """A command-line value: TOML scalar syntax (1, 2.5, true, "s"), else the bare string."""
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def adhoc(
    target: str,
    params: dict[str, Any],
    fault: str | None,
    fault_args: dict[str, Any],
    expect: str,
    archs: tuple[str, ...] = ("sm_90a",),
) -> Scenario:
    """A scenario from `cutedebug run path/to/kernel.py:ENTRY --param k=v --fault name:a=v`."""
    where = "command line"
    if ":" not in target:
        raise ScenarioError(f"{where}: {target!r}: expected a scenario .toml or FILE.py:ENTRY")
    file, entry = target.rsplit(":", 1)
    data: dict[str, Any] = {
        "id": f"adhoc/{Path(file).stem}.{entry}",
        "kernel": {"file": str(Path(file).resolve()), "entry": entry},
        "params": params,
        "expect": {"verdict": expect},
        "requires": {"arch": list(archs)},
    }
    if fault:
        data["fault"] = {"kind": fault, **fault_args}
    return build(data, where, Path.cwd(), None)
